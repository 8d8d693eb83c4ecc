//! Assertions both stores must pass, each run by a store's own tests on
//! its own instance: the same reads give the same answers.
use sqlbee_proto::v1::{Batch, QueryStats};

use super::*;

/// A store test's batch maker: one window of one digest (`u64::MAX - 1`,
/// schema "", instance `h:1`) ending at `end`, with these histogram
/// buckets.
pub(super) type MakeBatch = fn(u64, i64, &[(u32, u64)]) -> Batch;

/// A store test's batch with costs: `MakeBatch`'s window, measured, and
/// the agent's own window ending with it (sequence, end, the agent's CPU
/// cores, shedding).
pub(super) type MakeCostedBatch = fn(u64, i64, f64, &str) -> Batch;

/// The top 10 client digests of all time, of one instance or all.
pub(super) fn all_time(instance: Option<&str>) -> TopQuery {
    TopQuery {
        instance: instance.map(str::to_string),
        digest: None,
        schema: None,
        nested: false,
        program: None,
        since_unix_ms: 0,
        until_unix_ms: i64::MAX,
        order_by: OrderBy::Total,
        limit: 10,
    }
}

/// `top_lean` answers what `top` does, but for what it leaves empty, for
/// every order and both lineages of `query`'s range.
pub(super) fn lean_top_answers_as_top_does(store: &dyn Store, query: &TopQuery) {
    for key in OrderBy::NAMES {
        let order_by = OrderBy::parse(key).unwrap();
        for nested in [false, true] {
            let query = TopQuery { order_by, nested, ..query.clone() };
            let full: Vec<TopDigest> = store
                .top(&query)
                .unwrap()
                .into_iter()
                .map(|d| {
                    let stats = d.stats.map(|s| QueryStats {
                        rows_examined: s.rows_examined,
                        cpu_ns: s.cpu_ns,
                        ..Default::default()
                    });
                    TopDigest {
                        sample: String::new(),
                        waits: Vec::new(),
                        error_codes: Vec::new(),
                        accounts: Vec::new(),
                        clients: Vec::new(),
                        tags: Vec::new(),
                        exemplars: Vec::new(),
                        stats,
                        ..d
                    }
                })
                .collect();
            let lean = store.top_lean(&query).unwrap();
            if order_by == OrderBy::Wait {
                // Ranking by waits reads them: the same digests, in order.
                let ids = |v: &[TopDigest]| v.iter().map(|d| (d.digest, d.count)).collect::<Vec<_>>();
                assert_eq!(ids(&lean), ids(&full), "{key} {nested}");
            } else {
                assert_eq!(lean, full, "{key} {nested} over {}..{}", query.since_unix_ms, query.until_unix_ms);
            }
        }
    }
}

/// The fleet page's one read: each instance's series is the one a
/// filtered read gives, and together they are the whole fleet's.
pub(super) fn series_split_by_instance_add_up_to_the_fleet(store: &dyn Store, batch: MakeBatch) {
    let put = |b: &Batch, at: i64| store.ingest(b.clone(), at, content_hash(b)).unwrap();
    put(&batch(1, 1500, &[(10, 2)]), 1500);
    let mut other = batch(2, 2500, &[(40, 3)]);
    other.windows[0].instance.as_mut().unwrap().name = "h:2".into();
    put(&other, 2500);
    put(&batch(3, 3500, &[(60, 1)]), 3500);
    let query = SeriesQuery {
        of: SeriesOf::Statements,
        instance: None,
        schema: None,
        since_unix_ms: 1000,
        until_unix_ms: 4000,
        step_ms: 1000,
    };
    let split = store.series_by_instance(&query).unwrap();
    assert_eq!(split.iter().map(|s| s.instance.as_str()).collect::<Vec<_>>(), ["h:1", "h:2"]);
    for s in &split {
        assert_eq!(
            s.points,
            store.series(&SeriesQuery { instance: Some(s.instance.clone()), ..query.clone() }).unwrap(),
            "{}",
            s.instance
        );
    }
    let fleet = store.series(&query).unwrap();
    for (i, point) in fleet.iter().enumerate() {
        assert_eq!(point.count, split.iter().map(|s| s.points[i].count).sum::<u64>(), "step {i}");
    }
    assert_eq!(fleet.iter().map(|p| p.count).sum::<u64>(), 6);
    let named = store.series_by_instance(&SeriesQuery { instance: Some("h:2".into()), ..query.clone() }).unwrap();
    assert_eq!((named.len(), named[0].instance.as_str(), named[0].points[1].count), (1, "h:2", 3));
    let digest =
        store.series_by_instance(&SeriesQuery { of: SeriesOf::Digest(u64::MAX - 1), ..query.clone() }).unwrap();
    assert_eq!(digest, split, "every row is that digest");
    assert!(store.series_by_instance(&SeriesQuery { of: SeriesOf::Digest(9), ..query.clone() }).unwrap().is_empty());
    assert!(
        store
            .series_by_instance(&SeriesQuery { since_unix_ms: 5000, until_unix_ms: 6000, ..query })
            .unwrap()
            .is_empty()
    );
}

