//! What a replica applied in a window: its transactions and their lag at
//! commit, and where the apply time went, per event class and per table
//! and kind of rows event. Row events carry no text: tables and counts
//! only, never values.
use std::collections::{BTreeMap, HashMap};

use sqlbee_vocabulary::histogram::Histogram;

use crate::{
    discover::EventClass,
    probe::{Applied, RowsKind},
};

use super::locks::wall_time;

/// Tables named per window; the rest of a window's rows events count
/// under one row with empty names.
pub const MAX_TABLES: usize = 2_000;
/// Applier threads whose open transaction is remembered; a bound a server
/// cannot exceed (one thread per parallel worker).
const MAX_OPEN: usize = 4096;

/// Apply time of one class of events or one table's rows events.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ApplyTotals {
    pub events: u64,
    pub apply_ns: u64,
    /// Rows they changed; None once one event's could not be read.
    pub rows: Option<u64>,
}

impl ApplyTotals {
    fn add(&mut self, event: &Applied) {
        self.rows = match (self.events, self.rows, event.rows_changed) {
            (0, _, rows) => rows,
            (_, Some(sum), Some(rows)) => Some(sum + rows),
            _ => None,
        };
        self.events += 1;
        self.apply_ns += event.end_ns - event.start_ns;
    }
}

/// One instance's window of replication.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReplicationWindow {
    /// Transactions begun (one GTID event each).
    pub transactions: u64,
    /// Every event applied, by class (`gtid`, `xid`, `query`, ...).
    pub classes: BTreeMap<&'static str, ApplyTotals>,
    /// Rows events by schema, table and kind.
    pub tables: BTreeMap<(String, String, RowsKind), ApplyTotals>,
    /// Each transaction's lag at its commit, in ns (the replica's clock
    /// less the second the primary wrote its last event), exactly counted
    /// in the latency histograms' buckets.
    pub lag: Histogram,
    pub lag_max_ns: u64,
    pub lag_sum_ns: u128,
    /// Events applied that the kernel side could not time (their ring was
    /// full, or two appliers shared a slot): the counts above are short by
    /// this many.
    pub lost_events: u64,
}

impl ReplicationWindow {
    pub fn is_empty(&self) -> bool {
        self.classes.is_empty() && self.lost_events == 0
    }

    /// The lag's quantile `q` (0.0..=1.0) in ns, within its bucket and
    /// never above the largest lag seen.
    pub fn lag_quantile(&self, q: f64) -> Option<u64> {
        (self.lag.total() > 0).then(|| self.lag.percentile(q, 0, self.lag_max_ns))
    }

    fn lag(&mut self, ns: u64) {
        self.lag.record(ns);
        self.lag_max_ns = self.lag_max_ns.max(ns);
        self.lag_sum_ns += u128::from(ns);
    }
}

/// Per instance: this window's totals, and each applier thread's open
/// transaction (lives across windows).
#[derive(Default)]
pub struct Replication {
    window: ReplicationWindow,
    /// By thread: the lag at the last event of a transaction that has not
    /// committed through an XID event yet (DDL and non-transactional
    /// tables commit without one).
    open: HashMap<u32, u64>,
}

impl Replication {
    pub fn apply(&mut self, event: &Applied) {
        let window = &mut self.window;
        window.classes.entry(class_name(event.class)).or_default().add(event);
        if let Some((kind, schema, table)) = &event.rows {
            let mut key = (schema.clone(), table.clone(), *kind);
            if window.tables.len() >= MAX_TABLES && !window.tables.contains_key(&key) {
                key = (String::new(), String::new(), *kind);
            }
            window.tables.entry(key).or_default().add(event);
        }
        let lag = lag_ns(event);
        match event.class {
            EventClass::Gtid => {
                window.transactions += 1;
                // The thread's previous transaction ended without an XID:
                // its last event was its commit.
                if let Some(last) = self.open.remove(&event.tid) {
                    window.lag(last);
                }
            }
            EventClass::Xid => {
                self.open.remove(&event.tid);
                window.lag(lag);
            }
            _ if self.open.len() < MAX_OPEN || self.open.contains_key(&event.tid) => {
                self.open.insert(event.tid, lag);
            }
            _ => {}
        }
    }

    pub fn lost(&mut self, events: u64) {
        self.window.lost_events += events;
    }

    /// The window's totals. Transactions still open without an XID are
    /// measured at their last event so far: a window never waits for the
    /// next transaction to learn a DDL's lag.
    pub fn take(&mut self) -> ReplicationWindow {
        for (_, lag) in self.open.drain() {
            self.window.lag(lag);
        }
        std::mem::take(&mut self.window)
    }
}

/// The replica's clock at the event's end less the second the primary
/// wrote it. The primary's time has whole seconds: a transaction applied
/// at once reads up to 999 ms.
fn lag_ns(event: &Applied) -> u64 {
    let end = wall_time(event.end_ns).duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    end.saturating_sub(event.primary_unix_s.saturating_mul(1_000_000_000))
}

pub fn class_name(class: EventClass) -> &'static str {
    match class {
        EventClass::Gtid => "gtid",
        EventClass::Xid => "xid",
        EventClass::Query => "query",
        EventClass::TableMap => "table_map",
        EventClass::Rows => "rows",
        EventClass::Other => "other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(tid: u32, class: EventClass, rows: Option<(RowsKind, &str, &str)>, start_ns: u64, took: u64) -> Applied {
        Applied {
            tid,
            class,
            rows: rows.map(|(k, s, t)| (k, s.into(), t.into())),
            primary_unix_s: 0,
            start_ns,
            end_ns: start_ns + took,
            rows_changed: Some(3),
        }
    }

    #[test]
    fn transactions_tables_and_lag_per_commit() {
        let mut replication = Replication::default();
        let now = 1_000_000_000;
        for e in [
            event(1, EventClass::Gtid, None, now, 10),
            event(1, EventClass::TableMap, None, now, 5),
            event(1, EventClass::Rows, Some((RowsKind::Update, "shop", "orders")), now, 300),
            event(1, EventClass::Rows, Some((RowsKind::Update, "shop", "orders")), now, 200),
            event(1, EventClass::Xid, None, now, 50),
            // A DDL: no XID, measured when the next transaction begins.
            event(2, EventClass::Gtid, None, now, 10),
            event(2, EventClass::Query, None, now, 1000),
            event(2, EventClass::Gtid, None, now, 10),
            event(2, EventClass::Query, None, now, 700),
        ] {
            replication.apply(&e);
        }
        let window = replication.take();
        assert_eq!(window.transactions, 3);
        let orders = window.tables[&("shop".into(), "orders".into(), RowsKind::Update)];
        assert_eq!((orders.events, orders.apply_ns, orders.rows), (2, 500, Some(6)));
        assert_eq!(window.classes["query"], ApplyTotals { events: 2, apply_ns: 1700, rows: Some(6) });
        // One per transaction: the XID, the DDL measured at the next GTID,
        // and the last DDL at the window's end.
        assert_eq!(window.lag.total(), 3);
        // The primary wrote at the epoch: every lag is the time since.
        assert!(window.lag_quantile(0.5).unwrap() > 1_000_000_000_000);
        assert!(replication.take().is_empty());
    }
}
