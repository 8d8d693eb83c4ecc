//! The collector as users run it: the real `sqlbee collector` binary on a
//! private port and SQLite file, fed by a tonic client over real sockets,
//! read back through the Query service and the `sqlbee top` binary. No
//! root needed.
mod common;

use std::{path::PathBuf, time::Duration};

use common::collector::*;
use prost::Message as _;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};
use serde_json::Value;
use sqlbee::client::ClientOptions;
use sqlbee_proto::v1::{InstancesRequest, PushResponse, TopRequest, TotalsRequest};
use tonic::{Code, codec::CompressionEncoding};

const INSTANCE: &str = "db1:3306";

fn row<'a>(top: &'a Value, digest: u64) -> &'a Value {
    let hex = format!("{digest:016x}");
    top.as_array()
        .unwrap()
        .iter()
        .find(|d| d["digest"] == hex.as_str())
        .unwrap_or_else(|| panic!("digest {hex} missing from {top:#}"))
}

fn has_digest(top: &Value, digest: u64) -> bool {
    let hex = format!("{digest:016x}");
    top.as_array().unwrap().iter().any(|d| d["digest"] == hex.as_str())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_are_stored_once_and_histograms_merge_exactly() {
    let collector = Collector::start(&[]);
    let url = collector.http_url();
    let mut ingest = ingest_client(&plain(&url)).await;
    let now = now_ms();

    // Window A alone has p99 in the 2 ms bucket, window B alone in the 3 ms
    // bucket and max 50 ms: only an exact merge gives the numbers below.
    let a: Vec<u64> = [vec![1_000_000; 50], vec![2_000_000; 10]].concat();
    let b: Vec<u64> = [vec![3_000_000; 39], vec![50_000_000]].concat();
    let both = [a.clone(), b.clone()].concat();
    let select = 0x1111_2222_3333_4444;
    let update = 0xfedc_ba98_7654_3210; // above i64::MAX: must survive the bit-cast
    let first = batch(
        "agent-1",
        1,
        vec![window(INSTANCE, 100, now - 10_000, vec![digest(select, "SELECT ?", &a), digest(update, "UPDATE t SET a = ?", &[5_000])])],
    );
    let second = batch("agent-1", 2, vec![window(INSTANCE, 101, now, vec![digest(select, "SELECT ?", &b)])]);
    assert_eq!(push(&mut ingest, first.clone()).await.unwrap(), PushResponse { sequence: 1, duplicate: false });
    // Compressed like the agent sends it.
    let mut gzip = ingest.clone().send_compressed(CompressionEncoding::Gzip);
    assert_eq!(push(&mut gzip, second.clone()).await.unwrap(), PushResponse { sequence: 2, duplicate: false });
    // Replays: acknowledged, not stored again.
    assert_eq!(push(&mut ingest, first).await.unwrap(), PushResponse { sequence: 1, duplicate: true });
    assert_eq!(push(&mut gzip, second).await.unwrap(), PushResponse { sequence: 2, duplicate: true });

    let top = top_json(&url, &[]);
    let s = row(&top, select);
    assert_eq!(s["count"], 100, "{s:#}");
    assert_eq!(s["sum_ns"], both.iter().sum::<u64>());
    assert_eq!(s["min_ns"], 1_000_000);
    assert_eq!(s["max_ns"], 50_000_000);
    assert_eq!(s["digest_text"], "SELECT ?");
    assert_eq!(s["instances"], serde_json::json!([INSTANCE]));
    // Upper bounds of the buckets of 1 ms (rank 50) and 3 ms (ranks 95, 99).
    assert_eq!(s["p50_ns"], 1_048_575);
    assert_eq!(s["p95_ns"], 3_145_727);
    assert_eq!(s["p99_ns"], 3_145_727);
    for (field, q) in [("p50_ns", 0.5), ("p95_ns", 0.95), ("p99_ns", 0.99)] {
        assert_eq!(s[field], agent_quantile(&both, q), "{field} differs from the agent's own computation");
    }
    let u = row(&top, update);
    assert_eq!((u["count"].as_u64(), u["p99_ns"].as_u64()), (Some(1), Some(5_000)));
    assert_eq!(top[0]["digest"], format!("{select:016x}"), "ordered by total time");

    // The same through the Query service, with ordering and a filter.
    let mut query = query_client(&plain(&url)).await;
    let answer = query
        .top(TopRequest { instance: INSTANCE.into(), order_by: "count".into(), limit: 1, since_unix_ms: 0 })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.digests.len(), 1);
    assert_eq!((answer.digests[0].digest, answer.digests[0].count), (select, 100));
    let none = query.top(TopRequest { instance: "other:3306".into(), ..Default::default() }).await.unwrap();
    assert!(none.into_inner().digests.is_empty());
    let err = query.top(TopRequest { order_by: "slowest".into(), ..Default::default() }).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("order_by") && err.message().contains("p99"), "{err:?}");
    // Windows ending at or after `since`: only the second one.
    let recent = query.top(TopRequest { since_unix_ms: now - 1000, ..Default::default() }).await.unwrap().into_inner();
    assert_eq!(recent.digests.len(), 1);
    // 3 ms bucket's upper bound; the 1 ms statements of window A are out.
    assert_eq!((recent.digests[0].count, recent.digests[0].p50_ns), (40, 3_145_727));

    let totals = query.totals(TotalsRequest { instance: INSTANCE.into(), since_unix_ms: 0 }).await.unwrap().into_inner();
    assert_eq!((totals.statements, totals.digest_count), (101, 2));
    assert_eq!(totals.commands.len(), 1);
    assert_eq!((totals.commands[0].command.as_str(), totals.commands[0].count), ("COM_QUERY", 101));

    let instances = query.instances(InstancesRequest {}).await.unwrap().into_inner().instances;
    assert_eq!(instances.len(), 1, "{instances:?}");
    let i = &instances[0];
    assert_eq!((i.agent_id.as_str(), i.instance.as_str(), i.host.as_str()), ("agent-1", INSTANCE, "test-host"));
    assert_eq!((i.pid, i.last_sequence, i.batches, i.gaps), (101, 2, 2, 0));
    assert_eq!(i.last_window_end_unix_ms, now);

    // The table form prints the same digest.
    let out = sqlbee_query(&["top", "--collector", &url, "--since", "all"]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && table.contains(&format!("{select:016x}")), "{table}");
    let out = sqlbee_query(&["instances", "--collector", &url, "--format", "json"]);
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json[0]["instance"], INSTANCE);

    let (clean, log) = collector.stop();
    assert!(clean, "collector did not stop cleanly on SIGTERM: {log}");
    assert!(log.contains("collector stopped"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_are_required_when_configured() {
    let dir = TempDir::new("tokens");
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, "# agents of team A\ntoken-a\n\ntoken-b\n").unwrap();
    let collector = Collector::start(&["--tokens".into(), tokens.display().to_string()]);
    let url = collector.http_url();
    let b = || batch("agent-auth", 1, vec![window(INSTANCE, 1, now_ms(), vec![digest(1, "SELECT ?", &[1000])])]);

    let mut anonymous = ingest_client(&plain(&url)).await;
    let err = push(&mut anonymous, b()).await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");
    assert!(err.message().contains("missing authorization"), "{err:?}");
    let wrong = ClientOptions { token: Some("token-c".into()), ..plain(&url) };
    let err = push(&mut ingest_client(&wrong).await, b()).await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");
    assert!(err.message().contains("not accepted"), "{err:?}");
    let err = query_client(&wrong).await.instances(InstancesRequest {}).await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");

    let right = ClientOptions { token: Some("token-b".into()), ..plain(&url) };
    assert!(!push(&mut ingest_client(&right).await, b()).await.unwrap().duplicate);
    let instances = query_client(&right).await.instances(InstancesRequest {}).await.unwrap().into_inner();
    assert_eq!(instances.instances.len(), 1);

    // Health answers without a token (load balancers probe it).
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel(&plain(&url)).await);
    for service in ["sqlbee.v1.Ingest", "sqlbee.v1.Query"] {
        let status = health
            .check(tonic_health::pb::HealthCheckRequest { service: service.into() })
            .await
            .unwrap()
            .into_inner()
            .status;
        assert_eq!(status, tonic_health::pb::health_check_response::ServingStatus::Serving as i32, "{service}");
    }

    // The CLI: refused without the token, with a hint; works with it.
    let out = sqlbee_query(&["top", "--collector", &url, "--format", "json"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("Unauthenticated") && stderr.contains("--token-file"), "{stderr}");
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "token-a\n").unwrap();
    let top = top_json(&url, &["--token-file", token_file.to_str().unwrap()]);
    assert_eq!(row(&top, 1)["count"], 1);
}