/// The top page's one read: each (digest, schema) among the digests asked
/// for gets the series a filtered read gives, and no other pair comes.
pub(super) fn series_split_by_digest_match_filtered_reads(store: &dyn Store, batch: MakeBatch) {
    let put = |b: &Batch, at: i64| store.ingest(b.clone(), at, content_hash(b)).unwrap();
    put(&batch(1, 1500, &[(10, 2)]), 1500);
    let mut shop = batch(2, 2500, &[(40, 3)]);
    shop.windows[0].digests[0].digest = 9;
    shop.windows[0].digests[0].schema = "shop".into();
    put(&shop, 2500);
    let mut bare = batch(3, 3500, &[(60, 1)]);
    bare.windows[0].digests[0].digest = 9;
    put(&bare, 3500);
    let query = SeriesQuery {
        of: SeriesOf::Statements,
        instance: None,
        schema: None,
        since_unix_ms: 1000,
        until_unix_ms: 4000,
        step_ms: 1000,
    };
    let split = store.series_by_digest(&query, &[9, u64::MAX - 1]).unwrap();
    let keys: Vec<(u64, &str)> = split.iter().map(|s| (s.digest, s.schema.as_str())).collect();
    assert_eq!(keys, [(9, ""), (9, "shop"), (u64::MAX - 1, "")]);
    for s in &split {
        let filtered = SeriesQuery { of: SeriesOf::Digest(s.digest), schema: Some(s.schema.clone()), ..query.clone() };
        assert_eq!(s.points, store.series(&filtered).unwrap(), "{} {:?}", s.digest, s.schema);
    }
    assert_eq!(split.iter().map(|s| s.points.iter().map(|p| p.count).sum::<u64>()).collect::<Vec<_>>(), [1, 3, 2]);
    let asked = store.series_by_digest(&query, &[9]).unwrap();
    assert_eq!(asked.iter().map(|s| (s.digest, s.schema.as_str())).collect::<Vec<_>>(), [(9, ""), (9, "shop")]);
    let in_shop = store
        .series_by_digest(&SeriesQuery { schema: Some("shop".into()), ..query.clone() }, &[9, u64::MAX - 1])
        .unwrap();
    assert_eq!(in_shop.len(), 1);
    assert!(store.series_by_digest(&query, &[]).unwrap().is_empty());
    assert!(store.series_by_digest(&SeriesQuery { of: SeriesOf::Cost, ..query }, &[9]).unwrap().is_empty());
}

