//! A replica's windows merged over a range as the store reads them:
//! counts and apply times added, the lag's histogram merged bucket by
//! bucket (exact counts), and a timeline of at most 720 points.
use std::collections::BTreeMap;

use sqlbee_proto::v1::{
    AppliedClass, AppliedTable, Histogram, ReplicaAnswer, ReplicaDigest, ReplicaWindow, Replication, TopDigest,
};
use sqlbee_vocabulary::histogram;

use crate::store::{OrderBy, Store, StoreError, StoredReplication, TopQuery, merge::wire_histogram};

/// Applied digests a replica's answer lists.
pub const DIGESTS: usize = 20;

/// The digests `instance` applied as a replica (source `replica`), most
/// apply time first, each beside the same digest as clients ran it on the
/// instance that ran it most besides the replica (its primary, as far as
/// the store can tell): one read of the replica's rows, one per digest to
/// find where else it ran, and one for that instance's row.
pub fn digests(
    store: &dyn Store,
    instance: &str,
    since_unix_ms: i64,
    until_unix_ms: i64,
) -> Result<Vec<ReplicaDigest>, StoreError> {
    let query = TopQuery {
        instance: Some(instance.to_string()),
        digest: None,
        schema: None,
        nested: false,
        program: None,
        since_unix_ms,
        until_unix_ms,
        order_by: OrderBy::Total,
        limit: 10_000,
    };
    let applied: Vec<TopDigest> =
        store.top(&query)?.into_iter().filter(|d| d.source == "replica").take(DIGESTS).collect();
    let mut out = Vec::with_capacity(applied.len());
    for applied in applied {
        let of_digest =
            TopQuery { digest: Some(applied.digest), schema: Some(applied.schema.clone()), ..query.clone() };
        let client = |d: &TopDigest| d.source == "client";
        let everywhere = store.top(&TopQuery { instance: None, ..of_digest.clone() })?;
        let elsewhere: Vec<String> = everywhere
            .iter()
            .filter(|d| client(d))
            .flat_map(|d| d.instances.iter().filter(|i| *i != instance).cloned())
            .collect();
        let mut primary: Option<TopDigest> = None;
        for other in elsewhere.iter().take(4) {
            let row =
                store.top(&TopQuery { instance: Some(other.clone()), ..of_digest.clone() })?.into_iter().find(client);
            if let Some(mut row) = row.filter(|r| primary.as_ref().is_none_or(|p| r.count > p.count)) {
                row.instances = vec![other.clone()];
                primary = Some(row);
            }
        }
        out.push(ReplicaDigest { applied: Some(applied), primary });
    }
    Ok(out)
}

/// Timeline points per replica: past this, neighbouring windows merge
/// into one point, so a range of any length answers in a bounded size.
pub const MAX_TIMELINE: usize = 720;
/// (table, kind) pairs one merge names; the rest count under empty names,
/// as an agent's own overflow does.
pub const MAX_TABLES: usize = 10_000;

/// One answer per instance and channel (by name), each merged window by
/// window as the store hands them over, oldest first.
#[derive(Default)]
pub struct Answers {
    by_channel: BTreeMap<(String, String), (Merged, Timeline)>,
}

impl Answers {
    pub fn add(&mut self, w: StoredReplication) {
        let (merged, timeline) = self.by_channel.entry((w.instance, w.replication.channel.clone())).or_default();
        merged.add(&w.replication);
        timeline.add(ReplicaWindow {
            window_start_unix_ms: w.window_start_unix_ms,
            window_end_unix_ms: w.window_end_unix_ms,
            transactions: w.replication.transactions,
            lag_max_ns: w.replication.lag_max_ns,
            apply_ns: w.replication.classes.iter().map(|c| c.apply_ns).sum(),
        });
    }

    pub fn finish(self) -> Vec<ReplicaAnswer> {
        self.by_channel
            .into_iter()
            .map(|((instance, channel), (merged, timeline))| ReplicaAnswer {
                instance,
                totals: Some(merged.finish()),
                timeline: timeline.finish(),
                digests: Vec::new(),
                channel,
            })
            .collect()
    }
}

/// A replica's timeline, at most [`MAX_TIMELINE`] points of equally many
/// windows each (the last may hold fewer). Windows come oldest first.
struct Timeline {
    points: Vec<ReplicaWindow>,
    /// Windows per point, doubled each time the points are halved.
    width: usize,
    /// The point being filled, and how many windows it holds.
    filling: Option<(ReplicaWindow, usize)>,
}

impl Default for Timeline {
    fn default() -> Self {
        Timeline { points: Vec::new(), width: 1, filling: None }
    }
}

