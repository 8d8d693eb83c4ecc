//! Agent -> collector over real gRPC with a real SQLite store: exact totals
//! end to end, through a collector outage, an agent crash, a full spool, a
//! corrupt spool record and a collector that refuses the agent's batches.
mod common;

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use common::{
    Agent, NOT_QUESTIONS, PrivateServer,
    collector::{Collector, plain, query_client, sqlbee_query, sqlbee_query_with, top_answer, top_json},
    delta, privileged,
};
use prost::Message;
use sqlbee_proto::v1::{Batch, TotalsRequest};

/// What the collector holds, through the real query paths.
trait Stored {
    fn top_counts(&self) -> HashMap<String, u64>;
    fn instances(&self) -> Vec<serde_json::Value>;
    /// Exact totals over gRPC.
    fn totals(&self) -> Totals;
}

impl Stored for Collector {
    fn top_counts(&self) -> HashMap<String, u64> {
        let rows = top_json(&self.http_url(), &["--limit", "10000"]);
        let mut counts: HashMap<String, u64> = HashMap::new();
        for r in rows.as_array().unwrap() {
            let text = r["digest_text"].as_str().unwrap().to_string();
            let previous = counts.insert(text.clone(), r["count"].as_u64().unwrap());
            assert!(previous.is_none(), "two digests share the text {text:?}: {rows:#}");
        }
        counts
    }

    fn instances(&self) -> Vec<serde_json::Value> {
        let out = sqlbee_query(&["instances", "--collector", &self.http_url(), "--format", "json"]);
        assert!(out.status.success(), "instances failed: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    }

    fn totals(&self) -> Totals {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let mut client = query_client(&plain(&self.http_url())).await;
            let t = client.totals(TotalsRequest::default()).await.unwrap().into_inner();
            Totals {
                statements: t.statements,
                unmatched: t.unmatched,
                commands: t.commands.into_iter().map(|c| (c.command, c.count)).collect(),
                lost: t.lost_statements,
            }
        })
    }
}

struct Totals {
    statements: u64,
    /// Statements that ended after the attach but began before it: in
    /// `statements`, in no digest. Only a statement racing the attach.
    unmatched: u64,
    commands: HashMap<String, u64>,
    lost: u64,
}

impl Totals {
    fn in_digests(&self) -> u64 {
        assert!(self.unmatched <= 1, "only a statement ending at the attach may be unmatched: {}", self.unmatched);
        self.statements - self.unmatched
    }
}

fn ship_args(server: &PrivateServer, collector: &Collector, state: &Path, window: &str) -> Vec<String> {
    vec![
        format!("--pid={}", server.pid()),
        format!("--collector={}", collector.http_url()),
        format!("--state-dir={}", state.display()),
        format!("--window={window}"),
        // Exact counts of every command for the Questions equations.
        "--command-probe".into(),
    ]
}

fn spool_files(state: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(state.join("spool"))
        .map(|rd| rd.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "batch")).collect())
        .unwrap_or_default();
    files.sort();
    files
}

