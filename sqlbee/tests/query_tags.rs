//! Who sent it, as the applications say: sqlcommenter and marginalia
//! comments on statements run through a real server, a real agent and a
//! real collector. Each digest's query tags carry exact counts whether the
//! kernel counted the statements (one text repeated) or the agent did (a
//! trace context per statement); the digest is the one the statement has
//! without its comment; a `traceparent` is only ever an exemplar; 10,000
//! distinct values on one digest stay bounded with exact sums; and no
//! literal leaves through a tag value.
mod common;

use std::{
    collections::{BTreeMap, HashSet},
    time::{Duration, Instant},
};

use common::{
    Agent, PrivateServer,
    collector::{Collector, sqlbee_query, top_json},
    privileged, root_conn,
};
use mysql::prelude::Queryable;
use serde_json::Value;

const SECRETS: [&str; 2] = ["ann.secret@example.com", "4111111111111111"];
const KERNEL_COUNTED: u64 = 300;
const TRACED: u64 = 200;
const MARGINALIA: u64 = 100;
const UNTAGGED: u64 = 50;
const SECRET_TAGGED: u64 = 5;
const DISTINCT: u64 = 10_000;

fn trace_id(i: u64) -> String {
    format!("{:016x}{:016x}", 0x5bd6_6ef5_0953_69c7u64, i + 1)
}

/// A tag's `[{value, count}]` list as value -> count (`None`: the values
/// not told apart).
fn tag_counts(row: &Value, key: &str) -> BTreeMap<Option<String>, u64> {
    row["tags"][key]
        .as_array()
        .map(|values| {
            values.iter().map(|v| (v["value"].as_str().map(str::to_string), v["count"].as_u64().unwrap())).collect()
        })
        .unwrap_or_default()
}

fn row<'a>(digests: &'a Value, text: &str) -> Option<&'a Value> {
    digests.as_array()?.iter().find(|d| d["digest_text"] == text)
}

