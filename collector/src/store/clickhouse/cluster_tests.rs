//! The cluster store against a private cluster of two shards of two
//! replicas and a ZooKeeper (see `xtask::clickhouse_cluster`): the same
//! answers as one server's store on the same batches, raw and rolled up,
//! each agent's rows on its own shard only, the shared store assertions,
//! and a replica killed under writes.
use sqlbee_proto::v1::Batch;
use xtask::{
    clickhouse::for_test,
    clickhouse_cluster::{CLUSTER, REPLICAS, SHARDS, cluster_for_test, private_cluster_for_test},
};

use super::{
    ClickHouseStore, Location, cluster,
    tests::{batch, costed, everything},
};
use crate::store::{rollup::HOUR_MS as HOUR, *};

fn open_at(location: &str) -> ClickHouseStore {
    let location = Location::parse(&location["clickhouse:".len()..]).expect("a location");
    ClickHouseStore::open(&location).expect("opening the store")
}

/// A store on a fresh database of the shared cluster, or None (the test
/// skips, saying why).
fn cluster_store(test: &str) -> Option<ClickHouseStore> {
    let cluster = cluster_for_test(test)?;
    Some(open_at(&cluster.location(&cluster.fresh_database(test))))
}

/// `batch` of another agent and instance.
fn of_agent(agent: usize, sequence: u64, end: i64, buckets: &[(u32, u64)]) -> Batch {
    let mut b = batch(sequence, end, buckets);
    b.agent.as_mut().unwrap().agent_id = format!("agent-{agent}");
    b.windows[0].instance.as_mut().unwrap().name = format!("h{agent}:3306");
    b.windows[0].window_start_unix_ms = end - 10_000;
    b
}

fn put(store: &ClickHouseStore, b: &Batch, at: i64) -> IngestOutcome {
    store.ingest(b.clone(), at, content_hash(b)).expect("storing a batch")
}

/// Every answer the test compares, over all time and by ten minutes.
fn answers(store: &ClickHouseStore, since: i64, until: i64) -> String {
    let top = store.top(&TopQuery { limit: 100, ..everything(0) }).unwrap();
    let totals = store.totals(&TotalsQuery { instance: None, since_unix_ms: 0, until_unix_ms: i64::MAX }).unwrap();
    let mut out = format!("{top:?}\n{totals:?}\n");
    for of in [SeriesOf::Statements, SeriesOf::Digest(u64::MAX - 1), SeriesOf::Cost] {
        let query = SeriesQuery {
            of,
            instance: None,
            schema: None,
            since_unix_ms: since,
            until_unix_ms: until,
            step_ms: 10 * 60_000,
        };
        out.push_str(&format!("{:?}\n", store.series(&query).unwrap()));
        out.push_str(&format!("{:?}\n", store.series_by_instance(&query).unwrap()));
    }
    let mut instances = store.instances().unwrap();
    instances.sort_by(|a, b| (&a.agent_id, &a.instance).cmp(&(&b.agent_id, &b.instance)));
    out.push_str(&format!("{instances:?}\n"));
    out
}

