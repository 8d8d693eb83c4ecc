//! The ClickHouse store against a private clickhouse-server (one per test
//! process, a fresh database per store; see `xtask::clickhouse`): the
//! SQLite store's semantics, exactly-once under a kill between inserts
//! and under two collectors storing one batch at once, a server stopped
//! and started again under a store, and every statement the store sends
//! replayed on current ClickHouse (chdb, see `xtask::chdb`).
use std::sync::Arc;

use sqlbee_proto::v1::{
    AgentCost, AgentIdentity, AgentWindow, Blocker, Bucket, CommandCount, ErrorCount, Gap, Histogram, HostMetrics,
    InstanceWindow, LockWait, ProbeCost, ProcessMetrics, ServerInstance, WaitStats,
};
use xtask::clickhouse::{PASSWORD, PASSWORD_USER, for_test};

use super::{ClickHouseStore, Location, SCHEMA_VERSION, rollups, write};
use crate::store::{rollup::HOUR_MS as HOUR, *};

trait Put {
    fn put(&self, batch: &Batch, received_unix_ms: i64) -> Result<IngestOutcome, StoreError>;
}

impl Put for ClickHouseStore {
    fn put(&self, batch: &Batch, received_unix_ms: i64) -> Result<IngestOutcome, StoreError> {
        self.ingest(batch.clone(), received_unix_ms, content_hash(batch))
    }
}

/// A store on a fresh database, or None (the test skips, saying why).
fn store(test: &str) -> Option<(ClickHouseStore, Location)> {
    let server = for_test(test)?;
    let database = server.fresh_database(test);
    let location = Location::parse(&server.location(&database)["clickhouse:".len()..]).expect("a location");
    Some((ClickHouseStore::open(&location).expect("opening the store"), location))
}

pub(super) fn batch(sequence: u64, end: i64, buckets: &[(u32, u64)]) -> Batch {
    let count = buckets.iter().map(|b| b.1).sum();
    Batch {
        agent: Some(AgentIdentity { host: "h".into(), agent_id: "a".into(), version: "v".into() }),
        sequence,
        created_unix_ms: end,
        epoch: 0,
        content_hash: 0,
        windows: vec![InstanceWindow {
            instance: Some(ServerInstance {
                name: "h:1".into(),
                pid: sequence as u32,
                start_time_unix_ms: 0,
                ..Default::default()
            }),
            window_start_unix_ms: end - 10,
            window_end_unix_ms: end,
            digests: vec![sqlbee_proto::v1::DigestStats {
                digest: u64::MAX - 1,
                digest_text: "SELECT ?".into(),
                count,
                sum_ns: u64::MAX / 2 + 10,
                min_ns: 1,
                max_ns: u64::MAX / 4,
                histogram: Some(Histogram {
                    scheme: 1,
                    buckets: buckets.iter().map(|&(index, count)| Bucket { index, count }).collect(),
                }),
                ..Default::default()
            }],
            commands: vec![CommandCount { command: "COM_QUERY".into(), count }],
            statements: count,
            ..Default::default()
        }],
        gaps: vec![Gap { first_sequence: 1, last_sequence: 1, lost_statements: 5, ..Default::default() }],
        agent_windows: vec![],
    }
}

pub(super) fn everything(since: i64) -> TopQuery {
    TopQuery {
        instance: None,
        digest: None,
        schema: None,
        nested: false,
        program: None,
        since_unix_ms: since,
        until_unix_ms: i64::MAX,
        order_by: OrderBy::Total,
        limit: 20,
    }
}

#[test]
fn locations_parse_and_never_show_a_password_file_s_content() {
    let l = Location::parse("//db.example:8123/sqlbee?user=u&password_file=/run/pw&tls=1&ca=/etc/ca.pem").unwrap();
    assert_eq!(
        (l.nodes[0].as_str(), l.database.as_str(), l.user.as_deref(), l.tls),
        ("db.example:8123", "sqlbee", Some("u"), true)
    );
    assert_eq!(l.shown(), "clickhouse://db.example:8123/sqlbee");
    let c = Location::parse("//a:1,b:2/sqlbee?cluster=prod_1").unwrap();
    assert_eq!((c.nodes.len(), c.cluster.as_deref()), (2, Some("prod_1")));
    assert_eq!(c.shown(), "clickhouse://a:1,b:2/sqlbee?cluster=prod_1");
    for bad in [
        "//h:1,/db",
        "//h:1,h/db",
        "//h:1/db?cluster=a-b",
        "//h:1/db?cluster=",
        "//h:1/",
        "//h/db",
        "//h:1/d-b",
        "//h:1/db?password=x",
        "h:1/db",
        "//h:1/1db",
        "//h:x/db",
    ] {
        assert!(Location::parse(bad).is_none(), "{bad}");
    }
    assert!(matches!(open("clickhouse://h:1/a?password=secret"), Err(StoreError::Location { .. })));
}

#[test]
fn once_merged_and_pruned() {
    let Some((store, _)) = store("once") else { return };
    assert!(!store.put(&batch(2, 1000, &[(10, 2), (40, 1)]), 1000).unwrap().duplicate);
    assert!(store.put(&batch(2, 1000, &[(10, 2), (40, 1)]), 1001).unwrap().duplicate);
    assert!(!store.put(&batch(3, 2000, &[(40, 1), (60, 1)]), 2000).unwrap().duplicate);
    let changed = batch(3, 2000, &[(40, 2)]);
    assert!(matches!(store.put(&changed, 2001), Err(StoreError::Conflict { sequence: 3, .. })));
    let query = TopQuery { order_by: OrderBy::P99, ..everything(0) };
    let top = store.top(&query).unwrap();
    assert_eq!(top.len(), 1);
    let d = &top[0];
    // u64 values above i64::MAX come back exact; the sum saturates.
    assert_eq!((d.digest, d.count, d.sum_ns, d.max_ns), (u64::MAX - 1, 5, u64::MAX, u64::MAX / 4));
    assert_eq!(d.p50_ns, sqlbee_vocabulary::histogram::bucket_high(40));
    assert_eq!(d.p99_ns, sqlbee_vocabulary::histogram::bucket_high(60));
    assert_eq!(d.digest_text, "SELECT ?");
    let totals = store
        .totals(&TotalsQuery { instance: Some("h:1".into()), since_unix_ms: 1500, until_unix_ms: i64::MAX })
        .unwrap();
    assert_eq!((totals.statements, totals.digest_count, totals.lost_statements), (2, 1, 0));
    let totals = store.totals(&TotalsQuery { instance: None, since_unix_ms: 0, until_unix_ms: i64::MAX }).unwrap();
    assert_eq!((totals.statements, totals.commands[0].count, totals.lost_statements), (5, 5, 5));
    // The end of the range is exclusive.
    let before = store.totals(&TotalsQuery { instance: None, since_unix_ms: 0, until_unix_ms: 2000 }).unwrap();
    assert_eq!(before.statements, 3);
    assert_eq!(store.top(&TopQuery { until_unix_ms: 2000, ..everything(0) }).unwrap()[0].count, 3);
    let instances = store.instances().unwrap();
    assert_eq!((instances[0].pid, instances[0].batches, instances[0].gaps), (3, 2, 1));
    assert_eq!(
        (instances[0].host.as_str(), instances[0].last_sequence, instances[0].last_seen_unix_ms),
        ("h", 3, 2000)
    );
    let pruned = store.prune(&PruneCutoffs::all(1500)).unwrap();
    assert_eq!((pruned.digest_windows, pruned.instance_windows, pruned.batches), (1, 1, 1));
    assert_eq!(store.top(&query).unwrap()[0].count, 2);
}

