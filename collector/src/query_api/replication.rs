//! A replica's windows merged over a range: counts and apply times added,
//! the lag's histogram merged bucket by bucket (exact counts), and one
//! point per window for the timeline.
use std::collections::BTreeMap;

use sqlbee_proto::v1::{
    AppliedClass, AppliedTable, Bucket, Histogram, ReplicaAnswer, ReplicaDigest, ReplicaWindow, Replication, TopDigest,
};
use sqlbee_vocabulary::histogram;

use crate::store::{OrderBy, Store, StoreError, StoredReplication, TopQuery};

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

/// One answer per instance (by name), each with its windows oldest first.
pub fn answers(windows: Vec<StoredReplication>) -> Vec<ReplicaAnswer> {
    let mut by_instance: BTreeMap<String, Vec<StoredReplication>> = BTreeMap::new();
    for w in windows {
        by_instance.entry(w.instance.clone()).or_default().push(w);
    }
    by_instance
        .into_iter()
        .map(|(instance, mut windows)| {
            windows.sort_by_key(|w| w.window_start_unix_ms);
            let timeline = windows
                .iter()
                .map(|w| ReplicaWindow {
                    window_start_unix_ms: w.window_start_unix_ms,
                    window_end_unix_ms: w.window_end_unix_ms,
                    transactions: w.replication.transactions,
                    lag_max_ns: w.replication.lag_max_ns,
                    apply_ns: w.replication.classes.iter().map(|c| c.apply_ns).sum(),
                })
                .collect();
            let totals = merged(windows.iter().map(|w| &w.replication));
            ReplicaAnswer { instance, totals: Some(totals), timeline, digests: Vec::new() }
        })
        .collect()
}

/// Events, apply time and rows added up; rows stay known only while every
/// part knew them.
#[derive(Default)]
struct Totals {
    events: u64,
    apply_ns: u64,
    rows: Option<u64>,
}

impl Totals {
    fn add(&mut self, events: u64, apply_ns: u64, rows: Option<u64>) {
        self.rows = match (self.events, self.rows, rows) {
            (0, _, rows) => rows,
            (_, Some(sum), Some(rows)) => Some(sum + rows),
            _ => None,
        };
        self.events += events;
        self.apply_ns += apply_ns;
    }
}

fn merged<'a>(windows: impl Iterator<Item = &'a Replication>) -> Replication {
    let mut lag = histogram::Histogram::default();
    let mut out = Replication::default();
    let mut classes: BTreeMap<String, Totals> = BTreeMap::new();
    let mut tables: BTreeMap<(String, String, String), Totals> = BTreeMap::new();
    for r in windows {
        out.transactions += r.transactions;
        out.lag_max_ns = out.lag_max_ns.max(r.lag_max_ns);
        for b in r.lag.iter().flat_map(|h| &h.buckets) {
            lag.add_bucket(b.index as usize, b.count);
        }
        for c in &r.classes {
            classes.entry(c.class.clone()).or_default().add(c.events, c.apply_ns, c.rows);
        }
        for t in &r.tables {
            tables
                .entry((t.schema.clone(), t.table.clone(), t.kind.clone()))
                .or_default()
                .add(t.events, t.apply_ns, t.rows);
        }
    }
    out.lag = Some(Histogram {
        scheme: histogram::SCHEME,
        buckets: lag.buckets().map(|(index, count)| Bucket { index: index as u32, count }).collect(),
    });
    out.classes = classes
        .into_iter()
        .map(|(class, t)| AppliedClass { class, events: t.events, apply_ns: t.apply_ns, rows: t.rows })
        .collect();
    // The tables that took the most apply time first.
    let mut tables: Vec<AppliedTable> = tables
        .into_iter()
        .map(|((schema, table, kind), t)| AppliedTable {
            schema,
            table,
            kind,
            events: t.events,
            apply_ns: t.apply_ns,
            rows: t.rows,
        })
        .collect();
    tables.sort_by(|a, b| b.apply_ns.cmp(&a.apply_ns).then_with(|| (&a.schema, &a.table).cmp(&(&b.schema, &b.table))));
    out.tables = tables;
    out
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
                lag: Some(Histogram {
                    scheme: histogram::SCHEME,
                    buckets: lag.buckets().map(|(index, count)| Bucket { index: index as u32, count }).collect(),
                }),
                lag_max_ns: lag_ns.iter().copied().max().unwrap_or(0),
                classes: vec![AppliedClass { class: "rows".into(), events: 2, apply_ns: table_ns, rows: Some(2) }],
                tables: vec![AppliedTable {
                    schema: "shop".into(),
                    table: "orders".into(),
                    kind: "update_rows".into(),
                    events: 2,
                    apply_ns: table_ns,
                    rows: Some(3),
                }],
            },
        }
    }

    #[test]
    fn windows_merge_per_instance_with_a_timeline() {
        let answers = answers(vec![
            window("b", 2000, 1, &[5_000_000], 10),
            window("a", 2000, 3, &[1_000_000, 2_000_000, 48_000_000_000], 700),
            window("a", 1000, 2, &[1_000_000, 1_000_000], 300),
        ]);
        assert_eq!(answers.iter().map(|a| a.instance.as_str()).collect::<Vec<_>>(), ["a", "b"]);
        let a = &answers[0];
        let totals = a.totals.as_ref().unwrap();
        assert_eq!(totals.transactions, 5);
        assert_eq!(totals.lag.as_ref().unwrap().buckets.iter().map(|b| b.count).sum::<u64>(), 5);
        assert_eq!(totals.lag_max_ns, 48_000_000_000);
        assert_eq!((totals.tables[0].events, totals.tables[0].apply_ns, totals.tables[0].rows), (4, 1000, Some(6)));
        assert_eq!(a.timeline.iter().map(|w| w.window_start_unix_ms).collect::<Vec<_>>(), [1000, 2000]);
        assert_eq!(a.timeline[1].lag_max_ns, 48_000_000_000);
    }
}