#[test]
fn a_cluster_answers_as_one_server_does_raw_and_rolled_up() {
    let test = "cluster-equals-one-server";
    let (Some(cluster), Some(server)) = (cluster_for_test(test), for_test(test)) else { return };
    let on_cluster = open_at(&cluster.location(&cluster.fresh_database(test)));
    let alone = open_at(&server.location(&server.fresh_database(test)));
    // Eight agents (both shards), a window every three hours over 54
    // hours that ended four hours ago: 54 hours hold a whole UTC day
    // wherever they start, so every rollup level (ten minutes, hours,
    // days) has buckets.
    const SPAN: i64 = 58 * HOUR;
    let now = sqlbee_vocabulary::clock::now_unix_ms();
    let start = (now - SPAN).div_euclid(HOUR) * HOUR;
    let mut statements = 0;
    for agent in 0..8 {
        for n in 0..18u64 {
            let end = start + (n as i64 + 1) * 3 * HOUR + agent as i64 * 1000;
            let b = if n % 3 == 0 {
                let mut c = costed(n + 1, end, 0.25, "exact");
                c.agent = of_agent(agent, n + 1, end, &[]).agent;
                c.windows[0].instance.as_mut().unwrap().name = format!("h{agent}:3306");
                c
            } else {
                of_agent(agent, n + 1, end, &[(10 + agent as u32, n + 1), (40, 1)])
            };
            statements += b.windows[0].statements;
            for store in [&on_cluster, &alone] {
                assert!(!put(store, &b, end).duplicate);
                assert!(put(store, &b, end + 1).duplicate, "a replay is a duplicate");
            }
        }
    }
    // Each agent's batches are on its shard, both replicas, and nowhere else.
    for shard in 1..=SHARDS {
        let expected = (0..8).filter(|a| cluster::shard_of(&format!("agent-{a}"), SHARDS) == shard - 1).count();
        assert!(expected > 0, "eight agents spread over both shards");
        for replica in 1..=REPLICAS {
            let node = cluster.node(shard, replica);
            let sql = format!("SELECT uniqExact(agent_id) FROM {}_shard.batches", database_of(&on_cluster));
            let found = wait_for(|| node.sql(&sql).unwrap().trim() == expected.to_string());
            assert!(found, "shard {shard} replica {replica} holds the batches of its {expected} agents");
        }
    }
    let (since, until) = (start, start + SPAN);
    let raw = answers(&alone, since, until);
    assert!(raw.contains(&format!("statements: {statements}")), "{raw}");
    assert_eq!(answers(&on_cluster, since, until), raw, "raw answers");
    // Rolled up on both (every inserted second past), the same again.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    for store in [&on_cluster, &alone] {
        let mut passes = 0;
        // A replica still fetching the newest parts makes a pass wait.
        while store.roll_up_settled(0).map_or(1, |o| o.left) > 0 {
            passes += 1;
            assert!(passes < 40, "rollups end: {:?}", store.roll_up_settled(0));
            std::thread::sleep(std::time::Duration::from_millis(250));
        }
    }
    let rolled = answers(&on_cluster, since, until);
    assert_eq!(rolled, answers(&alone, since, until), "rolled-up answers");
    assert_eq!(rolled, raw, "rollups change no answer");
    for level in [10 * 60_000, HOUR, 24 * HOUR] {
        let sql = format!("SELECT count() FROM rollup_marks WHERE level = {level}");
        let marks = on_cluster.db.select(&sql).unwrap().u64().unwrap();
        assert!(marks > 0, "rolled up at level {level} ms");
    }
    // A pass over the same buckets again doubles nothing.
    assert_eq!(on_cluster.roll_up_settled(0).unwrap().buckets, 0, "nothing new, nothing due");
    assert_eq!(answers(&on_cluster, since, until), raw);
    // Retention prunes every shard.
    let pruned = on_cluster.prune(&PruneCutoffs::all(until)).unwrap();
    assert_eq!(pruned.batches, 8 * 18, "{pruned:?}");
    let left = on_cluster.totals(&TotalsQuery { instance: None, since_unix_ms: 0, until_unix_ms: i64::MAX }).unwrap();
    assert_eq!(left.statements, 0);
}

fn database_of(store: &ClickHouseStore) -> String {
    store.shown.rsplit('/').next().unwrap().split('?').next().unwrap().to_string()
}