/// Sends already-encoded bytes as a Push request, to send what the typed
/// client cannot: invalid UTF-8 in a string field.
mod raw {
    use prost::Message as _;
    use sqlbee_proto::v1::PushResponse;
    use tonic::{
        Status,
        codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder},
    };

    pub struct RawCodec;
    pub struct RawEncoder;
    pub struct ResponseDecoder;

    impl Codec for RawCodec {
        type Encode = Vec<u8>;
        type Decode = PushResponse;
        type Encoder = RawEncoder;
        type Decoder = ResponseDecoder;
        fn encoder(&mut self) -> RawEncoder {
            RawEncoder
        }
        fn decoder(&mut self) -> ResponseDecoder {
            ResponseDecoder
        }
    }

    impl Encoder for RawEncoder {
        type Item = Vec<u8>;
        type Error = Status;
        fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
            prost::bytes::BufMut::put_slice(dst, &item);
            Ok(())
        }
    }

    impl Decoder for ResponseDecoder {
        type Item = PushResponse;
        type Error = Status;
        fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<PushResponse>, Status> {
            PushResponse::decode(src).map(Some).map_err(|e| Status::internal(e.to_string()))
        }
    }

    pub async fn push(channel: tonic::transport::Channel, bytes: Vec<u8>) -> Result<PushResponse, Status> {
        let mut grpc = tonic::client::Grpc::new(channel);
        grpc.ready().await.map_err(|e| Status::unavailable(e.to_string()))?;
        let path = tonic::codegen::http::uri::PathAndQuery::from_static("/sqlbee.v1.Ingest/Push");
        grpc.unary(tonic::Request::new(bytes), path, RawCodec).await.map(|r| r.into_inner())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_batches_are_refused_and_not_stored() {
    let collector = Collector::start(&[]);
    let url = collector.http_url();
    let mut ingest = ingest_client(&plain(&url)).await;
    let now = now_ms();
    let good = || batch("agent-bad", 1, vec![window(INSTANCE, 1, now, vec![digest(7, "SELECT ?", &[1000, 3000])])]);
    let expect_invalid = |result: Result<PushResponse, tonic::Status>, needles: &[&str]| {
        let err = result.expect_err("a malformed batch was accepted");
        assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
        for needle in needles {
            assert!(err.message().contains(needle), "{needle:?} not in {:?}", err.message());
        }
    };

    let mut b = good();
    b.windows[0].digests[0].min_ns = 5000;
    expect_invalid(push(&mut ingest, b).await, &["windows[0].digests[0].min_ns", "above max_ns"]);
    let mut b = good();
    b.windows[0].window_start_unix_ms = now + 5000;
    expect_invalid(push(&mut ingest, b).await, &["windows[0].window_end_unix_ms", "not after"]);
    let mut b = good();
    b.windows[0].digests[0].histogram.as_mut().unwrap().buckets[0].count += 1;
    expect_invalid(push(&mut ingest, b).await, &["histogram.buckets", "sum to 3", "count is 2"]);
    let mut b = good();
    b.windows[0].window_end_unix_ms = now - 40 * 86_400_000;
    b.windows[0].window_start_unix_ms = now - 40 * 86_400_000 - 10_000;
    expect_invalid(push(&mut ingest, b).await, &["window_start_unix_ms", "clock"]);
    let mut b = good();
    b.windows[0].digests = vec![digest(8, "SELECT ?", &[10]); 100_001];
    expect_invalid(push(&mut ingest, b).await, &["digests", "at most 100000"]);

    // Invalid UTF-8: encode a good batch whose text holds a marker, then
    // overwrite the marker's bytes (same length, so the framing stays valid).
    let mut b = good();
    b.windows[0].digests[0].digest_text = "SELECT MARKER".into();
    let mut bytes = b.encode_to_vec();
    let at = bytes.windows(6).position(|w| w == b"MARKER").unwrap();
    bytes[at..at + 6].copy_from_slice(&[0xff, 0xfe, 0xc3, 0x28, 0xa0, 0xa1]);
    expect_invalid(raw::push(channel(&plain(&url)).await, bytes).await, &["digest_text", "UTF-8"]);

    // Above the 32 MiB limit, plain and gzip (a tiny compressed body that
    // would expand past the limit).
    let mut b = good();
    b.windows[0].digests[0].sample = "x".repeat(33 << 20);
    expect_invalid(push(&mut ingest, b.clone()).await, &["too large"]);
    let mut gzip = ingest.clone().send_compressed(CompressionEncoding::Gzip);
    expect_invalid(push(&mut gzip, b).await, &["size limit"]);

    // Nothing of the above was stored, and the collector still works.
    let mut query = query_client(&plain(&url)).await;
    assert!(query.instances(InstancesRequest {}).await.unwrap().into_inner().instances.is_empty());
    assert!(top_json(&url, &[]).as_array().unwrap().is_empty());
    assert!(!push(&mut ingest, good()).await.unwrap().duplicate);
    assert_eq!(row(&top_json(&url, &[]), 7)["count"], 2);
}

struct Pki {
    ca: PathBuf,
    server_cert: PathBuf,
    server_key: PathBuf,
    client_cert: PathBuf,
    client_key: PathBuf,
    rogue_cert: PathBuf,
    rogue_key: PathBuf,
}

fn ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    params.distinguished_name.push(DnType::CommonName, name);
    CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap()
}