/// Each instance's newest cost comes with its own agent's window that
/// ended closest to it: one inside the band read for the whole fleet, one
/// hours away that only the lookup of a single agent finds.
pub(super) fn latest_cost_takes_each_agents_nearest_window(store: &dyn Store, costed: MakeCostedBatch) {
    let put = |b: &Batch, at: i64| store.ingest(b.clone(), at, content_hash(b)).unwrap();
    const T: i64 = 100 * 3_600_000;
    let of_agent = |mut b: Batch, agent: &str| {
        b.agent.as_mut().expect("an identity").agent_id = agent.into();
        b
    };
    let agent_only = |sequence, end, cpu, agent| {
        let mut b = of_agent(costed(sequence, end, cpu, "exact"), agent);
        b.windows.clear();
        b
    };
    put(&of_agent(costed(1, T, 1.0, "exact"), "near"), T);
    put(&agent_only(2, T + 40 * 60_000, 9.0, "near"), T);
    let mut far = of_agent(costed(1, T, 2.0, "exact"), "far");
    far.agent_windows.clear();
    put(&far, T);
    put(&agent_only(2, T - 3 * 3_600_000, 3.0, "far"), T);
    put(&agent_only(3, T + 5 * 3_600_000, 4.0, "far"), T);
    let instances = store.instances().unwrap();
    let cpu = |agent: &str| {
        let info =
            instances.iter().find(|i| i.agent_id == agent && !i.instance.is_empty()).expect("the agent's instance");
        let latest = info.latest.as_ref().expect("a cost");
        (latest.window_end_unix_ms, latest.agent_cpu_cores)
    };
    assert_eq!(cpu("near"), (T, 1.0), "{instances:?}");
    assert_eq!(cpu("far"), (T, 3.0), "{instances:?}");
}

/// An error's message is kept per instance: a newer message from another
/// instance's agent replaces it only in fleet-wide reads, never in the
/// instance's own.
pub(super) fn error_messages_are_kept_per_instance(store: &dyn Store, batch: MakeBatch) {
    let put = |b: &Batch| store.ingest(b.clone(), 2000, content_hash(b)).unwrap();
    let failing = |sequence: u64, end: i64, instance: &str, message: &str| {
        let mut b = batch(sequence, end, &[(10, 2)]);
        b.windows[0].instance.as_mut().unwrap().name = instance.into();
        let d = &mut b.windows[0].digests[0];
        d.errors = 1;
        d.error_codes = vec![sqlbee_proto::v1::ErrorCount { code: 1062, count: 1, sample_message: message.into() }];
        b
    };
    put(&failing(1, 1500, "h:1", "Duplicate entry for key 'PRIMARY'"));
    put(&failing(2, 1600, "h:2", "planted by another agent"));
    let message = |instance: Option<&str>| {
        let top = store.top(&all_time(instance)).unwrap();
        top[0].error_codes[0].sample_message.clone()
    };
    assert_eq!(message(Some("h:1")), "Duplicate entry for key 'PRIMARY'");
    assert_eq!(message(Some("h:2")), "planted by another agent");
    assert_eq!(message(None), "planted by another agent", "fleet-wide, the newest");
}