/// Polls `done` for up to 30 s (replication is asynchronous).
fn wait_for(mut done: impl FnMut() -> bool) -> bool {
    let started = std::time::Instant::now();
    while started.elapsed() < std::time::Duration::from_secs(30) {
        if done() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    false
}

#[test]
fn shared_assertions_on_a_cluster() {
    let Some(store) = cluster_store("shared") else { return };
    shared_tests::series_split_by_instance_add_up_to_the_fleet(&store, batch);
    let Some(store) = cluster_store("shared-digest") else { return };
    shared_tests::series_split_by_digest_match_filtered_reads(&store, batch);
    let Some(store) = cluster_store("shared-messages") else { return };
    shared_tests::error_messages_are_kept_per_instance(&store, batch);
    let Some(store) = cluster_store("shared-plans") else { return };
    shared_tests::plans_merge_sightings_and_list_changes(&store, batch);
    let Some(store) = cluster_store("shared-tags") else { return };
    shared_tests::tags_and_exemplars_merge_over_windows(&store, batch);
    let Some(store) = cluster_store("shared-long") else { return };
    shared_tests::long_statements_newest_first_once_and_pruned(&store, batch);
    let Some(store) = cluster_store("shared-events") else { return };
    shared_tests::markers_and_events_keep_their_newest_version(&store);
    let Some(store) = cluster_store("shared-latest") else { return };
    shared_tests::latest_cost_takes_each_agents_nearest_window(&store, costed);
}

#[test]
fn a_replica_killed_under_writes_loses_and_doubles_nothing_and_a_node_down_at_open_joins_later() {
    let Some(cluster) = private_cluster_for_test("replica-killed") else { return };
    let store = std::sync::Arc::new(open_at(&cluster.location(&cluster.fresh_database("killed"))));
    let now = sqlbee_vocabulary::clock::now_unix_ms();
    let writers: Vec<_> = (0..4)
        .map(|agent| {
            let store = store.clone();
            std::thread::spawn(move || {
                let mut stored = 0u64;
                for n in 0..60u64 {
                    let b = of_agent(agent, n + 1, now + n as i64 * 100, &[(10, 1 + n % 3)]);
                    // As an agent does: again until acknowledged.
                    let mut tries = 0;
                    loop {
                        match store.ingest(b.clone(), now, content_hash(&b)) {
                            Ok(outcome) => {
                                stored += b.windows[0].statements * u64::from(!outcome.duplicate);
                                break;
                            }
                            Err(e) => {
                                tries += 1;
                                assert!(tries < 100, "agent {agent} batch {n}: {e}");
                                std::thread::sleep(std::time::Duration::from_millis(100));
                            }
                        }
                    }
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                stored
            })
        })
        .collect();
    // Both shards lose their first replica mid-run, one after the other.
    std::thread::sleep(std::time::Duration::from_millis(500));
    cluster.node(1, 1).stop().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(700));
    cluster.node(2, 1).stop().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(700));
    cluster.node(1, 1).start().unwrap();
    cluster.node(2, 1).start().unwrap();
    let acknowledged: u64 = writers.into_iter().map(|w| w.join().unwrap()).sum();
    let sent: u64 = (0..60u64).map(|n| 1 + n % 3).sum::<u64>() * 4;
    assert_eq!(acknowledged, sent, "every batch acknowledged once");
    let all = TotalsQuery { instance: None, since_unix_ms: 0, until_unix_ms: i64::MAX };
    let settled = wait_for(|| store.totals(&all).is_ok_and(|t| t.statements == sent));
    assert!(settled, "totals reach {sent}: {:?}", store.totals(&all));
    // Each replica alone, once replication has caught up, holds its
    // shard's agents' statements once: no batch twice, none lost.
    let per_agent: u64 = (0..60u64).map(|n| 1 + n % 3).sum();
    for shard in 1..=SHARDS {
        let agents = (0..4).filter(|a| cluster::shard_of(&format!("agent-{a}"), SHARDS) == shard - 1).count() as u64;
        let db = format!("{}_shard", database_of(&store));
        let sql = format!(
            "SELECT sum(count) FROM {db}.digest_windows WHERE (agent_id, epoch, sequence, ingest_id) IN
             (SELECT agent_id, epoch, sequence, min(ingest_id) FROM {db}.batches GROUP BY agent_id, epoch, sequence)"
        );
        for replica in 1..=REPLICAS {
            let node = cluster.node(shard, replica);
            let held = wait_for(|| node.sql(&sql).is_ok_and(|out| out.trim() == (agents * per_agent).to_string()));
            assert!(held, "shard {shard} replica {replica}: {:?}, expected {}", node.sql(&sql), agents * per_agent);
        }
    }
    drop(store);
    a_node_down_at_open_joins_its_shard_when_back(&cluster);
}