fn leaf(
    dir: &std::path::Path,
    name: &str,
    issuer: &CertifiedIssuer<'static, KeyPair>,
    purpose: ExtendedKeyUsagePurpose,
) -> (PathBuf, PathBuf) {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
    params.distinguished_name.push(DnType::CommonName, name);
    params.extended_key_usages = vec![purpose];
    let cert = params.signed_by(&key, issuer).unwrap();
    let (cert_path, key_path) = (dir.join(format!("{name}.crt")), dir.join(format!("{name}.key")));
    std::fs::write(&cert_path, cert.pem()).unwrap();
    std::fs::write(&key_path, key.serialize_pem()).unwrap();
    (cert_path, key_path)
}

fn pki(dir: &std::path::Path) -> Pki {
    let authority = ca("sqlbee test CA");
    let ca_path = dir.join("ca.crt");
    std::fs::write(&ca_path, authority.pem()).unwrap();
    let (server_cert, server_key) = leaf(dir, "server", &authority, ExtendedKeyUsagePurpose::ServerAuth);
    let (client_cert, client_key) = leaf(dir, "agent", &authority, ExtendedKeyUsagePurpose::ClientAuth);
    let (rogue_cert, rogue_key) = leaf(dir, "rogue", &ca("some other CA"), ExtendedKeyUsagePurpose::ClientAuth);
    Pki { ca: ca_path, server_cert, server_key, client_cert, client_key, rogue_cert, rogue_key }
}

