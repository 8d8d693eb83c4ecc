//! Drain of a spool backlog: a spool directory holding 10,000 small
//! batches (what a long collector outage leaves behind) is opened and
//! replayed the way the sender replays it, oldest first: find the oldest
//! entry, read and check it, delete it. No network and no replay pause, so
//! what is left is the spool's own cost per batch. Prints each round and
//! the median, min and max (results in `benches/results/`).
//!
//! `cargo bench -p sqlbee --bench spool_backlog -- [BATCHES] [ROUNDS]`
//! (defaults 10000 batches, 5 rounds). `cargo test --bench spool_backlog`
//! drains 200 batches once, so it stays a smoke test.
use std::{
    hint::black_box,
    path::Path,
    time::{Duration, Instant},
};

use prost::Message;
use sqlbee_agent::ship::spool::{Spool, encode_record};
use sqlbee_proto::v1::{AgentIdentity, AgentWindow, Batch, DigestStats, InstanceWindow};

fn arg(n: usize, default: u64) -> u64 {
    std::env::args().skip(1).filter(|a| !a.starts_with('-')).nth(n).and_then(|a| a.parse().ok()).unwrap_or(default)
}

/// A small batch: one server window of 5 digests and the agent's window.
fn payload(sequence: u64) -> Vec<u8> {
    let digests = (0..5u64)
        .map(|d| DigestStats {
            digest: sqlbee_vocabulary::digest_id::of(&format!("SELECT `c` FROM `sbtest{d}` WHERE `id` = ?")),
            digest_text: format!("SELECT `c` FROM `sbtest{d}` WHERE `id` = ?"),
            count: 100 + d,
            sum_ns: 5_000_000,
            min_ns: 20_000,
            max_ns: 90_000,
            ..Default::default()
        })
        .collect();
    let start = 1_700_000_000_000 + sequence as i64 * 10_000;
    Batch {
        agent: Some(AgentIdentity { host: "bench".into(), agent_id: "bench".into(), version: "0".into() }),
        sequence,
        created_unix_ms: start + 10_000,
        windows: vec![InstanceWindow {
            window_start_unix_ms: start,
            window_end_unix_ms: start + 10_000,
            statements: 510,
            digests,
            ..Default::default()
        }],
        agent_windows: vec![AgentWindow {
            window_start_unix_ms: start,
            window_end_unix_ms: start + 10_000,
            ..Default::default()
        }],
        ..Default::default()
    }
    .encode_to_vec()
}

/// The backlog as a crashed or restarted agent finds it: whole record
/// files, written directly (the drain is measured, not the appends).
fn fill(state_dir: &Path, batches: u64) -> u64 {
    let _ = std::fs::remove_dir_all(state_dir);
    let spool = state_dir.join("spool");
    std::fs::create_dir_all(&spool).expect("spool dir");
    let mut bytes = 0;
    for sequence in 1..=batches {
        let record = encode_record(&payload(sequence));
        bytes += record.len() as u64;
        std::fs::write(spool.join(format!("{sequence:020}.batch")), record).expect("write a batch");
    }
    bytes
}

/// Opens the spool and replays it as the sender does; returns the time to
/// open and the time of the whole drain (open included).
fn drain(state_dir: &Path, batches: u64) -> (Duration, Duration) {
    let started = Instant::now();
    let mut spool = Spool::open(state_dir, 1 << 40).expect("open");
    let opened = started.elapsed();
    let mut drained = 0;
    while let Some((entry, batch)) = spool.next_batch().expect("next batch") {
        black_box(batch);
        spool.remove(&entry).expect("remove");
        drained += 1;
    }
    let total = started.elapsed();
    assert_eq!(drained, batches, "every batch replayed once");
    (opened, total)
}

fn main() {
    let measuring = std::env::args().any(|a| a == "--bench");
    let (batches, rounds) = if measuring { (arg(0, 10_000), arg(1, 5)) } else { (200, 1) };
    let state_dir = std::env::temp_dir().join(format!("sqlbee-bench-backlog-{}", std::process::id()));
    let mut totals = Vec::new();
    for round in 1..=rounds {
        let bytes = fill(&state_dir, batches);
        let (opened, total) = drain(&state_dir, batches);
        println!(
            "round {round}: {batches} batches ({} KiB): open {:.1} ms, open + drain {:.3} s, {:.1} us per batch",
            bytes / 1024,
            opened.as_secs_f64() * 1e3,
            total.as_secs_f64(),
            total.as_secs_f64() * 1e6 / batches as f64
        );
        totals.push(total);
    }
    let _ = std::fs::remove_dir_all(&state_dir);
    totals.sort();
    let (min, median, max) = (totals[0], totals[totals.len() / 2], totals[totals.len() - 1]);
    println!(
        "{batches} batches, {rounds} rounds: median {:.3} s ({:.1} us per batch), min {:.3} s, max {:.3} s",
        median.as_secs_f64(),
        median.as_secs_f64() * 1e6 / batches as f64,
        min.as_secs_f64(),
        max.as_secs_f64()
    );
}
