//! What a replica applied in a window, per replication channel: its
//! transactions and their lag at commit, and where the apply time went,
//! per event class and per table and kind of rows event. Row events carry
//! no text: tables and counts only, never values.
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
/// Channels named per window (MariaDB replicates from at most 64
/// primaries at once); any more count with the default channel.
pub const MAX_CHANNELS: usize = 64;
/// Applier threads whose open transaction is remembered; a bound a server
/// does not reach (one thread per parallel worker).
const MAX_OPEN: usize = 4096;

/// Apply time of one class of events or one table's rows events.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ApplyTotals {
    pub events: u64,
    pub apply_ns: u64,
    /// Rows they changed; None once one event's could not be read.
    pub rows: Option<u64>,
    /// Each event's apply time, exactly counted in the latency
    /// histograms' buckets.
    pub latency: Histogram,
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
        self.latency.record(event.end_ns - event.start_ns);
    }

    /// An event's apply time at quantile `q`, in ms, within its bucket
    /// and never above the time of all of them.
    pub fn quantile_ms(&self, q: f64) -> f64 {
        self.latency.percentile(q, 0, self.apply_ns) as f64 / 1e6
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

    fn add(&mut self, event: &Applied) {
        self.classes.entry(class_name(event.class)).or_default().add(event);
        if let Some((kind, schema, table)) = &event.rows {
            let mut key = (schema.clone(), table.clone(), *kind);
            if self.tables.len() >= MAX_TABLES && !self.tables.contains_key(&key) {
                key = (String::new(), String::new(), *kind);
            }
            self.tables.entry(key).or_default().add(event);
        }
        if event.class == EventClass::Gtid {
            self.transactions += 1;
        }
    }
}

/// Per instance: this window's totals by channel, and each applier
/// thread's open transaction (lives across windows).
#[derive(Default)]
pub struct Replication {
    /// By channel (its connection name; empty: the default channel).
    channels: BTreeMap<String, ReplicationWindow>,
    /// By thread: the transaction it applies, from its GTID event until
    /// its XID.
    open: HashMap<u32, Transaction>,
    lost_events: u64,
}

/// One applier thread's transaction in flight.
struct Transaction {
    channel: String,
    /// The lag at its last event so far: its commit's, if no XID comes
    /// (DDL and non-transactional tables commit without one).
    lag: Option<u64>,
    /// Its lag was already counted, at a window's end: it is counted once.
    measured: bool,
}

impl Transaction {
    fn new(channel: String) -> Self {
        Transaction { channel, lag: None, measured: false }
    }
}

impl Replication {
    pub fn apply(&mut self, event: &Applied) {
        let lag = lag_ns(event);
        if event.class == EventClass::Gtid {
            // The thread's previous transaction ended without an XID: its
            // last event was its commit.
            if let Some(previous) = self.open.remove(&event.tid) {
                self.commit(&previous, None);
            }
            if self.open.len() < MAX_OPEN {
                self.open.insert(event.tid, Transaction::new(event.channel.clone().unwrap_or_default()));
            }
        }
        let channel = self.open.get(&event.tid).map_or("", |t| t.channel.as_str());
        window_of(&mut self.channels, channel).add(event);
        match event.class {
            EventClass::Gtid => {}
            EventClass::Xid => {
                let transaction = self.open.remove(&event.tid).unwrap_or_else(|| Transaction::new(String::new()));
                self.commit(&transaction, Some(lag));
            }
            _ => {
                if self.open.len() < MAX_OPEN || self.open.contains_key(&event.tid) {
                    self.open.entry(event.tid).or_insert_with(|| Transaction::new(String::new())).lag = Some(lag);
                }
            }
        }
    }

    /// A transaction's lag at its commit (`at`, else its last event's), on
    /// its channel, unless a window's end already counted it.
    fn commit(&mut self, transaction: &Transaction, at: Option<u64>) {
        if transaction.measured {
            return;
        }
        if let Some(lag) = at.or(transaction.lag) {
            window_of(&mut self.channels, &transaction.channel).lag(lag);
        }
    }

