//! What went wrong on the ship path between two windows, for the agent's
//! next window to report: a sender task that had to be restarted, disk
//! errors the spool lived through, and how far the agent's clock is from
//! the collector's.
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};

#[derive(Debug, Default)]
pub struct ShipHealth {
    restarts: AtomicU64,
    io_errors: AtomicU64,
    clock_skew_ms: AtomicI64,
    skew_known: AtomicBool,
}

/// Counts since the last `take`, and the latest skew.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HealthReport {
    pub sender_restarts: u64,
    pub spool_io_errors: u64,
    /// Agent clock minus collector clock; None until a push measured it.
    pub clock_skew_ms: Option<i64>,
}

impl ShipHealth {
    pub fn restarted(&self) {
        self.restarts.fetch_add(1, Ordering::Relaxed);
    }

    pub fn io_error(&self) {
        self.io_errors.fetch_add(1, Ordering::Relaxed);
    }

    pub fn clock_skew(&self, ms: i64) {
        self.clock_skew_ms.store(ms, Ordering::Relaxed);
        self.skew_known.store(true, Ordering::Relaxed);
    }

    /// Counts taken for a window that never left the agent (its batch
    /// could not be spooled): they go to the next one.
    pub fn give_back(&self, report: HealthReport) {
        self.restarts.fetch_add(report.sender_restarts, Ordering::Relaxed);
        self.io_errors.fetch_add(report.spool_io_errors, Ordering::Relaxed);
    }

    /// The counts since the previous call (they restart at zero), and the
    /// latest skew.
    pub fn take(&self) -> HealthReport {
        HealthReport {
            sender_restarts: self.restarts.swap(0, Ordering::Relaxed),
            spool_io_errors: self.io_errors.swap(0, Ordering::Relaxed),
            clock_skew_ms: self.skew_known.load(Ordering::Relaxed).then(|| self.clock_skew_ms.load(Ordering::Relaxed)),
        }
    }
}