#[test]
fn query_tags_are_counted_exactly_per_digest() {
    if !privileged("query_tags_are_counted_exactly_per_digest") {
        return;
    }
    let _serial = common::one_at_a_time();
    let server = PrivateServer::start("query-tags", &[]).unwrap();
    let mut conn = root_conn(&server);
    conn.query_drop(
        "CREATE DATABASE app; CREATE TABLE app.orders (id INT PRIMARY KEY, total INT) ENGINE=InnoDB; \
         INSERT INTO app.orders VALUES (1, 10), (2, 20); CREATE TABLE app.carts (id INT PRIMARY KEY) ENGINE=InnoDB",
    )
    .unwrap();
    let collector = Collector::start(&[]);
    let url = collector.http_url();
    let agent = Agent::start(
        server.dir(),
        &[
            format!("--pid={}", server.pid()),
            format!("--collector={url}"),
            format!("--state-dir={}", server.dir().join("state").display()),
            "--window=1s".into(),
            "--query-tags=controller,action,application,route".into(),
        ],
    );

    // One text repeated: counted in the kernel after its first record.
    for _ in 0..KERNEL_COUNTED {
        conn.query_drop("SELECT total FROM app.orders WHERE id = 1 /*action='show',controller='orders'*/").unwrap();
    }
    // A trace context per statement, as OpenTelemetry's sqlcommenter writes.
    for i in 0..TRACED {
        conn.query_drop(format!(
            "SELECT total FROM app.orders WHERE id = {} /*action='index',controller='orders',\
             framework='django%3A4.2',traceparent='00-{}-{:016x}-01'*/",
            i % 2 + 1,
            trace_id(i),
            i + 1
        ))
        .unwrap();
    }
    // Marginalia in front of the statement.
    for i in 0..MARGINALIA {
        conn.query_drop(format!("/*application:shop,controller:carts*/ SELECT total FROM app.orders WHERE id = {i}"))
            .unwrap();
    }
    for i in 0..UNTAGGED {
        conn.query_drop(format!("SELECT total FROM app.orders WHERE id = {i}")).unwrap();
    }
    // Values that are literals: replaced.
    for _ in 0..SECRET_TAGGED {
        conn.query_drop(
            "SELECT total FROM app.orders WHERE id = 2 /*controller='ann.secret%40example.com',\
             route='%2Forders%2F4111111111111111%2Fedit'*/",
        )
        .unwrap();
    }
    // 10,000 values of one key on one digest.
    for i in 0..DISTINCT {
        conn.query_drop(format!("SELECT id FROM app.carts WHERE id = 1 /*controller='c{i}'*/")).unwrap();
    }

    let orders_text = "SELECT `total` FROM `app`.`orders` WHERE ID = ?";
    let carts_text = "SELECT ID FROM `app`.`carts` WHERE ID = ?";
    let orders_total = KERNEL_COUNTED + TRACED + MARGINALIA + UNTAGGED + SECRET_TAGGED;
    let started = Instant::now();
    let digests = loop {
        let digests = top_json(&url, &["--limit", "100"]);
        let counted = |text| row(&digests, text).map_or(0, |d| d["count"].as_u64().unwrap());
        if counted(orders_text) >= orders_total && counted(carts_text) >= DISTINCT {
            break digests;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "not all counted within 30 s: {digests:#}");
        std::thread::sleep(Duration::from_millis(300));
    };
    let output = agent.stop();

    // One digest, with and without the comment, counted exactly.
    let orders = row(&digests, orders_text).unwrap();
    assert_eq!(orders["count"], orders_total, "{orders:#}");
    let expect = |pairs: &[(Option<&str>, u64)]| -> BTreeMap<Option<String>, u64> {
        pairs.iter().map(|(v, n)| (v.map(str::to_string), *n)).collect()
    };
    assert_eq!(
        tag_counts(orders, "controller"),
        expect(&[(Some("orders"), KERNEL_COUNTED + TRACED), (Some("carts"), MARGINALIA), (Some("?"), SECRET_TAGGED)]),
        "{orders:#}"
    );
    assert_eq!(tag_counts(orders, "action"), expect(&[(Some("show"), KERNEL_COUNTED), (Some("index"), TRACED)]));
    assert_eq!(tag_counts(orders, "application"), expect(&[(Some("shop"), MARGINALIA)]));
    assert_eq!(tag_counts(orders, "route"), expect(&[(Some("/orders/?/edit"), SECRET_TAGGED)]));
    let keys: HashSet<&str> = orders["tags"].as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(keys, HashSet::from(["controller", "action", "application", "route"]), "only --query-tags' keys");

    // The trace context is an exemplar, the slowest first, never a tag.
    let sent: HashSet<String> = (0..TRACED).map(trace_id).collect();
    let exemplars = orders["exemplars"].as_array().unwrap();
    assert!(!exemplars.is_empty() && exemplars.len() <= 5, "{orders:#}");
    for e in exemplars {
        assert!(sent.contains(e["trace_id"].as_str().unwrap()), "an exemplar the workload never sent: {e}");
    }
    let took: Vec<u64> = exemplars.iter().map(|e| e["duration_ns"].as_u64().unwrap()).collect();
    assert!(took.windows(2).all(|w| w[0] >= w[1]), "slowest first: {took:?}");
    assert!(took[0] <= orders["max_ns"].as_u64().unwrap());

    // Bounded, and the sums exact.
    let carts = row(&digests, carts_text).unwrap();
    assert_eq!(carts["count"], DISTINCT);
    let controller = tag_counts(carts, "controller");
    assert!(controller.len() <= 11, "at most 10 values and the rest: {controller:?}");
    assert_eq!(controller.values().sum::<u64>(), DISTINCT, "{controller:?}");
    assert!(controller.get(&None).is_some_and(|rest| *rest > 0));

    // Grouped by a tag's value over the top digests, the groups add up.
    let by = sqlbee_query(&[
        "top",
        "--by",
        "tag:controller",
        "--format",
        "json",
        "--since",
        "all",
        "--limit",
        "100",
        "--collector",
        &url,
    ]);
    assert!(by.status.success(), "{}", String::from_utf8_lossy(&by.stderr));
    let by: Value = serde_json::from_slice(&by.stdout).unwrap();
    let groups = by["groups"].as_array().unwrap();
    let orders_group = groups.iter().find(|g| g["value"] == "orders").unwrap();
    assert_eq!(orders_group["count"], KERNEL_COUNTED + TRACED, "{by:#}");
    let grouped: u64 = groups.iter().map(|g| g["count"].as_u64().unwrap()).sum();
    let total: u64 = digests.as_array().unwrap().iter().map(|d| d["count"].as_u64().unwrap()).sum();
    assert_eq!(grouped, total, "{by:#}");

    // The agent's own lines say the same, summed over its windows.
    let mut from_lines: BTreeMap<Option<String>, u64> = BTreeMap::new();
    for line in output.digest_rows(orders_text) {
        for (value, n) in tag_counts(line, "controller") {
            *from_lines.entry(value).or_default() += n;
        }
    }
    assert_eq!(from_lines, tag_counts(orders, "controller"));
    let in_kernel: u64 = output.summary_total(None, "aggregated_in_kernel");
    assert!(in_kernel > 0, "the repeated text was counted in the kernel, with its tags");

    let lines = Value::Array(output.lines.clone()).to_string();
    for secret in SECRETS {
        assert!(!digests.to_string().contains(secret), "{secret} left through a tag value");
        assert!(!lines.contains(secret) && !output.stderr.contains(secret), "{secret} in the agent's output");
    }
}
