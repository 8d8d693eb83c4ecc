//! What the probes cost one traced server, window by window, and in budget
//! mode the duty cycle that holds that cost under its share of mysqld.
//!
//! The probes' CPU in mysqld is the programs' own run time (BPF run-time
//! statistics) plus one trap per program run, whose price was measured at
//! start (see `calibrate`); neither shows in the agent's own CPU.
use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use super::{
    calibrate::FALLBACK_TRAP,
    duty::{DutyConfig, DutyCycle},
    phases::{Phase, Phases},
    query_counter::QueryCounter,
};
use crate::discover::cpu_seconds;

/// The probes' cost in one server over one window.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProbeCost {
    /// Share of the window the probes were attached (1 outside budget mode).
    pub attached_fraction: f64,
    /// Run time of the kernel programs, ns.
    pub program_ns: u64,
    /// Program runs, each one trap.
    pub program_runs: u64,
    /// Measured price of one trap, ns.
    pub trap_ns: u64,
    /// mysqld's own CPU over the window, in seconds (probes included).
    pub mysqld_cpu_s: f64,
    pub window_s: f64,
    /// Statements the probes counted (while attached).
    pub statements: u64,
    /// Queries the server itself counted over the whole window, when its
    /// counter could be read. Its counter also counts what the probes do
    /// not take for statements (a prepared statement's preparation and
    /// close), so it is a clock of the server's work, not a statement
    /// count.
    pub server_statements: Option<u64>,
    /// Of those, the ones that ran while the probes were attached (budget
    /// mode).
    pub server_statements_attached: Option<u64>,
    /// What one statement costs mysqld with the probes on, learned from
    /// attached against detached phases (budget mode), ns.
    pub learned_ns: Option<u64>,
}

impl ProbeCost {
    /// CPU the probes took from mysqld, seconds: the learned price when
    /// there is one, else run time plus calibrated traps.
    pub fn probe_cpu_s(&self) -> f64 {
        let calibrated = (self.program_ns as f64 + self.program_runs as f64 * self.trap_ns as f64) / 1e9;
        match self.learned_ns {
            Some(ns) => (ns as f64 * self.statements as f64 / 1e9).max(calibrated),
            None => calibrated,
        }
    }

    /// True when counts cover only the attached share of the window.
    pub fn sampled(&self) -> bool {
        self.attached_fraction < 1.0
    }

    /// Share of the server's queries that ran while attached.
    pub fn statement_share(&self) -> Option<f64> {
        let total = self.server_statements.filter(|n| *n > 0)?;
        Some(self.server_statements_attached? as f64 / total as f64)
    }

    /// Adds another part of the same window (a server's batches are
    /// closed more than once in a window when it goes away).
    pub fn merge(&mut self, other: &ProbeCost) {
        let add = |a: Option<u64>, b: Option<u64>| match (a, b) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(0) + b.unwrap_or(0)),
        };
        self.program_ns += other.program_ns;
        self.program_runs += other.program_runs;
        self.mysqld_cpu_s += other.mysqld_cpu_s;
        self.window_s += other.window_s;
        self.statements += other.statements;
        self.server_statements = add(self.server_statements, other.server_statements);
        self.server_statements_attached = add(self.server_statements_attached, other.server_statements_attached);
        self.trap_ns = other.trap_ns;
        self.attached_fraction = other.attached_fraction;
        self.learned_ns = other.learned_ns.or(self.learned_ns);
    }

    /// A count over the attached share, scaled to the whole window: by the
    /// share of the server's own queries that ran attached when known
    /// (right whatever the rate did, and whatever share of those queries
    /// are statements), else by the share of time.
    pub fn estimate(&self, counted: u64) -> u64 {
        if !self.sampled() {
            return counted;
        }
        let share = self.statement_share().filter(|s| *s > 0.0).unwrap_or(self.attached_fraction);
        if share > 0.0 { (counted as f64 / share).round() as u64 } else { counted }
    }

    /// The window's statements, scaled as each digest's count is, so the
    /// digests' estimates add up to it. Not the server's own count: a
    /// driver that prepares and closes every statement makes that three
    /// times the statements. Only a window without an attached phase, with
    /// no sample to scale, takes the server's count.
    pub fn estimate_total(&self, counted: u64) -> u64 {
        match (self.statement_share(), self.server_statements) {
            (Some(share), Some(server)) if self.sampled() && share == 0.0 => server.max(counted),
            _ => self.estimate(counted),
        }
    }

    /// Cores the probes add to the server per 10,000 statements per second,
    /// given the statements counted while attached; None without any.
    pub fn extra_cores_per_10k_qps(&self, statements: u64) -> Option<f64> {
        if statements == 0 || self.window_s <= 0.0 {
            return None;
        }
        let qps = self.estimate_total(statements) as f64 / self.window_s;
        Some(self.probe_cpu_s() / self.window_s / (qps / 10_000.0))
    }
}

