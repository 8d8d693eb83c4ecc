//! Readings taken around a run: process CPU and memory from /proc, the
//! kernel's per-program BPF statistics, sysbench's report. Read-only: it
//! never starts or stops anything but the statistics switch it holds.
use std::{
    collections::BTreeMap,
    fs,
    os::fd::{FromRawFd as _, OwnedFd},
    process::Command,
};

/// One BPF program a tracer held, over the whole time it was loaded.
#[derive(Clone, Debug, PartialEq)]
pub struct ProgramStats {
    pub name: String,
    pub hits: u64,
    pub ns: u64,
}

/// Keeps the kernel's BPF run-time statistics on while it lives.
/// BPF_ENABLE_STATS holds them by file descriptor, so a test elsewhere
/// switching `kernel.bpf_stats_enabled` off does not stop them mid-bench;
/// the sysctl is only the fallback.
pub struct RunTimeStats {
    _fd: Option<OwnedFd>,
    sysctl: bool,
}

const BPF_ENABLE_STATS: libc::c_long = 32;
const BPF_STATS_RUN_TIME: u32 = 0;

impl RunTimeStats {
    pub fn enable() -> RunTimeStats {
        #[repr(C)]
        struct EnableStatsAttr {
            kind: u32,
        }
        let attr = EnableStatsAttr { kind: BPF_STATS_RUN_TIME };
        // SAFETY: the kernel reads `size` bytes of `attr`, which outlives
        // the call; on success the returned descriptor is ours to own.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_ENABLE_STATS,
                &attr as *const EnableStatsAttr,
                size_of::<EnableStatsAttr>() as u32,
            )
        };
        if fd >= 0 {
            // SAFETY: a fresh descriptor returned by bpf(2), owned by nobody else.
            return RunTimeStats { _fd: Some(unsafe { OwnedFd::from_raw_fd(fd as i32) }), sysctl: false };
        }
        let sysctl =
            Command::new("sysctl").args(["-q", "kernel.bpf_stats_enabled=1"]).status().is_ok_and(|s| s.success());
        RunTimeStats { _fd: None, sysctl }
    }
}

impl Drop for RunTimeStats {
    fn drop(&mut self) {
        if self.sysctl {
            let _ = Command::new("sysctl").args(["-q", "kernel.bpf_stats_enabled=0"]).status();
        }
    }
}

/// The BPF programs process `pid` holds open, read from its fdinfo (so
/// programs of other processes on the host never count), named through
/// bpftool when it is there.
pub fn programs_of(pid: u32) -> Vec<ProgramStats> {
    let mut by_id: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
    let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fdinfo")) else { return Vec::new() };
    for fd in fds.flatten() {
        let Ok(info) = fs::read_to_string(fd.path()) else { continue };
        let field = |key: &str| -> Option<u64> {
            info.lines().find_map(|l| l.strip_prefix(key)?.strip_prefix(':')?.trim().parse().ok())
        };
        // Link descriptors name their program too but carry no counters:
        // only a program's own descriptor has run_cnt.
        if let (Some(id), Some(hits)) = (field("prog_id"), field("run_cnt")) {
            by_id.insert(id as u32, (hits, field("run_time_ns").unwrap_or(0)));
        }
    }
    if by_id.is_empty() {
        return Vec::new();
    }
    let names = program_names();
    let mut programs: Vec<ProgramStats> = by_id
        .into_iter()
        .map(|(id, (hits, ns))| ProgramStats {
            name: names.get(&id).cloned().unwrap_or_else(|| format!("prog{id}")),
            hits,
            ns,
        })
        .collect();
    // sqlbee's `calibrate` traps on a function of the agent itself: it is
    // the agent's cost, not the server's.
    programs.retain(|p| p.name != "calibrate");
    programs.sort_by(|a, b| a.name.cmp(&b.name));
    programs
}

/// Program names by id from `bpftool prog show --json`, picked out by hand
/// so xtask needs no JSON dependency: every program object starts with
/// `{"id":N` and has a `"name":"..."` (kernels cut names at 15 bytes).
fn program_names() -> BTreeMap<u32, String> {
    let Ok(out) = Command::new("bpftool").args(["prog", "show", "--json"]).output() else { return BTreeMap::new() };
    let text = String::from_utf8_lossy(&out.stdout);
    text.split("{\"id\":")
        .skip(1)
        .filter_map(|object| {
            let id = object.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()?;
            let name = object.split("\"name\":\"").nth(1)?.split('"').next()?;
            Some((id, name.to_string()))
        })
        .collect()
}

pub fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no preconditions.
    (unsafe { libc::sysconf(libc::_SC_CLK_TCK) }) as f64
}

/// utime + stime of a process (all its threads, exited ones included), in
/// clock ticks.
pub fn cpu_ticks(pid: u32) -> u64 {
    let (user, system) = user_and_system_ticks(pid);
    user + system
}

