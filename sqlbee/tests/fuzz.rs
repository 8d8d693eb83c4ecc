//! Fuzzing of everything that reads bytes someone else wrote: batches
//! through decode, validate and a real SQLite store; batches at each limit
//! of the decode bounds, whose mutations the bounds must refuse or decode
//! within every limit; spool records; the
//! store's blob decoders; the normalizer and the redactor; the kernel
//! event decoder. Each target mutates valid inputs (bit flips, cuts,
//! splices, repeated and random bytes) from a seeded generator and runs
//! for a time budget. Properties: nothing panics, a decoded batch that
//! validation accepts is stored (never a store error), and redacted text
//! never holds a literal the statement had.
//!
//! `cargo xtask fuzz --seconds N` runs every target N seconds with a
//! random seed and prints executions; `./x test` runs them briefly with a
//! fixed seed (`SQLBEE_FUZZ_SECONDS`, `SQLBEE_FUZZ_SEED`).
mod common;

use std::{
    panic::{AssertUnwindSafe, catch_unwind},
    time::{Duration, Instant},
};

use prost::Message;
use sqlbee_collector::store::Store;
use sqlbee_proto::v1::Batch;

/// xorshift64*: small, seedable, good enough to pick mutations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        if n == 0 { 0 } else { (self.next() % n as u64) as usize }
    }
}

const INTERESTING: [u8; 10] = [0, 0xff, 0x7f, 0x80, b'\'', b'"', b'\\', b'`', 0xc3, b'\n'];

/// One to four mutations of `input`.
fn mutate(rng: &mut Rng, input: &[u8], corpus: &[Vec<u8>]) -> Vec<u8> {
    let mut out = input.to_vec();
    for _ in 0..1 + rng.below(4) {
        let at = rng.below(out.len() + 1);
        match rng.below(7) {
            0 if !out.is_empty() => {
                let i = rng.below(out.len());
                out[i] ^= 1 << rng.below(8);
            }
            1 if !out.is_empty() => {
                let i = rng.below(out.len());
                out[i] = INTERESTING[rng.below(INTERESTING.len())];
            }
            2 => out.truncate(at),
            3 => {
                let other = &corpus[rng.below(corpus.len())];
                let from = rng.below(other.len() + 1);
                let piece = other[from..].iter().take(rng.below(64) + 1).copied().collect::<Vec<_>>();
                out.splice(at..at, piece);
            }
            4 if at < out.len() => {
                let len = (rng.below(16) + 1).min(out.len() - at);
                let piece = out[at..at + len].to_vec();
                for _ in 0..rng.below(8) {
                    out.splice(at..at, piece.iter().copied());
                }
            }
            5 => {
                let n = rng.below(32);
                out.splice(at..at, (0..n).map(|_| rng.next() as u8));
            }
            _ if at < out.len() => {
                let end = (at + rng.below(32)).min(out.len());
                out.drain(at..end);
            }
            _ => {}
        }
    }
    out
}

