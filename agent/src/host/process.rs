//! Per-process metrics from /proc/PID: used for each server and for the
//! agent itself.
//!
//! A process that cannot be read is described, never an error: it may have
//! exited between samples, or belong to someone this agent may not inspect.
use std::{
    collections::HashMap,
    io,
    path::{Path, PathBuf},
    time::Instant,
};

use crate::procfs::PidStat;

/// Entries of /proc/PID/fd counted at most; a server with more open files
/// reports this many and `open_fds_capped`. Keeps one sample's cost
/// bounded whatever `open_files_limit` is.
pub const MAX_FDS_COUNTED: u64 = 262_144;

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProcessStatus {
    Running,
    /// No such process (any more): every other field is empty.
    Gone,
    /// It exists but /proc/PID/stat could not be read or understood
    /// (permissions, hidepid): every other field is empty.
    Unreadable,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ProcessMetrics {
    pub pid: u32,
    pub status: ProcessStatus,
    /// Start time in clock ticks since boot: with `pid`, names one process
    /// across pid reuse.
    pub start_ticks: Option<u64>,
    /// Cores used (user + system) since the previous sample of this same
    /// process; `None` the first time it is seen.
    pub cpu_cores: Option<f64>,
    pub rss_bytes: Option<u64>,
    pub threads: Option<u64>,
    /// `None` when /proc/PID/fd is not readable by this agent.
    pub open_fds: Option<u64>,
    /// True when counting stopped at `MAX_FDS_COUNTED`.
    pub open_fds_capped: bool,
    /// Bytes fetched from and sent to storage since the previous sample;
    /// `None` the first time, or when /proc/PID/io is not readable (it
    /// needs ptrace rights over the process).
    pub read_bytes: Option<u64>,
    pub write_bytes: Option<u64>,
}

impl ProcessMetrics {
    fn empty(pid: u32, status: ProcessStatus) -> Self {
        ProcessMetrics {
            pid,
            status,
            start_ticks: None,
            cpu_cores: None,
            rss_bytes: None,
            threads: None,
            open_fds: None,
            open_fds_capped: false,
            read_bytes: None,
            write_bytes: None,
        }
    }
}

/// What the next sample of a process needs from this one.
struct Previous {
    start_ticks: u64,
    cpu_ticks: u64,
    io: Option<(u64, u64)>,
    at: Instant,
}

/// Samples processes by pid and keeps their previous readings; usable
/// alone, e.g. `ProcessSampler::new("/proc").sample(&[std::process::id()])`
/// for the agent itself.
pub struct ProcessSampler {
    proc_root: PathBuf,
    ticks_per_second: u64,
    page_size: u64,
    previous: HashMap<u32, Previous>,
}

impl ProcessSampler {
    pub fn new(proc_root: impl Into<PathBuf>) -> ProcessSampler {
        // SAFETY: sysconf has no preconditions.
        let page_size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        ProcessSampler {
            proc_root: proc_root.into(),
            ticks_per_second: crate::procfs::clock_ticks_per_second(),
            page_size: if page_size > 0 { page_size as u64 } else { 4096 },
            previous: HashMap::new(),
        }
    }

    /// Fixed units, so fixture tests expect exact numbers on any machine.
    #[cfg(test)]
    pub(super) fn set_units(&mut self, ticks_per_second: u64, page_size: u64) {
        self.ticks_per_second = ticks_per_second;
        self.page_size = page_size;
    }

    #[cfg(test)]
    pub(super) fn tracked(&self) -> usize {
        self.previous.len()
    }

    pub fn sample(&mut self, pids: &[u32]) -> Vec<ProcessMetrics> {
        self.sample_at(Instant::now(), pids)
    }

    /// One entry per pid, in order. Only the pids asked for this time are
    /// remembered, so state never outgrows the caller's list.
    pub fn sample_at(&mut self, now: Instant, pids: &[u32]) -> Vec<ProcessMetrics> {
        let mut previous = std::mem::take(&mut self.previous);
        let mut metrics = Vec::with_capacity(pids.len());
        for &pid in pids {
            let before = previous.remove(&pid);
            let (sample, next) = self.sample_one(now, pid, before);
            if let Some(next) = next {
                self.previous.insert(pid, next);
            }
            metrics.push(sample);
        }
        metrics
    }

    fn sample_one(&self, now: Instant, pid: u32, before: Option<Previous>) -> (ProcessMetrics, Option<Previous>) {
        let dir = self.proc_root.join(pid.to_string());
        let stat = match std::fs::read_to_string(dir.join("stat")) {
            Ok(text) => text,
            Err(e) if is_gone(&e) => return (ProcessMetrics::empty(pid, ProcessStatus::Gone), None),
            Err(e) => {
                tracing::debug!(pid, error = %e, "cannot read process stat");
                return (ProcessMetrics::empty(pid, ProcessStatus::Unreadable), None);
            }
        };
        let Some(stat) = PidStat::parse(&stat) else {
            tracing::debug!(pid, "process stat has an unexpected format");
            return (ProcessMetrics::empty(pid, ProcessStatus::Unreadable), None);
        };
        let io = read_io(&dir);
        let (open_fds, open_fds_capped) = match count_fds(&dir.join("fd")) {
            Some((n, capped)) => (Some(n), capped),
            None => (None, false),
        };

        // A different start time under the same pid is another process:
        // its counters are not a continuation of the old ones.
        let before = before.filter(|b| b.start_ticks == stat.start_ticks);
        let elapsed = before.as_ref().map(|b| now.saturating_duration_since(b.at)).filter(|d| !d.is_zero());
        let cpu_cores = before.as_ref().zip(elapsed).map(|(b, elapsed)| {
            stat.cpu_ticks.saturating_sub(b.cpu_ticks) as f64 / self.ticks_per_second as f64 / elapsed.as_secs_f64()
        });
        let io_delta = match (before.as_ref().and_then(|b| b.io), io) {
            (Some((r0, w0)), Some((r1, w1))) if r1 >= r0 && w1 >= w0 => Some((r1 - r0, w1 - w0)),
            _ => None,
        };

        let metrics = ProcessMetrics {
            pid,
            status: ProcessStatus::Running,
            start_ticks: Some(stat.start_ticks),
            cpu_cores,
            rss_bytes: Some(stat.rss_pages.saturating_mul(self.page_size)),
            threads: Some(stat.threads),
            open_fds,
            open_fds_capped,
            read_bytes: io_delta.map(|(r, _)| r),
            write_bytes: io_delta.map(|(_, w)| w),
        };
        let next = Previous { start_ticks: stat.start_ticks, cpu_ticks: stat.cpu_ticks, io, at: now };
        (metrics, Some(next))
    }
}

/// ESRCH shows up when the process exits while its files are being read.
fn is_gone(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ESRCH)
}

/// (read_bytes, write_bytes): what reached or left storage, not what went
/// through read(2)/write(2) (that includes page-cache hits).
fn read_io(dir: &Path) -> Option<(u64, u64)> {
    let text = std::fs::read_to_string(dir.join("io")).ok()?;
    let value =
        |key: &str| text.lines().find_map(|l| l.strip_prefix(key)?.strip_prefix(':')?.trim().parse::<u64>().ok());
    Some((value("read_bytes")?, value("write_bytes")?))
}

fn count_fds(dir: &Path) -> Option<(u64, bool)> {
    let mut n = 0;
    for _ in std::fs::read_dir(dir).ok()?.map_while(Result::ok) {
        if n == MAX_FDS_COUNTED {
            return Some((n, true));
        }
        n += 1;
    }
    Some((n, false))
}