/// Plans: sightings of one hash merge into one plan (first and last seen,
/// the newest sighting's content) whatever order batches arrive in, a
/// replayed batch adds nothing, changes come newest first, and an agent's
/// first plan of a digest changes from the plan stored before it.
pub(super) fn plans_merge_sightings_and_list_changes(store: &dyn Store, batch: MakeBatch) {
    use sqlbee_proto::v1::{Plan, TableAccess};
    let plan = |hash: u64, previous: u64, at: i64, key: &str| Plan {
        digest: u64::MAX - 1,
        schema: "app".into(),
        explained_unix_ms: at,
        plan_hash: hash,
        previous_plan_hash: previous,
        access: vec![TableAccess {
            table: "orders".into(),
            r#type: "ref".into(),
            key: key.into(),
            ..Default::default()
        }],
        plan_json: format!("{{\"seen\": {at}}}"),
        ..Default::default()
    };
    let put = |sequence: u64, end: i64, plans: Vec<Plan>, login: &str| {
        let mut b = batch(sequence, end, &[(10, 1)]);
        b.windows[0].plans = plans;
        b.windows[0].server_login = login.into();
        store.ingest(b.clone(), end, content_hash(&b)).unwrap();
        b
    };
    let first = put(1, 1500, vec![plan(11, 0, 1400, "")], "ok");
    put(3, 3500, vec![plan(11, 22, 3400, "")], "ok");
    // Arrives late: its sighting is older than the newest of hash 11.
    put(2, 2500, vec![plan(22, 11, 2400, "by_email"), plan(11, 0, 1200, "")], "login failed");
    store.ingest(first.clone(), 9000, content_hash(&first)).unwrap();

    let query = PlansQuery {
        digest: Some(u64::MAX - 1),
        schema: None,
        instance: None,
        since_unix_ms: 0,
        until_unix_ms: i64::MAX,
        limit: 100,
    };
    let answer = store.plans(&query).unwrap();
    let seen: Vec<(u64, i64, i64)> = answer
        .plans
        .iter()
        .map(|r| (r.plan.as_ref().unwrap().plan_hash, r.first_seen_unix_ms, r.last_seen_unix_ms))
        .collect();
    assert_eq!(seen, [(11, 1200, 3400), (22, 2400, 2400)]);
    assert_eq!(answer.plans[0].plan.as_ref().unwrap().plan_json, "{\"seen\": 3400}", "the newest sighting's");
    assert_eq!(answer.plans[1].plan.as_ref().unwrap().access[0].key, "by_email");
    let changes: Vec<(i64, u64, u64)> = answer.changes.iter().map(|c| (c.at_unix_ms, c.from_hash, c.to_hash)).collect();
    assert_eq!(changes, [(3400, 22, 11), (2400, 11, 22)]);
    assert_eq!(answer.changes[0].schema, "app");

    let other_schema = store.plans(&PlansQuery { schema: Some("shop".into()), ..query.clone() }).unwrap();
    assert!(other_schema.plans.is_empty() && other_schema.changes.is_empty());
    let fleet = store.plans(&PlansQuery { digest: None, since_unix_ms: 3000, ..query.clone() }).unwrap();
    assert!(fleet.plans.is_empty(), "no digest: changes only");
    assert_eq!(fleet.changes.len(), 1);
    // The plans index advice reads: every hash first seen before the end.
    let hashes = |until: i64, instance: Option<&str>| -> Vec<(u64, i64, i64)> {
        let mut rows: Vec<(u64, i64, i64)> = store
            .plans_of(&[u64::MAX - 1, 5], instance, until)
            .unwrap()
            .iter()
            .map(|r| (r.plan.as_ref().unwrap().plan_hash, r.first_seen_unix_ms, r.last_seen_unix_ms))
            .collect();
        rows.sort_unstable();
        rows
    };
    assert_eq!(hashes(i64::MAX, None), [(11, 1200, 3400), (22, 2400, 2400)]);
    assert_eq!(hashes(2000, None), [(11, 1200, 3400)]);
    assert!(hashes(i64::MAX, Some("elsewhere:1")).is_empty());

    // A restarted agent knows no previous plan: the stored one stands for
    // it, whether the plan changed (33 after 11) or not (33 again, from
    // an agent restarted once more), and in the same batch too (44 after
    // 33, and back to 33, all first plans of their agent).
    put(4, 5500, vec![plan(33, 0, 5400, "")], "ok");
    put(5, 6500, vec![plan(33, 0, 6400, "")], "ok");
    put(6, 7500, vec![plan(44, 0, 7300, ""), plan(33, 0, 7400, "")], "ok");
    let changes: Vec<(i64, u64, u64)> =
        store.plans(&query).unwrap().changes.iter().map(|c| (c.at_unix_ms, c.from_hash, c.to_hash)).collect();
    assert_eq!(changes, [(7400, 44, 33), (7300, 33, 44), (5400, 11, 33), (3400, 22, 11), (2400, 11, 22)]);

    // The newest window's word on the login stands.
    let instances = store.instances().unwrap();
    assert_eq!(instances.iter().find(|i| i.instance == "h:1").unwrap().server_login, "ok");

    // Plans follow the hour retention: a plan last seen before the cutoff
    // goes with the changes before it; the newer stay.
    let pruned = store.prune(&PruneCutoffs { raw: 0, minute: 0, hour: 3000 }).unwrap();
    // Rows: merged plans (SQLite) or sightings (ClickHouse).
    assert!(pruned.plan_rows >= 2, "plan 22 (last seen 2400) and the change at 2400: {pruned:?}");
    let left = store.plans(&query).unwrap();
    assert_eq!(left.plans.iter().map(|r| r.plan.as_ref().unwrap().plan_hash).collect::<Vec<_>>(), [33, 44, 11]);
    assert_eq!(left.changes.len(), 4);
}

