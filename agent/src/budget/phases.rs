//! Budget mode's own measurement of what the probes cost: the server's CPU
//! per query while they are attached against while they are not.
//!
//! The trap price calibrated at start is taken on an idle thread with warm
//! caches; in a loaded mysqld a statement with probes costs several times
//! that (side-by-side runs here: about 9 us against 1.1 + 1.9 us). The duty
//! cycle alternates attached and detached phases anyway, and the server's
//! query counter (`QueryCounter`) counts both, so the difference of CPU
//! per query between the two is the price as mysqld pays it. It also holds
//! when the host is saturated: the server's CPU then stays flat and the
//! probes show as fewer queries for it.
use super::query_counter::QueryCounter;
use crate::discover::threads_cpu_ns;

/// Fewer queries than this in either phase of a window teach nothing.
const MIN_QUERIES: u64 = 500;

/// Weight of a new window's measurement in the learned price.
const LEARN_RATE: f64 = 0.3;

/// What the probes are doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Attached and counting.
    On,
    /// Off, breakpoints gone.
    Off,
    /// Between a decision and its effect: an attach under load took up to
    /// seconds here and a detach tenths of a second, with breakpoints in
    /// place for part of it but nothing counted. Learned from neither side.
    Switching,
}

/// Server CPU and queries over one window, split by phase.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PhaseTotals {
    pub on_cpu_ns: u64,
    pub on_queries: u64,
    pub off_cpu_ns: u64,
    pub off_queries: u64,
    pub switching_queries: u64,
}

impl PhaseTotals {
    pub fn queries(&self) -> u64 {
        self.on_queries + self.off_queries + self.switching_queries
    }

    /// Extra server CPU per query while attached, ns; None without enough
    /// queries in both phases.
    pub fn extra_per_query_ns(&self) -> Option<f64> {
        if self.on_queries < MIN_QUERIES || self.off_queries < MIN_QUERIES {
            return None;
        }
        let on = self.on_cpu_ns as f64 / self.on_queries as f64;
        let off = self.off_cpu_ns as f64 / self.off_queries as f64;
        Some(on - off)
    }

    /// Extra server CPU per statement the probes counted while attached,
    /// ns. The server's counter also counts queries that are not
    /// statements (a driver that prepares and closes every statement sends
    /// three for one), and the probes' cost spreads over all of them.
    pub fn extra_per_statement_ns(&self, statements: u64) -> Option<f64> {
        if statements == 0 {
            return None;
        }
        Some(self.extra_per_query_ns()? * self.on_queries as f64 / statements as f64)
    }
}

pub struct Phases {
    pid: u32,
    counter: QueryCounter,
    current: Phase,
    /// CPU and queries at the start of the current phase.
    mark: Option<(u64, u64)>,
    window: PhaseTotals,
    /// Price learned over past windows, ns per query.
    learned_ns: Option<f64>,
}

impl Phases {
    /// Starts in `On`: a server is first seen when the probes attach.
    pub fn new(pid: u32, counter: QueryCounter) -> Self {
        let mut phases =
            Self { pid, counter, current: Phase::On, mark: None, window: PhaseTotals::default(), learned_ns: None };
        phases.mark = phases.sample();
        phases
    }

    fn sample(&self) -> Option<(u64, u64)> {
        Some((threads_cpu_ns(self.pid)?, self.counter.read()?))
    }

    pub fn current(&self) -> Phase {
        self.current
    }

    /// The current phase ends now and `next` begins.
    pub fn enter(&mut self, next: Phase) {
        let now = self.sample();
        if let (Some((cpu0, q0)), Some((cpu1, q1))) = (self.mark, now) {
            let (cpu, queries) = (cpu1.saturating_sub(cpu0), q1.saturating_sub(q0));
            tracing::debug!(phase = ?self.current, cpu_ns = cpu, queries, "phase ended");
            let w = &mut self.window;
            match self.current {
                Phase::On => (w.on_cpu_ns, w.on_queries) = (w.on_cpu_ns + cpu, w.on_queries + queries),
                Phase::Off => (w.off_cpu_ns, w.off_queries) = (w.off_cpu_ns + cpu, w.off_queries + queries),
                Phase::Switching => w.switching_queries += queries,
            }
        }
        self.mark = now;
        self.current = next;
    }

    /// Closes a window: its totals, and the price of one statement learned
    /// so far (never below `floor_ns`, what the program and the calibrated
    /// trap alone cost). `statements` are those the probes counted in the
    /// window, all while attached.
    pub fn close_window(&mut self, floor_ns: f64, statements: u64) -> (PhaseTotals, Option<f64>) {
        self.enter(self.current);
        let window = std::mem::take(&mut self.window);
        if let Some(measured) = window.extra_per_statement_ns(statements) {
            let learned = match self.learned_ns {
                Some(before) => before + LEARN_RATE * (measured - before),
                None => measured,
            };
            self.learned_ns = Some(learned);
        }
        (window, self.learned_ns.map(|ns| ns.max(floor_ns)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn price_is_the_difference_of_cpu_per_query() {
        let t = PhaseTotals {
            on_cpu_ns: 50_000 * 1000,
            on_queries: 1000,
            off_cpu_ns: 40_000 * 9000,
            off_queries: 9000,
            switching_queries: 7,
        };
        assert_eq!(t.extra_per_query_ns(), Some(10_000.0));
        assert_eq!(t.extra_per_statement_ns(1000), Some(10_000.0));
        // Three queries for each statement counted: the price of one
        // statement is that of three queries.
        assert_eq!(t.extra_per_statement_ns(333), Some(10_000.0 * 1000.0 / 333.0));
        assert_eq!(t.extra_per_statement_ns(0), None);
        assert_eq!(t.queries(), 10_007);
        let few = PhaseTotals { on_queries: MIN_QUERIES - 1, ..t };
        assert_eq!(few.extra_per_query_ns(), None, "too few attached queries");
    }
}
