//! Host and process metrics from procfs, sampled once per window.
//!
//! Owns the previous reading of every counter it turns into a rate, and
//! nothing more: that state is replaced on each sample, so a disk, interface
//! or process that goes away is forgotten and memory stays bounded by what
//! exists now (and by `MAX_DISKS` / `MAX_INTERFACES`). Everything is read
//! below an injectable proc root (and sys root) so tests run on fixture
//! trees. It must never panic on what it reads: a line it cannot parse is
//! skipped and counted.
mod counters;
mod cpu;
mod disk;
mod load;
mod memory;
mod net;
mod process;

pub use cpu::{CpuMetrics, CpuModes};
pub use disk::{DiskIo, MAX_DISKS};
pub use load::LoadAverage;
pub use memory::MemoryInfo;
pub use net::{MAX_INTERFACES, NetIo};
pub use process::{MAX_FDS_COUNTED, ProcessMetrics, ProcessSampler, ProcessStatus};

use std::{
    path::{Path, PathBuf},
    time::Instant,
};

use counters::Deltas;

#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error("cannot read {path}: {source} (is procfs mounted at the configured proc root?)")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} has no usable {what}: the file does not look like the Linux procfs format")]
    Unusable { path: PathBuf, what: &'static str },
}

/// One sample of the host and the requested processes.
#[derive(Debug, Clone, serde::Serialize)]
pub struct HostMetrics {
    /// Seconds since the previous sample; `None` on the first one, which
    /// therefore has no CPU rates and no disk or interface entries.
    pub interval_seconds: Option<f64>,
    pub cpu: CpuMetrics,
    pub memory: MemoryInfo,
    pub load: LoadAverage,
    /// Whole devices seen in both this and the previous sample, in
    /// /proc/diskstats order; values are what happened in between.
    pub disks: Vec<DiskIo>,
    /// Interfaces other than `lo` seen in both samples, as for `disks`.
    pub interfaces: Vec<NetIo>,
    /// One entry per requested pid, in request order.
    pub processes: Vec<ProcessMetrics>,
    pub truncated: Truncated,
    /// Lines of host files that could not be parsed and were ignored.
    pub skipped_lines: u64,
}

/// What the caps left out of this sample.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Truncated {
    pub disks: u64,
    pub interfaces: u64,
}

/// Reads host and process metrics, keeping what it needs for the next delta.
pub struct HostSampler {
    proc_root: PathBuf,
    sys_root: PathBuf,
    ticks_per_second: u64,
    last: Option<Instant>,
    cpu: Option<cpu::CpuTicks>,
    disks: Deltas<{ disk::FIELDS }>,
    interfaces: Deltas<{ net::FIELDS }>,
    processes: ProcessSampler,
}

impl HostSampler {
    /// `proc_root` is normally `/proc` and `sys_root` `/sys`.
    pub fn new(proc_root: impl Into<PathBuf>, sys_root: impl Into<PathBuf>) -> HostSampler {
        let proc_root = proc_root.into();
        HostSampler {
            processes: ProcessSampler::new(&proc_root),
            proc_root,
            sys_root: sys_root.into(),
            ticks_per_second: crate::procfs::clock_ticks_per_second(),
            last: None,
            cpu: None,
            disks: Deltas::default(),
            interfaces: Deltas::default(),
        }
    }

    pub fn sample(&mut self, pids: &[u32]) -> Result<HostMetrics, HostError> {
        self.sample_at(Instant::now(), pids)
    }

    /// As `sample`, with the caller's notion of now (a window boundary, or
    /// a synthetic clock in tests). A host file that cannot be read fails
    /// the whole sample and leaves the previous state untouched; problems
    /// with one process only mark that process.
    pub fn sample_at(&mut self, now: Instant, pids: &[u32]) -> Result<HostMetrics, HostError> {
        let stat_path = self.proc_root.join("stat");
        let stat = cpu::parse_stat(&read(&stat_path)?)
            .ok_or(HostError::Unusable { path: stat_path, what: "aggregate `cpu` line" })?;
        let mem_path = self.proc_root.join("meminfo");
        let (memory, mem_skipped) = memory::parse_meminfo(&read(&mem_path)?)
            .ok_or(HostError::Unusable { path: mem_path, what: "MemTotal line" })?;
        let load_path = self.proc_root.join("loadavg");
        let load = load::parse_loadavg(&read(&load_path)?)
            .ok_or(HostError::Unusable { path: load_path, what: "load averages" })?;
        let disks_now = disk::read(&read(&self.proc_root.join("diskstats"))?, &self.sys_root);
        let nets_now = net::read(&read(&self.proc_root.join("net/dev"))?);

        // Every file was read: only now advance the state, so a failed
        // sample does not stretch or shorten the next interval.
        let interval = self.last.map(|t| now.saturating_duration_since(t)).filter(|d| !d.is_zero());
        let busy = match (&self.cpu, interval) {
            (Some(before), Some(interval)) => {
                Some(cpu::busy(before, &stat.ticks, self.ticks_per_second, interval.as_secs_f64()))
            }
            _ => None,
        };
        self.last = Some(now);
        self.cpu = Some(stat.ticks);
        let disks = self.disks.advance(disks_now.kept).into_iter().map(DiskIo::from_delta).collect();
        let interfaces = self.interfaces.advance(nets_now.kept).into_iter().map(NetIo::from_delta).collect();

        Ok(HostMetrics {
            interval_seconds: interval.map(|d| d.as_secs_f64()),
            cpu: CpuMetrics { online_cores: stat.online_cores, busy },
            memory,
            load,
            disks,
            interfaces,
            processes: self.processes.sample_at(now, pids),
            truncated: Truncated { disks: disks_now.truncated, interfaces: nets_now.truncated },
            skipped_lines: stat.skipped + mem_skipped + disks_now.skipped + nets_now.skipped,
        })
    }
}

fn read(path: &Path) -> Result<String, HostError> {
    std::fs::read_to_string(path).map_err(|source| HostError::Read { path: path.to_path_buf(), source })
}

/// Named counter sets from one file, after filtering and the cap.
struct Counted<const N: usize> {
    kept: Vec<(String, [u64; N])>,
    truncated: u64,
    skipped: u64,
}

/// Parses the first `N` whitespace-separated fields as counters.
fn parse_counters<'a, const N: usize>(mut fields: impl Iterator<Item = &'a str>) -> Option<[u64; N]> {
    let mut values = [0; N];
    for value in &mut values {
        *value = fields.next()?.parse().ok()?;
    }
    Some(values)
}

#[cfg(test)]
mod tests;
