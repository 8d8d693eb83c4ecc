//! Userspace hot path: event decode, normalize (cache hit and miss), the
//! change classifier every statement record meets, aggregate, batch encode, spool append and replay. Run by
//! `cargo xtask bench`; `cargo test --bench hot_path` runs each once.
use std::{hint::black_box, path::PathBuf, time::SystemTime};

use criterion::{Criterion, criterion_group, criterion_main};
use prost::Message;
use sqlbee_agent::{
    aggregate::Aggregator,
    discover::ServerProcess,
    normalize::{Normalizer, change_of, digest_text},
    probe::{ProbeBatch, Statement, decode_statement},
    ship::{instance_window, spool::Spool},
};
use sqlbee_kernel_abi::{EVENT_HEADER_LEN, StatementEvent};
use sqlbee_proto::v1::{AgentIdentity, Batch};

const SYSBENCH_POINT: &[u8] = b"SELECT c FROM sbtest1 WHERE id=?";
const ORM_QUERY: &[u8] = b"SELECT u.id, u.name, o.total FROM users u JOIN orders o ON o.user_id = u.id \
    WHERE u.status = 'active' AND o.created_at > '2026-01-01' AND o.id IN (1, 2, 3, 4, 5) ORDER BY o.total DESC LIMIT 20";

fn record(text: &[u8]) -> Vec<u8> {
    let header = StatementEvent {
        captured_len: text.len() as u32,
        text_len: text.len() as u32,
        command: 3,
        ..Default::default()
    };
    let mut bytes = vec![0u8; EVENT_HEADER_LEN];
    // SAFETY: the vector holds exactly one header.
    unsafe { std::ptr::write_unaligned(bytes.as_mut_ptr().cast(), header) };
    bytes.extend_from_slice(text);
    bytes
}

fn benches(c: &mut Criterion) {
    let rec = record(ORM_QUERY);
    c.bench_function("decode_event", |b| b.iter(|| decode_statement(black_box(&rec))));

    let mut normalizer = Normalizer::new(10_000);
    normalizer.normalize(ORM_QUERY);
    c.bench_function("normalize_cache_hit", |b| b.iter(|| normalizer.normalize(black_box(ORM_QUERY))));
    c.bench_function("normalize_miss_sysbench", |b| b.iter(|| digest_text(black_box(SYSBENCH_POINT))));
    c.bench_function("normalize_miss_orm", |b| b.iter(|| digest_text(black_box(ORM_QUERY))));
    // What every statement record pays (a first word that starts no
    // change), and what a change pays once.
    c.bench_function("change_of_select", |b| b.iter(|| change_of(black_box(ORM_QUERY), None)));
    c.bench_function("change_of_set_session", |b| b.iter(|| change_of(black_box(b"SET autocommit=0"), None)));
    let ddl: &[u8] = b"ALTER TABLE shop.orders DROP INDEX idx_email, ALGORITHM=INPLACE, LOCK=NONE";
    c.bench_function("change_of_ddl", |b| b.iter(|| change_of(black_box(ddl), Some("shop"))));

    let server = ServerProcess {
        pid: 1,
        start_ticks: 1,
        start_unix_ms: 0,
        comm: "mariadbd".into(),
        binary: PathBuf::from("/usr/sbin/mariadbd"),
        instance: "bench:3306".into(),
        container: None,
    };
    let statements: Vec<Statement> = (0..1000)
        .map(|i| Statement {
            start_ns: 0,
            duration_ns: 50_000 + i * 37,
            thd: 1,
            connection_id: 1,
            tid: 1,
            command: 3,
            stmt_id: 0,
            error_code: 0,
            text_len: SYSBENCH_POINT.len() as u32,
            truncated: false,
            text: if i % 2 == 0 { SYSBENCH_POINT.to_vec() } else { ORM_QUERY.to_vec() },
            waits: [0; 8],
            stats: Default::default(),
            schema_hash: 0,
            account_hash: 0,
            schema: None,
            account: None,
            client: None,
            nested: false,
            source: 0,
            program_hash: 0,
            program_kind: 0,
            program: None,
            parent_start_ns: 0,
            error_ns: 0,
            error_message: None,
            text_hash: 0,
            sample: false,
            shed: false,
            values: None,
        })
        .collect();
    let batch = |statements: Vec<Statement>| ProbeBatch {
        binary: Default::default(),
        readable: Default::default(),
        programs: Default::default(),
        server: server.clone(),
        statements,
        long_waits: Vec::new(),
        applied: Vec::new(),
        counters: None,
        kernel: Vec::new(),
        forgotten: Vec::new(),
        cost: None,
        detached: false,
        stopped: None,
    };
    let mut aggregator = Aggregator::new(Normalizer::new(10_000), 5000, SystemTime::now());
    c.bench_function("aggregate_1000_statements", |b| b.iter(|| aggregator.ingest(batch(statements.clone()))));

    // A window of 200 digests, as one batch on the wire.
    let mut aggregator = Aggregator::new(Normalizer::new(10_000), 5000, SystemTime::now());
    let many: Vec<Statement> = (0..200u64)
        .flat_map(|d| {
            let text = format!("SELECT c FROM sbtest{d} WHERE id=?").into_bytes();
            statements[..5].iter().map(move |s| Statement {
                text: text.clone(),
                text_len: text.len() as u32,
                ..s.clone()
            })
        })
        .collect();
    aggregator.ingest(batch(many));
    let reports = aggregator.flush(SystemTime::now());
    let encode = || {
        Batch {
            agent: Some(AgentIdentity { host: "bench".into(), agent_id: "bench".into(), version: "0".into() }),
            sequence: 1,
            windows: reports.iter().map(|r| instance_window(r, None)).collect(),
            ..Default::default()
        }
        .encode_to_vec()
    };
    c.bench_function("batch_encode_200_digests", |b| b.iter(encode));

    // Spool: durable append (write, fsync, rename) and replay (read, check,
    // decode) of that batch.
    let payload = encode();
    let dir = std::env::temp_dir().join(format!("sqlbee-bench-spool-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut spool = Spool::open(&dir, 1 << 30).expect("spool");
    let mut sequence = 0;
    c.bench_function("spool_append", |b| {
        b.iter(|| {
            sequence += 1;
            spool.append(sequence, &payload).expect("append");
        })
    });
    let first = spool.oldest().expect("an appended batch");
    c.bench_function("spool_replay_one", |b| b.iter(|| spool.read(black_box(&first)).expect("read").expect("intact")));
    let _ = std::fs::remove_dir_all(&dir);
}

criterion_group!(hot_path, benches);
criterion_main!(hot_path);