/// Long statements come back whole, newest first, once each (a replayed
/// batch adds none), filtered by instance and start, and retention takes
/// them by start.
pub(super) fn long_statements_newest_first_once_and_pruned(store: &dyn Store, batch: MakeBatch) {
    use sqlbee_proto::v1::{LongStatement, WaitStats};
    let statement = |connection_id: u64, start: i64, outcome: &str| LongStatement {
        connection_id,
        digest: sqlbee_vocabulary::digest_id::of("SELECT `sleep` (?)"),
        digest_text: "SELECT `sleep` (?)".into(),
        sample: "select sleep(?)".into(),
        start_unix_ms: start,
        duration_ns: 12_000_000_000,
        outcome: outcome.into(),
        error_code: if outcome == "killed" { 1317 } else { 0 },
        waits: vec![WaitStats { class: "row_lock".into(), sum_ns: 5, max_ns: 5, statements: 1 }],
        blocked_by: 7,
        ..Default::default()
    };
    let mut first = batch(1, 1500, &[(10, 1)]);
    first.windows[0].long_statements = vec![statement(1, 1000, "long"), statement(2, 1400, "killed")];
    let mut other = batch(2, 2500, &[(10, 1)]);
    other.windows[0].instance.as_mut().unwrap().name = "h:2".into();
    other.windows[0].long_statements = vec![statement(3, 2000, "disconnected")];
    for (b, at) in [(&first, 1500), (&other, 2500), (&first, 9000)] {
        store.ingest(b.clone(), at, content_hash(b)).unwrap();
    }
    let read = |instance: Option<&str>, since: i64| -> Vec<(String, u64)> {
        let query = LocksQuery { instance: instance.map(str::to_string), since_unix_ms: since, limit: 100 };
        store
            .long_statements(&query)
            .unwrap()
            .into_iter()
            .map(|r| (r.instance, r.statement.unwrap().connection_id))
            .collect()
    };
    assert_eq!(read(None, 0), [("h:2".into(), 3), ("h:1".into(), 2), ("h:1".into(), 1)]);
    assert_eq!(read(Some("h:1"), 1200), [("h:1".to_string(), 2)]);
    let whole = store.long_statements(&LocksQuery { instance: None, since_unix_ms: 1400, limit: 1 }).unwrap();
    assert_eq!(whole[0].statement, Some(statement(3, 2000, "disconnected")), "kept whole");
    assert_eq!(whole[0].agent_id, first.agent.as_ref().unwrap().agent_id);
    assert_eq!(store.prune(&PruneCutoffs::all(1300)).unwrap().long_statements, 1);
    assert_eq!(read(None, 0).len(), 2);
}

