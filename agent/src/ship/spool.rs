//! The disk spool: every batch is written here (fsync'd) before it is
//! sent, and deleted only after the collector acknowledged it, so neither a
//! collector outage nor an agent crash loses a batch.
//!
//! Invariants:
//! - one batch per file `<sequence:020>.batch`, written to a temp file,
//!   fsync'd and renamed, so a file either holds a whole record or does
//!   not exist;
//! - record = magic `SQB1`, payload length (u32 LE), CRC32 of the payload
//!   (u32 LE), payload (protobuf `sqlbee.v1.Batch`);
//! - total size is bounded; when full, whole oldest batches are dropped and
//!   described as a gap (statements and windows lost) that travels with the
//!   next batch;
//! - one ledger: a batch that was ever sent is never dropped by the limits.
//!   A push that failed may still have been stored (the answer was lost,
//!   or came after the deadline), so only a batch that never left the
//!   agent may be reported lost: every statement is stored or reported
//!   lost, never both. The sender always sends the oldest batch, so this
//!   spares one batch at a time; at open, the oldest counts as sent (the
//!   agent may have stopped while it was in flight);
//! - a record that fails its checks is moved to `corrupt/`, counted and
//!   logged; the rest replays. Batches the collector refuses for good go to
//!   `rejected/` for inspection. The size limit covers the spool and these
//!   two folders together; set-aside files are dropped first;
//! - the spool never fills its filesystem past the free-space floor
//!   (`disk_floor`): it drops its oldest batches first, and a batch that
//!   still does not fit, or whose write fails (ENOSPC, EIO), becomes a gap
//!   like a dropped one. No write error stops the agent, and no temp file
//!   is left behind;
//! - the index of spooled batches (sequence -> file, size) lives in memory:
//!   it is rebuilt from the directory at open and kept in step by every
//!   change made here, so no batch costs a listing of the whole backlog (a
//!   long outage's backlog would drain in quadratic time). Files put into
//!   `spool/` behind the agent's back are seen at the next start; a file
//!   deleted behind its back counts as done, never as a fatal error.
//!
//! Every method here blocks on the disk; the sender calls them off the
//! async runtime (see `ship::on_disk`).
use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    io::ErrorKind,
    path::{Path, PathBuf},
    sync::Arc,
};

use prost::Message;
use sqlbee_proto::v1::{Batch, Gap};

use super::{
    ShipError,
    disk_floor::DiskFloor,
    health::ShipHealth,
    identity::{private_dir, write_atomic},
};

const MAGIC: &[u8; 4] = b"SQB1";
const HEADER: usize = 12;
const PENDING_GAPS: &str = "pending-gaps.pb";
/// Reads of one file that fail (EIO) before it is given up as unreadable.
const READ_ATTEMPTS: u32 = 5;
const SPOOL_FULL: &str = "spool full";
const DISK_FLOOR: &str = "disk below the free-space floor";

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub sequence: u64,
    pub path: PathBuf,
    pub bytes: u64,
}

pub struct Spool {
    dir: PathBuf,
    state_dir: PathBuf,
    limit_bytes: u64,
    /// Spooled batches by sequence, oldest first.
    index: BTreeMap<u64, Entry>,
    /// Sum of the sizes in `index`.
    spooled_bytes: u64,
    /// Files in `corrupt/` and `rejected/` by sequence, with their sizes:
    /// they count against the limit.
    aside: BTreeMap<(u64, PathBuf), u64>,
    aside_bytes: u64,
    /// Highest sequence found in `spool/`, `corrupt/` or `rejected/` at
    /// open, or appended since.
    highest: u64,
    pub corrupt_records: u64,
    floor: DiskFloor,
    /// Gaps waiting to travel with the next batch. The file is their copy
    /// across restarts; a full disk must not lose them, so memory leads.
    pending: Vec<Gap>,
    /// Failed reads of the oldest batch, to give up on a file that stays
    /// unreadable.
    read_failures: (u64, u32),
    /// Batches sent at least once and still spooled: the limits never drop
    /// them, so an acknowledgement, or a store that the agent never heard
    /// of, never meets a batch already counted as lost.
    sent: BTreeSet<u64>,
    health: Arc<ShipHealth>,
}

/// The sequence a spool, `corrupt/` or `rejected/` file name starts with.
fn sequence_of(path: &Path) -> Option<u64> {
    path.file_name()?.to_str()?.split('.').next()?.parse().ok()
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ShipError + '_ {
    move |source| ShipError::Spool { path: path.to_path_buf(), source }
}