impl Timeline {
    fn add(&mut self, w: ReplicaWindow) {
        let (point, held) = match self.filling.take() {
            Some((point, held)) => (joined(point, &w), held + 1),
            None => (w, 1),
        };
        if held < self.width {
            self.filling = Some((point, held));
            return;
        }
        self.points.push(point);
        if self.points.len() == 2 * MAX_TIMELINE {
            self.halve();
        }
    }

    fn halve(&mut self) {
        self.points =
            std::mem::take(&mut self.points).chunks(2).map(|pair| pair[1..].iter().fold(pair[0], joined)).collect();
        self.width *= 2;
    }

    fn finish(mut self) -> Vec<ReplicaWindow> {
        self.points.extend(self.filling.take().map(|(point, _)| point));
        while self.points.len() > MAX_TIMELINE {
            self.halve();
        }
        self.points
    }
}

/// Two neighbouring points as one: `b` follows `a`.
fn joined(a: ReplicaWindow, b: &ReplicaWindow) -> ReplicaWindow {
    ReplicaWindow {
        window_start_unix_ms: a.window_start_unix_ms.min(b.window_start_unix_ms),
        window_end_unix_ms: a.window_end_unix_ms.max(b.window_end_unix_ms),
        transactions: a.transactions + b.transactions,
        lag_max_ns: a.lag_max_ns.max(b.lag_max_ns),
        apply_ns: a.apply_ns.saturating_add(b.apply_ns),
    }
}

/// Events, apply time and rows added up; rows stay known only while every
/// part knew them.
#[derive(Default)]
struct Totals {
    events: u64,
    apply_ns: u64,
    rows: Option<u64>,
    latency: histogram::Histogram,
}

impl Totals {
    fn add(&mut self, events: u64, apply_ns: u64, rows: Option<u64>, latency: Option<&Histogram>) {
        self.rows = match (self.events, self.rows, rows) {
            (0, _, rows) => rows,
            (_, Some(sum), Some(rows)) => Some(sum + rows),
            _ => None,
        };
        self.events += events;
        self.apply_ns += apply_ns;
        for b in latency.iter().flat_map(|h| &h.buckets) {
            self.latency.add_bucket(b.index as usize, b.count);
        }
    }

    fn latency(&self) -> Option<Histogram> {
        Some(wire_histogram(&self.latency))
    }
}

/// Windows' replication merged: exact counts, the lag's histogram merged
/// bucket by bucket. Over several instances for a table's total.
#[derive(Default)]
pub struct Merged {
    transactions: u64,
    lost_events: u64,
    lag_max_ns: u64,
    lag: histogram::Histogram,
    classes: BTreeMap<String, Totals>,
    tables: BTreeMap<(String, String, String), Totals>,
}

impl Merged {
    pub fn add(&mut self, r: &Replication) {
        self.transactions += r.transactions;
        self.lost_events += r.lost_events;
        self.lag_max_ns = self.lag_max_ns.max(r.lag_max_ns);
        for b in r.lag.iter().flat_map(|h| &h.buckets) {
            self.lag.add_bucket(b.index as usize, b.count);
        }
        for c in &r.classes {
            self.classes.entry(c.class.clone()).or_default().add(c.events, c.apply_ns, c.rows, c.latency.as_ref());
        }
        for t in &r.tables {
            let mut key = (t.schema.clone(), t.table.clone(), t.kind.clone());
            if self.tables.len() >= MAX_TABLES && !self.tables.contains_key(&key) {
                key = (String::new(), String::new(), t.kind.clone());
            }
            self.tables.entry(key).or_default().add(t.events, t.apply_ns, t.rows, t.latency.as_ref());
        }
    }

