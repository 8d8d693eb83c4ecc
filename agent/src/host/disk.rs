//! Disk I/O per whole device from /proc/diskstats.
//!
//! Partitions are left out (their I/O is already in their disk's), and so
//! are loop, ram and zram devices, which are memory or files rather than
//! disks.
use std::{collections::HashSet, path::Path};

use super::{Counted, parse_counters};

/// Devices kept per sample; the rest are counted in `Truncated::disks`.
pub const MAX_DISKS: usize = 64;

/// reads, read bytes, writes, write bytes, io time ms.
pub(super) const FIELDS: usize = 5;

/// /proc/diskstats counts 512-byte sectors whatever the device's own
/// sector size.
const SECTOR_BYTES: u64 = 512;

const NOT_DISKS: [&str; 3] = ["loop", "ram", "zram"];

/// What a whole device did over the interval.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DiskIo {
    pub device: String,
    pub reads: u64,
    pub writes: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    /// Milliseconds the device had I/O in flight: 1000 per second means
    /// always busy.
    pub io_time_ms: u64,
}

impl DiskIo {
    pub(super) fn from_delta((device, c): (String, [u64; FIELDS])) -> Self {
        let [reads, read_bytes, writes, write_bytes, io_time_ms] = c;
        DiskIo { device, reads, writes, read_bytes, write_bytes, io_time_ms }
    }
}

pub(super) fn read(text: &str, sys_root: &Path) -> Counted<FIELDS> {
    let (devices, skipped) = parse_diskstats(text);
    let names: HashSet<&str> = devices.iter().map(|(n, _)| n.as_str()).collect();
    let class_block = sys_root.join("class/block");
    let sysfs = class_block.is_dir();
    let whole = |name: &str| {
        if NOT_DISKS.iter().any(|p| name.starts_with(p)) {
            return false;
        }
        if sysfs {
            // sysfs spells a `/` in a device name (cciss/c0d0) as `!`.
            !class_block.join(name.replace('/', "!")).join("partition").exists()
        } else {
            !looks_like_partition(name, &names)
        }
    };
    let mut kept = Vec::new();
    let mut truncated = 0;
    for (name, counters) in devices.iter().filter(|(n, _)| whole(n)) {
        if kept.len() < MAX_DISKS {
            kept.push((name.clone(), *counters));
        } else {
            truncated += 1;
        }
    }
    Counted { kept, truncated, skipped }
}

/// Every device line as (name, counters), and how many lines were skipped.
fn parse_diskstats(text: &str) -> (Vec<(String, [u64; FIELDS])>, u64) {
    let mut devices = Vec::new();
    let mut skipped = 0;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let mut fields = line.split_whitespace();
        let name = fields.nth(2);
        // The 11 original counters; newer kernels append discard and flush
        // counts, which are not needed here.
        match (name, parse_counters::<11>(fields)) {
            (Some(name), Some(c)) => {
                let bytes = |sectors: u64| sectors.saturating_mul(SECTOR_BYTES);
                devices.push((name.to_string(), [c[0], bytes(c[2]), c[4], bytes(c[6]), c[9]]));
            }
            _ => skipped += 1,
        }
    }
    (devices, skipped)
}

/// Without sysfs: a partition is named after another listed device plus a
/// number (`sda1` from `sda`), or plus `p` and a number when that device's
/// name ends in a digit (`nvme0n1p1`, `mmcblk0p2`). One lookup per name, so
/// hosts with thousands of devices stay cheap.
fn looks_like_partition(name: &str, names: &HashSet<&str>) -> bool {
    let stem = name.trim_end_matches(|c: char| c.is_ascii_digit());
    if stem.len() == name.len() {
        return false;
    }
    names.contains(stem)
        || stem
            .strip_suffix('p')
            .is_some_and(|parent| parent.ends_with(|c: char| c.is_ascii_digit()) && names.contains(parent))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partitions_by_name() {
        let names: HashSet<&str> = [
            "sda",
            "sda1",
            "sdaa",
            "sdp",
            "sdp1",
            "md1",
            "md10",
            "nvme0n1",
            "nvme0n1p2",
            "nvme0n11",
            "mmcblk0",
            "mmcblk0p1",
            "dm-1",
        ]
        .into();
        let mut partitions: Vec<&str> = names.iter().copied().filter(|n| looks_like_partition(n, &names)).collect();
        partitions.sort();
        assert_eq!(partitions, ["mmcblk0p1", "nvme0n1p2", "sda1", "sdp1"]);
    }
}