pub fn encode_record(payload: &[u8]) -> Vec<u8> {
    let mut record = Vec::with_capacity(HEADER + payload.len());
    record.extend_from_slice(MAGIC);
    record.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    record.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
    record.extend_from_slice(payload);
    record
}

/// The payload of a record, or what is wrong with it.
pub fn decode_record(record: &[u8]) -> Result<&[u8], String> {
    if record.len() < HEADER {
        return Err(format!("record of {} bytes is shorter than its header", record.len()));
    }
    if &record[..4] != MAGIC {
        return Err("bad magic".into());
    }
    let len = u32::from_le_bytes(record[4..8].try_into().unwrap()) as usize;
    let crc = u32::from_le_bytes(record[8..12].try_into().unwrap());
    let payload = &record[HEADER..];
    if payload.len() != len {
        return Err(format!("length field says {len} bytes, file holds {}", payload.len()));
    }
    if crc32fast::hash(payload) != crc {
        return Err("checksum mismatch".into());
    }
    Ok(payload)
}

impl Spool {
    /// Opens the spool and builds its index: the only time the spool lists
    /// its directories.
    pub fn open(state_dir: &Path, limit_bytes: u64) -> Result<Self, ShipError> {
        let dir = state_dir.join("spool");
        for d in [&dir, &state_dir.join("corrupt"), &state_dir.join("rejected")] {
            private_dir(d)?;
        }
        let mut index = BTreeMap::new();
        for file in fs::read_dir(&dir).map_err(io(&dir))?.flatten() {
            let path = file.path();
            match path.extension().and_then(|e| e.to_str()) {
                // Leftover temp files are batches whose write never
                // completed; the sequence they held was persisted, so
                // dropping them loses nothing that was acknowledged as safe.
                Some("tmp") => {
                    let _ = fs::remove_file(&path);
                }
                Some("batch") => {
                    let (Some(sequence), Ok(meta)) = (sequence_of(&path), file.metadata()) else { continue };
                    index.insert(sequence, Entry { sequence, path, bytes: meta.len() });
                }
                _ => {}
            }
        }
        let mut aside = BTreeMap::new();
        for file in ["corrupt", "rejected"]
            .iter()
            .filter_map(|d| fs::read_dir(state_dir.join(d)).ok())
            .flat_map(|rd| rd.flatten())
        {
            let path = file.path();
            let (Some(sequence), Ok(meta)) = (sequence_of(&path), file.metadata()) else {
                continue;
            };
            aside.insert((sequence, path), meta.len());
        }
        // A lost counter file must never lead to a reused number, so the
        // batches set aside count too.
        let highest = index.keys().next_back().copied().max(aside.keys().next_back().map(|k| k.0)).unwrap_or(0);
        let spooled_bytes = index.values().map(|e| e.bytes).sum();
        // The agent may have stopped while the oldest was in flight.
        let sent = index.keys().next().copied().into_iter().collect();
        let aside_bytes = aside.values().sum();
        let pending = fs::read(state_dir.join(PENDING_GAPS))
            .ok()
            .and_then(|b| Batch::decode(b.as_slice()).ok())
            .map(|b| b.gaps)
            .unwrap_or_default();
        Ok(Self {
            dir,
            state_dir: state_dir.to_path_buf(),
            limit_bytes,
            index,
            spooled_bytes,
            aside,
            aside_bytes,
            highest,
            corrupt_records: 0,
            floor: DiskFloor::default(),
            pending,
            read_failures: (0, 0),
            sent,
            health: Arc::default(),
        })
    }

    pub fn with_floor(mut self, floor: DiskFloor) -> Self {
        self.floor = floor;
        self
    }

    /// Where this spool counts its write errors; shared with the sender
    /// and the windows that report them.
    pub fn with_health(mut self, health: Arc<ShipHealth>) -> Self {
        self.health = health;
        self
    }

    /// Bytes in the spool and in the set-aside folders.
    pub fn used_bytes(&self) -> u64 {
        self.spooled_bytes + self.aside_bytes
    }

    /// Spooled batches, oldest first.
    pub fn entries(&self) -> Vec<Entry> {
        self.index.values().cloned().collect()
    }

    /// The batch to send next.
    pub fn oldest(&self) -> Option<Entry> {
        self.index.values().next().cloned()
    }

