//! What a replica applies, seen on the replica by its own agent: every
//! transaction and rows event is counted once against the replica's own
//! GTID position and the workload the primary ran, each rows event is named
//! by its table and kind, and the lag at commit is measured. Needs root
//! (eBPF) and a private primary and replica pair.
mod common;

use std::time::Duration;

use common::{
    Agent, PrivateServer, browser,
    collector::{Collector, sqlbee_query},
    privileged,
    replication::{SOURCES, caught_up, caught_up_in, multi_source, pair},
};
use serde_json::Value;

/// Events of `class` over the agent's replication lines.
fn events_of_class(windows: &[&Value], class: &str) -> u64 {
    windows
        .iter()
        .flat_map(|w| w["events"].as_array().unwrap())
        .filter(|e| e["class"] == class)
        .map(|e| e["events"].as_u64().unwrap())
        .sum()
}

/// The agent on the replica, shipping to `collector`, its metrics on
/// `metrics_port`.
fn agent_on(replica: &PrivateServer, collector: &Collector, metrics_port: u16) -> Agent {
    agent_with(replica, collector, metrics_port, &[])
}

fn agent_with(replica: &PrivateServer, collector: &Collector, metrics_port: u16, extra: &[&str]) -> Agent {
    let mut args = vec![
        format!("--pid={}", replica.pid()),
        "--window=500ms".into(),
        format!("--collector={}", collector.http_url()),
        format!("--state-dir={}", replica.dir().join("agent-state").display()),
        format!("--metrics-listen=127.0.0.1:{metrics_port}"),
    ];
    args.extend(extra.iter().map(|a| a.to_string()));
    Agent::start(replica.dir(), &args)
}