    pub fn lost(&mut self, events: u64) {
        self.lost_events += events;
    }

    /// The window's totals by channel. Transactions still open are
    /// measured at their last event so far, once: a window never waits for
    /// the next transaction to learn a DDL's lag. Events lost go with the
    /// first channel (the kernel cannot tell whose they were).
    pub fn take(&mut self) -> BTreeMap<String, ReplicationWindow> {
        for transaction in self.open.values_mut() {
            if let Some(lag) = transaction.lag.filter(|_| !transaction.measured) {
                transaction.measured = true;
                window_of(&mut self.channels, &transaction.channel).lag(lag);
            }
        }
        if self.lost_events > 0 {
            let first = self.channels.keys().next().cloned().unwrap_or_default();
            self.channels.entry(first).or_default().lost_events += std::mem::take(&mut self.lost_events);
        }
        std::mem::take(&mut self.channels)
    }
}

/// The channel's window, made when it is its first event; past
/// [`MAX_CHANNELS`], the default channel's.
fn window_of<'a>(channels: &'a mut BTreeMap<String, ReplicationWindow>, channel: &str) -> &'a mut ReplicationWindow {
    let channel = if channels.len() >= MAX_CHANNELS - 1 && !channels.contains_key(channel) { "" } else { channel };
    channels.entry(channel.to_string()).or_default()
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
            channel: (class == EventClass::Gtid).then(String::new),
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
        let channels = replication.take();
        assert_eq!(channels.keys().collect::<Vec<_>>(), [""], "the default channel");
        let window = &channels[""];
        assert_eq!(window.transactions, 3);
        let orders = &window.tables[&("shop".into(), "orders".into(), RowsKind::Update)];
        assert_eq!((orders.events, orders.apply_ns, orders.rows), (2, 500, Some(6)));
        assert_eq!(orders.latency.total(), 2, "each event's apply time");
        let query = &window.classes["query"];
        assert_eq!((query.events, query.apply_ns, query.rows, query.latency.total()), (2, 1700, Some(6), 2));
        // One per transaction: the XID, the DDL measured at the next GTID,
        // and the last DDL at the window's end.
        assert_eq!(window.lag.total(), 3);
        // The primary wrote at the epoch: every lag is the time since.
        assert!(window.lag_quantile(0.5).unwrap() > 1_000_000_000_000);
        assert!(replication.take().is_empty());
    }

    #[test]
    fn each_channel_gets_its_transactions_and_a_transaction_is_measured_once() {
        let mut replication = Replication::default();
        let gtid =
            |tid, channel: &str| Applied { channel: Some(channel.into()), ..event(tid, EventClass::Gtid, None, 0, 10) };
        let rows = |tid, table| event(tid, EventClass::Rows, Some((RowsKind::Write, "shop", table)), 0, 100);
        // Two workers, each applying a transaction of its own channel.
        for e in
            [gtid(1, "eu"), gtid(2, "us"), rows(1, "orders"), rows(2, "users"), event(1, EventClass::Xid, None, 0, 5)]
        {
            replication.apply(&e);
        }
        replication.lost(2);
        let first = replication.take();
        assert_eq!(first.keys().collect::<Vec<_>>(), ["eu", "us"]);
        assert_eq!((first["eu"].transactions, first["eu"].lag.total()), (1, 1));
        assert!(first["eu"].tables.contains_key(&("shop".into(), "orders".into(), RowsKind::Write)));
        assert!(first["us"].tables.contains_key(&("shop".into(), "users".into(), RowsKind::Write)));
        // us's transaction is open at the window's end: measured there.
        assert_eq!((first["us"].transactions, first["us"].lag.total()), (1, 1));
        assert_eq!((first["eu"].lost_events, first["us"].lost_events), (2, 0), "lost events go with the first channel");
        // Its XID in the next window is not a second sample.
        replication.apply(&event(2, EventClass::Xid, None, 0, 5));
        let second = replication.take();
        assert_eq!((second["us"].classes["xid"].events, second["us"].lag.total()), (1, 0));
    }
}