    /// The oldest intact batch, to send next. Damaged records on the way
    /// are moved to `corrupt/`, files deleted behind our back forgotten.
    pub fn next_batch(&mut self) -> Result<Option<(Entry, Batch)>, ShipError> {
        // Ends: every `read` that returns no batch drops the entry from the
        // index (or fails).
        while let Some(entry) = self.oldest() {
            if let Some(batch) = self.read(&entry)? {
                self.sent.insert(entry.sequence);
                return Ok(Some((entry, batch)));
            }
        }
        Ok(None)
    }

    /// Whether this batch is spooled.
    pub fn holds(&self, sequence: u64) -> bool {
        self.index.contains_key(&sequence)
    }

    /// Queues gaps again whose batch was lost before it was spooled.
    pub fn requeue_gaps(&mut self, gaps: Vec<Gap>) {
        self.push_pending_gaps(gaps);
    }

    /// How many batches are spooled.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// Highest sequence present anywhere in the state dir at open, or
    /// appended since, so a lost counter file never leads to a reused
    /// number.
    pub fn highest_sequence(&self) -> u64 {
        self.highest
    }

    /// Writes a batch durably. Returns the gap of what was lost to make
    /// room for it, or with it when it could not be written, if anything
    /// (`holds` tells which). The gaps a batch that could not be written
    /// carries are the caller's: they are still pending, or must be again.
    pub fn append(&mut self, sequence: u64, payload: &[u8]) -> Result<Option<Gap>, ShipError> {
        let path = self.dir.join(format!("{sequence:020}.batch"));
        let record = encode_record(payload);
        let len = record.len() as u64;
        self.highest = self.highest.max(sequence);
        let mut lost = Losses::default();
        // The configured limit; the batch being written stays even if it
        // alone is over it.
        while self.used_bytes() + len > self.limit_bytes && self.drop_oldest(&mut lost, SPOOL_FULL)? {}
        match if self.floor.is_off() { Ok(u64::MAX) } else { self.floor.room(&self.dir) } {
            Ok(mut room) => {
                while room < len {
                    let before = self.used_bytes();
                    if !self.drop_oldest(&mut lost, DISK_FLOOR)? {
                        break;
                    }
                    room = room.saturating_add(before - self.used_bytes());
                }
                if room < len {
                    tracing::warn!(
                        sequence,
                        bytes = len,
                        room,
                        "the spool's filesystem is at its free-space floor; this batch is not written"
                    );
                    lost.add(DISK_FLOOR, sequence, unwritten(payload));
                    return self.report(lost);
                }
            }
            // Not knowing the free space is no reason to lose the batch.
            Err(e) => {
                tracing::warn!(dir = %self.dir.display(), error = %e, "cannot read the spool's free space")
            }
        }
        match write_atomic(&path, &record) {
            Ok(()) => {
                let entry = Entry { sequence, path, bytes: len };
                self.spooled_bytes += entry.bytes;
                if let Some(replaced) = self.index.insert(sequence, entry) {
                    self.spooled_bytes -= replaced.bytes;
                }
            }
            Err(e) => {
                self.health.io_error();
                tracing::error!(sequence, error = %e, "could not spool a batch; it is reported as a gap");
                lost.add(&format!("spool write failed: {}", short_reason(&e)), sequence, unwritten(payload));
            }
        }
        self.report(lost)
    }