/// A row-based replica with two parallel workers: every transaction the
/// primary commits is applied once, rows events per table and kind as the
/// primary wrote them, and the lag stays near zero.
#[test]
fn a_row_based_replica_counts_each_transaction_and_table_once() {
    if !privileged("a_row_based_replica_counts_each_transaction_and_table_once") {
        return;
    }
    let _serial = common::one_at_a_time();
    let (primary, replica) = pair("ROW", 2);
    let caught_up = || caught_up(&primary, &replica);
    let before = caught_up();
    let collector = Collector::start(&[]);
    let metrics_port = common::free_port();
    let agent = agent_on(&replica, &collector, metrics_port);
    const INSERTS: u64 = 30;
    const DELETES: u64 = 5;
    for i in 0..INSERTS {
        primary.sql(&format!("INSERT INTO rep.t VALUES ({i}, {i})")).unwrap();
    }
    // One transaction of two rows events.
    primary
        .sql("BEGIN; UPDATE rep.t SET v = v + 1 WHERE id < 10; UPDATE rep.t SET v = v + 1 WHERE id >= 10; COMMIT")
        .unwrap();
    for i in 0..DELETES {
        primary.sql(&format!("DELETE FROM rep.t WHERE id = {i}")).unwrap();
    }
    // A DDL: a transaction without an XID.
    primary.sql("CREATE TABLE rep.u (id INT PRIMARY KEY)").unwrap();
    let after = caught_up();
    std::thread::sleep(Duration::from_millis(800));
    // The agent's page counts them too (rendered once a window: every
    // transaction is in once a window has closed after the last).
    let page = common::http_get(metrics_port, "/metrics");
    let line = |series: &str| -> u64 {
        page.lines().find_map(|l| l.strip_prefix(series)?.trim().parse::<f64>().ok()).map_or(0, |v| v as u64)
    };
    let instance = format!("{{instance=\"{}\",channel=\"\"}}", common::instance_of(&replica));
    assert_eq!(line(&format!("sqlbee_replica_transactions_total{instance}")), after - before, "{page}");
    assert_eq!(line(&format!("sqlbee_replica_lag_seconds_count{instance}")), after - before);
    let out = agent.stop();
    assert!(out.success, "{}", out.stderr);
    let windows: Vec<&Value> = out.of_type("replication").collect();
    let total = |pick: &dyn Fn(&Value) -> u64| windows.iter().map(|w| pick(w)).sum::<u64>();
    let transactions = total(&|w| w["transactions"].as_u64().unwrap());
    assert_eq!(transactions, after - before, "one per GTID the replica applied: {windows:#?}");
    assert_eq!(transactions, INSERTS + 1 + DELETES + 1);
    let rows = |kind: &str| {
        total(&|w| {
            w["tables"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|t| t["schema"] == "rep" && t["table"] == "t" && t["kind"] == kind)
                .map(|t| t["events"].as_u64().unwrap())
                .sum()
        })
    };
    assert_eq!((rows("write_rows"), rows("update_rows"), rows("delete_rows")), (INSERTS, 2, DELETES), "{windows:#?}");
    // And the rows each kind changed, exactly: every insert's row, the
    // two updates' 10 and 20, every delete's row.
    let changed = |kind: &str| {
        total(&|w| {
            w["tables"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|t| t["schema"] == "rep" && t["table"] == "t" && t["kind"] == kind)
                .map(|t| t["rows"].as_u64().expect("rows read"))
                .sum()
        })
    };
    assert_eq!((changed("write_rows"), changed("update_rows"), changed("delete_rows")), (INSERTS, INSERTS, DELETES));
    let class = |name: &str| events_of_class(&windows, name);
    assert_eq!(class("gtid"), transactions);
    assert_eq!(class("xid"), transactions - 1, "every transaction but the DDL commits with an XID");
    assert_eq!(class("rows"), INSERTS + 2 + DELETES);
    // Apply time is positive wherever events were applied, and each
    // event's, from its histogram, lies within it.
    for t in windows.iter().flat_map(|w| w["tables"].as_array().unwrap()) {
        let (p50, p99, all) =
            (t["p50_ms"].as_f64().unwrap(), t["p99_ms"].as_f64().unwrap(), t["apply_ns"].as_u64().unwrap());
        assert!(all > 0 && 0.0 < p50 && p50 <= p99 && p99 * 1e6 <= all as f64 + 1.0, "{t}");
    }
    // One lag sample per transaction, and near zero: both servers share
    // this clock, and the primary's time has whole seconds.
    let samples = total(&|w| w["lag"]["samples"].as_u64().unwrap());
    assert_eq!(samples, transactions);
    assert_eq!(total(&|w| w["lost_events"].as_u64().unwrap()), 0, "no event went untimed");
    let max = windows.iter().filter_map(|w| w["lag"]["max_ms"].as_u64()).max().unwrap();
    assert!(max < 5_000, "lag up to {max} ms on an idle pair");
    // Tables and counts only: no line of the replication carries a value.
    let text = serde_json::to_string(&windows).unwrap();
    assert!(!text.contains("\"v\"") && !text.contains("values"), "{text}");

    // The same through the collector: `sqlbee replication` merges the
    // windows it stored, exactly.
    let url = collector.http_url();
    let answer = sqlbee_query(&["replication", "--collector", &url, "--since", "all", "--format", "json"]);
    assert!(answer.status.success(), "{}", String::from_utf8_lossy(&answer.stderr));
    let answer: Value = serde_json::from_slice(&answer.stdout).unwrap();
    let replicas = answer["replicas"].as_array().unwrap();
    assert_eq!(replicas.len(), 1, "{answer:#}");
    let stored = &replicas[0];
    assert_eq!(stored["transactions"], transactions);
    assert_eq!(stored["lag"]["samples"], samples);
    assert_eq!(stored["lag"]["max_ms"].as_u64().unwrap() / 1000, max / 1000, "the same highest lag, to the second");
    let stored_rows = |kind: &str| -> u64 {
        stored["tables"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|t| t["schema"] == "rep" && t["table"] == "t" && t["kind"] == kind)
            .map(|t| t["events"].as_u64().unwrap())
            .sum()
    };
    assert_eq!(
        (stored_rows("write_rows"), stored_rows("update_rows"), stored_rows("delete_rows")),
        (INSERTS, 2, DELETES)
    );
    let update = stored["tables"].as_array().unwrap().iter().find(|t| t["kind"] == "update_rows").unwrap();
    assert_eq!(update["rows"], INSERTS, "rows survive the store");
    assert!(update["p99_ms"].as_f64().unwrap() * 1e6 <= update["apply_ns"].as_u64().unwrap() as f64 + 1.0, "{update}");
    let stored_apply: u64 = stored["tables"].as_array().unwrap().iter().map(|t| t["apply_ns"].as_u64().unwrap()).sum();
    let agent_apply = total(&|w| w["tables"].as_array().unwrap().iter().map(|t| t["apply_ns"].as_u64().unwrap()).sum());
    assert_eq!(stored_apply, agent_apply, "apply time stored as measured");
    assert_eq!(stored["lost_events"], 0);
    // `top --by table` ranks the replica's tables with the rows events
    // applied to them (rep.u's DDL is a statement of its own).
    let instance = common::instance_of(&replica);
    let by_table = sqlbee_query(&[
        "top",
        "--collector",
        &url,
        "--since",
        "all",
        "--instance",
        &instance,
        "--by",
        "table",
        "--format",
        "json",
    ]);
    assert!(by_table.status.success(), "{}", String::from_utf8_lossy(&by_table.stderr));
    let by_table: Value = serde_json::from_slice(&by_table.stdout).unwrap();
    let first = by_table["tables"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["schema"] == "rep" && t["table"] == "t")
        .unwrap_or_else(|| panic!("{by_table:#}"));
    let applied = first["applied"].as_array().unwrap();
    let sum = |key: &str| applied.iter().map(|a| a[key].as_u64().unwrap()).sum::<u64>();
    assert_eq!(sum("events"), INSERTS + 2 + DELETES);
    assert_eq!(sum("rows"), INSERTS + INSERTS + DELETES);
    assert_eq!(first["apply_ns"].as_u64().unwrap(), sum("apply_ns"));
    assert_eq!(first["total_ns"].as_u64().unwrap(), first["sum_ns"].as_u64().unwrap() + sum("apply_ns"));
    let shown = sqlbee_query(&["top", "--collector", &url, "--since", "all", "--instance", &instance, "--by", "table"]);
    let shown = String::from_utf8_lossy(&shown.stdout);
    assert!(shown.lines().any(|l| l.starts_with("rep.t ") && l.contains("update_rows")), "{shown}");
    let refused = sqlbee_query(&["top", "--collector", &url, "--by", "table", "--digest", "0123456789abcdef"]);
    assert!(
        !refused.status.success() && String::from_utf8_lossy(&refused.stderr).contains("--digest does not apply"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    let table = sqlbee_query(&["replication", "--collector", &url, "--since", "all"]);
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(
        table.contains("rep.t")
            && table.contains("update_rows")
            && table.contains(&format!("{transactions} transactions")),
        "{table}"
    );

    // In a real browser: the replication page names the replica, its
    // transactions and the table.
    if browser::available("a_row_based_replica_counts_each_transaction_and_table_once") {
        let page = format!("{}replication?since=all", collector.ui);
        let loaded = browser::load(&page);
        assert!(loaded.console.is_empty(), "{:#?}", loaded.console);
        let dom = &loaded.dom;
        assert_eq!(dom.matches("<section class=\"replica\"").count(), 1, "{dom}");
        assert!(dom.contains(&format!("<span class=\"transactions\">{transactions}</span>")), "{dom}");
        let row = format!("<td>rep.t</td><td>update_rows</td><td class=\"num\">2</td><td class=\"num\">{INSERTS}</td>");
        assert!(dom.contains(&row), "{dom}");
        assert!(dom.contains("Lag at commit"), "the lag plot");
        assert!(
            dom.contains("<p class=\"verdict\">Lag peaked at") && dom.contains("of apply time was write_rows on rep.t"),
            "{dom}"
        );
        assert!(browser::screenshot(&page, &browser::screenshot_dir().join("replication.png")).is_empty());
        // The Tables page counts the rows events beside the statements.
        let tables = browser::load(&format!("{}tables?since=all", collector.ui));
        assert!(tables.console.is_empty(), "{:#?}", tables.console);
        assert!(
            tables.dom.contains("<li class=\"table-applied\" data-kind=\"update_rows\" data-events=\"2\">"),
            "{}",
            tables.dom
        );
    }
}

/// A replica of two primaries (multi-source, two parallel workers shared
/// by both channels): each channel's transactions and tables are its own,
/// counted exactly against the replica's position in its GTID domain.
#[test]
fn a_multi_source_replica_tells_its_channels_apart() {
    if !privileged("a_multi_source_replica_tells_its_channels_apart") {
        return;
    }
    let _serial = common::one_at_a_time();
    let (primaries, replica) = multi_source(2);
    let position = |i: usize| caught_up_in(&primaries[i], &replica, SOURCES[i].1);
    let before: Vec<u64> = (0..2).map(position).collect();
    let collector = Collector::start(&[]);
    let metrics_port = common::free_port();
    let agent = agent_on(&replica, &collector, metrics_port);
    // eu: 12 single-row inserts; us: 7, then one transaction of two updates.
    let inserts = [12u64, 7];
    for (primary, ((channel, _), n)) in primaries.iter().zip(SOURCES.iter().zip(inserts)) {
        for i in 0..n {
            primary.sql(&format!("INSERT INTO {channel}.t VALUES ({i}, {i})")).unwrap();
        }
    }
    primaries[1].sql("BEGIN; UPDATE us.t SET v = 0 WHERE id < 3; UPDATE us.t SET v = 1 WHERE id >= 3; COMMIT").unwrap();
    let after: Vec<u64> = (0..2).map(position).collect();
    let applied = [after[0] - before[0], after[1] - before[1]];
    assert_eq!(applied, [12, 8]);
    std::thread::sleep(Duration::from_millis(800));
    let page = common::http_get(metrics_port, "/metrics");
    let out = agent.stop();
    assert!(out.success, "{}", out.stderr);
    let windows: Vec<&Value> = out.of_type("replication").collect();
    for (i, (channel, _)) in SOURCES.iter().enumerate() {
        let mine: Vec<&&Value> = windows.iter().filter(|w| w["channel"] == *channel).collect();
        let transactions: u64 = mine.iter().map(|w| w["transactions"].as_u64().unwrap()).sum();
        assert_eq!(transactions, applied[i], "channel {channel}: {windows:#?}");
        let samples: u64 = mine.iter().map(|w| w["lag"]["samples"].as_u64().unwrap()).sum();
        assert_eq!(samples, applied[i], "one lag per transaction on {channel}");
        // Its rows events name only its own schema's table.
        let tables: Vec<(String, String, u64)> = mine
            .iter()
            .flat_map(|w| w["tables"].as_array().unwrap())
            .map(|t| {
                (
                    t["schema"].as_str().unwrap().into(),
                    t["kind"].as_str().unwrap().into(),
                    t["events"].as_u64().unwrap(),
                )
            })
            .collect();
        assert!(tables.iter().all(|(schema, _, _)| schema == channel), "{channel}: {tables:?}");
        let of_kind = |kind: &str| tables.iter().filter(|t| t.1 == kind).map(|t| t.2).sum::<u64>();
        assert_eq!((of_kind("write_rows"), of_kind("update_rows")), (inserts[i], if i == 1 { 2 } else { 0 }));
        let series = format!(
            "sqlbee_replica_transactions_total{{instance=\"{}\",channel=\"{channel}\"}} ",
            common::instance_of(&replica)
        );
        assert!(page.contains(&format!("{series}{}", applied[i])), "{series} in {page}");
    }
    assert!(windows.iter().all(|w| w["channel"] != ""), "no event fell to the default channel: {windows:#?}");
    // The collector keeps each channel apart.
    let answer =
        sqlbee_query(&["replication", "--collector", &collector.http_url(), "--since", "all", "--format", "json"]);
    assert!(answer.status.success(), "{}", String::from_utf8_lossy(&answer.stderr));
    let answer: Value = serde_json::from_slice(&answer.stdout).unwrap();
    let channels: Vec<(&str, u64)> = answer["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["channel"].as_str().unwrap(), r["transactions"].as_u64().unwrap()))
        .collect();
    assert_eq!(channels, [("eu", applied[0]), ("us", applied[1])], "{answer:#}");
    let shown = sqlbee_query(&["replication", "--collector", &collector.http_url(), "--since", "all"]);
    let shown = String::from_utf8_lossy(&shown.stdout);
    assert!(
        shown.contains("(channel eu): 12 transactions") && shown.contains("(channel us): 8 transactions"),
        "{shown}"
    );
}

/// A statement-based replica with one applier thread, made late on
/// purpose: its SQL thread stopped while the primary writes, then started.
/// Every transaction is counted once, the lag at commit shows how long
/// they waited (on the timeline too), and the statements it applied are
/// the replica's digests. The replica's agent runs the lean tier, whose
/// narrowed window still tells the applier apart (the default's window is
/// tested with the applier in `stored_programs`).
#[test]
fn lag_made_on_purpose_is_measured_per_transaction() {
    if !privileged("lag_made_on_purpose_is_measured_per_transaction") {
        return;
    }
    let _serial = common::one_at_a_time();
    let (primary, replica) = pair("STATEMENT", 0);
    primary.sql("INSERT INTO rep.t VALUES (1, 0), (2, 0), (3, 0)").unwrap();
    let before = caught_up(&primary, &replica);
    let collector = Collector::start(&[]);
    let metrics_port = common::free_port();
    let agent = agent_with(&replica, &collector, metrics_port, &["--figures=lean"]);
    // The primary traced too, into the same collector: both sides of one
    // change.
    let primary_agent = agent_on(&primary, &collector, common::free_port());
    replica.sql("STOP SLAVE SQL_THREAD").unwrap();
    const UPDATES: u64 = 12;
    for i in 0..UPDATES {
        primary.sql(&format!("UPDATE rep.t SET v = v + 1 WHERE id = {}", i % 3 + 1)).unwrap();
    }
    const HELD: Duration = Duration::from_secs(3);
    std::thread::sleep(HELD);
    replica.sql("START SLAVE SQL_THREAD").unwrap();
    let after = caught_up(&primary, &replica);
    std::thread::sleep(Duration::from_millis(800));
    let out = agent.stop();
    assert!(out.success, "{}", out.stderr);
    assert!(primary_agent.stop().success);
    assert_eq!(after - before, UPDATES);
    let windows: Vec<&Value> = out.of_type("replication").collect();
    let total = |pick: &dyn Fn(&Value) -> u64| windows.iter().map(|w| pick(w)).sum::<u64>();
    assert_eq!(total(&|w| w["transactions"].as_u64().unwrap()), UPDATES, "{windows:#?}");
    assert_eq!(total(&|w| w["lag"]["samples"].as_u64().unwrap()), UPDATES);
    // Each waited at least as long as the applier was held, less the
    // primary's whole second; none absurdly long.
    let max = windows.iter().filter_map(|w| w["lag"]["max_ms"].as_u64()).max().unwrap();
    assert!(max + 1000 >= HELD.as_millis() as u64 && max < 60_000, "lag up to {max} ms after a {HELD:?} stop");
    let class = |name: &str| events_of_class(&windows, name);
    // Statements, not rows: the UPDATE and its XID each (MariaDB's GTID
    // event stands for the BEGIN).
    assert_eq!((class("xid"), class("rows"), class("gtid")), (UPDATES, 0, UPDATES));
    assert_eq!(class("query"), UPDATES, "{windows:#?}");
    let applied: u64 = out
        .of_type("digest")
        .filter(|d| d["source"] == "replica" && d["digest_text"].as_str().is_some_and(|t| t.starts_with("UPDATE")))
        .map(|d| d["count"].as_u64().unwrap())
        .sum();
    assert_eq!(applied, UPDATES, "the statements it applied, as digests");

    // The collector's timeline has the late window.
    let answer =
        sqlbee_query(&["replication", "--collector", &collector.http_url(), "--since", "all", "--format", "json"]);
    let answer: Value = serde_json::from_slice(&answer.stdout).unwrap();
    let replica_answer = &answer["replicas"][0];
    assert_eq!(replica_answer["transactions"], UPDATES);
    let highest = replica_answer["timeline"].as_array().unwrap().iter().filter_map(|w| w["lag_max_ms"].as_u64()).max();
    assert_eq!(highest, Some(max), "{answer:#}");
    // The UPDATE as the replica applied it, beside the same digest as the
    // primary's client ran it.
    let update = replica_answer["digests"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["digest_text"].as_str().is_some_and(|t| t.starts_with("UPDATE")))
        .unwrap_or_else(|| panic!("{answer:#}"));
    assert_eq!(update["applied"]["count"], UPDATES);
    assert_eq!(update["primary"]["count"], UPDATES, "{update:#}");
    assert_eq!(update["primary"]["instances"], serde_json::json!([common::instance_of(&primary)]));
    if browser::available("lag_made_on_purpose_is_measured_per_transaction") {
        let loaded = browser::load(&format!("{}replication?since=all", collector.ui));
        assert!(loaded.console.is_empty(), "{:#?}", loaded.console);
        let row = format!("<td class=\"num applied\">{UPDATES}</td>");
        assert!(loaded.dom.contains(&row) && loaded.dom.contains(&format!("<td class=\"num primary\">{UPDATES}</td>")));
    }
}
