//! The agent's half of kernel digests (`sqlbee_kernel_abi::kernel_digests`):
//! hands out slots to text hashes, flips the epoch at each window end and
//! reads back what the kernel counted in the other one.
//!
//! A hash is registered into a way of its set in `KNOWN`; when every way
//! of that set is taken, its statements keep coming as records.
//!
//! Slots are few (the maps are per CPU), so a slot whose hash saw no
//! statement for a few windows is given back when none is free. A freed
//! slot first cools for two epoch flips, so a program that looked it up
//! just before it was freed has written and been read before the slot
//! serves another hash; only then is the hash reported as forgotten.
use std::collections::HashMap;
use std::time::Duration;

use std::sync::Arc;

use crate::discover::Client;

use aya::maps::{Array, MapData, PerCpuArray, PerCpuValues};
use sqlbee_kernel_abi::{
    CONTROL_EPOCH, CONTROL_OPAQUE_ONES, CONTROL_SHEDDING, FigureSums, SlotStats,
    kernel_digests::{BUCKETS, KnownSet, entry_slot, known_entry, known_set},
};

use super::{
    ProbeError,
    clients::Clients,
    names::{Account, Names},
};

/// Statements of one text hash counted in the kernel during one epoch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelDigest {
    pub text_hash: u64,
    pub count: u64,
    pub sum_ns: u64,
    pub min_ns: u64,
    pub max_ns: u64,
    /// (kernel bucket, count), non-zero buckets only.
    pub buckets: Vec<(u16, u64)>,
    /// The server's figures summed over these statements.
    pub stats: FigureSums,
    /// Statements per account (by hash until `name_accounts`, then by
    /// name); the rest of `count` is in no account the kernel told apart.
    pub accounts: Vec<(u64, u64)>,
    pub named_accounts: Vec<(Arc<Account>, u64)>,
    /// Statements per client, from the same hashes (see `clients`).
    pub clients: Vec<(Arc<Client>, u64)>,
}

impl KernelDigest {
    /// Names each account hash; one the probe stage never learnt the name
    /// of is counted without one.
    pub fn name_accounts(&mut self, names: &Names, clients: Option<&Clients>) {
        for (hash, n) in &self.accounts {
            if let Some(client) = clients.and_then(|c| c.of_account(*hash)) {
                match self.clients.iter_mut().find(|(c, _)| *c == client) {
                    Some((_, total)) => *total += n,
                    None => self.clients.push((client, *n)),
                }
            }
        }
        for (hash, n) in self.accounts.drain(..) {
            if let Some(account) = names.account(hash) {
                match self.named_accounts.iter_mut().find(|(a, _)| *a == account) {
                    Some((_, total)) => *total += n,
                    None => self.named_accounts.push((account, n)),
                }
            }
        }
    }
}

/// How long a program may still write the old epoch after the flip: far
/// longer than one runs, unless it was preempted in between.
const FLIP_GRACE: Duration = Duration::from_millis(2);
/// Windows without a statement before a slot may be given back.
const IDLE_WINDOWS: u32 = 3;
/// Epoch flips a freed slot waits before it serves another hash.
const COOLING_FLIPS: u32 = 2;

#[derive(Clone, Copy)]
enum Slot {
    Free,
    Used { hash: u64, idle: u32 },
    Cooling { hash: u64, flips: u32 },
}

pub struct KernelDigests {
    known: Array<MapData, KnownSet>,
    /// Sets of `known`, a power of two.
    sets: u32,
    stats: PerCpuArray<MapData, SlotStats>,
    control: Array<MapData, u32>,
    epoch: u32,
    slots: Vec<Slot>,
    by_hash: HashMap<u64, u32>,
    free: Vec<u32>,
    cpus: usize,
}

fn map_error(map: &'static str) -> impl Fn(aya::maps::MapError) -> ProbeError {
    move |e| ProbeError::Map { map, detail: e.to_string() }
}