/// `batch` plus what the agent measured (see the SQLite store's tests).
pub(super) fn costed(sequence: u64, end: i64, agent_cpu: f64, shedding: &str) -> Batch {
    let mut b = batch(sequence, end, &[(10, 2)]);
    let w = &mut b.windows[0];
    w.probes = Some(ProbeCost {
        attached_fraction: 0.5,
        probe_cpu_seconds: 0.002,
        extra_cores_per_10k_qps: 0.3,
        estimated_statements: 4,
        ..Default::default()
    });
    w.process =
        Some(ProcessMetrics { pid: 7, status: "running".into(), rss_bytes: Some(5 << 20), ..Default::default() });
    w.aggregated_in_kernel = 1;
    w.digests[0].estimated_count = 4;
    b.agent_windows = vec![AgentWindow {
        window_start_unix_ms: end - 10,
        window_end_unix_ms: end,
        cost: Some(AgentCost {
            cpu_cores: agent_cpu,
            rss_bytes: sequence << 20,
            shedding: shedding.into(),
            ..Default::default()
        }),
        host: Some(HostMetrics { load1: sequence as f64, ..Default::default() }),
        untraced: Vec::new(),
    }];
    b
}

#[test]
fn costs_hosts_and_latest() {
    let Some((store, _)) = store("costs") else { return };
    store.put(&costed(1, 1000, 0.5, "exact"), 1000).unwrap();
    store.put(&costed(2, 2000, 1.5, "no-samples"), 2000).unwrap();
    let all = TotalsQuery { instance: None, since_unix_ms: 0, until_unix_ms: i64::MAX };
    let costs = store.costs(&all).unwrap();
    assert_eq!(costs.len(), 1, "{costs:?}");
    let c = &costs[0];
    assert_eq!((c.windows, c.statements, c.shedding_windows), (2, 4, 1));
    assert!((c.agent_cpu_seconds - 0.02).abs() < 1e-9, "{c:?}");
    assert!((c.agent_cores_per_10k_qps - 0.02 / 4.0 * 1e4).abs() < 1e-6, "{c:?}");
    assert!((c.server_extra_cores_per_10k_qps - 0.004 / 8.0 * 1e4).abs() < 1e-6, "{c:?}");
    assert_eq!((c.agent_max_rss_bytes, c.latest_shedding.as_str(), c.host.as_str()), (2 << 20, "no-samples", "h"));
    let other = TotalsQuery { instance: Some("elsewhere:1".into()), since_unix_ms: 0, until_unix_ms: i64::MAX };
    assert!(store.costs(&other).unwrap().is_empty());

    let top = store.top(&everything(0)).unwrap();
    assert_eq!((top[0].count, top[0].estimated_count), (4, 8));

    let instances = store.instances().unwrap();
    let latest = instances[0].latest.as_ref().expect("a cost");
    assert_eq!(
        (latest.window_end_unix_ms, latest.agent_cpu_cores, latest.shedding.as_str()),
        (2000, 1.5, "no-samples")
    );
    assert_eq!((latest.attached_fraction, latest.aggregated_in_kernel), (0.5, 1));
    assert_eq!(latest.server.as_ref().and_then(|p| p.rss_bytes), Some(5 << 20));

    let hosts = store.hosts(&HostsQuery { host: None, since_unix_ms: 1500, limit: 10 }).unwrap();
    assert_eq!(hosts.len(), 1);
    assert_eq!(hosts[0].window.as_ref().and_then(|w| w.host.as_ref()).map(|h| h.load1), Some(2.0));
    assert!(store.hosts(&HostsQuery { host: Some("other".into()), since_unix_ms: 0, limit: 10 }).unwrap().is_empty());
    assert_eq!(store.hosts(&HostsQuery { host: Some("h".into()), since_unix_ms: 0, limit: 10 }).unwrap().len(), 2);

    let series = store
        .series(&SeriesQuery {
            of: SeriesOf::Cost,
            instance: None,
            schema: None,
            since_unix_ms: 0,
            until_unix_ms: 3000,
            step_ms: 1000,
        })
        .unwrap();
    assert_eq!(series.iter().map(|p| p.windows).collect::<Vec<_>>(), vec![0, 1, 1]);
    assert!((series[1].agent_cpu_cores - 0.5 * 0.01).abs() < 1e-9, "{series:?}");
    assert_eq!(series[2].agent_max_rss_bytes, 2 << 20);

    let pruned = store.prune(&PruneCutoffs::all(1500)).unwrap();
    assert_eq!((pruned.agent_windows, pruned.instance_windows), (1, 1));
    assert_eq!(store.costs(&all).unwrap()[0].windows, 1);
}

fn wait(class: &str, sum_ns: u64, max_ns: u64, statements: u64) -> WaitStats {
    WaitStats { class: class.into(), sum_ns, max_ns, statements }
}

fn error(code: u32, count: u64, message: &str) -> ErrorCount {
    ErrorCount { code, count, sample_message: message.into() }
}

fn waiting(sequence: u64, instance: &str, end: i64, waits: Vec<WaitStats>, errors: Vec<ErrorCount>) -> Batch {
    let mut b = batch(sequence, end, &[(10, 5)]);
    let w = &mut b.windows[0];
    w.instance.as_mut().unwrap().name = instance.into();
    let d = &mut w.digests[0];
    d.digest = 7;
    d.sum_ns = 1_000_000;
    d.max_ns = 500_000;
    d.errors = errors.iter().map(|e| e.count).sum();
    d.waits = waits;
    d.error_codes = errors;
    b.gaps.clear();
    b
}

#[test]
fn waits_and_error_codes_merge() {
    let Some((store, _)) = store("waits") else { return };
    let first = waiting(
        1,
        "h:1",
        1000,
        vec![wait("row_lock", 300, 200, 2), wait("disk_io", 40, 30, 1)],
        vec![error(1213, 1, "Deadlock (old)"), error(1062, 1, "Duplicate entry"), error(1213, 1, "")],
    );
    let second = waiting(
        2,
        "h:2",
        2000,
        vec![wait("row_lock", 500, 450, 1), wait("some_new_class", 7, 7, 1)],
        vec![error(1213, 1, "Deadlock found when trying to get lock")],
    );
    store.put(&second, 2000).unwrap();
    store.put(&first, 2001).unwrap();
    store.put(&waiting(3, "h:1", 3000, vec![], vec![]), 3000).unwrap();
    let query = everything(0);
    let d = store.top(&query).unwrap().into_iter().find(|d| d.digest == 7).unwrap();
    assert_eq!(d.count, 15);
    assert_eq!(d.instances, vec!["h:1".to_string(), "h:2".to_string()]);
    assert_eq!(
        d.waits,
        vec![wait("row_lock", 800, 450, 3), wait("disk_io", 40, 30, 1), wait("some_new_class", 7, 7, 1)]
    );
    assert_eq!(
        d.error_codes,
        vec![error(1213, 3, "Deadlock found when trying to get lock"), error(1062, 1, "Duplicate entry")]
    );
    let only = TopQuery { instance: Some("h:1".into()), ..query.clone() };
    let d = store.top(&only).unwrap().remove(0);
    assert_eq!(d.waits, vec![wait("row_lock", 300, 200, 2), wait("disk_io", 40, 30, 1)]);
    assert_eq!(d.error_codes[0].count, 2);

    store.put(&waiting(4, "h:1", 3000, vec![wait("commit", 10_000, 10_000, 1)], vec![]), 3000).unwrap();
    let mut other = waiting(5, "h:1", 3000, vec![], vec![]);
    other.windows[0].digests[0].digest = 8;
    store.put(&other, 3000).unwrap();
    let by_wait = store.top(&TopQuery { order_by: OrderBy::Wait, ..query.clone() }).unwrap();
    assert_eq!(by_wait.iter().map(|d| d.digest).collect::<Vec<_>>(), vec![7, 8]);
    assert_eq!(by_wait[0].waits[0], wait("commit", 10_000, 10_000, 1));
    // Every order key answers, ties by digest.
    for key in OrderBy::NAMES {
        let top = store.top(&TopQuery { order_by: OrderBy::parse(key).unwrap(), ..query.clone() }).unwrap();
        assert_eq!(top.len(), 2, "{key}");
    }

    let pruned = store.prune(&PruneCutoffs::all(1500)).unwrap();
    assert_eq!(pruned.error_samples, 1);
    let d = store.top(&query).unwrap().into_iter().find(|d| d.digest == 7).unwrap();
    assert_eq!(d.error_codes, vec![error(1213, 1, "Deadlock found when trying to get lock")]);
}