/// utime and stime of a process (all its threads), in clock ticks: the
/// kernel charges each tick to the side the thread was on, so over many
/// ticks their ratio is how its time splits between its own code and the
/// kernel (system calls, and a uprobe's trap and programs).
pub fn user_and_system_ticks(pid: u32) -> (u64, u64) {
    let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else { return (0, 0) };
    let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else { return (0, 0) };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| fields.get(n).and_then(|v| v.parse().ok()).unwrap_or(0u64);
    (field(11), field(12))
}

/// utime + stime of a process (all its threads), in seconds.
pub fn cpu_seconds(pid: u32) -> f64 {
    cpu_ticks(pid) as f64 / clock_ticks()
}

/// A process's CPU at one moment, two ways. schedstat counts nanoseconds
/// per live thread (exact, but a thread that exits takes its time with
/// it); /proc/PID/stat counts whole clock ticks for the process (coarse,
/// but it keeps exited threads). The first is the measure, the second the
/// check that no time went missing.
#[derive(Clone, Debug, Default)]
pub struct CpuReading {
    /// ns on CPU (schedstat's first field) by thread id.
    pub tasks_ns: BTreeMap<u32, u64>,
    pub ticks: u64,
    /// Of those, the ticks in the kernel (stime).
    pub system_ticks: u64,
}

impl CpuReading {
    pub fn of(pid: u32) -> CpuReading {
        let mut tasks_ns = BTreeMap::new();
        for task in fs::read_dir(format!("/proc/{pid}/task")).into_iter().flatten().flatten() {
            let Some(tid) = task.file_name().to_str().and_then(|t| t.parse().ok()) else { continue };
            let Ok(text) = fs::read_to_string(task.path().join("schedstat")) else { continue };
            if let Some(ns) = text.split_whitespace().next().and_then(|v| v.parse().ok()) {
                tasks_ns.insert(tid, ns);
            }
        }
        let (user, system) = user_and_system_ticks(pid);
        CpuReading { tasks_ns, ticks: user + system, system_ticks: system }
    }

    /// ns on CPU since `earlier`, thread by thread: a thread born since
    /// counts whole, one that exited since is lost (the ticks keep it).
    pub fn ns_since(&self, earlier: &CpuReading) -> u64 {
        self.tasks_ns.iter().map(|(tid, &ns)| ns.saturating_sub(earlier.tasks_ns.get(tid).copied().unwrap_or(0))).sum()
    }
}

pub fn peak_rss_kib(pid: u32) -> u64 {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("VmHWM:")).map(|l| l.to_string()))
        .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}

/// What sysbench's report says about one run.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SysbenchReport {
    pub queries: u64,
    pub transactions: u64,
    pub qps: f64,
    pub tps: f64,
    pub avg_ms: f64,
    pub p95_ms: f64,
    /// Sum of every event's latency: with `queries` it gives the mean
    /// per statement finer than `avg`, which sysbench rounds to 10 us.
    pub latency_sum_ms: f64,
}

pub fn parse_sysbench(report: &str) -> SysbenchReport {
    let number_after = |key: &str, nth: usize| -> f64 {
        report
            .lines()
            .find(|l| l.trim_start().starts_with(key))
            .and_then(|l| {
                l.split(|c: char| c.is_whitespace() || c == '(').filter_map(|w| w.parse::<f64>().ok()).nth(nth)
            })
            .unwrap_or(0.0)
    };
    SysbenchReport {
        queries: number_after("queries:", 0) as u64,
        transactions: number_after("transactions:", 0) as u64,
        qps: number_after("queries:", 1),
        tps: number_after("transactions:", 1),
        avg_ms: number_after("avg:", 0),
        p95_ms: number_after("95th percentile:", 0),
        latency_sum_ms: number_after("sum:", 0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_of_this_process_is_read() {
        let before = CpuReading::of(std::process::id());
        let mut x = 0u64;
        for i in 0..5_000_000u64 {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
        }
        let after = CpuReading::of(std::process::id());
        assert!(!before.tasks_ns.is_empty(), "no schedstat for this process");
        assert!(after.ns_since(&before) > 0 && after.ticks >= before.ticks);
        // A thread that is gone since counts nothing, a new one whole.
        let gone = CpuReading { tasks_ns: BTreeMap::from([(1, 50), (2, 70)]), ticks: 0, system_ticks: 0 };
        let now = CpuReading { tasks_ns: BTreeMap::from([(2, 100), (3, 20)]), ticks: 0, system_ticks: 0 };
        assert_eq!(now.ns_since(&gone), 30 + 20);
    }

    #[test]
    fn sysbench_report_is_parsed() {
        let report = "SQL statistics:\n    queries performed:\n        read:                            140\n    \
                      transactions:                        10     (4.98 per sec.)\n    \
                      queries:                             200    (99.50 per sec.)\n\
                      Latency (ms):\n         min:                                    0.35\n         \
                      avg:                                    1.25\n         max:                                    9.00\n         \
                      95th percentile:                        2.52\n         \
                      sum:                                   12.51\n";
        let r = parse_sysbench(report);
        assert_eq!((r.queries, r.transactions, r.qps, r.tps), (200, 10, 99.5, 4.98));
        assert_eq!((r.avg_ms, r.p95_ms, r.latency_sum_ms), (1.25, 2.52, 12.51));
    }
}