fn seconds() -> f64 {
    std::env::var("SQLBEE_FUZZ_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(2.0)
}

/// With `SQLBEE_FUZZ_EXECUTIONS`, each target runs that many executions
/// instead of for `seconds()`.
fn executions_wanted() -> Option<u64> {
    std::env::var("SQLBEE_FUZZ_EXECUTIONS").ok().and_then(|s| s.parse().ok())
}

fn seed() -> u64 {
    std::env::var("SQLBEE_FUZZ_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x5eed_f00d_cafe_0001).max(1)
}

/// Runs `target` on mutations of `corpus` for the time budget; a panic is
/// reported with its input. Returns executions.
fn run(name: &str, corpus: &[Vec<u8>], mut target: impl FnMut(&[u8])) -> u64 {
    let mut rng = Rng(seed() ^ name.bytes().fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(b as u64)));
    let budget = Duration::from_secs_f64(seconds());
    let started = Instant::now();
    let mut executions = 0u64;
    for input in corpus {
        target(input);
        executions += 1;
    }
    let wanted = executions_wanted();
    while wanted.map_or(started.elapsed() < budget, |n| executions < n) {
        let base = &corpus[rng.below(corpus.len())];
        let input = mutate(&mut rng, base, corpus);
        if catch_unwind(AssertUnwindSafe(|| target(&input))).is_err() {
            panic!("fuzz target {name} panicked on input {:?} (seed {})", String::from_utf8_lossy(&input), seed());
        }
        executions += 1;
    }
    println!(
        "fuzz {name}: {executions} executions in {:.1} s, seed {}, no finding",
        started.elapsed().as_secs_f64(),
        seed()
    );
    executions
}

fn batches() -> Vec<Vec<u8>> {
    use common::collector::{batch, digest, window};
    let now = common::collector::now_ms();
    let mut with_waits =
        batch("fuzz-agent", 2, vec![window("db1:3306", 7, now, vec![digest("UPDATE t SET a = ?", &[900, 4000])])]);
    with_waits.windows[0].digests[0].waits =
        vec![sqlbee_proto::v1::WaitStats { class: "row_lock".into(), sum_ns: 800, max_ns: 700, statements: 1 }];
    with_waits.windows[0].lock_waits = vec![sqlbee_proto::v1::LockWait {
        start_unix_ms: now - 500,
        duration_ns: 60_000_000,
        class: "row_lock".into(),
        connection_id: 9,
        digest: common::collector::id_of("UPDATE t SET a = ?"),
        digest_text: "UPDATE t SET a = ?".into(),
        sample: "UPDATE t SET a = ?".into(),
        blocker_kind: "candidates".into(),
        blockers: vec![sqlbee_proto::v1::Blocker {
            connection_id: 4,
            transaction: true,
            started_unix_ms: now - 900,
            statements: vec!["SELECT ? FOR UPDATE".into()],
        }],
    }];
    vec![
        batch("fuzz-agent", 1, vec![window("db1:3306", 7, now, vec![digest("SELECT ?", &[1000, 2000, 1_000_000])])])
            .encode_to_vec(),
        with_waits.encode_to_vec(),
        Batch::default().encode_to_vec(),
    ]
}

#[test]
fn batches_decode_validate_and_store_or_are_refused() {
    let dir = common::collector::TempDir::new("fuzz-store");
    let store = sqlbee_collector::store::sqlite::SqliteStore::open(&dir.path().join("fuzz.db")).unwrap();
    let (mut accepted, mut stored) = (0u64, 0u64);
    let executions = run("batch", &batches(), |bytes| {
        let Ok(mut batch) = Batch::decode(bytes) else { return };
        let now = common::collector::now_ms();
        if sqlbee_collector::validate::batch(&batch, now).is_err() {
            return;
        }
        accepted += 1;
        // A key of its own (one epoch per input), so a store is never a
        // duplicate of, or a conflict with, an earlier input.
        batch.epoch = accepted;
        let hash = sqlbee_collector::store::content_hash(&batch);
        match store.ingest(batch, now, hash) {
            Ok(_) => stored += 1,
            Err(e) => panic!("a valid batch was not stored: {e}"),
        }
    });
    assert!(executions > 100, "the target hardly ran");
    assert_eq!(accepted, stored);
    println!("fuzz batch: {accepted} of {executions} inputs decoded and validated, every one stored");
    // What was stored reads back.
    store
        .top(&sqlbee_collector::store::TopQuery {
            instance: None,
            digest: None,
            schema: None,
            nested: true,
            program: None,
            since_unix_ms: 0,
            until_unix_ms: i64::MAX,
            order_by: sqlbee_collector::store::OrderBy::P99,
            limit: 100,
        })
        .unwrap();
}

#[test]
fn spool_records_and_blobs_decode_or_are_refused() {
    let record = sqlbee_agent::ship::spool::encode_record(&batches()[0]);
    run("spool-record", &[record, vec![], b"SQB1".to_vec()], |bytes| {
        if let Ok(payload) = sqlbee_agent::ship::spool::decode_record(bytes) {
            let _ = Batch::decode(payload);
        }
    });
    use sqlbee_collector::store::blob;
    let blobs = vec![
        blob::encode([(0, 1), (40, 7), (495, u64::MAX)]),
        blob::encode_waits([("row_lock", 5, 3, 1), ("disk_io", 1, 1, 1)]),
        vec![0x80, 0x80],
    ];
    run("blobs", &blobs, |bytes| {
        let _ = blob::decode(bytes);
        let _ = blob::decode_any_order(bytes);
        let _ = blob::decode_waits(bytes);
    });
}

#[test]
fn statement_text_normalizes_and_redacts() {
    let corpus: Vec<Vec<u8>> = [
        "SELECT c FROM t WHERE id = 5 AND s = 'ann@example.com'",
        "INSERT INTO t (a, b) VALUES (1, 'x'), (2, \"y\") /* c */ -- d\n",
        "CREATE USER 'u'@'%' IDENTIFIED BY 'secret'",
        "SELECT /*!50100 1 */ 0x1F, b'01', _utf8'a', `we``ird`, @v, ?",
        "UPDATE t SET a = a + -1.5e-3 WHERE b IN (1,2,3) # x",
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect();
    run("normalize-redact", &corpus, |bytes| {
        let _ = sqlbee_agent::normalize::digest_text(bytes);
        let redacted = sqlbee_agent::normalize::redact::statement(bytes);
        // Outside backquoted identifiers, a quote that survived would open
        // a literal left in clear.
        let mut in_identifier = false;
        for c in redacted.chars() {
            match c {
                '`' => in_identifier = !in_identifier,
                '\'' | '"' => assert!(in_identifier, "a quote survived redaction: {redacted}"),
                _ => {}
            }
        }
        let _ = sqlbee_agent::normalize::redact::message(&String::from_utf8_lossy(bytes));
    });
}

#[test]
fn kernel_records_decode_or_are_refused() {
    let header = vec![0u8; sqlbee_kernel_abi::EVENT_HEADER_LEN];
    let mut with_text = header.clone();
    // captured_len at its offset would be read from the bytes; a record
    // claiming more text than it holds must be cut, not overrun.
    with_text.extend_from_slice(b"SELECT 1");
    run("kernel-events", &[header, with_text, vec![0xff; 600]], |bytes| {
        let _ = sqlbee_agent::probe::decode_statement(bytes);
        let _ = sqlbee_agent::probe::decode_error(bytes);
    });
}

/// Batches at each limit of the decode bounds (and with a string at its
/// longest), small enough on the wire to mutate quickly.
fn at_the_limits() -> Vec<Vec<u8>> {
    use common::collector::{batch, digest, window};
    use sqlbee_proto::v1::{AccountCount, Blocker, Bucket, DigestStats, ErrorCount, Histogram, LockWait, WaitStats};
    let now = common::collector::now_ms();
    let mut wide = batch("fuzz-limits", 1, vec![window("db1:3306", 7, now, Vec::new())]);
    wide.windows[0].digests = vec![DigestStats::default(); 50_001];
    let mut deep = digest(&"x".repeat(65_536), &[1000]);
    deep.waits = (0..16).map(|i| WaitStats { class: format!("c{i}"), ..Default::default() }).collect();
    deep.accounts = (0..64).map(|i| AccountCount { user: format!("u{i}"), ..Default::default() }).collect();
    deep.error_codes = (0..1024).map(|i| ErrorCount { code: i, ..Default::default() }).collect();
    deep.histogram = Some(Histogram { scheme: 1, buckets: (0..1024).map(|i| Bucket { index: i, count: 1 }).collect() });
    let mut deep_batch = batch("fuzz-limits", 2, vec![window("db1:3306", 7, now, vec![deep])]);
    deep_batch.windows[0].lock_waits = vec![LockWait {
        blockers: (0..32).map(|_| Blocker { statements: vec!["SELECT ?".into(); 8], ..Default::default() }).collect(),
        ..Default::default()
    }];
    vec![wide.encode_to_vec(), deep_batch.encode_to_vec()]
}

/// What the bounds promise of a batch they let through, checked on the
/// decoded batch.
fn within_limits(b: &Batch) {
    use sqlbee_proto::limits::COUNT_LIMITS;
    let max = |key: &str| COUNT_LIMITS.iter().find(|(k, _)| *k == key).unwrap().1 as usize;
    assert!(b.windows.len() <= max("Batch.windows"));
    for w in &b.windows {
        assert!(w.digests.len() <= max("InstanceWindow.digests"));
        assert!(w.lock_waits.len() <= max("InstanceWindow.lock_waits"));
        for d in &w.digests {
            assert!(d.digest_text.len() <= 65_536 && d.sample.len() <= 65_536);
            assert!(d.waits.len() <= max("DigestStats.waits"));
            assert!(d.accounts.len() <= max("DigestStats.accounts"));
            assert!(d.error_codes.len() <= max("DigestStats.error_codes"));
            assert!(d.histogram.as_ref().is_none_or(|h| h.buckets.len() <= max("Histogram.buckets")));
        }
        for l in &w.lock_waits {
            assert!(l.blockers.len() <= max("LockWait.blockers"));
            assert!(l.blockers.iter().all(|b| b.statements.len() <= max("Blocker.statements")));
        }
    }
}

/// Each batch at a limit passes the decode bounds, one element or byte
/// past it is refused naming the field, and any mutation the bounds let
/// through decodes (or fails to) into a batch within every limit.
#[test]
fn batches_at_each_limit_pass_the_bounds_and_past_them_are_refused() {
    use sqlbee_proto::bounds::check;
    let corpus = at_the_limits();
    for bytes in &corpus {
        assert_eq!(check::<Batch>(bytes), Ok(()));
    }
    let mut wide = Batch::decode(corpus[0].as_slice()).unwrap();
    wide.windows[0].digests.push(Default::default());
    assert_eq!(check::<Batch>(&wide.encode_to_vec()).unwrap_err().path, "windows[0].digests");
    let mut deep = Batch::decode(corpus[1].as_slice()).unwrap();
    deep.windows[0].digests[0].digest_text.push('x');
    assert_eq!(check::<Batch>(&deep.encode_to_vec()).unwrap_err().path, "windows[0].digests[0].digest_text");
    let mut deep = Batch::decode(corpus[1].as_slice()).unwrap();
    deep.windows[0].lock_waits[0].blockers[3].statements.push("SELECT 1".into());
    assert_eq!(
        check::<Batch>(&deep.encode_to_vec()).unwrap_err().path,
        "windows[0].lock_waits[0].blockers[3].statements"
    );

    let (mut passed, mut decoded) = (0u64, 0u64);
    let executions = run("batch-bounds", &corpus, |bytes| {
        if check::<Batch>(bytes).is_err() {
            return;
        }
        passed += 1;
        if let Ok(batch) = Batch::decode(bytes) {
            decoded += 1;
            within_limits(&batch);
        }
    });
    assert!(executions > 10, "the target hardly ran");
    println!(
        "fuzz batch-bounds: {passed} of {executions} inputs within the bounds, {decoded} decoded within every limit"
    );
}