fn lock_wait(start: i64, connection_id: u64, blockers: Vec<Blocker>) -> LockWait {
    LockWait {
        start_unix_ms: start,
        duration_ns: u64::MAX - 3,
        class: "row_lock".into(),
        connection_id,
        digest: u64::MAX - 5,
        digest_text: "UPDATE t SET a = ? WHERE id = ?".into(),
        sample: "UPDATE t SET a = 1 WHERE id = 'it''s'".into(),
        blocker_kind: "candidates".into(),
        blockers,
    }
}

#[test]
fn lock_waits_newest_first_filtered_and_pruned() {
    let Some((store, _)) = store("locks") else { return };
    let blocker = Blocker {
        connection_id: u64::MAX,
        transaction: true,
        started_unix_ms: 900,
        statements: vec!["SELECT * FROM t WHERE id = ? FOR UPDATE".into(), "UPDATE t SET b = ?".into()],
    };
    let mut b = batch(1, 2000, &[(10, 1)]);
    b.windows[0].lock_waits = vec![lock_wait(1000, 1, vec![blocker.clone()]), lock_wait(1500, 2, vec![])];
    let mut other = batch(2, 2000, &[(10, 1)]);
    other.windows[0].instance.as_mut().unwrap().name = "h'2".into();
    other.windows[0].lock_waits = vec![lock_wait(1200, 3, vec![])];
    store.put(&b, 2000).unwrap();
    store.put(&other, 2000).unwrap();
    store.put(&b, 2001).unwrap();
    let all = LocksQuery { instance: None, since_unix_ms: 0, limit: 100 };
    let rows = store.locks(&all).unwrap();
    let ids: Vec<u64> = rows.iter().map(|r| r.wait.as_ref().unwrap().connection_id).collect();
    assert_eq!(ids, vec![2, 3, 1]);
    assert_eq!((rows[1].instance.as_str(), rows[1].agent_id.as_str()), ("h'2", "a"));
    assert_eq!(rows[2].wait, Some(lock_wait(1000, 1, vec![blocker])));
    // A quote in a filter is bound, not spliced.
    assert_eq!(store.locks(&LocksQuery { instance: Some("h'2".into()), ..all.clone() }).unwrap().len(), 1);
    assert_eq!(store.locks(&LocksQuery { instance: Some("h:1".into()), ..all.clone() }).unwrap().len(), 2);
    assert_eq!(store.locks(&LocksQuery { since_unix_ms: 1200, ..all.clone() }).unwrap().len(), 2);
    assert_eq!(store.locks(&LocksQuery { limit: 1, ..all.clone() }).unwrap().len(), 1);
    assert_eq!(store.prune(&PruneCutoffs::all(1300)).unwrap().lock_waits, 2);
    assert_eq!(store.locks(&all).unwrap().len(), 1);
}

/// A collector killed between the data rows and the batch record leaves
/// rows no record vouches for: they never count, and the agent's retry
/// is stored as new.
#[test]
fn a_kill_between_inserts_counts_nothing_and_the_retry_counts_once() {
    let Some((store, _)) = store("kill") else { return };
    let b = batch(1, 1000, &[(10, 3)]);
    write::data_rows(&store.db, &b, write::new_ingest_id(1), 1000).unwrap();
    assert!(store.top(&everything(0)).unwrap().is_empty());
    assert_eq!(
        store.totals(&TotalsQuery { instance: None, since_unix_ms: 0, until_unix_ms: i64::MAX }).unwrap().statements,
        0
    );
    assert!(!store.put(&b, 1001).unwrap().duplicate);
    assert_eq!(store.top(&everything(0)).unwrap()[0].count, 3);
    // Killed after the record, before the answer: the retry is a duplicate.
    assert!(store.put(&b, 1002).unwrap().duplicate);
    let totals = store.totals(&TotalsQuery { instance: None, since_unix_ms: 0, until_unix_ms: i64::MAX }).unwrap();
    assert_eq!((totals.statements, totals.lost_statements), (3, 5));
    assert_eq!(store.instances().unwrap()[0].batches, 1);
}

/// Two attempts that both got their record in (a race the look-up before
/// writing cannot see): only the smaller ingest_id's rows count, whatever
/// order the records arrived in.
#[test]
fn two_records_of_one_batch_count_once() {
    let Some((store, _)) = store("race") else { return };
    let b = batch(1, 1000, &[(10, 3)]);
    let hash = content_hash(&b);
    let (small, large) = (write::new_ingest_id(5), write::new_ingest_id(9));
    write::data_rows(&store.db, &b, large, 1000).unwrap();
    write::record(&store.db, &b, large, 1000, hash).unwrap();
    write::data_rows(&store.db, &b, small, 1000).unwrap();
    write::record(&store.db, &b, small, 1000, hash).unwrap();
    let d = store.top(&everything(0)).unwrap().remove(0);
    assert_eq!(d.count, 3);
    let locks_and_gaps =
        store.totals(&TotalsQuery { instance: None, since_unix_ms: 0, until_unix_ms: i64::MAX }).unwrap();
    assert_eq!((locks_and_gaps.statements, locks_and_gaps.lost_statements), (3, 5));
    assert!(store.put(&b, 1001).unwrap().duplicate);
}

/// Real collectors, one database: every thread stores every batch at the
/// same time; each batch counts exactly once.
#[test]
fn collectors_sharing_a_database_store_each_batch_once() {
    let Some((first, location)) = store("shared") else { return };
    let stores: Vec<Arc<ClickHouseStore>> = std::iter::once(Arc::new(first))
        .chain((0..3).map(|_| Arc::new(ClickHouseStore::open(&location).unwrap())))
        .collect();
    let batches: Vec<Batch> = (1..=6).map(|n| batch(n, 1000 * n as i64, &[(10, n), (20, 1)])).collect();
    let threads: Vec<_> = stores
        .iter()
        .map(|store| {
            let store = store.clone();
            let batches = batches.clone();
            std::thread::spawn(move || {
                batches.iter().map(|b| store.put(b, 10_000).unwrap().duplicate).filter(|d| !d).count()
            })
        })
        .collect();
    let stored: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
    assert!(stored >= batches.len(), "each batch is new to at least one collector: {stored}");
    let d = stores[0].top(&everything(0)).unwrap().remove(0);
    assert_eq!(d.count, (1..=6).map(|n| n + 1).sum::<u64>());
    assert_eq!(stores[1].instances().unwrap()[0].batches, 6);
}

