//! What the collector spends on one batch before any store sees it, stage
//! by stage: inflating it (agents send gzip), the decode bounds' scan of
//! its bytes (`sqlbee_proto::bounds`), decoding the protobuf, the
//! content hash exactly-once keys on (taken by the agent now, and by the
//! collector only for agents from before `Batch.content_hash`), and
//! validation. The batch is the one `collector_load` sends (10 windows
//! of 20 digest rows with figures, accounts and samples), so a stage's
//! time here times 1000 is its share of a collector core-second at 1000
//! batches/s. `cargo bench -p sqlbee --bench collector_ingest`.
use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use prost::Message as _;
use sqlbee_collector::validate;
use sqlbee_proto::content_hash;
use sqlbee_proto::v1::{AgentIdentity, Batch};

mod load_batch;

fn benches(c: &mut Criterion) {
    let now_ms = 1_800_000_000_000;
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let batch = Batch {
        agent: Some(AgentIdentity { host: "host7".into(), agent_id: "load-7".into(), version: "load".into() }),
        sequence: 1,
        created_unix_ms: now_ms,
        epoch: 0,
        windows: (0..10).map(|w| load_batch::window(7, now_ms - (10 - w) * 60_000, 60_000, 20, &mut seed)).collect(),
        gaps: vec![],
        agent_windows: vec![],
        content_hash: 0,
    };
    let bytes = batch.encode_to_vec();
    // Through flate2, as tonic inflates a gzip request, with whichever
    // backend the build selects for it.
    let gzipped = {
        use std::io::Write as _;
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(&bytes).unwrap();
        gz.finish().unwrap()
    };
    let mut inflated = Vec::with_capacity(bytes.len());
    c.bench_function("inflate_batch", |b| {
        b.iter(|| {
            use std::io::Read as _;
            inflated.clear();
            flate2::read::GzDecoder::new(black_box(gzipped.as_slice())).read_to_end(&mut inflated).unwrap();
        })
    });
    validate::batch(&batch, now_ms).expect("the load batch is valid");
    // The walk itself (a batch this size skips it: see `check_if_large`).
    c.bench_function("bounds_batch", |b| {
        b.iter(|| sqlbee_proto::bounds::check::<Batch>(black_box(bytes.as_slice())).unwrap())
    });
    c.bench_function("bounds_if_large_batch", |b| {
        b.iter(|| sqlbee_proto::bounds::check_if_large::<Batch>(black_box(bytes.as_slice())).unwrap())
    });
    c.bench_function("decode_batch", |b| b.iter(|| Batch::decode(black_box(bytes.as_slice())).unwrap()));
    c.bench_function("content_hash_batch", |b| b.iter(|| content_hash(black_box(&batch))));
    c.bench_function("validate_batch", |b| b.iter(|| validate::batch(black_box(&batch), now_ms)));
}

criterion_group!(collector_ingest, benches);
criterion_main!(collector_ingest);