/// Waits until `check` holds; fails after `limit` with `what` and the
/// agent's log.
fn wait_for(what: &str, limit: Duration, agent: &Agent, mut check: impl FnMut() -> bool) {
    let started = Instant::now();
    while !check() {
        assert!(started.elapsed() < limit, "timed out waiting for {what}; agent:\n{}", agent.progress());
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn end_to_end_counts_reach_the_collector() {
    if !privileged("end_to_end_counts_reach_the_collector") {
        return;
    }
    let _serial = common::one_at_a_time();
    let server = PrivateServer::start("ship-e2e", &[]).unwrap();
    let collector = Collector::start(&[]);
    let state = server.dir().join("agent-state");
    server.sql("CREATE DATABASE app; CREATE TABLE app.k (id INT PRIMARY KEY, v INT)").unwrap();
    let before = common::status_before_agent(&server);
    let agent = Agent::start(server.dir(), &ship_args(&server, &collector, &state, "1s"));
    for i in 0..120 {
        server.sql(&format!("INSERT INTO app.k VALUES ({i}, {i})")).unwrap();
    }
    for i in 0..45 {
        server.sql(&format!("SELECT v FROM app.k WHERE id = {i}")).unwrap();
    }
    let out = agent.stop();
    let after = server.global_status().unwrap();
    assert!(out.success, "{}", out.stderr);
    let counts = collector.top_counts();
    assert_eq!(counts.get("INSERT INTO `app`.`k` VALUES (...)"), Some(&120), "{counts:#?}");
    assert_eq!(counts.get("SELECT `v` FROM `app`.`k` WHERE ID = ?"), Some(&45), "{counts:#?}");
    let totals = collector.totals();
    assert_eq!(totals.lost, 0);
    assert_eq!(totals.in_digests(), counts.values().sum::<u64>());
    let commands = &totals.commands;
    let questions: u64 = commands.iter().filter(|(c, _)| !NOT_QUESTIONS.contains(&c.as_str())).map(|(_, n)| n).sum();
    assert_eq!(questions + 2, delta(&before, &after, "Questions"), "{commands:?}");
    assert!(spool_files(&state).is_empty(), "acknowledged batches must leave the spool");
    costs_and_host_reach_the_collector(&collector, &server, totals.statements);
}

/// What watching cost and the host's metrics went the same way as the
/// counts: `top` sums the cost over the statements it saw, `instances`
/// shows the newest window's cost and the server process, `hosts` the host.
fn costs_and_host_reach_the_collector(collector: &Collector, server: &PrivateServer, statements: u64) {
    let url = collector.http_url();
    let answer = top_answer(&url, &[]);
    let costs = answer["costs"].as_array().unwrap();
    assert_eq!(costs.len(), 1, "{answer:#}");
    let c = &costs[0];
    assert_eq!(c["statements"].as_u64(), Some(statements), "{c:#}");
    assert!(c["agent_cpu_seconds"].as_f64().unwrap() > 0.0, "{c:#}");
    let rss = c["agent_max_rss_bytes"].as_u64().unwrap();
    assert!(rss > (1 << 20) && rss < (1 << 30), "{c:#}");
    assert!(c["probe_cpu_seconds"].as_f64().unwrap() > 0.0 && c["server_extra_cores_per_10k_qps"].as_f64().unwrap() > 0.0, "{c:#}");
    assert_eq!(c["latest_shedding"], "exact", "{c:#}");

    let instances = collector.instances();
    let latest = &instances[0]["latest"];
    assert_eq!(latest["server"]["pid"].as_u64(), Some(u64::from(server.pid())), "{instances:#?}");
    assert_eq!(latest["server"]["status"], "running", "{instances:#?}");
    assert!(latest["server"]["rss_bytes"].as_u64().unwrap() > (1 << 20), "{instances:#?}");
    assert!(latest["agent_rss_bytes"].as_u64().unwrap() > 0 && latest["attached_fraction"] == 1.0, "{instances:#?}");

    let out = sqlbee_query(&["hosts", "--collector", &url, "--format", "json", "--since", "all"]);
    assert!(out.status.success(), "hosts failed: {}", String::from_utf8_lossy(&out.stderr));
    let hosts: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let windows = hosts.as_array().unwrap();
    assert!(!windows.is_empty(), "no agent windows");
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
    let total_kib: u64 = meminfo.lines().next().unwrap().split_whitespace().nth(1).unwrap().parse().unwrap();
    let stat = std::fs::read_to_string("/proc/stat").unwrap();
    let cores = stat.lines().filter(|l| l.starts_with("cpu") && !l.starts_with("cpu ")).count() as u64;
    for w in windows {
        assert_eq!(w["memory"]["total_bytes"].as_u64(), Some(total_kib * 1024), "{w:#}");
        assert_eq!(w["online_cores"].as_u64(), Some(cores), "{w:#}");
        assert!(w["agent"]["rss_bytes"].as_u64().unwrap() > 0, "{w:#}");
    }
}

#[test]
fn collector_outage_loses_and_doubles_nothing() {
    if !privileged("collector_outage_loses_and_doubles_nothing") {
        return;
    }
    let _serial = common::one_at_a_time();
    let server = PrivateServer::start("ship-outage", &[]).unwrap();
    let mut collector = Collector::start(&[]);
    let state = server.dir().join("agent-state");
    let run = common::Workload::sysbench(&server, "oltp_read_write", 4, 120, "auto");
    std::thread::sleep(Duration::from_millis(1000));
    run.pause();
    let before = common::status_before_agent(&server);
    let agent = Agent::start(server.dir(), &ship_args(&server, &collector, &state, "1s"));
    run.resume();
    std::thread::sleep(Duration::from_secs(3));
    collector.kill9();
    std::thread::sleep(Duration::from_secs(21));
    assert!(!spool_files(&state).is_empty(), "batches must pile up in the spool during the outage: {}", agent.progress());
    collector.restart();
    std::thread::sleep(Duration::from_secs(4));
    run.pause();
    let out = agent.stop();
    let after = server.global_status().unwrap();
    drop(run);
    assert!(out.success, "{}", out.stderr);
    assert!(spool_files(&state).is_empty(), "spool not drained: {}", out.stderr);

    let totals = collector.totals();
    assert_eq!(totals.lost, 0);
    assert!(totals.statements > 2000, "too little traffic: {}", totals.statements);
    let commands = &totals.commands;
    let get = |c: &str| commands.get(c).copied().unwrap_or(0);
    assert_eq!(get("COM_STMT_EXECUTE"), delta(&before, &after, "Com_stmt_execute"));
    let questions: u64 = commands.iter().filter(|(c, _)| !NOT_QUESTIONS.contains(&c.as_str())).map(|(_, n)| n).sum();
    assert_eq!(questions + 2, delta(&before, &after, "Questions"), "{commands:?}");
    let counts = collector.top_counts();
    assert_eq!(counts.values().sum::<u64>(), totals.in_digests());
    assert_eq!(counts.get("COMMIT").copied(), Some(delta(&before, &after, "Com_commit")));
}

#[test]
fn agent_crash_replays_spooled_batches_once() {
    if !privileged("agent_crash_replays_spooled_batches_once") {
        return;
    }
    let _serial = common::one_at_a_time();
    let server = PrivateServer::start("ship-crash", &[]).unwrap();
    let mut collector = Collector::start(&[]);
    collector.kill9();
    let state = server.dir().join("agent-state");
    let agent = Agent::start(server.dir(), &ship_args(&server, &collector, &state, "300ms"));
    for _ in 0..40 {
        server.sql("SELECT 'before crash'").unwrap();
    }
    wait_for("spooled batches", Duration::from_secs(10), &agent, || spool_files(&state).len() >= 2);
    std::thread::sleep(Duration::from_millis(700));
    agent.kill9();
    let spooled = spool_files(&state);
    let backup = server.dir().join("spool-backup");
    std::fs::create_dir_all(&backup).unwrap();
    for f in &spooled {
        std::fs::copy(f, backup.join(f.file_name().unwrap())).unwrap();
    }

    collector.restart();
    let agent = Agent::start(server.dir(), &ship_args(&server, &collector, &state, "300ms"));
    for _ in 0..25 {
        server.sql("SELECT 'after crash'").unwrap();
    }
    let out = agent.stop();
    assert!(out.success, "{}", out.stderr);
    assert_eq!(collector.top_counts().get("SELECT ?"), Some(&65));

    // Replaying the very same batches again must not count them twice.
    for f in std::fs::read_dir(&backup).unwrap().flatten() {
        std::fs::copy(f.path(), state.join("spool").join(f.file_name())).unwrap();
    }
    let agent = Agent::start(server.dir(), &ship_args(&server, &collector, &state, "300ms"));
    wait_for("replay", Duration::from_secs(20), &agent, || spool_files(&state).is_empty());
    let out = agent.stop();
    assert!(out.stderr.contains("already had this batch"), "{}", out.stderr);
    assert_eq!(collector.top_counts().get("SELECT ?"), Some(&65));
}

#[test]
fn full_spool_drops_oldest_and_reports_the_gap() {
    if !privileged("full_spool_drops_oldest_and_reports_the_gap") {
        return;
    }
    let _serial = common::one_at_a_time();
    let server = PrivateServer::start("ship-full", &[]).unwrap();
    let mut collector = Collector::start(&[]);
    collector.kill9();
    let state = server.dir().join("agent-state");
    let mut args = ship_args(&server, &collector, &state, "200ms");
    args.push("--spool-limit=1500".into());
    let agent = Agent::start(server.dir(), &args);
    const EXECUTED: u64 = 60;
    for i in 0..EXECUTED {
        server.sql(&format!("SELECT {i} AS n{}", i % 10)).unwrap();
        std::thread::sleep(Duration::from_millis(30));
    }
    std::thread::sleep(Duration::from_millis(500));
    let out = agent.stop();
    assert!(out.stderr.contains("spool full"), "{}", out.stderr);
    collector.restart();
    let agent = Agent::start(server.dir(), &ship_args(&server, &collector, &state, "200ms"));
    wait_for("replay", Duration::from_secs(20), &agent, || spool_files(&state).is_empty());
    agent.stop();

    let Totals { statements, lost, .. } = collector.totals();
    assert!(lost > 0, "no gap recorded");
    assert_eq!(statements + lost, EXECUTED, "stored {statements} + lost {lost} != executed");
    let instances = collector.instances();
    let gaps: u64 = instances.iter().map(|i| i["gaps"].as_u64().unwrap_or(0)).sum();
    let lost_shown: u64 = instances.iter().map(|i| i["lost_statements"].as_u64().unwrap_or(0)).sum();
    assert!(gaps > 0 && lost_shown == lost, "{instances:#?}");
}

#[test]
fn corrupt_spool_record_is_skipped_and_counted() {
    if !privileged("corrupt_spool_record_is_skipped_and_counted") {
        return;
    }
    let _serial = common::one_at_a_time();
    let server = PrivateServer::start("ship-corrupt", &[]).unwrap();
    let mut collector = Collector::start(&[]);
    collector.kill9();
    let state = server.dir().join("agent-state");
    let agent = Agent::start(server.dir(), &ship_args(&server, &collector, &state, "300ms"));
    const EXECUTED: u64 = 30;
    for i in 0..EXECUTED {
        server.sql(&format!("SELECT {i}")).unwrap();
        std::thread::sleep(Duration::from_millis(40));
    }
    std::thread::sleep(Duration::from_millis(500));
    agent.kill9();
    let files = spool_files(&state);
    assert!(files.len() >= 3, "{files:?}");
    // Damage a batch that carries statements and remember how many.
    let (victim, lost) = files
        .iter()
        .find_map(|f| {
            let bytes = std::fs::read(f).unwrap();
            let batch = Batch::decode(&bytes[12..]).unwrap();
            let n: u64 = batch.windows.iter().map(|w| w.statements).sum();
            (n > 0).then(|| (f.clone(), n))
        })
        .unwrap();
    let mut bytes = std::fs::read(&victim).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x5a;
    std::fs::write(&victim, bytes).unwrap();

    collector.restart();
    let agent = Agent::start(server.dir(), &ship_args(&server, &collector, &state, "300ms"));
    wait_for("replay", Duration::from_secs(20), &agent, || spool_files(&state).is_empty());
    let out = agent.stop();
    // One damaged record: logged once, counted as one, one file set aside.
    let log = common::strip_ansi(&out.stderr);
    let skipped: Vec<&str> = log.lines().filter(|l| l.contains("corrupt spool record skipped")).collect();
    assert_eq!(skipped.len(), 1, "{log}");
    let counted = skipped[0].split_whitespace().find_map(|f| f.strip_prefix("corrupt_records="));
    assert_eq!(counted, Some("1"), "{log}");
    let aside: Vec<_> = std::fs::read_dir(state.join("corrupt")).unwrap().flatten().map(|e| e.file_name()).collect();
    assert_eq!(aside, [victim.file_name().unwrap()], "only the damaged record goes to corrupt/");
    let statements = collector.totals().statements;
    assert_eq!(statements, EXECUTED - lost);
}

/// Batch files a state dir's `rejected/` holds, oldest first.
fn rejected_files(state: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(state.join("rejected"))
        .map(|rd| rd.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "batch")).collect())
        .unwrap_or_default();
    files.sort();
    files
}