/// Batches pushed at once are written in groups, and each still gets its
/// own outcome: distinct batches stored, a replay of one a duplicate, other
/// content under one identity a conflict, and the counts exact.
#[test]
fn concurrent_batches_are_written_in_groups_each_with_its_own_outcome() {
    let Some((store, _)) = store("groups") else { return };
    let store = Arc::new(store);
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            let store = store.clone();
            std::thread::spawn(move || {
                let mut outcomes = Vec::new();
                for k in 0..10 {
                    outcomes.push(store.put(&batch(t * 10 + k + 1, 1000 + k as i64, &[(10, 1)]), 1000));
                }
                outcomes.push(store.put(&batch(1000, 5000, &[(10, 2)]), 5000));
                outcomes.push(store.put(&batch(2000, 6000, &[(10, t + 1)]), 6000));
                outcomes
            })
        })
        .collect();
    let (mut stored, mut duplicates, mut conflicts) = (0, 0, 0);
    for t in threads {
        for outcome in t.join().unwrap() {
            match outcome {
                Ok(o) if o.duplicate => duplicates += 1,
                Ok(_) => stored += 1,
                Err(StoreError::Conflict { sequence: 2000, .. }) => conflicts += 1,
                Err(e) => panic!("{e}"),
            }
        }
    }
    assert_eq!((stored, duplicates, conflicts), (82, 7, 7));
    let top = store.top(&everything(0)).unwrap();
    // 80 batches of 1, the replayed batch's 2, and one content of the
    // conflicting batch (1 to 8 statements).
    assert!((83..=90).contains(&top[0].count), "{top:?}");
    let won = top[0].count - 82;
    let instances = store.instances().unwrap();
    assert_eq!(instances[0].batches, 82);
    let totals = store.totals(&TotalsQuery { instance: None, since_unix_ms: 6000, until_unix_ms: 6001 }).unwrap();
    assert_eq!(totals.statements, won);
}

#[test]
fn series_have_one_point_per_step_with_merged_percentiles() {
    let Some((store, _)) = store("series") else { return };
    store.put(&batch(1, 1500, &[(10, 2)]), 1500).unwrap();
    store.put(&batch(2, 1700, &[(40, 1)]), 1700).unwrap();
    let mut other = batch(3, 3500, &[(60, 1)]);
    other.windows[0].digests[0].digest = 9;
    store.put(&other, 3500).unwrap();
    let query = SeriesQuery {
        of: SeriesOf::Statements,
        instance: None,
        schema: None,
        since_unix_ms: 1000,
        until_unix_ms: 4000,
        step_ms: 1000,
    };
    let points = store.series(&query).unwrap();
    assert_eq!(
        points.iter().map(|p| (p.start_unix_ms, p.count)).collect::<Vec<_>>(),
        vec![(1000, 3), (2000, 0), (3000, 1)]
    );
    assert_eq!(points[0].p99_ns, sqlbee_vocabulary::histogram::bucket_high(40));
    assert_eq!(points[0].p50_ns, sqlbee_vocabulary::histogram::bucket_high(10));
    assert_eq!(points[0].histogram.as_ref().unwrap().buckets.len(), 2);
    let one = store.series(&SeriesQuery { of: SeriesOf::Digest(9), ..query.clone() }).unwrap();
    assert_eq!(one.iter().map(|p| p.count).collect::<Vec<_>>(), vec![0, 0, 1]);
    let elsewhere = store.series(&SeriesQuery { instance: Some("h:9".into()), ..query }).unwrap();
    assert!(elsewhere.iter().all(|p| p.count == 0));
}

#[test]
fn series_split_by_instance_add_up_to_the_fleet() {
    let Some((store, _)) = store("series-by-instance") else { return };
    shared_tests::series_split_by_instance_add_up_to_the_fleet(&store, batch);
}

#[test]
fn series_split_by_digest_match_filtered_reads() {
    let Some((store, _)) = store("series-by-digest") else { return };
    shared_tests::series_split_by_digest_match_filtered_reads(&store, batch);
}

#[test]
fn error_messages_are_kept_per_instance() {
    let Some((store, _)) = store("messages") else { return };
    shared_tests::error_messages_are_kept_per_instance(&store, batch);
}

#[test]
fn plans_merge_sightings_and_list_changes() {
    let Some((store, _)) = store("plans") else { return };
    shared_tests::plans_merge_sightings_and_list_changes(&store, batch);
}

#[test]
fn tags_and_exemplars_merge_over_windows() {
    let Some((store, _)) = store("tags") else { return };
    shared_tests::tags_and_exemplars_merge_over_windows(&store, batch);
}

#[test]
fn long_statements_newest_first_once_and_pruned() {
    let Some((store, _)) = store("long") else { return };
    shared_tests::long_statements_newest_first_once_and_pruned(&store, batch);
}

#[test]
fn replication_windows_read_once_per_window() {
    let Some((store, _)) = store("replication") else { return };
    shared_tests::replication_windows_read_once_per_window(&store, batch);
}

#[test]
fn table_indexes_keep_the_newest_reading() {
    let Some((store, _)) = store("table_indexes") else { return };
    shared_tests::table_indexes_keep_the_newest_reading(&store, batch);
}

#[test]
fn export_marks_read_back_the_furthest() {
    let Some((store, _)) = store("export_marks") else { return };
    shared_tests::export_marks_read_back_the_furthest(&store);
}

#[test]
fn markers_and_events_keep_their_newest_version() {
    let Some((store, _)) = store("events") else { return };
    shared_tests::markers_and_events_keep_their_newest_version(&store);
}

#[test]
fn latest_cost_takes_each_agents_nearest_window() {
    let Some((store, _)) = store("latest") else { return };
    shared_tests::latest_cost_takes_each_agents_nearest_window(&store, costed);
}

