//! What the agent costs, measured every window: its CPU (from its own
//! cgroup when it has one, else the kernel's per-process clock), its RSS,
//! and both per 10k statements per second, the unit the field compares.
use std::time::Instant;

use serde::Serialize;

use super::Applied;

#[derive(Clone, Debug, Default, Serialize)]
pub struct CostSample {
    /// Cores the agent used over the window.
    pub cpu_cores: f64,
    /// Where `cpu_cores` came from: "cgroup" or "process".
    pub cpu_source: &'static str,
    /// The same source's CPU time since it began counting (the agent's
    /// start, or its cgroup's creation), for a Prometheus counter.
    #[serde(skip)]
    pub cpu_seconds_total: f64,
    pub rss_bytes: u64,
    /// Statements per second the agent observed over the window.
    pub statements_per_s: f64,
    /// Agent cores per 10,000 statements per second (0 when idle).
    pub cores_per_10k_qps: f64,
    pub cpu_limit_cores: Option<f64>,
    pub memory_limit_bytes: Option<u64>,
    /// Length of the window measured, seconds.
    pub window_seconds: f64,
    /// Shedding step in force after this window (see `budget::shedding`).
    pub shedding: super::Step,
    /// Statement records read from the kernel per second.
    pub events_per_s: f64,
    /// Records the kernel dropped in this window (ring buffers full).
    pub dropped_events: u64,
    /// EXPLAINs run for plans in this window, and their wall time.
    pub explains: u64,
    pub explain_ns: u64,
}

pub struct CostMeter {
    last: Option<(Instant, u64)>,
}

impl Default for CostMeter {
    fn default() -> Self {
        Self::new()
    }
}

impl CostMeter {
    pub fn new() -> Self {
        Self { last: None }
    }

    /// Closes a window: the agent's CPU and memory since the last call.
    pub fn sample(&mut self, budget: Option<&Applied>) -> CostSample {
        let own = budget.and_then(Applied::cpu_usage_ns);
        let (cpu_ns, cpu_source) = match own {
            Some(ns) => (ns, "cgroup"),
            None => (process_cpu_ns(), "process"),
        };
        let now = Instant::now();
        let mut sample = CostSample {
            cpu_source,
            cpu_seconds_total: cpu_ns as f64 / 1e9,
            rss_bytes: rss_bytes(),
            cpu_limit_cores: budget.and_then(Applied::cpu_cores),
            memory_limit_bytes: budget.and_then(Applied::memory_bytes),
            ..Default::default()
        };
        if let Some((then, cpu_then)) = self.last {
            sample.window_seconds = now.duration_since(then).as_secs_f64();
            if sample.window_seconds > 0.0 {
                sample.cpu_cores = cpu_ns.saturating_sub(cpu_then) as f64 / 1e9 / sample.window_seconds;
            }
        }
        self.last = Some((now, cpu_ns));
        sample
    }
}

impl CostSample {
    /// Relates the cost to what the window saw: statements, records read
    /// and records dropped, over every server.
    pub fn attribute(&mut self, statements: u64, events: u64, dropped_events: u64) {
        self.dropped_events = dropped_events;
        if self.window_seconds > 0.0 {
            self.statements_per_s = statements as f64 / self.window_seconds;
            self.events_per_s = events as f64 / self.window_seconds;
        }
        if self.statements_per_s > 0.0 {
            self.cores_per_10k_qps = self.cpu_cores / self.statements_per_s * 10_000.0;
        }
    }
}

/// CPU time of every thread of this process, ns.
pub fn process_cpu_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: plain syscall writing into a local.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm.split_whitespace().nth(1).and_then(|v| v.parse().ok()).unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    pages * unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_process_cost_is_seen() {
        let mut meter = CostMeter::new();
        meter.sample(None);
        let start = Instant::now();
        let mut x = 0u64;
        while start.elapsed().as_millis() < 200 {
            x = x.wrapping_mul(31).wrapping_add(7);
        }
        std::hint::black_box(x);
        let mut s = meter.sample(None);
        s.attribute(1000, 10, 0);
        assert!(s.cpu_cores > 0.5, "{s:?}");
        assert!(s.rss_bytes > 0 && s.cores_per_10k_qps > 0.0, "{s:?}");
        assert_eq!(s.cpu_source, "process");
    }
}