/// One traced server's probe cost, window by window, and in budget mode
/// its duty cycle.
pub struct Overhead {
    pid: u32,
    /// Measured trap price, ns; 0 while unknown.
    trap_ns: Arc<AtomicU64>,
    duty: Option<DutyCycle>,
    /// The server's CPU and queries by phase, when its query counter reads.
    phases: Option<Phases>,
    /// Cumulative program run time and runs at the last window end.
    last_programs: (Duration, u64),
    last_cpu_s: Option<f64>,
    last_statements: u64,
    window_start: Instant,
}

impl Overhead {
    pub fn new(
        pid: u32,
        trap_ns: Arc<AtomicU64>,
        budget: Option<DutyConfig>,
        counter: Option<QueryCounter>,
        now: Instant,
    ) -> Self {
        Self {
            pid,
            trap_ns,
            duty: budget.map(|config| DutyCycle::new(config, now)),
            phases: counter.map(|c| Phases::new(pid, c)),
            last_programs: (Duration::ZERO, 0),
            last_cpu_s: cpu_seconds(pid),
            last_statements: 0,
            window_start: now,
        }
    }

    /// In budget mode, whether the probes change state now.
    /// An attach (`Some(true)`) is not in effect until `attached` says so
    /// (under load it took up to seconds here), a detach not until
    /// `detached` does.
    pub fn tick(&mut self, now: Instant) -> Option<bool> {
        let attach = self.duty.as_mut()?.tick(now)?;
        // A deferred attach asks again every drain; it is one switching
        // phase, sampled once.
        if let Some(phases) = &mut self.phases
            && phases.current() != Phase::Switching
        {
            phases.enter(Phase::Switching);
        }
        Some(attach)
    }

    /// The probes are attached and counting from `now`.
    pub fn attached(&mut self, now: Instant) {
        if let Some(duty) = &mut self.duty {
            duty.started(now);
        }
        if let Some(phases) = &mut self.phases {
            phases.enter(Phase::On);
        }
    }

    /// The kernel has let go of every probe: the server runs untouched.
    pub fn detached(&mut self) {
        if let Some(phases) = &mut self.phases
            && phases.current() == Phase::Switching
            && self.duty.as_ref().is_some_and(|d| !d.attached())
        {
            phases.enter(Phase::Off);
        }
    }

    /// See `DutyCycle::stay_detached`.
    pub fn stay_detached(&mut self, now: Instant) {
        if let Some(duty) = &mut self.duty {
            duty.stay_detached(now);
        }
    }