/// A collector opened while a replica is down writes through the other;
/// once the replica answers, the rollup pass places it, and the shard's
/// writes go on through it when the other replica goes away.
fn a_node_down_at_open_joins_its_shard_when_back(cluster: &xtask::clickhouse_cluster::ClickHouseCluster) {
    let (late, other) = (cluster.node(2, 2), cluster.node(2, 1));
    late.stop().unwrap();
    let store = open_at(&cluster.location(&cluster.fresh_database("late")));
    let agent = (0..).find(|a| cluster::shard_of(&format!("agent-{a}"), SHARDS) == 1).unwrap();
    let now = sqlbee_vocabulary::clock::now_unix_ms();
    assert!(!put(&store, &of_agent(agent, 1, now, &[(10, 3)]), now).duplicate);
    late.start().unwrap();
    // The replica takes the shard's log before it is asked to write alone.
    cluster.wait_replicated(std::time::Duration::from_secs(60)).unwrap();
    store.roll_up().unwrap();
    other.stop().unwrap();
    let b = of_agent(agent, 2, now + 1000, &[(10, 4)]);
    let stored = store.ingest(b.clone(), now, content_hash(&b));
    other.start().unwrap();
    assert!(!stored.expect("written through the replica placed late").duplicate);
    let all = TotalsQuery { instance: None, since_unix_ms: 0, until_unix_ms: i64::MAX };
    let settled = wait_for(|| store.totals(&all).is_ok_and(|t| t.statements == 7));
    assert!(settled, "both batches counted once: {:?}", store.totals(&all));
}