/// Connect and push; any failure (connect, handshake, call) as text.
async fn try_push(opts: &ClientOptions, sequence: u64) -> Result<PushResponse, String> {
    let channel = sqlbee::client::connect(opts).await.map_err(|e| e.to_string())?;
    let token = sqlbee::client::BearerToken::new(opts.token.as_deref()).unwrap();
    let mut client = sqlbee_proto::v1::ingest_client::IngestClient::with_interceptor(channel, token);
    let b = batch("agent-tls", sequence, vec![window(INSTANCE, 1, now_ms(), vec![digest(9, "SELECT ?", &[1000])])]);
    client.push(b).await.map(|r| r.into_inner()).map_err(|s| format!("{s:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_and_mutual_tls() {
    let dir = TempDir::new("pki");
    let pki = pki(dir.path());
    let arg = |p: &PathBuf| p.display().to_string();
    let tls_args = vec!["--tls-cert".to_string(), arg(&pki.server_cert), "--tls-key".to_string(), arg(&pki.server_key)];

    // TLS: a client trusting the CA works; plain text and an https client
    // without the CA do not.
    let collector = Collector::start(&tls_args);
    let https = collector.https_url();
    let trusting = ClientOptions { url: https.clone(), ca_cert: Some(pki.ca.clone()), ..Default::default() };
    assert!(!try_push(&trusting, 1).await.unwrap().duplicate);
    assert!(try_push(&plain(&collector.http_url()), 2).await.is_err(), "plain text accepted by a TLS collector");
    let err = try_push(&ClientOptions { url: https.clone(), ..Default::default() }, 2).await.unwrap_err();
    assert!(err.contains("--ca-cert"), "{err}");
    let other_ca = ClientOptions { url: https.clone(), ca_cert: Some(pki.rogue_cert.clone()), ..Default::default() };
    assert!(try_push(&other_ca, 2).await.is_err(), "a server certificate from an untrusted CA was accepted");
    let top = top_json(&https, &["--ca-cert", pki.ca.to_str().unwrap()]);
    assert_eq!(row(&top, 9)["count"], 1);
    drop(collector);

    // mTLS: refused without a client certificate or with one from another
    // CA; accepted with one signed by the client CA.
    let mut mtls_args = tls_args.clone();
    mtls_args.extend(["--tls-client-ca".to_string(), arg(&pki.ca)]);
    let collector = Collector::start(&mtls_args);
    let https = collector.https_url();
    let no_cert = ClientOptions { url: https.clone(), ca_cert: Some(pki.ca.clone()), ..Default::default() };
    assert!(try_push(&no_cert, 1).await.is_err(), "a client without a certificate was accepted");
    let rogue = ClientOptions {
        client_cert: Some(pki.rogue_cert.clone()),
        client_key: Some(pki.rogue_key.clone()),
        ..no_cert.clone()
    };
    assert!(try_push(&rogue, 1).await.is_err(), "a client certificate from another CA was accepted");
    let agent = ClientOptions {
        client_cert: Some(pki.client_cert.clone()),
        client_key: Some(pki.client_key.clone()),
        ..no_cert.clone()
    };
    assert!(!try_push(&agent, 1).await.unwrap().duplicate);
    assert!(try_push(&agent, 1).await.unwrap().duplicate);
    let top = top_json(
        &https,
        &[
            "--ca-cert",
            pki.ca.to_str().unwrap(),
            "--client-cert",
            pki.client_cert.to_str().unwrap(),
            "--client-key",
            pki.client_key.to_str().unwrap(),
        ],
    );
    assert_eq!(row(&top, 9)["count"], 1);
    let out = sqlbee_query(&["top", "--collector", &https, "--ca-cert", pki.ca.to_str().unwrap()]);
    assert!(!out.status.success(), "sqlbee top without a client certificate was answered");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_prunes_old_windows() {
    let collector = Collector::start(&["--retention".into(), "5s".into(), "--prune-interval".into(), "300ms".into()]);
    let url = collector.http_url();
    let mut ingest = ingest_client(&plain(&url)).await;
    let now = now_ms();
    let (old, fresh, ancient) = (1, 2, 3);
    let b1 = batch("agent-r", 1, vec![window(INSTANCE, 1, now - 100, vec![digest(old, "SELECT old", &[1000])])]);
    // Ends in the future (allowed clock skew), so it outlives the test.
    let b2 = batch("agent-r", 2, vec![window(INSTANCE, 1, now + 600_000, vec![digest(fresh, "SELECT fresh", &[1000])])]);
    // Valid (within 30 days) but already past retention: accepted, not kept.
    let b3 = batch("agent-r", 3, vec![window(INSTANCE, 1, now - 86_400_000, vec![digest(ancient, "SELECT ancient", &[1000])])]);
    for b in [b1.clone(), b2, b3] {
        assert!(!push(&mut ingest, b).await.unwrap().duplicate);
    }
    let top = top_json(&url, &[]);
    assert!(has_digest(&top, old) && has_digest(&top, fresh), "{top:#}");
    assert!(!has_digest(&top, ancient), "a window past retention was stored: {top:#}");

    // The old window goes first; the exactly-once records of batches 1 and
    // 3 follow once their receive time is past retention too.
    let mut query = query_client(&plain(&url)).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let top = top_json(&url, &[]);
        let instances = query.instances(InstancesRequest {}).await.unwrap().into_inner().instances;
        assert!(has_digest(&top, fresh), "the fresh window was pruned: {top:#}");
        assert_eq!(instances.len(), 1, "{instances:?}");
        if !has_digest(&top, old) && instances[0].batches == 1 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "nothing pruned: {top:#} {instances:?}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let totals = query.totals(TotalsRequest::default()).await.unwrap().into_inner();
    assert_eq!((totals.statements, totals.digest_count), (1, 1));
    // Replaying the pruned batch does not bring its expired window back.
    push(&mut ingest, b1).await.unwrap();
    assert!(!has_digest(&top_json(&url, &[]), old));
}