/// Query tags, clients and trace exemplars merge over windows and
/// instances: counts per value (and per client) add, values not listed add
/// to `other`, and the slowest exemplars come first, each once.
pub(super) fn tags_and_exemplars_merge_over_windows(store: &dyn Store, batch: MakeBatch) {
    use sqlbee_proto::v1::{ClientCount, TagCount, TagValue, TraceExemplar};
    let tagged = |sequence: u64, end: i64, instance: &str, values: &[(&str, u64)], other: u64, slowest: u64| {
        let mut b = batch(sequence, end, &[(10, 4)]);
        b.windows[0].instance.as_mut().unwrap().name = instance.into();
        let d = &mut b.windows[0].digests[0];
        d.tags = vec![TagCount {
            key: "controller".into(),
            values: values.iter().map(|(v, count)| TagValue { value: v.to_string(), count: *count }).collect(),
            other,
        }];
        d.exemplar = Some(TraceExemplar {
            trace_id: format!("{sequence:032x}"),
            span_id: format!("{sequence:016x}"),
            duration_ns: slowest.min(d.max_ns),
        });
        // The same program in every window, and one client of one window;
        // only the first says what it is (as connection attributes do).
        let client = |process: &str, pid: u32, count: u64| ClientCount {
            process: process.into(),
            pid,
            container: "web-1".into(),
            count,
            ..Default::default()
        };
        let shop = ClientCount {
            program: "shop".into(),
            driver: "mysqlnd 8.2".into(),
            client_pid: 7,
            ..client("php-fpm", 7, 2)
        };
        d.clients = vec![shop, client(&format!("worker-{sequence}"), 9, 1)];
        b
    };
    for b in [
        tagged(1, 1500, "h:1", &[("orders", 3)], 1, 30),
        tagged(2, 1600, "h:2", &[("carts", 2), ("orders", 1)], 0, 90),
        tagged(3, 1700, "h:1", &[("orders", 4)], 0, 60),
    ] {
        store.ingest(b.clone(), 2000, content_hash(&b)).unwrap();
    }
    let top = store.top(&all_time(None)).unwrap();
    let d = &top[0];
    assert_eq!(d.count, 12);
    let controller = &d.tags[0];
    let values: Vec<(&str, u64)> = controller.values.iter().map(|v| (v.value.as_str(), v.count)).collect();
    assert_eq!((values, controller.other), (vec![("orders", 8), ("carts", 2)], 1));
    let slowest: Vec<u64> = d.exemplars.iter().map(|e| e.duration_ns).collect();
    assert_eq!(slowest, [90, 60, 30]);
    assert_eq!(d.exemplars[0].trace_id, format!("{:032x}", 2));
    let one = store.top(&all_time(Some("h:1"))).unwrap();
    assert_eq!(one[0].tags[0].values[0].count, 7);
    assert_eq!(one[0].exemplars.len(), 2);
    // Clients add up by everything that names them, the most first.
    let clients: Vec<(&str, &str, u32, &str, u64)> = d
        .clients
        .iter()
        .map(|c| (c.program.as_str(), c.process.as_str(), c.pid, c.container.as_str(), c.count))
        .collect();
    assert_eq!(
        clients,
        [
            ("shop", "php-fpm", 7, "web-1", 6),
            ("", "worker-1", 9, "web-1", 1),
            ("", "worker-2", 9, "web-1", 1),
            ("", "worker-3", 9, "web-1", 1)
        ]
    );
    assert_eq!((d.clients[0].driver.as_str(), d.clients[0].client_pid), ("mysqlnd 8.2", 7));
    assert_eq!(one[0].clients.iter().map(|c| c.count).sum::<u64>(), 6);
}

/// Markers read by range, instance and id; events read as their newest
/// version, open or overlapping the range; both pruned by the hour
/// retention.
/// A table's indexes read back as the newest reading per instance and
/// table, whatever order the batches came in; a replayed batch changes
/// nothing.
pub(super) fn table_indexes_keep_the_newest_reading(store: &dyn Store, batch: MakeBatch) {
    use sqlbee_proto::v1::{IndexColumn, IndexDefinition, TableIndexes};
    let reading = |table: &str, at: i64, index: &str| TableIndexes {
        schema: "app".into(),
        table: table.into(),
        read_unix_ms: at,
        indexes: vec![IndexDefinition {
            name: index.into(),
            columns: vec![IndexColumn { name: "k".into(), prefix: 0 }],
            unique: false,
            r#type: "BTREE".into(),
            ignored: false,
            rows_read: None,
        }],
        missing: false,
    };
    let put = |sequence: u64, end: i64, readings: Vec<TableIndexes>| {
        let mut b = batch(sequence, end, &[(10, 1)]);
        b.windows[0].table_indexes = readings;
        store.ingest(b.clone(), end, content_hash(&b)).unwrap();
        b
    };
    put(1, 1500, vec![reading("items", 1400, "k_idx"), reading("tags", 1400, "t_idx")]);
    let late = put(3, 3500, vec![reading("items", 3400, "k_new")]);
    // Arrives late: older than the newest reading of items.
    put(2, 2500, vec![reading("items", 2400, "k_old")]);
    store.ingest(late.clone(), 9000, content_hash(&late)).unwrap();
    let read = |instance: Option<&str>| -> Vec<(String, String, i64, String)> {
        let mut rows: Vec<_> = store
            .table_indexes(instance)
            .unwrap()
            .into_iter()
            .map(|s| (s.instance, s.table.table.clone(), s.table.read_unix_ms, s.table.indexes[0].name.clone()))
            .collect();
        rows.sort();
        rows
    };
    let instance = batch(1, 1500, &[(10, 1)]).windows[0].instance.as_ref().unwrap().name.clone();
    let expected = vec![
        (instance.clone(), "items".to_string(), 3400, "k_new".to_string()),
        (instance.clone(), "tags".to_string(), 1400, "t_idx".to_string()),
    ];
    assert_eq!(read(None), expected);
    assert_eq!(read(Some(&instance)), expected);
    assert!(read(Some("elsewhere:1")).is_empty());
}

