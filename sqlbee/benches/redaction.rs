//! What redacting a sample costs, beside the digest the agent computes for
//! the same text. A sample is redacted once per digest per window (and per
//! lock wait), not per statement, so this bounds the cost per statement
//! from above. `cargo bench -p sqlbee --bench redaction`.
use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use sqlbee_agent::normalize::{Samples, digest_text};

const POINT: &[u8] = b"SELECT c FROM sbtest1 WHERE id=4711";
const ORM: &[u8] = b"SELECT u.id, u.name, o.total FROM users u JOIN orders o ON o.user_id = u.id \
    WHERE u.email = 'ann@example.com' AND o.created_at > '2026-01-01' AND o.id IN (1, 2, 3, 4, 5) ORDER BY o.total DESC LIMIT 20";
const ERROR: &str = "Duplicate entry 'ann@example.com' for key 'users.email'";

fn benches(c: &mut Criterion) {
    let insert: Vec<u8> = {
        let mut s = b"INSERT INTO t (id, email, card) VALUES ".to_vec();
        for i in 0..20 {
            s.extend_from_slice(format!("({i}, 'user{i}@example.com', '4111111111111{i:03}'),").as_bytes());
        }
        s.pop();
        s
    };
    for (name, text) in [("point", POINT), ("orm", ORM), ("insert_1k", insert.as_slice())] {
        c.bench_function(&format!("redact_{name}"), |b| b.iter(|| Samples::Redacted.statement(black_box(text), 1024)));
        c.bench_function(&format!("digest_{name}"), |b| b.iter(|| digest_text(black_box(text))));
    }
    c.bench_function("redact_error_message", |b| b.iter(|| Samples::Redacted.message(black_box(ERROR))));
}

criterion_group!(redaction, benches);
criterion_main!(redaction);
