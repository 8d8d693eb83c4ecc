//! What reading query tags costs the agent per statement, beside the
//! digest cache hit every statement already pays: statements without a
//! comment (one search for `/*`), with a sqlcommenter comment and a trace
//! context, and with marginalia; and the aggregate stage over 1,000
//! untagged statements with tags on and off, side by side in one run.
//! The kernel side does not change: tags are read from the text the probe
//! already copies. `cargo bench -p sqlbee --bench query_tags`.
use std::{hint::black_box, path::PathBuf, time::SystemTime};

use criterion::{Criterion, criterion_group, criterion_main};
use sqlbee_agent::{
    aggregate::Aggregator,
    discover::ServerProcess,
    normalize::{Normalizer, Samples, TagReader, tags::DEFAULT_KEYS},
    probe::{ProbeBatch, Statement},
};

const POINT: &[u8] = b"SELECT c FROM sbtest1 WHERE id=4711";
const ORM: &[u8] = b"SELECT u.id, u.name, o.total FROM users u JOIN orders o ON o.user_id = u.id \
    WHERE u.status = 'active' AND o.created_at > '2026-01-01' AND o.id IN (1, 2, 3, 4, 5) ORDER BY o.total DESC LIMIT 20";
const SQLCOMMENTER: &[u8] = b"SELECT u.id, u.name, o.total FROM users u JOIN orders o ON o.user_id = u.id \
    WHERE u.status = 'active' AND o.id IN (1, 2, 3) ORDER BY o.total DESC LIMIT 20 \
    /*action='show',controller='orders',db_driver='django.db.backends.mysql',framework='django%3A4.2.7',\
    route='%2Forders%2F%3Cint%3Aid%3E',traceparent='00-5bd66ef5095369c7b0d1f8f4bd33716a-c532cb4098ac3dd2-01'*/";
const MARGINALIA: &[u8] = b"SELECT u.id FROM users u WHERE u.id = 5 /*application:Shop,controller:orders,action:show*/";

fn statement(text: &[u8], i: u64) -> Statement {
    Statement {
        duration_ns: 50_000 + i * 37,
        thd: 1,
        connection_id: 1,
        tid: 1,
        command: 3,
        text_len: text.len() as u32,
        text: text.to_vec(),
        ..Default::default()
    }
}

fn benches(c: &mut Criterion) {
    let keys: Vec<String> = DEFAULT_KEYS.split(',').map(String::from).collect();
    let mut reader = TagReader::new(&keys, Samples::Redacted);
    let mut normalizer = Normalizer::new(10_000);
    normalizer.normalize(ORM);
    c.bench_function("digest_cache_hit_orm", |b| b.iter(|| normalizer.normalize(black_box(ORM))));
    for (name, text) in [("point", POINT), ("orm", ORM), ("sqlcommenter", SQLCOMMENTER), ("marginalia", MARGINALIA)] {
        c.bench_function(&format!("tags_{name}"), |b| b.iter(|| reader.read(black_box(text))));
    }
    // Each statement its own trace, as OpenTelemetry writes them.
    let traced: Vec<Vec<u8>> = (0..1024u64)
        .map(|i| {
            String::from_utf8_lossy(SQLCOMMENTER).replace("5bd66ef5095369c7", &format!("{:016x}", i + 1)).into_bytes()
        })
        .collect();
    let mut next = 0;
    c.bench_function("tags_sqlcommenter_new_trace_each", |b| {
        b.iter(|| {
            next = (next + 1) % traced.len();
            reader.read(black_box(&traced[next]))
        })
    });

    let server = ServerProcess {
        pid: 1,
        start_ticks: 1,
        start_unix_ms: 0,
        comm: "mariadbd".into(),
        binary: PathBuf::from("/usr/sbin/mariadbd"),
        instance: "bench:3306".into(),
        container: None,
    };
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
    let untagged: Vec<Statement> = (0..1000).map(|i| statement(if i % 2 == 0 { POINT } else { ORM }, i)).collect();
    let tagged: Vec<Statement> = (0..1000).map(|i| statement(&traced[i as usize], i)).collect();
    for (name, tags) in [("off", None), ("on", Some(reader.clone()))] {
        let mut aggregator =
            Aggregator::new(Normalizer::new(10_000), 5000, SystemTime::now()).with_query_tags(tags.clone());
        c.bench_function(&format!("aggregate_1000_untagged_tags_{name}"), |b| {
            b.iter(|| aggregator.ingest(batch(untagged.clone())))
        });
        let mut aggregator = Aggregator::new(Normalizer::new(10_000), 5000, SystemTime::now()).with_query_tags(tags);
        c.bench_function(&format!("aggregate_1000_sqlcommenter_tags_{name}"), |b| {
            b.iter(|| aggregator.ingest(batch(tagged.clone())))
        });
    }
}

criterion_group! {
    name = query_tags;
    config = Criterion::default().sample_size(30).measurement_time(std::time::Duration::from_secs(3));
    targets = benches
}
criterion_main!(query_tags);
