//! What reading every connection from the server's memory costs, at 1,000
//! idle connections and 50 running statements: the agent's time per
//! snapshot (criterion), and mysqld's own CPU while the agent reads it a
//! hundred times faster than it does (every 10 ms), against the same time
//! without reads, in alternating rounds. The statements sleep, so mysqld's
//! CPU is near nothing and any cost of the reads would show.
//! `cargo bench -p sqlbee --bench activity_reads` (root: it reads another
//! process's memory).
use std::{
    hint::black_box,
    time::{Duration, Instant},
};

use criterion::Criterion;
use mysql::prelude::Queryable;
use sqlbee_agent::{
    activity::{SnapshotReader, Target},
    discover::{inspect_binary, server_by_pid},
    normalize::Samples,
};
use xtask::mariadb::PrivateServer;

const IDLE: usize = 1000;
const BUSY: usize = 50;
const ROUNDS: usize = 10;
const ROUND: Duration = Duration::from_secs(3);

/// Each thread's CPU time (ns, from `/proc/PID/task/TID/schedstat`).
fn cpu_by_thread(pid: u32) -> std::collections::HashMap<u32, u64> {
    let mut out = std::collections::HashMap::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap().flatten() {
        let Ok(tid) = task.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(text) = std::fs::read_to_string(task.path().join("schedstat")) else { continue };
        if let Some(ns) = text.split_whitespace().next().and_then(|n| n.parse().ok()) {
            out.insert(tid, ns);
        }
    }
    out
}

fn main() {
    // SAFETY: raising this process's own descriptor limit to its hard limit.
    unsafe {
        let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
        limit.rlim_cur = limit.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
    }
    let server = PrivateServer::start("activity-bench", &["--max-connections=2000"]).expect("a private server");
    let opts =
        mysql::OptsBuilder::new().socket(Some(server.socket.to_str().unwrap())).user(Some("root")).prefer_socket(true);
    let idle: Vec<mysql::Conn> = (0..IDLE).map(|_| mysql::Conn::new(opts.clone()).unwrap()).collect();
    let busy: Vec<_> = (0..BUSY)
        .map(|i| {
            let mut conn = mysql::Conn::new(opts.clone()).unwrap();
            std::thread::spawn(move || {
                let _ = conn.query_drop(format!("SELECT SLEEP(600) AS busy_{i}"));
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(1));
    let pid = server.pid();
    let process = server_by_pid(pid, "bench").unwrap();
    let binary = inspect_binary(&process.binary).unwrap();
    let target = Target {
        server: process,
        build_id: binary.build_id.clone(),
        version: binary.version.clone(),
        layout: binary.layout,
        activity: binary.activity.clone(),
    };
    let mut reader = SnapshotReader::new(Samples::Redacted);
    let first = reader.read(&target);
    let running = first.connections.iter().filter(|c| c.command == "Query").count();
    println!("one snapshot: {} connections, {running} running a statement", first.connections.len());
    assert!(first.connections.len() >= IDLE + BUSY, "{:?}", first.warning);

    let mut criterion = Criterion::default().sample_size(20).measurement_time(Duration::from_secs(10));
    criterion.bench_function("snapshot_1050_connections", |b| b.iter(|| black_box(reader.read(&target))));

    // mysqld's CPU with reads every 10 ms against none, alternating.
    let mut with_reads = Vec::new();
    let mut without = Vec::new();
    for round in 0..ROUNDS * 2 {
        let reading = round % 2 == 0;
        let before = cpu_by_thread(pid);
        let started = Instant::now();
        let mut reads = 0u64;
        while started.elapsed() < ROUND {
            if reading {
                black_box(reader.read(&target));
                reads += 1;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let after = cpu_by_thread(pid);
        // Threads alive at both ends: one that ends meanwhile takes its
        // time with it.
        let spent: u64 = after.iter().filter_map(|(tid, ns)| Some(ns.saturating_sub(*before.get(tid)?))).sum();
        let per_s = spent as f64 / started.elapsed().as_secs_f64() / 1e6;
        if reading {
            with_reads.push((per_s, reads));
        } else {
            without.push(per_s);
        }
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let reads: Vec<f64> = with_reads.iter().map(|r| r.0).collect();
    let per_second: f64 = with_reads.iter().map(|r| r.1 as f64).sum::<f64>() / (ROUNDS as f64 * ROUND.as_secs_f64());
    let diffs: Vec<f64> = reads.iter().zip(&without).map(|(a, b)| a - b).collect();
    let d = mean(&diffs);
    let sd = (diffs.iter().map(|x| (x - d).powi(2)).sum::<f64>() / (diffs.len() - 1) as f64).sqrt();
    let half = 2.262 * sd / (diffs.len() as f64).sqrt();
    println!(
        "mysqld CPU, ms per second: {:.3} with {per_second:.0} snapshots/s, {:.3} without; \
         difference {d:+.3} [{:+.3}, {:+.3}] (95%, {ROUNDS} pairs)",
        mean(&reads),
        mean(&without),
        d - half,
        d + half
    );
    drop(idle);
    drop(server);
    for b in busy {
        let _ = b.join();
    }
}