    /// Drops the oldest set-aside file, or else the oldest batch (into
    /// `lost`); false when there is nothing left to drop.
    fn drop_oldest(&mut self, lost: &mut Losses, reason: &str) -> Result<bool, ShipError> {
        if let Some(((sequence, path), bytes)) = self.aside.pop_first() {
            self.aside_bytes -= bytes;
            match fs::remove_file(&path) {
                Ok(()) => {
                    tracing::warn!(sequence, path = %path.display(), reason, "dropped a set-aside file to make room")
                }
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) => {
                    self.health.io_error();
                    tracing::error!(path = %path.display(), error = %e, "could not drop a set-aside file");
                }
            }
            return Ok(true);
        }
        let Some(entry) = self.index.values().find(|e| !self.sent.contains(&e.sequence)).cloned() else {
            return Ok(false);
        };
        let batch = match fs::read(&entry.path) {
            Err(e) if e.kind() == ErrorKind::NotFound => {
                // Deleted behind our back: nothing left to drop or to
                // describe.
                self.forget(&entry, "dropping the oldest batch");
                return Ok(true);
            }
            record => record.ok().and_then(|r| decode_record(&r).ok().and_then(|p| Batch::decode(p).ok())),
        };
        if let Err(e) = self.delete(&entry) {
            // The file stays but leaves the index: its room is not won
            // back, and the next start finds it again.
            self.health.io_error();
            tracing::error!(error = %e, "could not delete a dropped batch");
            self.unindex(&entry);
        }
        lost.add(reason, entry.sequence, batch);
        Ok(true)
    }

    /// Logs the gaps of one append and queues them for the next batch.
    fn report(&mut self, lost: Losses) -> Result<Option<Gap>, ShipError> {
        for g in &lost.gaps {
            self.health.lost(g.batches, g.lost_statements);
            tracing::warn!(first = g.first_sequence, last = g.last_sequence, batches = g.batches,
                lost_statements = g.lost_statements, reason = %g.reason, "batches lost before shipping");
        }
        let merged = lost.gaps.iter().cloned().reduce(|mut a, b| {
            a.first_sequence = a.first_sequence.min(b.first_sequence);
            a.last_sequence = a.last_sequence.max(b.last_sequence);
            a.batches += b.batches;
            a.lost_statements += b.lost_statements;
            a.lost_windows += b.lost_windows;
            a
        });
        self.push_pending_gaps(lost.carried.into_iter().chain(lost.gaps).collect());
        Ok(merged)
    }

    /// Gaps waiting to travel with the next batch.
    pub fn pending_gaps(&self) -> Vec<Gap> {
        self.pending.clone()
    }

    fn push_pending_gaps(&mut self, gaps: Vec<Gap>) {
        if gaps.is_empty() {
            return;
        }
        self.pending.extend(gaps);
        self.persist_pending();
    }

    /// Keeps the pending gaps across restarts. A failure is counted and
    /// logged but not fatal: memory holds them until the next write.
    fn persist_pending(&self) {
        let path = self.state_dir.join(PENDING_GAPS);
        let written = if self.pending.is_empty() {
            match fs::remove_file(&path) {
                Err(e) if e.kind() != ErrorKind::NotFound => Err(ShipError::Spool { path, source: e }),
                _ => Ok(()),
            }
        } else {
            write_atomic(&path, &Batch { gaps: self.pending.clone(), ..Default::default() }.encode_to_vec())
        };
        if let Err(e) = written {
            self.health.io_error();
            tracing::error!(error = %e, gaps = self.pending.len(), "could not persist the pending gaps; kept in memory");
        }
    }

    /// Called once a batch carrying these gaps (by first and last
    /// sequence) is safely spooled; gaps added since stay pending.
    pub fn forget_pending_gaps(&mut self, carried: &[(u64, u64)]) -> Result<(), ShipError> {
        if carried.is_empty() {
            return Ok(());
        }
        self.pending.retain(|g| !carried.contains(&(g.first_sequence, g.last_sequence)));
        self.persist_pending();
        Ok(())
    }

    /// Reads a spooled batch; a damaged record is moved to `corrupt/`, a
    /// file deleted behind our back is forgotten. Either way there is
    /// nothing to send (`None`).
    pub fn read(&mut self, entry: &Entry) -> Result<Option<Batch>, ShipError> {
        let record = match fs::read(&entry.path) {
            Ok(record) => record,
            Err(e) if e.kind() == ErrorKind::NotFound => {
                self.forget(entry, "reading it");
                return Ok(None);
            }
            Err(e) => {
                let failures = if self.read_failures.0 == entry.sequence { self.read_failures.1 + 1 } else { 1 };
                self.read_failures = (entry.sequence, failures);
                if failures < READ_ATTEMPTS {
                    return Err(ShipError::Spool { path: entry.path.clone(), source: e });
                }
                // A file that stays unreadable must not stop the batches
                // behind it: it is lost, and said to be. The sender
                // counted the earlier failures.
                self.health.io_error();
                tracing::error!(sequence = entry.sequence, path = %entry.path.display(), error = %e, failures,
                    "spool file unreadable; reported as a gap");
                if self.move_aside(entry, "corrupt").is_err() {
                    self.unindex(entry);
                }
                let mut lost = Losses::default();
                lost.add(&format!("spool read failed: {e}"), entry.sequence, None);
                self.report(lost)?;
                return Ok(None);
            }
        };
        let problem = match decode_record(&record) {
            Ok(payload) => match Batch::decode(payload) {
                Ok(batch) => return Ok(Some(batch)),
                Err(e) => format!("payload does not decode: {e}"),
            },
            Err(problem) => problem,
        };
        self.corrupt_records += 1;
        tracing::error!(sequence = entry.sequence, path = %entry.path.display(), problem = %problem,
            corrupt_records = self.corrupt_records, "corrupt spool record skipped; moved to corrupt/");
        self.move_aside(entry, "corrupt")?;
        Ok(None)
    }

    /// Deletes an acknowledged batch. A batch already gone (dropped by the
    /// limit while it was in flight, or deleted behind our back) is done.
    pub fn remove(&mut self, entry: &Entry) -> Result<(), ShipError> {
        self.delete(entry)
    }

    /// Keeps a batch the collector will never take, with the reason beside it.
    pub fn reject(&mut self, entry: &Entry, reason: &str) -> Result<(), ShipError> {
        if !self.index.contains_key(&entry.sequence) {
            // Dropped by the limit while it was in flight: its gap already
            // tells the collector.
            return Ok(());
        }
        // Moved first, so a file deleted behind our back leaves no note.
        if self.move_aside(entry, "rejected")? {
            let note = self.state_dir.join("rejected").join(format!("{:020}.reason.txt", entry.sequence));
            write_atomic(&note, reason.as_bytes())?;
            self.aside_bytes += reason.len() as u64;
            self.aside.insert((entry.sequence, note), reason.len() as u64);
        }
        Ok(())
    }

    /// Moves a batch out of the spool; false if its file was already gone.
    fn move_aside(&mut self, entry: &Entry, folder: &str) -> Result<bool, ShipError> {
        let target = self.state_dir.join(folder).join(entry.path.file_name().unwrap_or_default());
        match fs::rename(&entry.path, &target) {
            Ok(()) => {
                self.unindex(entry);
                self.aside_bytes += entry.bytes;
                self.aside.insert((entry.sequence, target), entry.bytes);
                Ok(true)
            }
            Err(e) if e.kind() == ErrorKind::NotFound => {
                self.forget(entry, &format!("moving it to {folder}/"));
                Ok(false)
            }
            Err(e) => Err(ShipError::Spool { path: entry.path.clone(), source: e }),
        }
    }

    /// Deletes a batch's file and its index entry; a file already gone is
    /// no error.
    fn delete(&mut self, entry: &Entry) -> Result<(), ShipError> {
        match fs::remove_file(&entry.path) {
            Ok(()) => {
                self.unindex(entry);
            }
            Err(e) if e.kind() == ErrorKind::NotFound => self.forget(entry, "deleting it"),
            Err(e) => return Err(ShipError::Spool { path: entry.path.clone(), source: e }),
        }
        Ok(())
    }

    /// Drops the index entry of a file that is no longer there.
    fn forget(&mut self, entry: &Entry, doing: &str) {
        // Not in the index: the limit already dropped it, nothing to say.
        if self.unindex(entry) {
            tracing::warn!(sequence = entry.sequence, path = %entry.path.display(), doing,
                "spool file deleted behind the agent's back; treated as done");
        }
    }

    /// Drops an index entry; false if it was not there.
    fn unindex(&mut self, entry: &Entry) -> bool {
        self.sent.remove(&entry.sequence);
        match self.index.remove(&entry.sequence) {
            Some(gone) => {
                self.spooled_bytes -= gone.bytes;
                true
            }
            None => false,
        }
    }
}