impl KernelDigests {
    /// `sets`: the programs' `ServerLayout::known_sets`.
    pub fn new(ebpf: &mut aya::Ebpf, slots: u32, sets: u32) -> Result<Self, ProbeError> {
        let take = |ebpf: &mut aya::Ebpf, name: &'static str| {
            ebpf.take_map(name).ok_or_else(|| ProbeError::Map { map: name, detail: "not in object".into() })
        };
        let known = Array::try_from(take(ebpf, "KNOWN")?).map_err(map_error("KNOWN"))?;
        let stats = PerCpuArray::try_from(take(ebpf, "DIGEST_SLOTS")?).map_err(map_error("DIGEST_SLOTS"))?;
        let mut control = Array::try_from(take(ebpf, "CONTROL")?).map_err(map_error("CONTROL"))?;
        control.set(CONTROL_OPAQUE_ONES, &u32::MAX, 0).map_err(map_error("CONTROL"))?;
        let cpus = aya::util::nr_cpus()
            .map_err(|(what, e)| ProbeError::Map { map: "DIGEST_SLOTS", detail: format!("{what}: {e}") })?
            .get() as usize;
        Ok(Self {
            known,
            sets,
            stats,
            control,
            epoch: 0,
            slots: vec![Slot::Free; slots as usize],
            by_hash: HashMap::new(),
            free: (0..slots).rev().collect(),
            cpus,
        })
    }

    /// Tells the programs the agent's shedding step.
    pub fn set_shedding(&mut self, step: u32) -> Result<(), ProbeError> {
        self.control.set(CONTROL_SHEDDING, &step, 0).map_err(map_error("CONTROL"))
    }

    /// Gives `hash` a slot unless it has one; false when no slot or no way
    /// of its set is free (its statements then keep coming as records).
    pub fn register(&mut self, hash: u64) -> Result<bool, ProbeError> {
        if let Some(slot) = self.by_hash.get(&hash) {
            return Ok(matches!(self.slots[*slot as usize], Slot::Used { .. }));
        }
        let Some(&slot) = self.free.last() else { return Ok(false) };
        let index = known_set(hash, self.sets);
        let mut set = self.known.get(&index, 0).map_err(map_error("KNOWN"))?;
        let Some(way) = set.iter().position(|entry| *entry == 0) else { return Ok(false) };
        // The whole set is written back: the other ways get the values
        // they had, so a program reading meanwhile finds them unchanged.
        set[way] = known_entry(hash, slot);
        self.known.set(index, &set, 0).map_err(map_error("KNOWN"))?;
        self.free.pop();
        self.slots[slot as usize] = Slot::Used { hash, idle: 0 };
        self.by_hash.insert(hash, slot);
        Ok(true)
    }

    /// Closes the epoch the programs write now: flips it, waits out
    /// programs still running, reads and clears it. Hashes whose slots
    /// finished cooling are appended to `forgotten`.
    pub fn flip(&mut self, out: &mut Vec<KernelDigest>, forgotten: &mut Vec<u64>) -> Result<(), ProbeError> {
        let closing = self.epoch;
        self.epoch ^= 1;
        self.control.set(CONTROL_EPOCH, &self.epoch, 0).map_err(map_error("CONTROL"))?;
        std::thread::sleep(FLIP_GRACE);
        self.collect(closing, out)?;
        self.age(forgotten);
        Ok(())
    }

    /// Reads both epochs, for the last time (the programs are detached).
    pub fn collect_all(&mut self, out: &mut Vec<KernelDigest>) -> Result<(), ProbeError> {
        self.collect(self.epoch ^ 1, out)?;
        self.collect(self.epoch, out)
    }

    fn collect(&mut self, epoch: u32, out: &mut Vec<KernelDigest>) -> Result<(), ProbeError> {
        let base = epoch * self.slots.len() as u32;
        let cpus = self.cpus;
        let zeros = || {
            PerCpuValues::try_from(vec![SlotStats::default(); cpus])
                .map_err(|e| ProbeError::Map { map: "DIGEST_SLOTS", detail: e.to_string() })
        };
        for (slot, state) in self.slots.iter_mut().enumerate() {
            let hash = match *state {
                Slot::Free => continue,
                Slot::Used { hash, .. } | Slot::Cooling { hash, .. } => hash,
            };
            let index = base + slot as u32;
            let per_cpu = self.stats.get(&index, 0).map_err(map_error("DIGEST_SLOTS"))?;
            let Some(digest) = sum(hash, &per_cpu) else {
                if let Slot::Used { idle, .. } = state {
                    *idle = idle.saturating_add(1);
                }
                continue;
            };
            self.stats.set(index, zeros()?, 0).map_err(map_error("DIGEST_SLOTS"))?;
            if let Slot::Used { idle, .. } = state {
                *idle = 0;
            }
            out.push(digest);
        }
        Ok(())
    }

    /// Finishes cooling slots and, when no slot is free, starts cooling the
    /// idle ones.
    fn age(&mut self, forgotten: &mut Vec<u64>) {
        let no_free = self.free.is_empty();
        for (slot, state) in self.slots.iter_mut().enumerate() {
            match *state {
                Slot::Cooling { hash, flips } if flips <= 1 => {
                    *state = Slot::Free;
                    self.by_hash.remove(&hash);
                    self.free.push(slot as u32);
                    forgotten.push(hash);
                }
                Slot::Cooling { hash, flips } => *state = Slot::Cooling { hash, flips: flips - 1 },
                Slot::Used { hash, idle } if no_free && idle >= IDLE_WINDOWS => {
                    if unregister(&mut self.known, self.sets, hash, slot as u32).is_ok() {
                        *state = Slot::Cooling { hash, flips: COOLING_FLIPS };
                    }
                }
                _ => {}
            }
        }
    }
}

/// Clears `hash`'s way of its set: from then on its statements come as
/// records again.
fn unregister(known: &mut Array<MapData, KnownSet>, sets: u32, hash: u64, slot: u32) -> Result<(), ProbeError> {
    let index = known_set(hash, sets);
    let mut set = known.get(&index, 0).map_err(map_error("KNOWN"))?;
    for entry in set.iter_mut().filter(|entry| entry_slot(**entry, hash) == Some(slot)) {
        *entry = 0;
    }
    known.set(index, &set, 0).map_err(map_error("KNOWN"))
}