#[test]
fn a_newer_database_is_refused_and_a_password_never_shows() {
    let Some((store, location)) = store("version") else { return };
    store.db.execute(&format!("INSERT INTO schema_version VALUES ({}, 0)", SCHEMA_VERSION + 1)).unwrap();
    let found = SCHEMA_VERSION as i64 + 1;
    assert!(matches!(
        ClickHouseStore::open(&location),
        Err(StoreError::Version { found: f, .. }) if f == found
    ));

    let dir = std::env::temp_dir().join(format!("sqlbee-ch-pw-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let good = dir.join("good");
    let wrong = dir.join("wrong");
    std::fs::write(&good, format!("{PASSWORD}\n")).unwrap();
    std::fs::write(&wrong, "wrong-secret-123\n").unwrap();
    let with = |file: &std::path::Path| Location {
        database: format!("{}_pw", location.database),
        user: Some(PASSWORD_USER.into()),
        password_file: Some(file.to_path_buf()),
        ..location.clone()
    };
    let store = ClickHouseStore::open(&with(&good)).expect("the right password opens the store");
    store.put(&batch(1, 1000, &[(10, 1)]), 1000).unwrap();
    let refused = ClickHouseStore::open(&with(&wrong)).err().expect("a wrong password is refused");
    let shown = format!("{refused} {refused:?}");
    assert!(!shown.contains("wrong-secret-123") && !shown.contains(PASSWORD), "{shown}");
    let _ = std::fs::remove_dir_all(dir);
}

/// ClickHouse stopped under a store: writes and reads fail with the
/// cause named, as UNAVAILABLE, which agents retry; started again on its
/// data, the same store goes on, the batch that failed is stored once.
#[test]
fn a_stopped_clickhouse_is_unavailable_and_the_store_goes_on_when_it_is_back() {
    let test = "a_stopped_clickhouse_is_unavailable_and_the_store_goes_on_when_it_is_back";
    let Some(server) = xtask::clickhouse::private_for_test(test) else { return };
    let location = Location::parse(&server.location("sqlbee_stopped")["clickhouse:".len()..]).unwrap();
    let store = ClickHouseStore::open(&location).unwrap();
    store.put(&batch(1, 1000, &[(10, 2)]), 1000).unwrap();
    server.stop().unwrap();
    let unavailable = |result: Result<(), StoreError>, what: &str| {
        let status = crate::store_task::status(result.expect_err(what));
        assert_eq!(status.code(), tonic::Code::Unavailable, "{what}: {status:?}");
        assert!(status.message().contains("cannot reach ClickHouse"), "{what}: {status:?}");
    };
    unavailable(store.put(&batch(2, 2000, &[(10, 3)]), 2000).map(drop), "an ingest with ClickHouse stopped");
    unavailable(store.top(&everything(0)).map(drop), "a top with ClickHouse stopped");
    unavailable(store.prune(&PruneCutoffs::all(0)).map(drop), "a prune with ClickHouse stopped");
    server.start().unwrap();
    assert!(!store.put(&batch(2, 2000, &[(10, 3)]), 2001).unwrap().duplicate);
    assert!(store.put(&batch(1, 1000, &[(10, 2)]), 2002).unwrap().duplicate);
    assert_eq!(store.top(&everything(0)).unwrap()[0].count, 5);
}

/// A batch with a row for every table: digests with waits, error codes,
/// the server's figures and accounts, a nested program's statement, a lock
/// wait with blockers, an agent window with its cost, host and an
/// untraced server, and a gap.
pub(super) fn every_kind_of_row(sequence: u64, end: i64) -> Batch {
    let mut b = costed(sequence, end, 0.5, "exact");
    let w = &mut b.windows[0];
    let d = &mut w.digests[0];
    d.schema = "app".into();
    d.waits = vec![wait("row_lock", 300, 200, 2)];
    d.error_codes = vec![error(1213, 1, "Deadlock found when trying to get lock")];
    d.errors = 1;
    d.stats = Some(sqlbee_proto::v1::QueryStats {
        rows_examined: Some(40),
        cpu_ns: Some(9000),
        tmp_disk_tables: Some(1),
        ..Default::default()
    });
    d.accounts = vec![sqlbee_proto::v1::AccountCount { user: "app".into(), host: "10.0.0.%".into(), count: 2 }];
    d.tags = vec![sqlbee_proto::v1::TagCount {
        key: "controller".into(),
        values: vec![sqlbee_proto::v1::TagValue { value: format!("c{}", sequence % 2), count: 1 }],
        other: 1,
    }];
    d.clients = vec![sqlbee_proto::v1::ClientCount {
        process: format!("worker-{}", sequence % 2),
        pid: 40,
        address: "10.0.0.7".into(),
        count: 2,
        ..Default::default()
    }];
    d.exemplar = Some(sqlbee_proto::v1::TraceExemplar {
        trace_id: format!("{:032x}", sequence + 1),
        span_id: format!("{:016x}", sequence + 1),
        duration_ns: d.max_ns - sequence % 2,
    });
    d.statement_kind = "SELECT".into();
    d.tables = vec![sqlbee_proto::v1::TableUse { schema: "app".into(), table: "t".into(), write: false }];
    w.plans = vec![sqlbee_proto::v1::Plan {
        digest: d.digest,
        schema: "app".into(),
        explained_unix_ms: end - 3,
        plan_hash: 22,
        previous_plan_hash: 11,
        access: vec![sqlbee_proto::v1::TableAccess { table: "t".into(), r#type: "ALL".into(), ..Default::default() }],
        plan_json: "{\"query_block\": {}}".into(),
        ..Default::default()
    }];
    w.server_login = "ok".into();
    w.table_indexes = vec![sqlbee_proto::v1::TableIndexes {
        schema: "app".into(),
        table: "t".into(),
        read_unix_ms: end - 3,
        indexes: vec![sqlbee_proto::v1::IndexDefinition {
            name: "k'idx".into(),
            columns: vec![sqlbee_proto::v1::IndexColumn { name: "k".into(), prefix: 8 }],
            unique: false,
            r#type: "BTREE".into(),
            ignored: false,
            rows_read: None,
        }],
        missing: false,
    }];
    let mut nested = d.clone();
    nested.digest = 11;
    nested.digest_text = "UPDATE t SET a = ?".into();
    nested.nested = true;
    nested.program = "app.p".into();
    nested.program_kind = "procedure".into();
    nested.parent_digest = d.digest;
    w.digests.push(nested);
    let blocker = Blocker {
        connection_id: 9,
        transaction: true,
        started_unix_ms: end - 5,
        statements: vec!["UPDATE t SET b = ?".into()],
    };
    w.lock_waits = vec![lock_wait(end - 2, 1, vec![blocker])];
    w.replication = vec![sqlbee_proto::v1::Replication {
        channel: "eu".into(),
        transactions: 1,
        lag: Some(Histogram { scheme: 1, buckets: vec![Bucket { index: 3, count: 1 }] }),
        lag_max_ns: 5,
        classes: vec![sqlbee_proto::v1::AppliedClass {
            class: "xid".into(),
            events: 1,
            apply_ns: 2,
            rows: Some(1),
            latency: Some(Histogram { scheme: 1, buckets: vec![Bucket { index: 2, count: 1 }] }),
        }],
        tables: vec![sqlbee_proto::v1::AppliedTable {
            schema: "app".into(),
            table: "t'x".into(),
            kind: "write_rows".into(),
            events: 1,
            apply_ns: 1,
            rows: None,
            latency: None,
        }],
        lost_events: 0,
    }];
    w.long_statements = vec![sqlbee_proto::v1::LongStatement {
        connection_id: 3,
        digest: sqlbee_vocabulary::digest_id::of("SELECT ?"),
        digest_text: "SELECT ?".into(),
        start_unix_ms: end - 3,
        duration_ns: 1,
        outcome: "killed".into(),
        error_code: 1317,
        ..Default::default()
    }];
    b.agent_windows[0].untraced = vec![sqlbee_proto::v1::UntracedServer {
        instance: Some(ServerInstance { name: "h:2".into(), pid: 77, ..Default::default() }),
        reason: "no log_slow_statement in /usr/sbin/mariadbd".into(),
        kind: "missing_symbol".into(),
        since_unix_ms: end - 100,
        attempts: 1,
    }];
    b.gaps[0].last_window_end_unix_ms = end - 20;
    b
}

fn count_of(store: &ClickHouseStore, sql: &str) -> u64 {
    store.db.select(sql).unwrap().u64().unwrap()
}

/// Everything a reader sees, floats apart (`cost_answers`).
fn answers(store: &ClickHouseStore, since: i64, until: i64) -> String {
    let mut out = String::new();
    for key in OrderBy::NAMES {
        let order_by = OrderBy::parse(key).unwrap();
        for nested in [false, true] {
            let top = TopQuery { order_by, nested, since_unix_ms: since, until_unix_ms: until, ..everything(0) };
            out += &format!("{key} {nested}: {:?}\n", store.top(&top).unwrap());
        }
    }
    shared_tests::lean_top_answers_as_top_does(
        store,
        &TopQuery { since_unix_ms: since, until_unix_ms: until, ..everything(0) },
    );
    for instance in [None, Some("h:1".to_string()), Some("h:2".to_string())] {
        let totals = TotalsQuery { instance: instance.clone(), since_unix_ms: since, until_unix_ms: until };
        out += &format!("totals {instance:?}: {:?}\n", store.totals(&totals).unwrap());
        for of in [SeriesOf::Statements, SeriesOf::Digest(u64::MAX - 1), SeriesOf::Digest(11)] {
            for step in [HOUR, HOUR / 3, 24 * HOUR] {
                let query = SeriesQuery {
                    of,
                    instance: instance.clone(),
                    schema: None,
                    since_unix_ms: since,
                    until_unix_ms: until,
                    step_ms: step,
                };
                out += &format!("series {of:?} {step}: {:?}\n", store.series(&query).unwrap());
            }
        }
    }
    out
}

/// Costs and cost series, floats to the ninth digit.
fn cost_answers(store: &ClickHouseStore, since: i64, until: i64) -> String {
    let mut out = String::new();
    for instance in [None, Some("h:1".to_string())] {
        let totals = TotalsQuery { instance: instance.clone(), since_unix_ms: since, until_unix_ms: until };
        for c in store.costs(&totals).unwrap() {
            out += &format!(
                "{} {} w{} st{} shed{} {} rss{} dropped{} cpu{:.9} s{:.3} probe{:.9} a{:.9} x{:.9}\n",
                c.agent_id,
                c.host,
                c.windows,
                c.statements,
                c.shedding_windows,
                c.latest_shedding,
                c.agent_max_rss_bytes,
                c.dropped_events,
                c.agent_cpu_seconds,
                c.seconds,
                c.probe_cpu_seconds,
                c.agent_cores_per_10k_qps,
                c.server_extra_cores_per_10k_qps
            );
        }
        let query = SeriesQuery {
            of: SeriesOf::Cost,
            instance,
            schema: None,
            since_unix_ms: since,
            until_unix_ms: until,
            step_ms: HOUR,
        };
        for p in store.series(&query).unwrap() {
            out += &format!(
                "{} w{} cpu{:.9} rss{} probe{:.9}\n",
                p.start_unix_ms, p.windows, p.agent_cpu_cores, p.agent_max_rss_bytes, p.probe_cpu_seconds
            );
        }
    }
    out
}

/// Rollups answer what the raw windows answer: one store rolls its buckets
/// up, its twin with the same batches never does, and every read of both
/// must agree, through a late batch into a rolled hour, a duplicate, a
/// second pass, and a pass that died before its mark. Reads cover a range
/// of whole hours, one with a whole day (read from the day's rollup) and
/// one with ragged ends (ten-minute rollups and raw windows). Once
/// retention has taken the raw windows, the rollups still answer.
#[test]
fn rollups_answer_exactly_what_the_raw_windows_answer() {
    let Some((rolled, _)) = store("rolled") else { return };
    let Some((raw, _)) = store("raw") else { return };
    let hour = HOUR;
    let base = 400_000 * hour;
    // Hours, the day around base (base - 16 h to base + 8 h), ragged ends.
    let ranges =
        [(base - hour, base + 3 * hour), (base - 48 * hour, base + 48 * hour), (base + 907_000, base + 95 * 60_000)];
    let every = |store: &ClickHouseStore| -> String {
        ranges.iter().map(|&(since, until)| answers(store, since, until) + &cost_answers(store, since, until)).collect()
    };
    let marks = |store: &ClickHouseStore, level: i64| {
        count_of(store, &format!("SELECT count() FROM rollup_marks WHERE level = {level}"))
    };
    let batches: Vec<Batch> = (0..6)
        .map(|k| {
            let end = base + k * hour / 3 + 1000;
            if k % 3 == 2 {
                waiting(
                    k as u64 + 1,
                    "h:2",
                    end,
                    vec![wait("disk_io", 40, 30, 1)],
                    vec![error(1146, 2, "no such table")],
                )
            } else {
                let mut b = every_kind_of_row(k as u64 + 1, end);
                b.agent_windows[0].cost.as_mut().unwrap().shedding =
                    if k == 1 { "no-samples".into() } else { "exact".into() };
                b
            }
        })
        .collect();
    for store in [&rolled, &raw] {
        for b in &batches {
            assert!(!store.put(b, base + 3 * hour).unwrap().duplicate);
        }
    }
    let (since, until) = ranges[0];
    let expected = every(&raw);
    let count = |store: &ClickHouseStore| {
        store.top(&TopQuery { since_unix_ms: since, until_unix_ms: until, ..everything(0) }).unwrap()[0].count
    };
    let total = count(&raw);
    assert!(total > 0);

    // The server stamps inserts by the second; a pass counts those before its own.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    // Two hours with windows: twelve ten-minute buckets, two hours, a day.
    let pass = rolled.roll_up_settled(0).unwrap();
    assert_eq!((pass.buckets, pass.left), (15, 0), "{pass:?}");
    assert_eq!([10 * 60_000, hour, 24 * hour].map(|level| marks(&rolled, level)), [12, 2, 1]);
    assert!(count_of(&rolled, "SELECT count() FROM digest_rollups WHERE level = 86400000") >= 3);
    assert_eq!(every(&rolled), expected);
    assert_eq!(rolled.roll_up_settled(0).unwrap().buckets, 0, "nothing new, nothing due");

    // A late batch into the first hour (its rows are the delta) and a replay.
    let late = every_kind_of_row(7, base + 5000);
    for store in [&rolled, &raw] {
        assert!(!store.put(&late, base + 4 * hour).unwrap().duplicate);
        assert!(store.put(&batches[1], base + 4 * hour).unwrap().duplicate);
    }
    let expected = every(&raw);
    assert_eq!(count(&raw), total + 2);
    assert_eq!(every(&rolled), expected);

    // The next pass rolls the first hour again, its ten-minute buckets and
    // its day, under newer marks.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    assert_eq!(rolled.roll_up_settled(0).unwrap().buckets, 8);
    assert_eq!(count_of(&rolled, "SELECT count() FROM rollup_marks"), 23);
    assert_eq!(every(&rolled), expected);

    // Two passes over one bucket with one cutoff (two collectors in the
    // same second): each marks its own rows, and reads take one pass's.
    let cutoff_s = count_of(&rolled, "SELECT toUInt64(toUInt32(now()))") as i64;
    for _ in 0..2 {
        assert!(rollups::roll_bucket(&[&rolled.db], hour, base, cutoff_s).unwrap() > 0);
    }
    assert_eq!(count_of(&rolled, "SELECT count() FROM rollup_marks"), 25);
    assert_eq!(every(&rolled), expected);

    // A pass that died before its mark: its rows never count.
    let counted = [rollups::counted(base, base + hour, cutoff_s + 1)];
    let day = base - 16 * hour;
    for bucket in [(hour, base), (24 * hour, day)] {
        assert!(rollups::roll_digests(&rolled.db, &counted, bucket, rollups::pass_id(cutoff_s + 1)).unwrap() > 0);
    }
    assert_eq!(every(&rolled), expected);

    // Retention takes the raw windows; the hour rollups stay and answer.
    let cutoffs = PruneCutoffs { raw: base + 3 * hour, minute: base + 3 * hour, hour: base - hour };
    for store in [&rolled, &raw] {
        store.prune(&cutoffs).unwrap();
    }
    assert!(raw.top(&everything(0)).unwrap().is_empty());
    assert_eq!(count(&rolled), total + 2);

    // The ten-minute level goes by the minute cutoff, a whole day at a
    // time (never newer than the raw cutoff); its marks with it. Hours and
    // days stay and still answer.
    let ten_minutes = |store: &ClickHouseStore, table: &str| {
        count_of(store, &format!("SELECT count() FROM {table} WHERE level = {}", 10 * 60_000))
    };
    let hour_marks = marks(&rolled, hour);
    assert!(ten_minutes(&rolled, "digest_rollups") > 0 && ten_minutes(&rolled, "rollup_marks") > 0);
    let windows_day_ends = (base + 2 * hour).div_euclid(24 * hour) * 24 * hour + 24 * hour;
    let same_day = PruneCutoffs { raw: windows_day_ends - 1, minute: windows_day_ends - 1, hour: base - 48 * hour };
    assert_eq!(rolled.prune(&same_day).unwrap().rollup_rows, 0, "the cutoff's own day stays");
    assert!(ten_minutes(&rolled, "digest_rollups") > 0);
    let next_day =
        PruneCutoffs { raw: windows_day_ends + hour, minute: windows_day_ends + hour, hour: base - 48 * hour };
    let pruned = rolled.prune(&next_day).unwrap();
    assert!(pruned.rollup_rows > 0, "{pruned:?}");
    for table in ["digest_rollups", "instance_rollups", "agent_rollups", "rollup_marks"] {
        assert_eq!(ten_minutes(&rolled, table), 0, "{table}");
    }
    assert_eq!(marks(&rolled, hour), hour_marks);
    assert_eq!(count(&rolled), total + 2);

    let pruned = rolled.prune(&PruneCutoffs::all(base + 3 * hour)).unwrap();
    assert!(pruned.rollup_rows > 0, "{pruned:?}");
    assert!(rolled.top(&everything(0)).unwrap().is_empty());
}

/// A database schema 1 wrote (before rollups) is upgraded in place: its
/// batches keep counting (their records have no insert stamp, so they stay
/// with raw reads, beside a rolled-up hour) and new ones roll up.
#[test]
fn a_version_1_database_is_upgraded_in_place() {
    let Some((store, location)) = store("upgrade") else { return };
    let hour = HOUR;
    let base = 400_000 * hour;
    store.put(&every_kind_of_row(1, base + 1000), base + hour).unwrap();
    let v1 = [
        "ALTER TABLE batches DROP COLUMN inserted",
        "ALTER TABLE batches DROP COLUMN window_hours",
        "ALTER TABLE digest_windows DROP COLUMN sample_end",
        "DROP TABLE digest_rollups",
        "DROP TABLE instance_rollups",
        "DROP TABLE agent_rollups",
        "DROP TABLE rollup_marks",
        "DROP TABLE schema_version",
    ];
    for sql in v1 {
        store.db.execute(sql).unwrap();
    }
    store.db.execute(&super::schema::tables()[0].1).unwrap();
    store.db.execute("INSERT INTO schema_version (version, written_unix_ms) VALUES (1, 0)").unwrap();
    drop(store);

    let store = ClickHouseStore::open(&location).unwrap();
    assert_eq!(count_of(&store, "SELECT toUInt64(max(version)) FROM schema_version"), u64::from(SCHEMA_VERSION));
    let count = |store: &ClickHouseStore| store.top(&everything(0)).unwrap()[0].count;
    assert_eq!(count(&store), 2);
    store.put(&every_kind_of_row(2, base + 2000), base + hour).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1100));
    // Its hour, the hour's six ten-minute buckets and its day.
    let pass = store.roll_up_settled(0).unwrap();
    assert_eq!(pass.buckets, 8, "{pass:?}");
    assert_eq!(count(&store), 4);
    let totals =
        store.totals(&TotalsQuery { instance: None, since_unix_ms: base, until_unix_ms: base + hour }).unwrap();
    assert_eq!(totals.statements, 4);

    // Version 2 kept hours only, with no level: its rows and marks read as
    // hours once the column is added.
    let marks = count_of(&store, "SELECT count() FROM rollup_marks");
    for table in ["digest_rollups", "instance_rollups", "agent_rollups", "rollup_marks"] {
        store.db.execute(&format!("ALTER TABLE {table} DROP COLUMN level")).unwrap();
    }
    store.db.execute("DROP TABLE schema_version").unwrap();
    store.db.execute(&super::schema::tables()[0].1).unwrap();
    store.db.execute("INSERT INTO schema_version (version, written_unix_ms) VALUES (2, 0)").unwrap();
    drop(store);
    let store = ClickHouseStore::open(&location).unwrap();
    assert_eq!(count_of(&store, "SELECT toUInt64(max(version)) FROM schema_version"), u64::from(SCHEMA_VERSION));
    assert_eq!(count_of(&store, &format!("SELECT count() FROM rollup_marks WHERE level = {hour}")), marks);

    // A figure the list ranks by since the store was made gets its column
    // on open, with no new version; rows written before rank as unknown.
    let newest = crate::store::rank_columns::names().last().unwrap();
    let has_it = format!(
        "SELECT count() FROM system.columns WHERE database = currentDatabase() AND name = '{newest}'
         AND table IN ('digest_windows', 'digest_rollups')"
    );
    for table in ["digest_windows", "digest_rollups"] {
        store.db.execute(&format!("ALTER TABLE {table} DROP COLUMN {newest}")).unwrap();
    }
    assert_eq!(count_of(&store, &has_it), 0);
    drop(store);
    let store = ClickHouseStore::open(&location).unwrap();
    assert_eq!(count_of(&store, &has_it), 2);
    let by_it = OrderBy::ALL.into_iter().find(|o| o.figure().is_some_and(|f| f.name == newest)).unwrap();
    let statements =
        |order_by| store.top(&TopQuery { order_by, ..everything(0) }).unwrap().iter().map(|d| d.count).sum::<u64>();
    assert_eq!(statements(by_it), statements(OrderBy::Total));
}

/// The store's SQL runs on current ClickHouse too. Every statement the
/// store sends Debian's 18.16 while it goes through its paces (create and
/// reopen, ingest of every kind of row, duplicates and conflicts, every
/// read with every order key and filter, series of each kind, a prune that
/// drops day partitions and deletes in its boundary day) is replayed in
/// order on chdb, current ClickHouse in-process, which must take each one
/// and answer each SELECT with as many bytes as 18.16 did.
#[test]
fn every_statement_the_store_sends_runs_on_current_clickhouse() {
    const DAY: i64 = 86_400_000;
    let test = "every_statement_the_store_sends_runs_on_current_clickhouse";
    let Some(python) = xtask::chdb::for_test(test) else { return };
    super::http::recording::start();
    let Some((store, location)) = store("chdb") else { return };
    let store = {
        drop(store);
        // Opening a database that exists takes another path than creating it.
        ClickHouseStore::open(&location).unwrap()
    };
    let (early, late) = (DAY + 1000, 3 * DAY + 5000);
    assert!(!store.put(&every_kind_of_row(1, early), early).unwrap().duplicate);
    assert!(!store.put(&every_kind_of_row(2, late - 3000), late - 3000).unwrap().duplicate);
    assert!(!store.put(&waiting(3, "h'1", late, vec![wait("disk_io", 40, 30, 1)], vec![]), late).unwrap().duplicate);
    assert!(store.put(&every_kind_of_row(2, late - 3000), late).unwrap().duplicate);
    let changed = waiting(3, "h'1", late, vec![], vec![]);
    assert!(matches!(store.put(&changed, late), Err(StoreError::Conflict { .. })));

    let reads = |store: &ClickHouseStore| {
        let all = everything(0);
        for key in OrderBy::NAMES {
            let order_by = OrderBy::parse(key).unwrap();
            assert!(!store.top(&TopQuery { order_by, ..all.clone() }).unwrap().is_empty(), "{key}");
        }
        let filtered = TopQuery {
            instance: Some("h:1".into()),
            schema: Some("app".into()),
            since_unix_ms: early,
            until_unix_ms: late,
            ..all.clone()
        };
        store.top(&filtered).unwrap();
        store.top(&TopQuery { nested: true, ..all.clone() }).unwrap();
        store.top(&TopQuery { program: Some("app.p".into()), ..all.clone() }).unwrap();
        for instance in [None, Some("h:1".to_string()), Some("h'1".to_string())] {
            let totals = TotalsQuery { instance: instance.clone(), since_unix_ms: 0, until_unix_ms: i64::MAX };
            store.totals(&totals).unwrap();
            store.totals(&TotalsQuery { since_unix_ms: early, until_unix_ms: late, ..totals.clone() }).unwrap();
            store.costs(&totals).unwrap();
            for of in [SeriesOf::Digest(u64::MAX - 1), SeriesOf::Statements, SeriesOf::Cost] {
                let schema = instance.as_ref().map(|_| "app".to_string());
                let query = SeriesQuery {
                    of,
                    instance: instance.clone(),
                    schema,
                    since_unix_ms: 0,
                    until_unix_ms: 4 * DAY,
                    step_ms: DAY,
                };
                assert_eq!(store.series(&query).unwrap().len(), 4);
            }
            store.long_statements(&LocksQuery { instance: instance.clone(), since_unix_ms: 0, limit: 10 }).unwrap();
            store.locks(&LocksQuery { instance, since_unix_ms: 0, limit: 10 }).unwrap();
        }
        store.locks(&LocksQuery { instance: None, since_unix_ms: late - 4000, limit: 1 }).unwrap();
        for host in [None, Some("h".to_string())] {
            store.hosts(&HostsQuery { host, since_unix_ms: 0, limit: 10 }).unwrap();
        }
        assert!(!store.instances().unwrap().is_empty());
        let plans = PlansQuery {
            digest: Some(u64::MAX - 1),
            schema: None,
            instance: None,
            since_unix_ms: 0,
            until_unix_ms: i64::MAX,
            limit: 10,
        };
        store.plans(&plans).unwrap();
        store.plans(&PlansQuery { digest: None, schema: Some("app".into()), ..plans }).unwrap();
        store.digest_tables(&[u64::MAX - 1, 11]).unwrap();
        for instance in [None, Some("h'1")] {
            store.table_indexes(instance).unwrap();
            store.plans_of(&[u64::MAX - 1, 11], instance, late).unwrap();
            store.replication(instance, 0, late).unwrap();
        }
        store.export_mark("otlp'metrics").unwrap();
        for instance in [None, Some("h'1".to_string())] {
            let marks = AnnotationsQuery {
                instance: instance.clone(),
                since_unix_ms: 0,
                until_unix_ms: i64::MAX,
                id: None,
                limit: 10,
            };
            store.annotations(&marks).unwrap();
            store.annotations(&AnnotationsQuery { id: Some(7), ..marks }).unwrap();
            for open_only in [false, true] {
                let kind = open_only.then(|| "regressed".to_string());
                let events = EventsQuery {
                    instance: instance.clone(),
                    kind,
                    since_unix_ms: early,
                    until_unix_ms: late,
                    open_only,
                    limit: 10,
                };
                store.events(&events).unwrap();
            }
        }
    };
    let marker = sqlbee_proto::v1::Annotation {
        id: 7,
        at_unix_ms: early,
        text: "deploy 'v2' \\ done".into(),
        instances: vec!["h'1".into()],
        created_unix_ms: early,
    };
    store.annotate(&marker).unwrap();
    let event = sqlbee_proto::v1::Event {
        id: 9,
        instance: "h'1".into(),
        kind: "regressed".into(),
        opened_unix_ms: early,
        updated_unix_ms: early,
        ..Default::default()
    };
    store
        .put_events(&[event.clone(), sqlbee_proto::v1::Event { closed_unix_ms: late, updated_unix_ms: late, ..event }])
        .unwrap();
    let export = crate::store::ExportMark { step_ms: 60_000, until_unix_ms: early, instance: "h'1".into() };
    store.set_export_mark("otlp'metrics", &export).unwrap();
    reads(&store);
    // Rolled up, then read through rollups and their delta (a late batch).
    std::thread::sleep(std::time::Duration::from_millis(1100));
    assert!(store.roll_up_settled(0).unwrap().buckets >= 2);
    assert!(!store.put(&every_kind_of_row(4, early + 2000), late).unwrap().duplicate);
    reads(&store);
    // Before the cutoff: day 1 whole (a dropped partition) and part of day 3
    // (a delete); day 1's ten-minute rollups by a delete of their own, the
    // hours kept.
    let pruned = store.prune(&PruneCutoffs { raw: late - 1000, minute: late - 1000, hour: 0 }).unwrap();
    assert!(pruned.digest_windows >= 3 && pruned.batches == 2, "{pruned:?}");
    reads(&store);

    let sent = super::http::recording::take();
    for needed in
        ["CREATE DATABASE", "DROP PARTITION", "DELETE WHERE", "DELETE WHERE level", "FROM system.mutations", "argMax("]
    {
        assert!(sent.iter().any(|s| s.sql.contains(needed)), "no statement with {needed:?} was recorded");
    }
    for (table, _) in super::schema::tables() {
        assert!(
            sent.iter().any(|s| s.sql.starts_with(&format!("INSERT INTO {table} "))
                && s.rows.as_ref().is_some_and(|r| !r.is_empty()))
                || table == "schema_version",
            "no rows were inserted into {table}"
        );
    }
    // What depends on the server's clock (insert stamps, a pass's cutoff)
    // answers otherwise on a replay: run, not compared.
    let statements: Vec<xtask::chdb::Statement> = sent
        .into_iter()
        .map(|s| {
            let clocked = s.sql.contains("inserted") || s.sql.contains("now()");
            let answer_len = if clocked { None } else { s.answer_len };
            xtask::chdb::Statement { database: s.database, sql: s.sql, rows: s.rows, answer_len }
        })
        .collect();
    let count = statements.len();
    let version = xtask::chdb::replay(&python, &statements).unwrap_or_else(|e| panic!("{e}"));
    eprintln!("{count} statements ran on ClickHouse 18.16 and on {version} (chdb)");

    // The replay fails on SQL only 18.16 takes: the old MergeTree syntax,
    // which current versions refuse.
    let old_syntax =
        format!("CREATE TABLE {}.old_syntax (d Date, a UInt64) ENGINE = MergeTree(d, (a), 8192)", location.database);
    store.db.execute(&old_syntax).expect("18.16 takes the old MergeTree syntax");
    let create = format!("CREATE DATABASE IF NOT EXISTS {}", location.database);
    let statements =
        [create, old_syntax].map(|sql| xtask::chdb::Statement { database: None, sql, rows: None, answer_len: None });
    match xtask::chdb::replay(&python, &statements) {
        Err(xtask::chdb::ChdbError::Refused { index: 1, error, .. }) => {
            assert!(error.contains("deprecated"), "{error}")
        }
        other => panic!("the old MergeTree syntax must be refused: {other:?}"),
    }
}