    /// Closes a window: `programs` are the cumulative (run time, runs) of
    /// the server's programs, `statements` its cumulative statement count.
    pub fn close_window(&mut self, programs: (Duration, u64), statements: u64, now: Instant) -> ProbeCost {
        let window_s = now.saturating_duration_since(self.window_start).as_secs_f64();
        self.window_start = now;
        let cpu = cpu_seconds(self.pid);
        let mysqld_cpu_s = match (cpu, self.last_cpu_s) {
            (Some(now), Some(before)) => (now - before).max(0.0),
            _ => 0.0,
        };
        self.last_cpu_s = cpu;
        let program_ns = programs.0.saturating_sub(self.last_programs.0).as_nanos() as u64;
        let program_runs = programs.1.saturating_sub(self.last_programs.1);
        self.last_programs = programs;
        let seen = statements.saturating_sub(self.last_statements);
        self.last_statements = statements;
        let attached_fraction = self.duty.as_mut().map_or(1.0, |d| d.take_attached_fraction(now));
        let trap_ns = match self.trap_ns.load(Ordering::Relaxed) {
            0 => FALLBACK_TRAP.as_nanos() as u64,
            measured => measured,
        };
        let floor_ns = if seen > 0 { (program_ns + program_runs * trap_ns) as f64 / seen as f64 } else { 0.0 };
        let (phases, learned) = match &mut self.phases {
            Some(p) => {
                let (totals, learned) = p.close_window(floor_ns, seen);
                (Some(totals), learned)
            }
            None => (None, None),
        };
        let cost = ProbeCost {
            attached_fraction,
            program_ns,
            program_runs,
            trap_ns,
            mysqld_cpu_s,
            window_s,
            statements: seen,
            server_statements: phases.map(|p| p.queries()),
            server_statements_attached: phases.filter(|_| self.duty.is_some()).map(|p| p.on_queries),
            learned_ns: learned.map(|ns| ns.round() as u64),
        };
        if let Some(duty) = &mut self.duty
            && seen > 0
            && attached_fraction > 0.0
        {
            // Statements over the whole window, scaled as the output's are.
            let per_s = cost.estimate_total(seen) as f64 / window_s.max(1e-9);
            let per_statement = cost.probe_cpu_s() / seen as f64;
            duty.rebudget(per_s, per_statement, mysqld_cpu_s / window_s.max(1e-9));
        }
        cost
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_scale_by_the_servers_own_count() {
        let cost = ProbeCost {
            attached_fraction: 0.5,
            statements: 100,
            server_statements: Some(1000),
            server_statements_attached: Some(100),
            ..Default::default()
        };
        // A tenth of the server's queries ran attached, though half of the
        // time did: the rate moved.
        assert_eq!(cost.estimate(30), 300);
        assert_eq!(cost.estimate_total(100), 1000);
        // A driver that prepares, executes and closes every statement: the
        // server counts three queries for each, the probes one statement.
        let prepared_each_time =
            ProbeCost { server_statements: Some(3000), server_statements_attached: Some(300), ..cost.clone() };
        assert_eq!(prepared_each_time.estimate_total(100), 1000);
        assert_eq!(prepared_each_time.estimate(30), 300);
        // Detached for the whole window: nothing to scale but the server's
        // count.
        let never_attached = ProbeCost {
            attached_fraction: 0.0,
            statements: 0,
            server_statements_attached: Some(0),
            ..prepared_each_time.clone()
        };
        assert_eq!(never_attached.estimate_total(0), 3000);
        let by_time = ProbeCost { server_statements: None, server_statements_attached: None, ..cost.clone() };
        assert_eq!(by_time.estimate(30), 60);
        assert_eq!(by_time.estimate_total(100), 200);
        let exact = ProbeCost { attached_fraction: 1.0, ..cost.clone() };
        assert_eq!((exact.estimate(30), exact.estimate_total(100)), (30, 100));

        let mut merged = cost.clone();
        merged.merge(&ProbeCost {
            statements: 50,
            server_statements: Some(500),
            server_statements_attached: Some(400),
            ..cost
        });
        assert_eq!(
            (merged.statements, merged.server_statements, merged.statement_share()),
            (150, Some(1500), Some(1.0 / 3.0))
        );
    }

    #[test]
    fn a_learned_price_counts_when_above_the_calibrated_one() {
        let cost = ProbeCost { program_ns: 2000, program_runs: 1, trap_ns: 1000, statements: 1, ..Default::default() };
        assert!((cost.probe_cpu_s() - 3e-6).abs() < 1e-15);
        let learned = ProbeCost { learned_ns: Some(5000), ..cost.clone() };
        assert!((learned.probe_cpu_s() - 5e-6).abs() < 1e-15);
        let low = ProbeCost { learned_ns: Some(100), ..cost };
        assert!((low.probe_cpu_s() - 3e-6).abs() < 1e-15);
    }

    #[test]
    fn own_cpu_is_read_and_windows_take_deltas() {
        let now = Instant::now();
        let mut o = Overhead::new(std::process::id(), Arc::new(AtomicU64::new(1500)), None, None, now);
        assert!(cpu_seconds(std::process::id()).is_some());
        assert!(cpu_seconds(u32::MAX).is_none());
        let first = o.close_window((Duration::from_micros(30), 10), 10, now + Duration::from_secs(1));
        assert_eq!((first.program_ns, first.program_runs, first.attached_fraction), (30_000, 10, 1.0));
        assert!((first.probe_cpu_s() - 45e-6).abs() < 1e-12);
        let second = o.close_window((Duration::from_micros(50), 14), 14, now + Duration::from_secs(2));
        assert_eq!((second.program_ns, second.program_runs), (20_000, 4));
    }
}