    pub fn finish(self) -> Replication {
        let classes = self
            .classes
            .into_iter()
            .map(|(class, t)| AppliedClass {
                latency: t.latency(),
                class,
                events: t.events,
                apply_ns: t.apply_ns,
                rows: t.rows,
            })
            .collect();
        // The tables that took the most apply time first.
        let mut tables: Vec<AppliedTable> = self
            .tables
            .into_iter()
            .map(|((schema, table, kind), t)| AppliedTable {
                latency: t.latency(),
                schema,
                table,
                kind,
                events: t.events,
                apply_ns: t.apply_ns,
                rows: t.rows,
            })
            .collect();
        tables.sort_by(|a, b| {
            b.apply_ns.cmp(&a.apply_ns).then_with(|| (&a.schema, &a.table).cmp(&(&b.schema, &b.table)))
        });
        Replication {
            channel: String::new(),
            transactions: self.transactions,
            lag: Some(wire_histogram(&self.lag)),
            lag_max_ns: self.lag_max_ns,
            classes,
            tables,
            lost_events: self.lost_events,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(instance: &str, start: i64, transactions: u64, lag_ns: &[u64], table_ns: u64) -> StoredReplication {
        let mut lag = histogram::Histogram::default();
        for ns in lag_ns {
            lag.record(*ns);
        }
        StoredReplication {
            instance: instance.into(),
            window_start_unix_ms: start,
            window_end_unix_ms: start + 1000,
            replication: Replication {
                transactions,
                lag: Some(wire_histogram(&lag)),
                lag_max_ns: lag_ns.iter().copied().max().unwrap_or(0),
                classes: vec![AppliedClass {
                    class: "rows".into(),
                    events: 2,
                    apply_ns: table_ns,
                    rows: Some(2),
                    latency: None,
                }],
                tables: vec![AppliedTable {
                    schema: "shop".into(),
                    table: "orders".into(),
                    kind: "update_rows".into(),
                    events: 2,
                    apply_ns: table_ns,
                    rows: Some(3),
                    latency: Some(wire_histogram(&{
                        let mut h = histogram::Histogram::default();
                        h.record(table_ns / 2);
                        h.record(table_ns / 2);
                        h
                    })),
                }],
                lost_events: 1,
                channel: String::new(),
            },
        }
    }

    fn answers(windows: Vec<StoredReplication>) -> Vec<ReplicaAnswer> {
        let mut answers = Answers::default();
        for w in windows {
            answers.add(w);
        }
        answers.finish()
    }

    #[test]
    fn windows_merge_per_instance_with_a_timeline() {
        let answers = answers(vec![
            window("a", 1000, 2, &[1_000_000, 1_000_000], 300),
            window("a", 2000, 3, &[1_000_000, 2_000_000, 48_000_000_000], 700),
            window("b", 2000, 1, &[5_000_000], 10),
        ]);
        assert_eq!(answers.iter().map(|a| a.instance.as_str()).collect::<Vec<_>>(), ["a", "b"]);
        let a = &answers[0];
        let totals = a.totals.as_ref().unwrap();
        assert_eq!(totals.transactions, 5);
        assert_eq!(totals.lag.as_ref().unwrap().buckets.iter().map(|b| b.count).sum::<u64>(), 5);
        assert_eq!(totals.lag_max_ns, 48_000_000_000);
        assert_eq!((totals.tables[0].events, totals.tables[0].apply_ns, totals.tables[0].rows), (4, 1000, Some(6)));
        let samples: u64 = totals.tables[0].latency.iter().flat_map(|h| &h.buckets).map(|b| b.count).sum();
        assert_eq!(samples, 4, "each event's apply time, merged");
        assert_eq!(a.timeline.iter().map(|w| w.window_start_unix_ms).collect::<Vec<_>>(), [1000, 2000]);
        assert_eq!(a.timeline[1].lag_max_ns, 48_000_000_000);
        assert_eq!(totals.lost_events, 2);
    }

    #[test]
    fn each_channel_is_an_answer_of_its_own() {
        let on = |channel: &str, transactions| {
            let mut w = window("a", 1000, transactions, &[1_000_000], 10);
            w.replication.channel = channel.into();
            w
        };
        let answers = answers(vec![on("", 1), on("eu", 2), on("us", 4), window("a", 2000, 8, &[], 0)]);
        let by_channel: Vec<(&str, u64)> =
            answers.iter().map(|a| (a.channel.as_str(), a.totals.as_ref().unwrap().transactions)).collect();
        assert_eq!(by_channel, [("", 9), ("eu", 2), ("us", 4)]);
    }

    #[test]
    fn a_long_range_answers_a_bounded_timeline_that_keeps_every_count() {
        let windows = 3 * MAX_TIMELINE as i64 + 5;
        let answers = answers(
            (0..windows)
                .map(|i| window("a", 1000 * i, 1, &[if i == 1234 { 60_000_000_000 } else { 1_000_000 }], 10))
                .collect(),
        );
        let timeline = &answers[0].timeline;
        assert!(timeline.len() <= MAX_TIMELINE && timeline.len() > MAX_TIMELINE / 2, "{}", timeline.len());
        assert_eq!(timeline.iter().map(|w| w.transactions).sum::<u64>(), windows as u64);
        assert_eq!(timeline.iter().map(|w| w.apply_ns).sum::<u64>(), 10 * windows as u64);
        // Points cover the range in order, without a gap or an overlap.
        assert_eq!(
            (timeline[0].window_start_unix_ms, timeline.last().unwrap().window_end_unix_ms),
            (0, 1000 * windows)
        );
        assert!(timeline.windows(2).all(|p| p[0].window_end_unix_ms == p[1].window_start_unix_ms));
        // The peak survives, in the point that holds its window.
        let peak = timeline.iter().find(|w| w.lag_max_ns == 60_000_000_000).unwrap();
        assert!(peak.window_start_unix_ms <= 1_234_000 && peak.window_end_unix_ms > 1_234_000);
        assert_eq!(answers[0].totals.as_ref().unwrap().transactions, windows as u64);
    }
}
