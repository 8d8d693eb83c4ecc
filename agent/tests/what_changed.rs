//! What changed, from a real server, a real agent and a real collector:
//! a workload runs, then the index it needs is dropped. `sqlbee diff`
//! finds exactly the digest that lost its index `regressed` (with the rank
//! test's evidence), leaves the untouched one `unchanged`, names the shape
//! that appeared `new` and the one that went `gone`, and each side's counts
//! are what `sqlbee top` says for that range, digest by digest.
mod common;

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use common::{
    Agent, PrivateServer,
    collector::{Collector, sqlbee_query, top_json},
    privileged, root_conn,
};
use mysql::prelude::Queryable;
use serde_json::Value;

const ROWS: u64 = 16_384;

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
}

/// Runs `statements` in turn for `for_how_long`; how many of each ran.
fn run(conn: &mut mysql::Conn, statements: &[&dyn Fn(u64) -> String], for_how_long: Duration) -> Vec<u64> {
    let started = Instant::now();
    let mut counts = vec![0u64; statements.len()];
    let mut i = 0u64;
    while started.elapsed() < for_how_long {
        for (n, statement) in statements.iter().enumerate() {
            conn.query_drop(statement(i)).unwrap();
            counts[n] += 1;
        }
        i += 1;
    }
    counts
}

/// Count per digest text over a range, as `top` says.
fn top_counts(url: &str, since: i64, until: i64) -> BTreeMap<String, u64> {
    top_json(url, &["--since", &since.to_string(), "--until", &until.to_string(), "--limit", "1000"])
        .as_array()
        .unwrap()
        .iter()
        .map(|d| (d["digest_text"].as_str().unwrap().to_string(), d["count"].as_u64().unwrap()))
        .collect()
}

#[test]
fn a_dropped_index_is_a_regression_and_nothing_else_is() {
    if !privileged("a_dropped_index_is_a_regression_and_nothing_else_is") {
        return;
    }
    let _serial = common::one_at_a_time();
    let server = PrivateServer::start("what-changed", &[]).unwrap();
    let mut conn = root_conn(&server);
    conn.query_drop(
        "CREATE DATABASE app; CREATE TABLE app.items (id INT PRIMARY KEY AUTO_INCREMENT, k INT, pad CHAR(100), \
         INDEX k_idx (k)) ENGINE=InnoDB; INSERT INTO app.items (k, pad) VALUES (1, 'x')",
    )
    .unwrap();
    while conn.query_first::<u64, _>("SELECT COUNT(*) FROM app.items").unwrap().unwrap() < ROWS {
        conn.query_drop("INSERT INTO app.items (k, pad) SELECT id, pad FROM app.items").unwrap();
    }
    let collector = Collector::start(&[]);
    let url = collector.http_url();
    let _agent = Agent::start(
        server.dir(),
        &[
            format!("--pid={}", server.pid()),
            format!("--collector={url}"),
            format!("--state-dir={}", server.dir().join("state").display()),
            "--window=1s".into(),
        ],
    );

    let by_key = |i: u64| format!("SELECT pad FROM app.items WHERE k = {}", i % 5000 + 1);
    let untouched = |i: u64| format!("SELECT {i} + 1");
    let only_before = |i: u64| format!("SELECT id FROM app.items WHERE id = {}", i % 5000 + 1);
    let only_after = |i: u64| format!("SELECT k FROM app.items WHERE id = {}", i % 5000 + 1);
    let before_start = now_ms();
    let before = run(&mut conn, &[&by_key, &untouched, &only_before], Duration::from_secs(3));
    // Quiet windows between the two, so no window holds both.
    std::thread::sleep(Duration::from_millis(2500));
    let split = now_ms();
    conn.query_drop("ALTER TABLE app.items DROP INDEX k_idx").unwrap();
    let after = run(&mut conn, &[&by_key, &untouched, &only_after], Duration::from_secs(3));
    eprintln!("before: {before:?} statements, after: {after:?}");

    let key_text = "SELECT `pad` FROM `app`.`items` WHERE `k` = ?";
    let new_text = "SELECT `k` FROM `app`.`items` WHERE ID = ?";
    let started = Instant::now();
    while top_counts(&url, split, now_ms() + 60_000).get(new_text).copied().unwrap_or(0) < after[2] {
        assert!(started.elapsed() < Duration::from_secs(30), "the second range never arrived");
        std::thread::sleep(Duration::from_millis(300));
    }
    std::thread::sleep(Duration::from_millis(1500));
    let until = now_ms();

    let out = sqlbee_query(&[
        "diff",
        "--before",
        &format!("{before_start}..{split}"),
        "--after",
        &format!("{split}..{until}"),
        "--format",
        "json",
        "--limit",
        "1000",
        "--collector",
        &url,
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
    let digests = answer["digests"].as_array().unwrap();
    let find = |text: &str| {
        digests.iter().find(|d| d["digest_text"] == text).unwrap_or_else(|| panic!("{text} missing: {answer:#}"))
    };
    let regressed = find(key_text);
    assert_eq!(regressed["status"], "regressed", "{regressed:#}");
    assert!(regressed["evidence"].as_str().unwrap().contains("Mann-Whitney"), "{regressed:#}");
    assert!(regressed["p_value"].as_f64().unwrap() < 0.001);
    assert_eq!(regressed["before"]["count"], before[0]);
    assert_eq!(regressed["after"]["count"], after[0]);
    assert_eq!(find("SELECT ? + ?")["status"], "unchanged", "{answer:#}");
    assert_eq!(find(new_text)["status"], "new");
    assert_eq!(find("SELECT ID FROM `app`.`items` WHERE ID = ?")["status"], "gone");
    let statuses: Vec<&str> = digests.iter().map(|d| d["status"].as_str().unwrap()).collect();
    assert_eq!(
        statuses.iter().filter(|s| **s == "regressed").count(),
        1,
        "only the digest that lost its index: {answer:#}"
    );
    assert_eq!(digests[0]["digest_text"], key_text, "the largest change in total time first");

    // The web UI's /api/diff answers the same, and its compare page shows it.
    let get = |path: String| {
        ureq::get(format!("{}{path}", collector.ui)).call().unwrap().body_mut().read_to_string().unwrap()
    };
    let range = format!("since={split}&until={until}&before={before_start}..{split}");
    let api: Value = serde_json::from_str(&get(format!("api/diff?{range}&limit=1000"))).unwrap();
    assert_eq!(api, answer, "/api/diff and sqlbee diff agree");
    let page = get(format!("compare?{range}"));
    let regressed_id = regressed["digest"].as_str().unwrap();
    assert!(page.contains(&format!("data-digest=\"{regressed_id}\" data-status=\"regressed\"")), "{page}");
    assert_eq!(page.matches("data-status=\"regressed\"").count(), 1, "{page}");

    // Each side is what `top` says for its range, digest by digest.
    for (side, since, until) in [("before", before_start, split), ("after", split, until)] {
        let top = top_counts(&url, since, until);
        let diffed: BTreeMap<String, u64> = digests
            .iter()
            .filter(|d| !d[side].is_null())
            .map(|d| (d["digest_text"].as_str().unwrap().to_string(), d[side]["count"].as_u64().unwrap()))
            .collect();
        assert_eq!(diffed, top, "{side}");
    }
}