/// One slot over every CPU; None when nothing was counted.
fn sum(text_hash: u64, per_cpu: &[SlotStats]) -> Option<KernelDigest> {
    let mut total = KernelDigest {
        text_hash,
        count: 0,
        sum_ns: 0,
        min_ns: u64::MAX,
        max_ns: 0,
        buckets: Vec::new(),
        stats: FigureSums::default(),
        accounts: Vec::new(),
        named_accounts: Vec::new(),
        clients: Vec::new(),
    };
    let mut buckets = [0u64; BUCKETS];
    for cpu in per_cpu.iter().filter(|s| s.count > 0) {
        total.count += cpu.count;
        total.sum_ns = total.sum_ns.saturating_add(cpu.sum_ns);
        total.min_ns = total.min_ns.min(cpu.min_ns);
        total.max_ns = total.max_ns.max(cpu.max_ns);
        total.stats.add(&cpu.stats);
        for (hash, n) in cpu.accounts.iter().zip(cpu.account_counts).filter(|(hash, n)| **hash != 0 && *n > 0) {
            match total.accounts.iter_mut().find(|(h, _)| h == hash) {
                Some((_, sum)) => *sum += n,
                None => total.accounts.push((*hash, n)),
            }
        }
        for (sum, n) in buckets.iter_mut().zip(cpu.buckets) {
            *sum += u64::from(n);
        }
    }
    if total.count == 0 {
        return None;
    }
    total.buckets = buckets.iter().enumerate().filter(|(_, n)| **n > 0).map(|(k, n)| (k as u16, *n)).collect();
    Some(total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sqlbee_kernel_abi::kernel_digests::{MAX_SLOTS, known_sets};

    #[test]
    fn per_cpu_values_add_up() {
        let mut a = SlotStats { count: 2, sum_ns: 3000, min_ns: 1000, max_ns: 2000, ..Default::default() };
        a.buckets[0] = 1;
        a.buckets[8] = 1;
        let mut b = SlotStats { count: 1, sum_ns: 5000, min_ns: 5000, max_ns: 5000, ..Default::default() };
        b.buckets[8] = 1;
        let idle = SlotStats::default();
        let total = sum(7, &[a, idle, b]).unwrap();
        assert_eq!((total.count, total.sum_ns, total.min_ns, total.max_ns), (3, 8000, 1000, 5000));
        assert_eq!(total.buckets, vec![(0, 1), (8, 2)]);
        assert!(sum(7, &[idle, idle]).is_none());
    }

    #[test]
    fn known_entries_name_only_their_own_hash() {
        assert_eq!((known_sets(1), known_sets(64), known_sets(4096), known_sets(4098)), (1, 32, 2048, 4096));
        let hash = 0x8123_4567_89ab_cdef;
        let entry = known_entry(hash, 4095);
        assert_eq!(entry_slot(entry, hash), Some(4095));
        assert_eq!(entry_slot(known_entry(hash, 0), hash), Some(0));
        assert_eq!(entry_slot(known_entry(hash, MAX_SLOTS - 1), hash), Some(MAX_SLOTS - 1));
        // Same set and same low bits, different high bits: no match.
        assert_eq!(entry_slot(entry, hash ^ (1 << 40)), None);
        assert_eq!(entry_slot(entry, hash & !(1 << 63)), None);
        assert_eq!(entry_slot(0, hash), None);
        assert_eq!(entry_slot(0, 0), None);
        for sets in [1, 32, 4096] {
            assert!(known_set(u64::MAX, sets) < sets && known_set(hash, sets) < sets);
        }
    }

    /// A program may read a way while the agent writes it, with any of its
    /// bytes already new and the rest still old: that read must name the
    /// right slot or none, never another one.
    #[test]
    fn half_written_entries_name_no_wrong_slot() {
        // Hashes with zero bytes in the tag are the worst case: an
        // unwritten zero byte there still matches.
        let hashes = [0x8123_4567_89ab_cdef_u64, 0x8000_0000_0000_0000, 0x0000_00ff_0000_0001, u64::MAX];
        let slots = (0..600).chain((600..MAX_SLOTS).step_by(251)).chain([MAX_SLOTS - 1]);
        for slot in slots {
            for hash in hashes {
                let whole = known_entry(hash, slot);
                // Bytes in `written` come from the entry, the rest are
                // zero: an entry being added or one being removed.
                for written in 0u32..256 {
                    let torn = (0..8)
                        .filter(|byte| written & (1 << byte) != 0)
                        .fold(0, |torn, byte| torn | (whole & (0xff << (byte * 8))));
                    let found = entry_slot(torn, hash);
                    assert!(found.is_none() || found == Some(slot), "{hash:#x} slot {slot}: {torn:#x} -> {found:?}");
                }
            }
        }
    }
}