/// What one append lost, one gap per reason.
#[derive(Default)]
struct Losses {
    gaps: Vec<Gap>,
    /// Gaps the lost batches carried: not lost with them, queued again.
    carried: Vec<Gap>,
}

impl Losses {
    fn add(&mut self, reason: &str, sequence: u64, batch: Option<Batch>) {
        let g = match self.gaps.iter().position(|g| g.reason == reason && g.last_sequence + 1 == sequence) {
            Some(i) => &mut self.gaps[i],
            None => {
                self.gaps.push(Gap {
                    first_sequence: sequence,
                    last_sequence: sequence,
                    reason: reason.into(),
                    ..Default::default()
                });
                self.gaps.last_mut().unwrap()
            }
        };
        g.last_sequence = sequence;
        g.batches += 1;
        let Some(batch) = batch else { return };
        for w in &batch.windows {
            g.lost_statements += w.statements;
            g.lost_windows += 1;
        }
        // The agent's own windows (cost, host) are lost too; they widen
        // the gap's time range but hold no statements.
        let spans = batch.windows.iter().map(|w| (w.window_start_unix_ms, w.window_end_unix_ms));
        for (start, end) in
            spans.chain(batch.agent_windows.iter().map(|w| (w.window_start_unix_ms, w.window_end_unix_ms)))
        {
            if g.first_window_start_unix_ms == 0 || start < g.first_window_start_unix_ms {
                g.first_window_start_unix_ms = start;
            }
            g.last_window_end_unix_ms = g.last_window_end_unix_ms.max(end);
        }
        self.carried.extend(batch.gaps);
    }
}