/// What a replica applied: one row per window, read once for a range
/// whatever the replays, filtered by instance, and aged with the plans.
pub(super) fn replication_windows_read_once_per_window(store: &dyn Store, batch: MakeBatch) {
    use sqlbee_proto::v1::{AppliedClass, AppliedTable, Bucket, Histogram, Replication};
    let applied = |transactions: u64| Replication {
        channel: String::new(),
        lost_events: 0,
        transactions,
        lag: Some(Histogram { scheme: 1, buckets: vec![Bucket { index: 200, count: transactions }] }),
        lag_max_ns: 1_000_000 * transactions,
        classes: vec![AppliedClass {
            class: "xid".into(),
            events: transactions,
            apply_ns: 10 * transactions,
            rows: Some(transactions),
            latency: Some(Histogram { scheme: 1, buckets: vec![Bucket { index: 100, count: transactions }] }),
        }],
        tables: vec![AppliedTable {
            schema: "shop".into(),
            table: "orders".into(),
            kind: "update_rows".into(),
            events: transactions,
            apply_ns: 7 * transactions,
            rows: None,
            latency: None,
        }],
    };
    let put = |sequence: u64, end: i64, transactions: u64| {
        let mut b = batch(sequence, end, &[(10, 1)]);
        // Two channels: one row each.
        let other = sqlbee_proto::v1::Replication { channel: "eu".into(), ..applied(1) };
        b.windows[0].replication = vec![applied(transactions), other];
        store.ingest(b.clone(), end, content_hash(&b)).unwrap();
        b
    };
    put(1, 1500, 2);
    let replayed = put(2, 2500, 3);
    put(3, 3500, 5);
    // A window without replication writes no row.
    let primary = batch(4, 4500, &[(10, 1)]);
    store.ingest(primary.clone(), 4500, content_hash(&primary)).unwrap();
    store.ingest(replayed.clone(), 9000, content_hash(&replayed)).unwrap();
    let instance = replayed.windows[0].instance.as_ref().unwrap().name.clone();
    let read = |instance: Option<&str>, since: i64, until: i64| -> Vec<(String, i64, u64)> {
        store
            .replication(instance, since, until)
            .unwrap()
            .into_iter()
            .filter(|w| w.replication.channel.is_empty())
            .map(|w| (w.instance, w.window_end_unix_ms, w.replication.transactions))
            .collect()
    };
    let channels: Vec<String> =
        store.replication(None, 2000, 3000).unwrap().into_iter().map(|w| w.replication.channel).collect();
    assert_eq!(channels, ["", "eu"], "each channel once, the replay's included");
    assert_eq!(
        read(None, 0, 10_000),
        vec![(instance.clone(), 1500, 2), (instance.clone(), 2500, 3), (instance.clone(), 3500, 5)]
    );
    assert_eq!(read(Some(&instance), 1500, 3500), vec![(instance.clone(), 2500, 3), (instance.clone(), 3500, 5)]);
    assert!(read(Some("elsewhere:1"), 0, 10_000).is_empty());
    let stored = store.replication(None, 2000, 3000).unwrap();
    assert_eq!(stored[0].replication, applied(3), "stored as sent");
    store.prune(&PruneCutoffs { raw: 0, minute: 0, hour: 3000 }).unwrap();
    assert_eq!(read(None, 0, 10_000), vec![(instance, 3500, 5)]);
}