/// A cluster store an older collector wrote (here version 4: no
/// `instance_windows.server_login`, none of the tables versions 5 to 7
/// added) is upgraded on every node, shard tables and `Distributed` tables
/// alike, and then stores and answers what the new columns carry.
#[test]
fn an_older_cluster_store_is_upgraded_on_every_node() {
    let Some(cluster) = cluster_for_test("cluster-upgrade") else { return };
    let database = cluster.fresh_database("cluster_upgrade");
    let shard_db = super::schema::shard_database(&database);
    let layout = super::schema::Layout::Cluster { cluster: CLUSTER, database: &database, shard_db: &shard_db };
    let first = cluster.node(1, 1);
    for db in [&shard_db, &database] {
        first.sql(&format!("CREATE DATABASE {db} ON CLUSTER {CLUSTER}")).unwrap();
    }
    let added_later = ["plans", "plan_changes", "digest_tables", "long_statements", "annotations", "events"];
    let tables = super::schema::tables_for(layout);
    for (name, create) in tables.iter().filter(|(name, _)| !added_later.contains(name)) {
        first.sql(create).unwrap();
        first
            .sql(&format!(
                "CREATE TABLE {database}.{name} ON CLUSTER {CLUSTER} AS {shard_db}.{name}
                 ENGINE = Distributed({CLUSTER}, {shard_db}, {name})"
            ))
            .unwrap();
    }
    let drop_login = "DROP COLUMN server_login";
    first.sql(&format!("ALTER TABLE {shard_db}.instance_windows ON CLUSTER {CLUSTER} {drop_login}")).unwrap();
    // A `Distributed` table is altered node by node (ON CLUSTER refuses it).
    for node in &cluster.nodes {
        node.sql(&format!("ALTER TABLE {database}.instance_windows {drop_login}")).unwrap();
    }
    first.sql(&format!("INSERT INTO {shard_db}.schema_version (version, written_unix_ms) VALUES (4, 0)")).unwrap();

    let store = open_at(&cluster.location(&database));
    let version = store.db.select("SELECT toUInt64(max(version)) FROM schema_version").unwrap().u64().unwrap();
    assert_eq!(version, u64::from(super::SCHEMA_VERSION));
    for node in &cluster.nodes {
        for db in [&shard_db, &database] {
            let has = |sql: String| node.sql(&sql).unwrap().trim() == "1";
            assert!(
                has(format!(
                    "SELECT count() FROM system.columns
                     WHERE database = '{db}' AND table = 'instance_windows' AND name = 'server_login'"
                )),
                "{db}.instance_windows.server_login on {}",
                node.host_port
            );
            let tables = format!("SELECT count() = {} FROM system.tables WHERE database = '{db}'", tables.len());
            assert!(has(tables), "every table in {db} on {}", node.host_port);
        }
    }
    // What the added column carries is stored and read, on either shard.
    let end = sqlbee_vocabulary::clock::now_unix_ms() - HOUR;
    for agent in 0..4 {
        let mut b = super::tests::every_kind_of_row(1, end);
        b.agent.as_mut().unwrap().agent_id = format!("agent-{agent}");
        assert!(!put(&store, &b, end).duplicate);
    }
    // Each batch's traced instance (its other one is untraced: no login).
    let traced: Vec<_> = store.instances().unwrap().into_iter().filter(|i| i.latest.is_some()).collect();
    assert_eq!(traced.len(), 4, "{traced:?}");
    assert!(traced.iter().all(|i| i.server_login == "ok"), "{traced:?}");
}

/// Two collectors running the rollup pass at once over the same buckets of
/// a cluster store: each writes its rows under its own pass id, and reads
/// take one pass's rows per bucket, so every answer stays the raw one.
#[test]
fn two_collectors_rolling_up_at_once_double_no_bucket() {
    let Some(cluster) = cluster_for_test("rollups-at-once") else { return };
    let location = cluster.location(&cluster.fresh_database("at_once"));
    let (first, second) = (std::sync::Arc::new(open_at(&location)), std::sync::Arc::new(open_at(&location)));
    const SPAN: i64 = 58 * HOUR;
    let start = (sqlbee_vocabulary::clock::now_unix_ms() - SPAN).div_euclid(HOUR) * HOUR;
    for agent in 0..4 {
        for n in 0..12u64 {
            let end = start + (n as i64 + 1) * 4 * HOUR + agent as i64 * 1000;
            let store = if n % 2 == 0 { &first } else { &second };
            assert!(!put(store, &of_agent(agent, n + 1, end, &[(10 + agent as u32, n + 1), (40, 1)]), end).duplicate);
        }
    }
    let raw = answers(&first, start, start + SPAN);
    cluster.wait_replicated(std::time::Duration::from_secs(60)).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let passes: Vec<_> = [first.clone(), second.clone()]
        .into_iter()
        .map(|store| {
            std::thread::spawn(move || {
                let mut rounds = 0;
                while store.roll_up_settled(0).map_or(1, |o| o.left) > 0 {
                    rounds += 1;
                    assert!(rounds < 40, "rollups end");
                    std::thread::sleep(std::time::Duration::from_millis(250));
                }
            })
        })
        .collect();
    for pass in passes {
        pass.join().unwrap();
    }
    let mut day = first.db.select(&format!("SELECT count() FROM rollup_marks WHERE level = {}", 24 * HOUR)).unwrap();
    assert!(day.u64().unwrap() > 0, "a day rolled up");
    assert_eq!(answers(&first, start, start + SPAN), raw, "through the first collector");
    assert_eq!(answers(&second, start, start + SPAN), raw, "through the second");
}