#[test]
fn refused_batches_are_set_aside_once_with_their_reason() {
    if !privileged("refused_batches_are_set_aside_once_with_their_reason") {
        return;
    }
    let _serial = common::one_at_a_time();
    let server = PrivateServer::start("ship-refused", &[]).unwrap();
    let (tokens, wrong) = (server.dir().join("tokens"), server.dir().join("wrong-token"));
    std::fs::write(&tokens, "right-token\n").unwrap();
    std::fs::write(&wrong, "wrong-token\n").unwrap();
    let collector = Collector::start(&["--tokens".into(), tokens.display().to_string()]);
    let state = server.dir().join("agent-state");
    let mut args = ship_args(&server, &collector, &state, "300ms");
    args.push(format!("--token-file={}", wrong.display()));
    let agent = Agent::start(server.dir(), &args);
    const EXECUTED: u64 = 20;
    for i in 0..EXECUTED {
        server.sql(&format!("SELECT {i}")).unwrap();
        std::thread::sleep(Duration::from_millis(40));
    }
    wait_for("refused batches", Duration::from_secs(20), &agent, || rejected_files(&state).len() >= 3);
    let out = agent.stop();
    assert!(out.success, "{}", out.stderr);

    // Nothing waits for a retry: every batch, the one spooled at shutdown
    // too, was tried once and set aside.
    assert!(spool_files(&state).is_empty(), "refused batches must leave the spool: {:?}", spool_files(&state));
    let rejected = rejected_files(&state);
    let log = common::strip_ansi(&out.stderr);
    let refusals = log.lines().filter(|l| l.contains("refused the batch for good")).count();
    assert_eq!(refusals, rejected.len(), "one attempt per refused batch:\n{log}");
    assert!(!log.contains("batch stays spooled"), "a refused batch must not be retried:\n{log}");
    let mut statements = 0;
    for batch in &rejected {
        let reason = std::fs::read_to_string(batch.with_extension("reason.txt")).unwrap();
        assert!(reason.starts_with("Unauthenticated: ") && reason.contains("not accepted"), "{batch:?}: {reason}");
        let bytes = std::fs::read(batch).unwrap();
        statements += Batch::decode(&bytes[12..]).unwrap().windows.iter().map(|w| w.statements).sum::<u64>();
    }
    assert_eq!(statements, EXECUTED, "the refused batches keep every statement for inspection");

    let (url, right) = (collector.http_url(), tokens.display().to_string());
    let out = sqlbee_query(&["instances", "--collector", &url, "--token-file", &right, "--format", "json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap(), serde_json::json!([]), "nothing stored");
}

/// The collector-only build (`--no-default-features --features
/// collector`, no eBPF toolchain), fed by an agent of the default build,
/// counts exactly what a sysbench run executed, and that build's own
/// `top` reports it. `./x test` builds it and names it in
/// `SQLBEE_COLLECTOR_ONLY_BIN`.
#[test]
fn collector_only_build_counts_a_sysbench_run_exactly() {
    if !privileged("collector_only_build_counts_a_sysbench_run_exactly") {
        return;
    }
    let Some(binary) = std::env::var_os("SQLBEE_COLLECTOR_ONLY_BIN").map(PathBuf::from) else {
        assert!(
            std::env::var_os("SQLBEE_REQUIRE_PRIVILEGED").is_none(),
            "SQLBEE_COLLECTOR_ONLY_BIN is not set: run the suite through ./x test, which builds the collector-only binary"
        );
        eprintln!("skipping collector_only_build_counts_a_sysbench_run_exactly: SQLBEE_COLLECTOR_ONLY_BIN not set (./x test sets it)");
        return;
    };
    let refused = std::process::Command::new(&binary).args(["agent", "--pid", "1"]).output().unwrap();
    assert_eq!(refused.status.code(), Some(2), "the collector-only build must refuse the agent role");
    assert!(String::from_utf8_lossy(&refused.stderr).contains("built without the agent"));

    let _serial = common::one_at_a_time();
    let server = PrivateServer::start("ship-collector-only", &[]).unwrap();
    let collector = Collector::start_binary(&binary, &[]);
    let state = server.dir().join("agent-state");
    let run = common::Workload::sysbench(&server, "oltp_read_write", 2, 60, "auto");
    std::thread::sleep(Duration::from_millis(1000));
    run.pause();
    let before = common::status_before_agent(&server);
    let agent = Agent::start(server.dir(), &ship_args(&server, &collector, &state, "1s"));
    run.resume();
    std::thread::sleep(Duration::from_secs(4));
    run.pause();
    let out = agent.stop();
    let after = server.global_status().unwrap();
    drop(run);
    assert!(out.success, "{}", out.stderr);

    let totals = collector.totals();
    assert_eq!(totals.lost, 0);
    assert!(totals.statements > 1000, "too little traffic: {}", totals.statements);
    let get = |c: &str| totals.commands.get(c).copied().unwrap_or(0);
    assert_eq!(get("COM_STMT_EXECUTE"), delta(&before, &after, "Com_stmt_execute"));
    let answer = sqlbee_query_with(
        &binary,
        &["top", "--collector", &collector.http_url(), "--format", "json", "--since", "all", "--limit", "10000"],
    );
    assert!(answer.status.success(), "{}", String::from_utf8_lossy(&answer.stderr));
    let rows: serde_json::Value = serde_json::from_slice(&answer.stdout).unwrap();
    let counts: HashMap<String, u64> = rows["digests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["digest_text"].as_str().unwrap().to_string(), r["count"].as_u64().unwrap()))
        .collect();
    assert_eq!(counts.values().sum::<u64>(), totals.in_digests(), "{counts:#?}");
    assert_eq!(counts.get("COMMIT").copied(), Some(delta(&before, &after, "Com_commit")), "{counts:#?}");
    let selects: u64 = counts.iter().filter(|(t, _)| t.starts_with("SELECT ")).map(|(_, n)| n).sum();
    assert_eq!(selects, delta(&before, &after, "Com_select"), "{counts:#?}");
    // Writes are left out: one that waits on a row lock of the paused
    // workload when the agent starts is in the server's counter from its
    // start but counted by the agent at its end (see the outage test).
}

/// One agent per state directory: a second agent given the same
/// `--state-dir` is refused at start with the holder named, and the first
/// ships on; the directory and its files are private to the agent's user.
#[test]
fn a_state_directory_serves_one_agent() {
    if !privileged("a_state_directory_serves_one_agent") {
        return;
    }
    let _serial = common::one_at_a_time();
    let server = PrivateServer::start("ship-one-state", &[]).unwrap();
    let collector = Collector::start(&[]);
    let state = server.dir().join("agent-state");
    let first = Agent::start(server.dir(), &ship_args(&server, &collector, &state, "500ms"));
    let second = std::process::Command::new(common::sqlbee())
        .arg("agent")
        .args(ship_args(&server, &collector, &state, "500ms"))
        .args(["--duration", "20s", "--no-cgroup"])
        .env("SQLBEE_LOG", "warn")
        .output()
        .unwrap();
    let stderr = common::strip_ansi(&String::from_utf8_lossy(&second.stderr));
    assert!(!second.status.success(), "a second agent ran on the same state directory: {stderr}");
    assert!(stderr.contains("in use by another agent") && stderr.contains(&format!("pid {}", first.pid())), "{stderr}");
    for i in 0..10 {
        server.sql(&format!("SELECT {i} + 100")).unwrap();
    }
    let out = first.stop();
    assert!(out.success, "{}", out.stderr);
    assert_eq!(collector.top_counts().get("SELECT ? + ?"), Some(&10));
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&state).unwrap().permissions().mode() & 0o777, 0o700);
}