/// An export's mark reads as the furthest written, per export name.
pub(super) fn export_marks_read_back_the_furthest(store: &dyn Store) {
    assert_eq!(store.export_mark("otlp-metrics").unwrap(), None);
    let mark = |until_unix_ms, instance: &str| ExportMark { step_ms: 60_000, until_unix_ms, instance: instance.into() };
    for m in [mark(60_000, ""), mark(60_000, "db-a"), mark(60_000, "db-b"), mark(120_000, "")] {
        store.set_export_mark("otlp-metrics", &m).unwrap();
        assert_eq!(store.export_mark("otlp-metrics").unwrap(), Some(m));
    }
    store.set_export_mark("another", &mark(1_000, "x")).unwrap();
    assert_eq!(store.export_mark("otlp-metrics").unwrap(), Some(mark(120_000, "")));
    assert_eq!(store.export_mark("another").unwrap(), Some(mark(1_000, "x")));
}

pub(super) fn markers_and_events_keep_their_newest_version(store: &dyn Store) {
    use sqlbee_proto::v1::{Annotation, Event};
    let marker = |id: u64, at: i64, instances: &[&str]| Annotation {
        id,
        at_unix_ms: at,
        text: format!("deploy {id}"),
        instances: instances.iter().map(|s| s.to_string()).collect(),
        created_unix_ms: at,
    };
    store.annotate(&marker(1, 1_000, &[])).unwrap();
    store.annotate(&marker(2, 2_000, &["a:1"])).unwrap();
    store.annotate(&marker(3, 3_000, &["b:1"])).unwrap();
    // A retried request stores the same marker again: it is read once.
    store.annotate(&marker(2, 2_000, &["a:1"])).unwrap();
    let marks = |instance: Option<&str>, since: i64, id: Option<u64>| -> Vec<u64> {
        let query = AnnotationsQuery {
            instance: instance.map(str::to_string),
            since_unix_ms: since,
            until_unix_ms: i64::MAX,
            id,
            limit: 100,
        };
        store.annotations(&query).unwrap().into_iter().map(|a| a.id).collect()
    };
    assert_eq!(marks(None, 0, None), [1, 2, 3]);
    assert_eq!(marks(Some("a:1"), 0, None), [1, 2], "the fleet's markers and its own");
    assert_eq!(marks(None, 1_500, None), [2, 3]);
    assert_eq!(marks(None, 0, Some(3)), [3]);

    let event = |id: u64, instance: &str, opened: i64, closed: i64, updated: i64| Event {
        id,
        instance: instance.into(),
        kind: "regressed".into(),
        digest: id * 10,
        opened_unix_ms: opened,
        closed_unix_ms: closed,
        updated_unix_ms: updated,
        ..Default::default()
    };
    store.put_events(&[event(1, "a:1", 1_000, 0, 1_000), event(2, "b:1", 2_000, 0, 2_000)]).unwrap();
    // Event 1 closes; a late write of its older version changes nothing.
    store.put_events(&[event(1, "a:1", 1_000, 5_000, 5_000)]).unwrap();
    store.put_events(&[event(1, "a:1", 1_000, 0, 1_000)]).unwrap();
    let read = |instance: Option<&str>, since: i64, until: i64, open_only: bool| -> Vec<(u64, i64)> {
        let query = EventsQuery {
            instance: instance.map(str::to_string),
            kind: None,
            since_unix_ms: since,
            until_unix_ms: until,
            open_only,
            limit: 100,
        };
        store.events(&query).unwrap().into_iter().map(|e| (e.id, e.closed_unix_ms)).collect()
    };
    assert_eq!(read(None, 0, i64::MAX, false), [(2, 0), (1, 5_000)], "newest opened first, newest version");
    assert_eq!(read(None, 0, i64::MAX, true), [(2, 0)]);
    assert_eq!(read(Some("a:1"), 0, i64::MAX, false), [(1, 5_000)]);
    assert_eq!(read(None, 6_000, i64::MAX, false), [(2, 0)], "closed before the range");
    assert_eq!(read(None, 0, 1_500, false), [(1, 5_000)], "opened after the range");

    let pruned = store.prune(&PruneCutoffs { raw: 0, minute: 0, hour: 1_500 }).unwrap();
    assert!(pruned.event_rows >= 2, "{pruned:?}");
    assert_eq!(marks(None, 0, None), [2, 3]);
    assert_eq!(read(None, 0, i64::MAX, false), [(2, 0)]);
}