/// A batch that is lost before it was written, without the gaps it
/// carries: those are still pending.
fn unwritten(payload: &[u8]) -> Option<Batch> {
    Batch::decode(payload).ok().map(|b| Batch { gaps: Vec::new(), ..b })
}

/// An I/O error's kind in words, short enough for a gap's reason.
fn short_reason(e: &ShipError) -> String {
    match e {
        ShipError::Spool { source, .. } | ShipError::State { source, .. } => source.to_string(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sqlbee_proto::v1::InstanceWindow;

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("sqlbee-spool-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    /// A spool with no free-space floor: these tests are about the spool,
    /// not about how full the disk of the machine running them is.
    fn open(dir: &Path, limit_bytes: u64) -> Spool {
        Spool::open(dir, limit_bytes).unwrap().with_floor(DiskFloor { percent: 0, bytes: 0 })
    }

    fn batch(sequence: u64, statements: u64) -> Vec<u8> {
        Batch {
            sequence,
            windows: vec![InstanceWindow {
                statements,
                window_start_unix_ms: 1000,
                window_end_unix_ms: 2000,
                ..Default::default()
            }],
            ..Default::default()
        }
        .encode_to_vec()
    }

    #[test]
    fn records_round_trip_and_damage_is_detected() {
        let payload = batch(1, 5);
        let record = encode_record(&payload);
        assert_eq!(decode_record(&record).unwrap(), payload.as_slice());
        for i in 0..record.len() {
            let mut bad = record.clone();
            bad[i] ^= 0x40;
            assert!(decode_record(&bad).is_err(), "flip at {i} undetected");
        }
        assert!(decode_record(&record[..record.len() - 1]).is_err());
    }

    #[test]
    fn full_spool_drops_oldest_and_records_the_gap() {
        let dir = temp_dir("full");
        let one = encode_record(&batch(1, 7)).len() as u64;
        let mut spool = open(&dir, one * 2);
        for seq in 1..=5 {
            spool.append(seq, &batch(seq, 7)).unwrap();
        }
        let left: Vec<u64> = spool.entries().iter().map(|e| e.sequence).collect();
        assert_eq!(left, vec![4, 5]);
        let gaps = spool.pending_gaps();
        let lost: u64 = gaps.iter().map(|g| g.lost_statements).sum();
        let batches: u64 = gaps.iter().map(|g| g.batches).sum();
        assert_eq!((lost, batches), (21, 3));
        let carried: Vec<(u64, u64)> = gaps.iter().map(|g| (g.first_sequence, g.last_sequence)).collect();
        spool.append(6, &batch(6, 7)).unwrap();
        let newer = spool.pending_gaps().len() - gaps.len();
        assert_eq!(newer, 1, "dropping batch 4 adds a gap");
        spool.forget_pending_gaps(&carried).unwrap();
        assert_eq!(spool.pending_gaps().len(), 1, "the newer gap stays pending");
        fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn corrupt_record_is_moved_aside_and_counted() {
        let dir = temp_dir("corrupt");
        let mut spool = open(&dir, 1 << 20);
        spool.append(1, &batch(1, 1)).unwrap();
        spool.append(2, &batch(2, 2)).unwrap();
        let entries = spool.entries();
        let mut bytes = fs::read(&entries[0].path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0xff;
        fs::write(&entries[0].path, bytes).unwrap();
        assert!(spool.read(&entries[0]).unwrap().is_none());
        assert_eq!(spool.corrupt_records, 1);
        assert_eq!(spool.read(&entries[1]).unwrap().unwrap().sequence, 2);
        assert_eq!(spool.entries().len(), 1);
        assert_eq!(spool.highest_sequence(), 2);
        fs::remove_dir_all(dir).ok();
    }

    fn sequences(spool: &Spool) -> Vec<u64> {
        spool.entries().iter().map(|e| e.sequence).collect()
    }

    #[test]
    fn open_rebuilds_the_index_from_the_directory() {
        let dir = temp_dir("reopen");
        let mut spool = open(&dir, 1 << 20);
        for seq in 1..=3 {
            spool.append(seq, &batch(seq, seq)).unwrap();
        }
        let before = spool.entries();
        drop(spool);
        // What a crash can leave: a torn temp file, batches set aside.
        fs::write(dir.join("spool").join(format!("{:020}.tmp", 4)), b"torn").unwrap();
        fs::write(dir.join("rejected").join(format!("{:020}.batch", 9)), encode_record(&batch(9, 1))).unwrap();
        fs::write(dir.join("rejected").join(format!("{:020}.reason.txt", 9)), "refused").unwrap();

        let mut spool = open(&dir, 1 << 20);
        assert_eq!(spool.entries(), before, "same sequences, paths and sizes");
        for e in &before {
            assert_eq!(e.bytes, fs::metadata(&e.path).unwrap().len());
        }
        assert_eq!((spool.len(), spool.oldest().map(|e| e.sequence)), (3, Some(1)));
        assert_eq!(spool.highest_sequence(), 9, "rejected batches count for the highest sequence");
        assert!(!dir.join("spool").join(format!("{:020}.tmp", 4)).exists(), "temp files are dropped at open");

        // The index is not the directory: a file put there behind the
        // agent's back is seen at the next open only.
        fs::write(dir.join("spool").join(format!("{:020}.batch", 5)), encode_record(&batch(5, 5))).unwrap();
        assert_eq!(sequences(&spool), [1, 2, 3]);
        spool.append(10, &batch(10, 1)).unwrap();
        assert_eq!((sequences(&spool), spool.highest_sequence()), (vec![1, 2, 3, 10], 10));
        assert_eq!(sequences(&open(&dir, 1 << 20)), [1, 2, 3, 5, 10]);
        fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn limit_drops_the_oldest_of_a_reopened_spool() {
        let dir = temp_dir("limit-reopen");
        let one = encode_record(&batch(1, 3)).len() as u64;
        let mut spool = open(&dir, 1 << 20);
        for seq in 1..=4 {
            spool.append(seq, &batch(seq, 3)).unwrap();
        }
        drop(spool);
        // A smaller limit at the next start: the sizes come from the index
        // built at open. The oldest may have been in flight when the agent
        // stopped, so the next oldest go.
        let mut spool = open(&dir, one * 2);
        let gap = spool.append(5, &batch(5, 3)).unwrap().expect("a gap");
        assert_eq!((gap.first_sequence, gap.last_sequence, gap.batches, gap.lost_statements), (2, 4, 3, 9));
        assert_eq!(sequences(&spool), [1, 5]);
        let on_disk = fs::read_dir(dir.join("spool")).unwrap().count();
        assert_eq!(on_disk, 2, "dropped batches leave the disk too");
        // A batch alone over the limit stays: the newest is never dropped.
        let mut tiny = open(&dir, 1);
        tiny.append(6, &batch(6, 3)).unwrap();
        assert_eq!(sequences(&tiny), [1, 6]);
        fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn remove_and_reject_update_the_index() {
        let dir = temp_dir("remove-reject");
        let mut spool = open(&dir, 1 << 20);
        for seq in 1..=3 {
            spool.append(seq, &batch(seq, seq)).unwrap();
        }
        let (first, sent) = spool.next_batch().unwrap().unwrap();
        assert_eq!((first.sequence, sent.sequence), (1, 1));
        spool.remove(&first).unwrap();
        assert_eq!(sequences(&spool), [2, 3]);
        let second = spool.oldest().unwrap();
        spool.reject(&second, "InvalidArgument: no").unwrap();
        assert_eq!(sequences(&spool), [3]);
        let rejected = dir.join("rejected");
        assert!(rejected.join(second.path.file_name().unwrap()).exists());
        assert_eq!(fs::read_to_string(rejected.join(format!("{:020}.reason.txt", 2))).unwrap(), "InvalidArgument: no");
        // Removing twice (the limit dropped it while in flight) is no error.
        spool.remove(&first).unwrap();
        spool.reject(&second, "again").unwrap();
        assert_eq!(sequences(&spool), [3]);
        fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn file_deleted_behind_the_spools_back_is_done() {
        let dir = temp_dir("vanished");
        let one = encode_record(&batch(1, 1)).len() as u64;
        let mut spool = open(&dir, 1 << 20);
        for seq in 1..=5 {
            spool.append(seq, &batch(seq, 1)).unwrap();
        }
        let entries = spool.entries();
        for e in &entries[..4] {
            fs::remove_file(&e.path).unwrap();
        }
        spool.remove(&entries[0]).unwrap();
        assert!(spool.read(&entries[1]).unwrap().is_none(), "nothing to send");
        spool.reject(&entries[2], "refused").unwrap();
        assert_eq!(sequences(&spool), [4, 5]);
        let (next, _) = spool.next_batch().unwrap().unwrap();
        assert_eq!(next.sequence, 5, "the vanished batch 4 is skipped");
        assert_eq!(spool.corrupt_records, 0, "a vanished file is not a corrupt record");
        assert_eq!(fs::read_dir(dir.join("corrupt")).unwrap().count(), 0);
        assert_eq!(fs::read_dir(dir.join("rejected")).unwrap().count(), 0, "no note without its batch");

        // The limit: a vanished batch frees its room without a gap (5, the
        // oldest at open, is spared as possibly in flight).
        let mut spool = open(&dir, one * 2);
        spool.append(6, &batch(6, 1)).unwrap();
        fs::remove_file(&spool.entries().iter().find(|e| e.sequence == 6).unwrap().path).unwrap();
        assert!(spool.append(7, &batch(7, 1)).unwrap().is_none());
        assert_eq!(sequences(&spool), [5, 7]);
        assert!(spool.pending_gaps().is_empty());
        fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn the_limit_covers_set_aside_files_and_spares_the_batch_in_flight() {
        let dir = temp_dir("aside-limit");
        let one = encode_record(&batch(1, 1)).len() as u64;
        let mut spool = open(&dir, 1 << 20);
        for seq in 1..=3 {
            spool.append(seq, &batch(seq, 1)).unwrap();
        }
        let (first, _) = spool.next_batch().unwrap().unwrap();
        spool.reject(&first, "InvalidArgument: no").unwrap();
        let (second, _) = spool.next_batch().unwrap().unwrap();
        assert_eq!(second.sequence, 2);
        drop(spool);
        // Reopened with room for three records: the rejected batch and its
        // note count, and go first.
        let mut spool = open(&dir, one * 3);
        assert!(spool.used_bytes() > one * 3 - one, "{}", spool.used_bytes());
        let (in_flight, _) = spool.next_batch().unwrap().unwrap();
        assert_eq!(in_flight.sequence, 2);
        let gap = spool.append(4, &batch(4, 1)).unwrap();
        assert!(gap.is_none(), "room is made from rejected/ first: {gap:?}");
        assert_eq!(fs::read_dir(dir.join("rejected")).unwrap().count(), 0);
        // Now batches must go, but not the one being pushed.
        let gap = spool.append(5, &batch(5, 1)).unwrap().expect("a gap");
        assert_eq!((gap.first_sequence, gap.last_sequence, gap.reason.as_str()), (3, 3, SPOOL_FULL));
        assert_eq!(sequences(&spool), [2, 4, 5]);
        // Its push failing does not make it droppable: the collector may
        // have stored it all the same.
        spool.append(6, &batch(6, 1)).unwrap().expect("a gap");
        assert_eq!(sequences(&spool), [2, 5, 6], "a batch once sent is never reported lost");
        drop(spool);
        // Reopened: the oldest may have been in flight when the agent
        // stopped, so it is spared as well.
        let mut spool = open(&dir, one * 3);
        spool.append(7, &batch(7, 1)).unwrap().expect("a gap");
        assert_eq!(sequences(&spool), [2, 6, 7]);
        fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn the_free_space_floor_keeps_the_batch_out_and_reports_it() {
        let dir = temp_dir("floor");
        let mut spool = open(&dir, 1 << 20);
        spool.append(1, &batch(1, 4)).unwrap();
        // A floor of the whole filesystem: nothing more may be written.
        let mut spool = spool.with_floor(DiskFloor { percent: 100, bytes: u64::MAX });
        // Larger than the batch whose room it may take.
        let mut larger = Batch::decode(batch(2, 5).as_slice()).unwrap();
        larger.windows = vec![larger.windows[0].clone(); 3];
        let gap = spool.append(2, &larger.encode_to_vec()).unwrap().expect("a gap");
        assert_eq!((gap.first_sequence, gap.last_sequence, gap.batches, gap.lost_statements), (1, 2, 2, 19));
        assert!(spool.is_empty(), "the older batch was dropped to make room, then the new one could not be written");
        assert_eq!(fs::read_dir(dir.join("spool")).unwrap().count(), 0, "no file, no temp file");
        let pending = spool.pending_gaps();
        assert!(pending.iter().all(|g| g.reason == DISK_FLOOR), "{pending:?}");
        // Room again: the next batch is written, the gaps still wait.
        let mut spool = spool.with_floor(DiskFloor { percent: 0, bytes: 0 });
        assert!(spool.append(3, &batch(3, 1)).unwrap().is_none());
        assert_eq!(sequences(&spool), [3]);
        assert_eq!(spool.pending_gaps(), pending);
        fs::remove_dir_all(dir).ok();
    }
}
