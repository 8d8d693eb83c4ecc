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
use sqlbee_collector::store::sqlite::SCHEMA_VERSION;
use sqlbee_proto::client::ClientOptions;
use sqlbee_proto::v1::{
    Blocker, DigestStats, ErrorCount, InstancesRequest, LockWait, LocksRequest, PushResponse, SeriesPoint,
    SeriesRequest, TopRequest, TotalsRequest, WaitStats,
};
use tonic::{Code, codec::CompressionEncoding};

const INSTANCE: &str = "db1:3306";

fn row(top: &Value, digest: u64) -> &Value {
    let hex = format!("{digest:016x}");
    top.as_array()
        .unwrap()
        .iter()
        .find(|d| d["digest"] == hex.as_str())
        .unwrap_or_else(|| panic!("digest {hex} missing from {top:#}"))
}

/// Sequence and duplicate flag of an acknowledgement.
fn ack(response: PushResponse) -> (u64, bool) {
    (response.sequence, response.duplicate)
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
    let select = id_of("SELECT ?");
    // A text whose id is above i64::MAX: it must survive the bit-cast.
    let update_text = (0..).map(|n| format!("UPDATE t{n} SET a = ?")).find(|t| id_of(t) > i64::MAX as u64).unwrap();
    let update = id_of(&update_text);
    let first = batch(
        "agent-1",
        1,
        vec![window(INSTANCE, 100, now - 10_000, vec![digest("SELECT ?", &a), digest(&update_text, &[5_000])])],
    );
    let second = batch("agent-1", 2, vec![window(INSTANCE, 101, now, vec![digest("SELECT ?", &b)])]);
    assert_eq!(ack(push(&mut ingest, first.clone()).await.unwrap()), (1, false));
    // Compressed like the agent sends it.
    let mut gzip = ingest.clone().send_compressed(CompressionEncoding::Gzip);
    assert_eq!(ack(push(&mut gzip, second.clone()).await.unwrap()), (2, false));
    // Replays: acknowledged, not stored again.
    assert_eq!(ack(push(&mut ingest, first).await.unwrap()), (1, true));
    assert_eq!(ack(push(&mut gzip, second).await.unwrap()), (2, true));

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
        .top(TopRequest { instance: INSTANCE.into(), order_by: "count".into(), limit: 1, ..Default::default() })
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

    let totals = query
        .totals(TotalsRequest { instance: INSTANCE.into(), since_unix_ms: 0, ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((totals.statements, totals.digest_count), (101, 2));
    assert_eq!(totals.commands.len(), 1);
    assert_eq!((totals.commands[0].command.as_str(), totals.commands[0].count), ("COM_QUERY", 101));

    // Series split by instance and by digest, as the web UI's tables read
    // them: each split adds up to the whole, and the splits it cannot make
    // are refused.
    let whole = SeriesRequest { of: "statements".into(), since_unix_ms: now - 3_600_000, ..Default::default() };
    let counted = |points: &[SeriesPoint]| points.iter().map(|p| p.count).sum::<u64>();
    let all = query.series(whole.clone()).await.unwrap().into_inner();
    assert_eq!(counted(&all.points), 101);
    let instances = query.series(SeriesRequest { by_instance: true, ..whole.clone() }).await.unwrap().into_inner();
    assert!(instances.points.is_empty());
    assert_eq!(
        instances.instances.iter().map(|s| (s.instance.as_str(), counted(&s.points))).collect::<Vec<_>>(),
        [(INSTANCE, 101)]
    );
    let digests =
        query.series(SeriesRequest { by_digests: vec![update, select], ..whole.clone() }).await.unwrap().into_inner();
    let mut per_digest: Vec<(u64, u64)> = digests.digests.iter().map(|s| (s.digest, counted(&s.points))).collect();
    per_digest.sort_unstable();
    assert_eq!(per_digest, [(select, 100), (update, 1)]);
    for (request, needle) in [
        (SeriesRequest { of: "cost".into(), by_instance: true, ..whole.clone() }, "by_instance"),
        (
            SeriesRequest { of: "digest".into(), digest: select, by_digests: vec![select], ..whole.clone() },
            "by_digests",
        ),
        (SeriesRequest { by_digests: (1..=1001).collect(), ..whole.clone() }, "1000"),
        (SeriesRequest { by_instance: true, by_digests: vec![select], ..whole.clone() }, "one way"),
    ] {
        let err = query.series(request).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
        assert!(err.message().contains(needle), "{needle:?} not in {:?}", err.message());
    }

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
    // The last window ended at `now`, taken before anything was pushed:
    // the lag is at most the time this test has run since.
    let lag = json[0]["lag_ms"].as_i64().unwrap_or_else(|| panic!("no lag_ms: {json:#}"));
    assert!((0..=now_ms() - now).contains(&lag), "lag {lag} ms outside 0..={} ms", now_ms() - now);
    let seen = json[0]["last_seen_unix_ms"].as_i64().unwrap();
    assert!((now..=now_ms()).contains(&seen), "last seen {seen} outside {now}..=now");
    // The table shows that last-seen time in its own column.
    let out = sqlbee_query(&["instances", "--collector", &url]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && table.lines().next().unwrap_or("").contains("last_seen"), "{table}");
    let seen = sqlbee_vocabulary::clock::rfc3339(std::time::UNIX_EPOCH + Duration::from_millis(seen as u64));
    assert!(table.lines().nth(1).unwrap_or("").contains(&seen), "{seen} missing from {table}");

    let (clean, log) = collector.stop();
    assert!(clean, "collector did not stop cleanly on SIGTERM: {log}");
    assert!(log.contains("collector stopped"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_are_required_when_configured() {
    let dir = TempDir::new("tokens");
    let tokens = dir.path().join("tokens");
    std::fs::write(
        &tokens,
        "# agents of team A\ntoken-a-0123456789abcdef0123456789abcdef\n\ntoken-b-0123456789abcdef0123456789abcdef\n",
    )
    .unwrap();
    let collector = Collector::start(&["--tokens".into(), tokens.display().to_string()]);
    let url = collector.http_url();
    let b = || batch("agent-auth", 1, vec![window(INSTANCE, 1, now_ms(), vec![digest("SELECT ?", &[1000])])]);

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

    let right = ClientOptions { token: Some("token-b-0123456789abcdef0123456789abcdef".into()), ..plain(&url) };
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
    std::fs::write(&token_file, "token-a-0123456789abcdef0123456789abcdef\n").unwrap();
    let top = top_json(&url, &["--token-file", token_file.to_str().unwrap()]);
    assert_eq!(row(&top, id_of("SELECT ?"))["count"], 1);
}

/// A database host's token cannot read the fleet, a reader's cannot send,
/// a token bound to agent ids sends for those agents only, and a new
/// tokens file takes effect on SIGHUP (a broken one changes nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingest_and_read_tokens_are_separate_and_reload_on_sighup() {
    let dir = TempDir::new("roles");
    let tokens = dir.path().join("tokens");
    std::fs::write(
        &tokens,
        "ingest host-token-0123456789abcdef0123456789abcdef agents=web-1
read reader-token-0123456789abcdef0123456789abcdef
",
    )
    .unwrap();
    let collector = Collector::start(&["--tokens".into(), tokens.display().to_string()]);
    let url = collector.http_url();
    let as_token = |t: &str| ClientOptions { token: Some(t.into()), ..plain(&url) };
    let b = |agent: &str, sequence| {
        batch(agent, sequence, vec![window(INSTANCE, 1, now_ms(), vec![digest("SELECT ?", &[1000])])])
    };

    let mut host = ingest_client(&as_token("host-token-0123456789abcdef0123456789abcdef")).await;
    assert!(!push(&mut host, b("web-1", 1)).await.unwrap().duplicate);
    let err = push(&mut host, b("db-7", 1)).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(err.message().contains("web-1"), "{err:?}");
    let err = query_client(&as_token("host-token-0123456789abcdef0123456789abcdef"))
        .await
        .instances(InstancesRequest {})
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "a host's token reads nothing: {err:?}");

    let err = push(&mut ingest_client(&as_token("reader-token-0123456789abcdef0123456789abcdef")).await, b("web-1", 2))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    let instances = query_client(&as_token("reader-token-0123456789abcdef0123456789abcdef"))
        .await
        .instances(InstancesRequest {})
        .await
        .unwrap();
    assert_eq!(instances.into_inner().instances.len(), 1, "only web-1's batch was stored");

    let hup = |collector: &Collector| {
        let pid = collector.pid();
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(pid as i32, libc::SIGHUP) };
        std::thread::sleep(Duration::from_millis(300));
    };
    std::fs::write(
        &tokens,
        "read new-reader-0123456789abcdef0123456789abcdef
",
    )
    .unwrap();
    hup(&collector);
    assert!(
        query_client(&as_token("new-reader-0123456789abcdef0123456789abcdef"))
            .await
            .instances(InstancesRequest {})
            .await
            .is_ok()
    );
    let err = query_client(&as_token("reader-token-0123456789abcdef0123456789abcdef"))
        .await
        .instances(InstancesRequest {})
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "the old token is gone: {err:?}");
    std::fs::write(
        &tokens,
        "garbage line with too many fields
",
    )
    .unwrap();
    hup(&collector);
    assert!(
        query_client(&as_token("new-reader-0123456789abcdef0123456789abcdef"))
            .await
            .instances(InstancesRequest {})
            .await
            .is_ok(),
        "kept"
    );
    assert!(collector.stderr_text().contains("not reloaded"), "{}", collector.stderr_text());
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
    let good = || batch("agent-bad", 1, vec![window(INSTANCE, 1, now, vec![digest("SELECT ?", &[1000, 3000])])]);
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
    b.windows[0].digests = vec![digest("SELECT ?", &[10]); 100_001];
    expect_invalid(push(&mut ingest, b).await, &["windows[0].digests", "at most 50001"]);

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
    assert_eq!(row(&top_json(&url, &[]), id_of("SELECT ?"))["count"], 2);
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
    let channel = sqlbee_proto::client::connect(opts).await.map_err(|e| e.to_string())?;
    let token = sqlbee_proto::client::BearerToken::new(opts.token.as_deref()).unwrap();
    let mut client = sqlbee_proto::v1::ingest_client::IngestClient::with_interceptor(channel, token);
    // The same sequence carries the same window: a replay, not new content.
    static START: std::sync::OnceLock<i64> = std::sync::OnceLock::new();
    let end = *START.get_or_init(now_ms) + sequence as i64;
    let b = batch("agent-tls", sequence, vec![window(INSTANCE, 1, end, vec![digest("SELECT ?", &[1000])])]);
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
    assert_eq!(row(&top, id_of("SELECT ?"))["count"], 1);
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
    assert_eq!(row(&top, id_of("SELECT ?"))["count"], 1);
    let out = sqlbee_query(&["top", "--collector", &https, "--ca-cert", pki.ca.to_str().unwrap()]);
    assert!(!out.status.success(), "sqlbee top without a client certificate was answered");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_prunes_old_windows() {
    let collector = Collector::start(&["--retention".into(), "5s".into(), "--prune-interval".into(), "300ms".into()]);
    let url = collector.http_url();
    let mut ingest = ingest_client(&plain(&url)).await;
    let now = now_ms();
    let (old, fresh, ancient) = (id_of("SELECT old"), id_of("SELECT fresh"), id_of("SELECT ancient"));
    let b1 = batch("agent-r", 1, vec![window(INSTANCE, 1, now - 100, vec![digest("SELECT old", &[1000])])]);
    // Ends in the future (allowed clock skew), so it outlives the test.
    let b2 = batch("agent-r", 2, vec![window(INSTANCE, 1, now + 600_000, vec![digest("SELECT fresh", &[1000])])]);
    // Valid (within 30 days) but already past retention: accepted, not kept.
    let b3 = batch("agent-r", 3, vec![window(INSTANCE, 1, now - 86_400_000, vec![digest("SELECT ancient", &[1000])])]);
    for b in [b1.clone(), b2, b3] {
        assert!(!push(&mut ingest, b).await.unwrap().duplicate);
    }
    // Raw windows: a range shorter than a minute is read raw, never from
    // the rollups (which keep their own, longer, retention).
    let raw_around =
        |t: i64| top_json(&url, &["--since", &(t - 29_000).to_string(), "--until", &(t + 29_000).to_string()]);
    let (old_end, fresh_end) = (now - 100, now + 600_000);
    assert!(has_digest(&raw_around(old_end), old) && has_digest(&raw_around(fresh_end), fresh));
    let top = top_json(&url, &[]);
    assert!(has_digest(&top, old) && has_digest(&top, fresh), "{top:#}");
    assert!(!has_digest(&top, ancient), "a window past retention was stored: {top:#}");

    // The old window goes first; the exactly-once records of batches 1 and
    // 3 follow once their receive time is past retention too.
    let mut query = query_client(&plain(&url)).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let instances = query.instances(InstancesRequest {}).await.unwrap().into_inner().instances;
        assert!(has_digest(&raw_around(fresh_end), fresh), "the fresh window was pruned");
        assert_eq!(instances.len(), 1, "{instances:?}");
        if !has_digest(&raw_around(old_end), old) && instances[0].batches == 1 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "nothing pruned: {instances:?}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let totals = query.totals(TotalsRequest::default()).await.unwrap().into_inner();
    assert_eq!(totals.statements, 1);
    // The minute and hour rollups keep the old window past the raw
    // retention: a long range still counts it (the ClickHouse store has
    // no rollups yet).
    if !common::collector::clickhouse_store() {
        assert!(has_digest(&top_json(&url, &[]), old));
    }
    // Replaying the pruned batch does not bring its expired window back.
    push(&mut ingest, b1).await.unwrap();
    assert!(!has_digest(&raw_around(old_end), old));
}

fn wait(class: &str, sum_ns: u64, max_ns: u64, statements: u64) -> WaitStats {
    WaitStats { class: class.into(), sum_ns, max_ns, statements }
}

fn error(code: u32, count: u64, message: &str) -> ErrorCount {
    ErrorCount { code, count, sample_message: message.into() }
}

/// `digest(...)` with waits and error codes, as an agent with wait
/// tracking sends it.
fn waiting(text: &str, durations_ns: &[u64], waits: Vec<WaitStats>, errors: Vec<ErrorCount>) -> DigestStats {
    let mut d = digest(text, durations_ns);
    d.errors = errors.iter().map(|e| e.count).sum();
    d.error_codes = errors;
    d.waits = waits;
    d
}

const DEADLOCK: &str = "Deadlock found when trying to get lock; try restarting transaction";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_and_error_samples_merge_across_windows_and_instances() {
    let collector = Collector::start(&[]);
    let url = collector.http_url();
    let mut ingest = ingest_client(&plain(&url)).await;
    let now = now_ms();
    let (update, select) = (id_of("UPDATE t SET a = ? WHERE id = ?"), id_of("SELECT * FROM big"));
    let ms = 1_000_000u64;
    // Two agents, two instances, two windows of the same UPDATE.
    let first = batch(
        "agent-w1",
        1,
        vec![window(
            INSTANCE,
            10,
            now - 10_000,
            vec![
                waiting(
                    "UPDATE t SET a = ? WHERE id = ?",
                    &[400 * ms, 300 * ms, 2 * ms],
                    vec![wait("row_lock", 300 * ms, 200 * ms, 2), wait("disk_io", 5 * ms, 3 * ms, 1)],
                    vec![
                        error(1213, 1, "an older deadlock"),
                        error(1205, 1, "Lock wait timeout exceeded; try restarting transaction"),
                    ],
                ),
                // An old agent's digest: no waits, no error messages.
                digest("SELECT * FROM big", &[900 * ms, 900 * ms]),
            ],
        )],
    );
    let second = batch(
        "agent-w2",
        1,
        vec![window(
            "db2:3306",
            20,
            now,
            vec![waiting(
                "UPDATE t SET a = ? WHERE id = ?",
                &[260 * ms, ms],
                vec![wait("row_lock", 212 * ms, 212 * ms, 1), wait("commit", 0, 0, 0)],
                vec![error(1213, 2, DEADLOCK)],
            )],
        )],
    );
    assert!(!push(&mut ingest, first).await.unwrap().duplicate);
    assert!(!push(&mut ingest, second).await.unwrap().duplicate);

    let top = top_json(&url, &[]);
    let u = row(&top, update);
    assert_eq!(u["count"], 5, "{u:#}");
    assert_eq!(u["errors"], 4);
    assert_eq!(u["instances"], serde_json::json!([INSTANCE, "db2:3306"]));
    // Sums of sum_ns and statements, max of max_ns, per class.
    assert_eq!(u["waits"]["row_lock"], serde_json::json!({"sum_ns": 512 * ms, "max_ns": 212 * ms, "statements": 3}));
    assert_eq!(u["waits"]["disk_io"], serde_json::json!({"sum_ns": 5 * ms, "max_ns": 3 * ms, "statements": 1}));
    assert_eq!(u["waits"]["commit"], serde_json::json!({"sum_ns": 0, "max_ns": 0, "statements": 0}));
    assert_eq!(u["waits"].as_object().unwrap().len(), 3);
    // Counts add up; the newest window's message is the sample.
    assert_eq!(u["error_codes"]["1213"], serde_json::json!({"count": 3, "sample_message": DEADLOCK}));
    assert_eq!(u["error_codes"]["1205"]["count"], 1);
    assert_eq!(u["error_codes"]["1205"]["sample_message"], "Lock wait timeout exceeded; try restarting transaction");
    let s = row(&top, select);
    assert_eq!((&s["waits"], &s["error_codes"]), (&serde_json::json!({}), &serde_json::json!({})));
    // By total time the SELECT leads; by wait the UPDATE.
    assert_eq!(top[0]["digest"], format!("{select:016x}"));
    let by_wait = top_json(&url, &["--order-by", "wait"]);
    assert_eq!(by_wait[0]["digest"], format!("{update:016x}"), "{by_wait:#}");
    // Only one instance: only its window.
    let one = top_json(&url, &["--instance", "db2:3306"]);
    assert_eq!(row(&one, update)["waits"]["row_lock"]["statements"], 1);
    assert_eq!(row(&one, update)["error_codes"]["1213"]["count"], 2);
    assert!(row(&one, update)["error_codes"].get("1205").is_none());

    // The Query service answers the same, most wait first.
    let answer = query_client(&plain(&url))
        .await
        .top(TopRequest { order_by: "wait".into(), limit: 1, ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    let d = &answer.digests[0];
    assert_eq!(d.waits[0], wait("row_lock", 512 * ms, 212 * ms, 3));
    assert_eq!(d.error_codes[0], error(1213, 3, DEADLOCK));

    // The table: total wait and the dominant class.
    let out = sqlbee_query(&["top", "--collector", &url, "--since", "all"]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{table}");
    let header = table.lines().next().unwrap();
    assert!(header.contains("wait_ms") && header.contains("top_wait"), "{table}");
    let line = table.lines().find(|l| l.contains(&format!("{update:016x}"))).unwrap();
    assert!(line.contains("517.000") && line.contains("row_lock 512ms"), "{table}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_waits_and_error_messages_are_refused_and_not_stored() {
    let collector = Collector::start(&[]);
    let url = collector.http_url();
    let mut ingest = ingest_client(&plain(&url)).await;
    let now = now_ms();
    let good = || {
        batch(
            "agent-waits",
            1,
            vec![window(
                INSTANCE,
                1,
                now,
                vec![waiting(
                    "UPDATE t SET a = ?",
                    &[1000, 3000],
                    vec![wait("row_lock", 800, 600, 2), wait("metadata_lock", 100, 100, 1)],
                    vec![error(1062, 1, "Duplicate entry '1' for key 'PRIMARY'")],
                )],
            )],
        )
    };
    let expect_invalid = |result: Result<PushResponse, tonic::Status>, needles: &[&str]| {
        let err = result.expect_err("a malformed batch was accepted");
        assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
        for needle in needles {
            assert!(err.message().contains(needle), "{needle:?} not in {:?}", err.message());
        }
    };

    let mut b = good();
    b.windows[0].digests[0].waits[1].max_ns = 101;
    expect_invalid(push(&mut ingest, b).await, &["windows[0].digests[0].waits[1].max_ns", "above sum_ns 100"]);
    let mut b = good();
    b.windows[0].digests[0].waits[1].class = "row_lock".into();
    expect_invalid(push(&mut ingest, b).await, &["windows[0].digests[0].waits[1].class", "row_lock"]);
    let mut b = good();
    b.windows[0].digests[0].waits[0].statements = 3;
    expect_invalid(push(&mut ingest, b).await, &["waits[0].statements", "count 2"]);
    let mut b = good();
    b.windows[0].digests[0].waits[0].class = String::new();
    expect_invalid(push(&mut ingest, b).await, &["waits[0].class", "empty"]);
    let mut b = good();
    b.windows[0].digests[0].waits[0].class = "c".repeat(33);
    expect_invalid(push(&mut ingest, b).await, &["waits[0].class", "at most 32"]);
    let mut b = good();
    let mut many = b.windows[0].digests[0].waits.clone();
    many.extend((0..15).map(|n| wait(&format!("class_{n}"), 1, 1, 1)));
    b.windows[0].digests[0].waits = many;
    expect_invalid(push(&mut ingest, b).await, &["windows[0].digests[0].waits", "at most 16"]);
    let mut b = good();
    b.windows[0].digests[0].error_codes[0].sample_message = "m".repeat(1025);
    expect_invalid(push(&mut ingest, b).await, &["error_codes[0].sample_message", "at most 1024"]);

    // Nothing was stored, not even the sequence: the good batch with the
    // same sequence is new.
    assert!(top_json(&url, &[]).as_array().unwrap().is_empty());
    assert!(
        query_client(&plain(&url))
            .await
            .instances(InstancesRequest {})
            .await
            .unwrap()
            .into_inner()
            .instances
            .is_empty()
    );
    assert!(!push(&mut ingest, good()).await.unwrap().duplicate);
    let d = top_json(&url, &[]);
    assert_eq!(row(&d, id_of("UPDATE t SET a = ?"))["waits"]["row_lock"]["sum_ns"], 800);
    assert_eq!(row(&d, id_of("UPDATE t SET a = ?"))["error_codes"]["1062"]["count"], 1);
    // A batch without waits or messages (an older agent) is fine.
    let old = batch("agent-waits", 2, vec![window(INSTANCE, 1, now, vec![digest("SELECT ?", &[1000])])]);
    assert!(!push(&mut ingest, old).await.unwrap().duplicate);
    assert_eq!(row(&top_json(&url, &[]), id_of("SELECT ?"))["waits"], serde_json::json!({}));
}

/// A store written by a version-1 collector (no waits column, no
/// error_samples table) is upgraded when a newer collector opens it: its
/// rows are still served and new ones carry waits and messages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn version_1_store_is_upgraded_and_keeps_its_data() {
    if !sqlite_store("version_1_store_is_upgraded_and_keeps_its_data", "it rewrites the SQLite file") {
        return;
    }
    let mut collector = Collector::start(&[]);
    let url = collector.http_url();
    let mut ingest = ingest_client(&plain(&url)).await;
    let now = now_ms();
    let id = id_of("INSERT INTO t VALUES (?)");
    let old = batch(
        "agent-v1",
        1,
        vec![window(
            INSTANCE,
            1,
            now - 10_000,
            vec![waiting("INSERT INTO t VALUES (?)", &[1000, 2000], vec![], vec![error(1062, 1, "")])],
        )],
    );
    assert!(!push(&mut ingest, old.clone()).await.unwrap().duplicate);
    drop(ingest);

    // Turn the file into what a version-1 collector left behind.
    collector.kill9();
    let path = collector.dir.path().join("store.db");
    let columns = |conn: &rusqlite::Connection| -> Vec<String> {
        let mut stmt = conn.prepare("SELECT name FROM pragma_table_info('digest_windows')").unwrap();
        stmt.query_map([], |r| r.get(0)).unwrap().map(Result::unwrap).collect()
    };
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        assert_eq!(conn.query_row("PRAGMA user_version", [], |r| r.get::<_, i64>(0)).unwrap(), SCHEMA_VERSION);
        conn.execute_batch(
            "ALTER TABLE digest_windows DROP COLUMN estimated_count;
             ALTER TABLE digest_windows DROP COLUMN waits;
             ALTER TABLE agent_instances DROP COLUMN untraced_seen_unix_ms;
             ALTER TABLE agent_instances DROP COLUMN untraced_since_unix_ms;
             ALTER TABLE agent_instances DROP COLUMN untraced_kind;
             ALTER TABLE agent_instances DROP COLUMN untraced_reason;
             ALTER TABLE agent_instances DROP COLUMN server_version;
             ALTER TABLE agent_instances DROP COLUMN build_id;
             DROP TABLE error_samples;
             DROP TABLE lock_waits;
             DROP TABLE instance_costs;
             DROP TABLE agent_windows;
             CREATE TABLE batches_v4 (agent_id TEXT NOT NULL, sequence INTEGER NOT NULL,
                 received_unix_ms INTEGER NOT NULL, keep_until_unix_ms INTEGER NOT NULL,
                 PRIMARY KEY (agent_id, sequence)) WITHOUT ROWID;
             INSERT INTO batches_v4 SELECT agent_id, sequence, received_unix_ms, keep_until_unix_ms FROM batches;
             DROP TABLE batches;
             ALTER TABLE batches_v4 RENAME TO batches;
             CREATE INDEX batches_keep ON batches (keep_until_unix_ms);
             PRAGMA user_version = 1;",
        )
        .unwrap();
        assert!(!columns(&conn).contains(&"waits".to_string()));
    }

    collector.restart();
    let url = collector.http_url();
    let log = collector.stderr_text();
    assert!(log.contains("store schema upgraded"), "{log}");
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        assert_eq!(conn.query_row("PRAGMA user_version", [], |r| r.get::<_, i64>(0)).unwrap(), SCHEMA_VERSION);
        let columns = columns(&conn);
        assert_eq!(columns[columns.len() - 2..], ["waits", "estimated_count"]);
    }
    let top = top_json(&url, &[]);
    let d = row(&top, id);
    assert_eq!((d["count"].as_u64(), d["errors"].as_u64()), (Some(2), Some(1)), "{d:#}");
    assert_eq!(d["digest_text"], "INSERT INTO t VALUES (?)");
    assert_eq!(d["waits"], serde_json::json!({}));
    assert_eq!(d["error_codes"], serde_json::json!({"1062": {"count": 1, "sample_message": ""}}));

    // Exactly-once records survived: the old batch is still a duplicate.
    let mut ingest = ingest_client(&plain(&url)).await;
    assert!(push(&mut ingest, old).await.unwrap().duplicate);
    let new = batch(
        "agent-v1",
        2,
        vec![window(
            INSTANCE,
            1,
            now,
            vec![waiting(
                "INSERT INTO t VALUES (?)",
                &[5000],
                vec![wait("row_lock", 4000, 4000, 1)],
                vec![error(1062, 1, "Duplicate entry '7' for key 'PRIMARY'")],
            )],
        )],
    );
    assert!(!push(&mut ingest, new).await.unwrap().duplicate);
    let d = top_json(&url, &[]);
    let d = row(&d, id);
    assert_eq!(d["count"], 3);
    assert_eq!(d["waits"], serde_json::json!({"row_lock": {"sum_ns": 4000, "max_ns": 4000, "statements": 1}}));
    assert_eq!(
        d["error_codes"],
        serde_json::json!({"1062": {"count": 2, "sample_message": "Duplicate entry '7' for key 'PRIMARY'"}})
    );
}

const FOR_UPDATE: &str = "SELECT * FROM t WHERE id = ? FOR UPDATE";

fn lock_wait(start: i64, connection_id: u64, blockers: Vec<Blocker>) -> LockWait {
    LockWait {
        start_unix_ms: start,
        duration_ns: 250_000_000,
        class: "row_lock".into(),
        connection_id,
        digest: id_of("UPDATE t SET a = ? WHERE id = ?"),
        digest_text: "UPDATE t SET a = ? WHERE id = ?".into(),
        sample: "UPDATE t SET a = 1 WHERE id = 1".into(),
        blocker_kind: "candidates".into(),
        blockers,
    }
}

fn blocker(connection_id: u64, transaction: bool, started: i64, statements: &[&str]) -> Blocker {
    Blocker {
        connection_id,
        transaction,
        started_unix_ms: started,
        statements: statements.iter().map(|s| s.to_string()).collect(),
    }
}

/// `sqlbee locks --format json ...`, parsed; panics with stderr on failure.
fn locks_json(url: &str, extra: &[&str]) -> Value {
    let mut args = vec!["locks", "--collector", url, "--format", "json"];
    args.extend_from_slice(extra);
    let out = sqlbee_query(&args);
    assert!(out.status.success(), "sqlbee locks failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("sqlbee locks printed no JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)))
}

fn connections(locks: &Value) -> Vec<u64> {
    locks.as_array().unwrap().iter().map(|l| l["connection_id"].as_u64().unwrap()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_waits_are_stored_and_listed_newest_first() {
    let collector = Collector::start(&[]);
    let url = collector.http_url();
    let mut ingest = ingest_client(&plain(&url)).await;
    let now = now_ms();
    let hour = 3_600_000;
    let mut w1 = window(INSTANCE, 1, now, vec![digest("SELECT ?", &[1000])]);
    w1.lock_waits = vec![
        lock_wait(now - 2 * hour, 21, vec![]),
        lock_wait(
            now - 60_000,
            22,
            vec![
                blocker(12, true, now - 90_000, &[FOR_UPDATE, "UPDATE t SET b = ?"]),
                blocker(u64::MAX, false, now - 70_000, &["ALTER TABLE t ADD c INT"]),
            ],
        ),
    ];
    let mut w2 = window("db2:3306", 2, now, vec![digest("SELECT ?", &[1000])]);
    w2.lock_waits = vec![lock_wait(now - 3000, 31, vec![blocker(40, true, now - 4000, &[FOR_UPDATE])])];
    w2.lock_waits[0].class = "metadata_lock".into();
    w2.lock_waits[0].blocker_kind = String::new();
    assert!(!push(&mut ingest, batch("agent-l1", 1, vec![w1.clone()])).await.unwrap().duplicate);
    assert!(!push(&mut ingest, batch("agent-l2", 1, vec![w2])).await.unwrap().duplicate);
    // A replay stores nothing twice.
    assert!(push(&mut ingest, batch("agent-l1", 1, vec![w1])).await.unwrap().duplicate);

    let all = locks_json(&url, &["--since", "all"]);
    assert_eq!(connections(&all), vec![31, 22, 21], "{all:#}");
    let l = &all[1];
    assert_eq!((l["instance"].as_str(), l["agent_id"].as_str()), (Some(INSTANCE), Some("agent-l1")));
    assert_eq!(l["start_unix_ms"], now - 60_000);
    assert_eq!((l["duration_ns"].as_u64(), l["class"].as_str()), (Some(250_000_000), Some("row_lock")));
    assert_eq!(l["digest"], format!("{:016x}", id_of("UPDATE t SET a = ? WHERE id = ?")));
    assert_eq!(l["digest_text"], "UPDATE t SET a = ? WHERE id = ?");
    assert_eq!(l["sample"], "UPDATE t SET a = 1 WHERE id = 1");
    assert_eq!(l["blocker_kind"], "candidates");
    assert_eq!(
        l["blockers"],
        serde_json::json!([
            {"connection_id": 12, "transaction": true, "started_unix_ms": now - 90_000, "statements": [FOR_UPDATE, "UPDATE t SET b = ?"]},
            {"connection_id": u64::MAX, "transaction": false, "started_unix_ms": now - 70_000, "statements": ["ALTER TABLE t ADD c INT"]},
        ])
    );
    assert_eq!(all[0]["class"], "metadata_lock");
    assert_eq!(all[2]["blockers"], serde_json::json!([]));

    // Filters: instance, since (default 1h), limit.
    assert_eq!(connections(&locks_json(&url, &["--since", "all", "--instance", INSTANCE])), vec![22, 21]);
    assert_eq!(connections(&locks_json(&url, &["--instance", "db2:3306"])), vec![31]);
    assert_eq!(connections(&locks_json(&url, &[])), vec![31, 22]);
    assert_eq!(connections(&locks_json(&url, &["--since", "30s"])), vec![31]);
    assert_eq!(connections(&locks_json(&url, &["--since", "all", "--limit", "1"])), vec![31]);
    assert!(locks_json(&url, &["--instance", "nope:1"]).as_array().unwrap().is_empty());

    // The Query service directly.
    let mut query = query_client(&plain(&url)).await;
    let answer = query.locks(LocksRequest::default()).await.unwrap().into_inner();
    assert_eq!(answer.waits.len(), 3);
    assert_eq!(answer.waits[1].wait.as_ref().unwrap().blockers[1].connection_id, u64::MAX);
    let err = query.locks(LocksRequest { limit: 10_001, ..Default::default() }).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("limit"), "{err:?}");

    // The table: a note that blockers are candidates, one line per wait.
    let out = sqlbee_query(&["locks", "--collector", &url, "--since", "all"]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{table}");
    assert!(table.lines().next().unwrap().contains("candidates"), "{table}");
    let line = table.lines().find(|l| l.contains(" 22 ")).unwrap_or_else(|| panic!("{table}"));
    assert!(line.contains("250.000") && line.contains("UPDATE t SET a = ? WHERE id = ?"), "{table}");
    assert!(line.contains("conn 12 txn since ") && line.contains(FOR_UPDATE), "{table}");
    assert!(line.contains(&format!("conn {} stmt since ", u64::MAX)), "{table}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_lock_waits_are_refused_and_not_stored() {
    let collector = Collector::start(&[]);
    let url = collector.http_url();
    let mut ingest = ingest_client(&plain(&url)).await;
    let now = now_ms();
    let good = || {
        let mut w = window(INSTANCE, 1, now, vec![digest("SELECT ?", &[1000])]);
        w.lock_waits = vec![lock_wait(now - 1000, 1, vec![blocker(2, true, now - 2000, &[FOR_UPDATE])])];
        batch("agent-lbad", 1, vec![w])
    };
    let expect_invalid = |result: Result<PushResponse, tonic::Status>, needles: &[&str]| {
        let err = result.expect_err("a malformed batch was accepted");
        assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
        for needle in needles {
            assert!(err.message().contains(needle), "{needle:?} not in {:?}", err.message());
        }
    };
    let at = "windows[0].lock_waits[0]";
    let mut b = good();
    b.windows[0].lock_waits[0].duration_ns = 0;
    expect_invalid(push(&mut ingest, b).await, &[&format!("{at}.duration_ns")]);
    let mut b = good();
    b.windows[0].lock_waits[0].class = String::new();
    expect_invalid(push(&mut ingest, b).await, &[&format!("{at}.class"), "empty"]);
    let mut b = good();
    b.windows[0].lock_waits[0].class = "c".repeat(33);
    expect_invalid(push(&mut ingest, b).await, &[&format!("{at}.class"), "at most 32"]);
    let mut b = good();
    b.windows[0].lock_waits[0].start_unix_ms = now - 40 * 86_400_000;
    expect_invalid(push(&mut ingest, b).await, &[&format!("{at}.start_unix_ms"), "clock"]);
    let mut b = good();
    b.windows[0].lock_waits[0].blocker_kind = "k".repeat(33);
    expect_invalid(push(&mut ingest, b).await, &[&format!("{at}.blocker_kind")]);
    let mut b = good();
    b.windows[0].lock_waits[0].blockers = vec![blocker(2, true, now, &[]); 33];
    expect_invalid(push(&mut ingest, b).await, &[&format!("{at}.blockers"), "at most 32"]);
    let mut b = good();
    b.windows[0].lock_waits[0].blockers[0].statements = vec![FOR_UPDATE.to_string(); 9];
    expect_invalid(push(&mut ingest, b).await, &[&format!("{at}.blockers[0].statements"), "at most 8"]);
    let mut b = good();
    b.windows[0].lock_waits[0].blockers[0].statements[0] = "x".repeat(64 * 1024 + 1);
    expect_invalid(push(&mut ingest, b).await, &[&format!("{at}.blockers[0].statements[0]")]);
    let mut b = good();
    b.windows[0].lock_waits[0].digest_text = "x".repeat(64 * 1024 + 1);
    expect_invalid(push(&mut ingest, b).await, &[&format!("{at}.digest_text")]);
    let mut b = good();
    b.windows[0].lock_waits = vec![lock_wait(now - 1000, 1, vec![]); 1001];
    expect_invalid(push(&mut ingest, b).await, &["windows[0].lock_waits", "at most 1000"]);

    // Nothing was stored, not even the sequence.
    assert!(locks_json(&url, &["--since", "all"]).as_array().unwrap().is_empty());
    assert!(top_json(&url, &[]).as_array().unwrap().is_empty());
    assert!(!push(&mut ingest, good()).await.unwrap().duplicate);
    assert_eq!(connections(&locks_json(&url, &["--since", "all"])), vec![1]);
    // A batch without lock waits (an older agent) is fine.
    let old = batch("agent-lbad", 2, vec![window(INSTANCE, 1, now, vec![digest("SELECT ?", &[1000])])]);
    assert!(!push(&mut ingest, old).await.unwrap().duplicate);
    assert_eq!(locks_json(&url, &["--since", "all"]).as_array().unwrap().len(), 1);
}

/// A store written by a version-2 collector (no lock_waits table) is
/// upgraded when a newer collector opens it, keeping its data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn version_2_store_is_upgraded_and_keeps_its_data() {
    if !sqlite_store("version_2_store_is_upgraded_and_keeps_its_data", "it rewrites the SQLite file") {
        return;
    }
    let mut collector = Collector::start(&[]);
    let url = collector.http_url();
    let mut ingest = ingest_client(&plain(&url)).await;
    let now = now_ms();
    let id = id_of("SELECT ?");
    let old = batch(
        "agent-v2",
        1,
        vec![window(
            INSTANCE,
            1,
            now - 10_000,
            vec![waiting("SELECT ?", &[1000, 2000], vec![wait("row_lock", 900, 900, 1)], vec![])],
        )],
    );
    assert!(!push(&mut ingest, old.clone()).await.unwrap().duplicate);
    drop(ingest);

    collector.kill9();
    let path = collector.dir.path().join("store.db");
    let tables = |conn: &rusqlite::Connection| -> Vec<String> {
        let mut stmt = conn.prepare("SELECT name FROM sqlite_master WHERE type = 'table'").unwrap();
        stmt.query_map([], |r| r.get(0)).unwrap().map(Result::unwrap).collect()
    };
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(
            "ALTER TABLE digest_windows DROP COLUMN estimated_count;
             DROP TABLE lock_waits; DROP TABLE instance_costs; DROP TABLE agent_windows;
             CREATE TABLE batches_v4 (agent_id TEXT NOT NULL, sequence INTEGER NOT NULL,
                 received_unix_ms INTEGER NOT NULL, keep_until_unix_ms INTEGER NOT NULL,
                 PRIMARY KEY (agent_id, sequence)) WITHOUT ROWID;
             INSERT INTO batches_v4 SELECT agent_id, sequence, received_unix_ms, keep_until_unix_ms FROM batches;
             DROP TABLE batches;
             ALTER TABLE batches_v4 RENAME TO batches;
             CREATE INDEX batches_keep ON batches (keep_until_unix_ms);
             PRAGMA user_version = 2;",
        )
        .unwrap();
        assert!(!tables(&conn).contains(&"lock_waits".to_string()));
    }

    collector.restart();
    let url = collector.http_url();
    let log = collector.stderr_text();
    assert!(log.contains("store schema upgraded"), "{log}");
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        assert_eq!(conn.query_row("PRAGMA user_version", [], |r| r.get::<_, i64>(0)).unwrap(), SCHEMA_VERSION);
        assert!(tables(&conn).contains(&"lock_waits".to_string()));
    }
    let top = top_json(&url, &[]);
    let d = row(&top, id);
    assert_eq!(d["count"], 2, "{d:#}");
    assert_eq!(d["waits"]["row_lock"]["sum_ns"], 900);
    assert!(locks_json(&url, &["--since", "all"]).as_array().unwrap().is_empty());

    let mut ingest = ingest_client(&plain(&url)).await;
    assert!(push(&mut ingest, old).await.unwrap().duplicate);
    let mut w = window(INSTANCE, 1, now, vec![digest("SELECT ?", &[3000])]);
    w.lock_waits = vec![lock_wait(now - 100, 8, vec![blocker(9, true, now - 500, &[FOR_UPDATE])])];
    assert!(!push(&mut ingest, batch("agent-v2", 2, vec![w])).await.unwrap().duplicate);
    let locks = locks_json(&url, &["--since", "all"]);
    assert_eq!(connections(&locks), vec![8]);
    assert_eq!(locks[0]["blockers"][0]["connection_id"], 9);
    assert_eq!(row(&top_json(&url, &[]), id)["count"], 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_prunes_lock_waits() {
    let collector = Collector::start(&["--retention".into(), "5s".into(), "--prune-interval".into(), "300ms".into()]);
    let url = collector.http_url();
    let mut ingest = ingest_client(&plain(&url)).await;
    let now = now_ms();
    // The window ends in the future (allowed skew), so it stays; its first
    // wait started just now and passes the retention within seconds.
    let mut w = window(INSTANCE, 1, now + 600_000, vec![digest("SELECT ?", &[1000])]);
    w.lock_waits = vec![lock_wait(now - 100, 1, vec![]), lock_wait(now + 590_000, 2, vec![])];
    // Past retention already: the window and its wait are not kept.
    let mut ancient = window(INSTANCE, 1, now - 86_400_000, vec![digest("SELECT ?", &[1000])]);
    ancient.lock_waits = vec![lock_wait(now - 86_400_000 - 1000, 3, vec![])];
    assert!(!push(&mut ingest, batch("agent-lr", 1, vec![w, ancient])).await.unwrap().duplicate);
    assert_eq!(connections(&locks_json(&url, &["--since", "all"])), vec![2, 1]);

    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let ids = connections(&locks_json(&url, &["--since", "all"]));
        assert!(ids.contains(&2), "the fresh wait was pruned: {ids:?}");
        if ids == vec![2] {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "nothing pruned: {ids:?}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// The agent's own histograms, encoded by the agent's wire code
/// (`ship::instance_window`) and merged by a real collector over two
/// windows, give back the percentiles the agent itself reports for the
/// same statements in one window: one histogram scheme on both sides.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_histograms_keep_their_percentiles_through_the_wire_and_the_merge() {
    use std::time::UNIX_EPOCH;

    use sqlbee_agent::aggregate::{DigestRow as AgentDigest, Summary, WindowReport};
    use sqlbee_vocabulary::histogram::Histogram as AgentHistogram;

    let collector = Collector::start(&[]);
    let url = collector.http_url();
    let mut ingest = ingest_client(&plain(&url)).await;
    let now = now_ms();
    // Durations from 1 us to about 4 s, spread over many buckets.
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut durations = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        1_000 + (x % 4_000_000) * ((x >> 40) % 1000 + 1)
    };
    let first: Vec<u64> = (0..700).map(|_| durations()).collect();
    let second: Vec<u64> = (0..1300).map(|_| durations()).collect();
    let report = |durations: &[u64], end_ms: i64| {
        let mut histogram = AgentHistogram::default();
        durations.iter().for_each(|&ns| histogram.record(ns));
        let digest = AgentDigest {
            digest: id_of("SELECT * FROM `t` WHERE `id` = ?"),
            digest_text: "SELECT * FROM `t` WHERE `id` = ?".into(),
            count: durations.len() as u64,
            errors: 0,
            error_codes: Default::default(),
            sum_ns: durations.iter().sum(),
            min_ns: *durations.iter().min().unwrap(),
            max_ns: *durations.iter().max().unwrap(),
            histogram,
            sample: String::new(),
            raw_sample: None,
            tables: None,
            tags: Default::default(),
            truncated: 0,
            waits: Default::default(),
            error_messages: Default::default(),
            schema: None,
            stats: Default::default(),
            accounts: Default::default(),
            clients: Default::default(),
            lineage: Default::default(),
        };
        let at = |ms: i64| UNIX_EPOCH + Duration::from_millis(ms as u64);
        WindowReport {
            instance: INSTANCE.into(),
            window_start: at(end_ms - 10_000),
            window_end: at(end_ms),
            digests: vec![digest],
            summary: Summary { pid: 100, statements: durations.len() as u64, ..Default::default() },
            lock_waits: vec![],
            long_statements: vec![],
            long_statements_dropped: 0,
            changes: vec![],
            changes_dropped: 0,
            replication: Default::default(),
        }
    };
    for (sequence, (durations, end)) in [(&first, now - 10_000), (&second, now)].into_iter().enumerate() {
        let wire = sqlbee_agent::ship::instance_window(&report(durations, end), None);
        let pushed = push(&mut ingest, batch("agent-wire", sequence as u64 + 1, vec![wire])).await.unwrap();
        assert!(!pushed.duplicate);
    }

    let all = [first, second].concat();
    let agent = sqlbee_agent::output::window_to_json(&report(&all, now));
    let agent = agent.iter().find(|l| l["type"] == "digest").expect("the agent's digest line");
    let merged = top_json(&url, &[]);
    let merged = row(&merged, id_of("SELECT * FROM `t` WHERE `id` = ?"));
    assert_eq!(merged["count"], all.len() as u64);
    for key in ["p50_ns", "p95_ns", "p99_ns", "min_ns", "max_ns"] {
        assert_eq!(merged[key], agent[key], "{key}: collector {merged:#} against agent {agent:#}");
    }
    collector.stop();
}

/// A batch the collector acknowledged is stored: killed with SIGKILL right
/// after its last answer and restarted, the collector has every batch
/// (the store commits, with `synchronous=FULL`, before it answers).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_batches_survive_a_kill_right_after_the_answer() {
    let mut collector = Collector::start(&[]);
    let url = collector.http_url();
    let mut ingest = ingest_client(&plain(&url)).await;
    let now = now_ms();
    for sequence in 1..=20u64 {
        let end = now - 20_000 + sequence as i64 * 500;
        let pushed = push(
            &mut ingest,
            batch("agent-kill", sequence, vec![window(INSTANCE, 100, end, vec![digest("SELECT ?", &[1000; 3])])]),
        )
        .await
        .unwrap();
        assert!(!pushed.duplicate);
    }
    collector.kill9();
    collector.restart();
    let top = top_json(&collector.http_url(), &[]);
    assert_eq!(row(&top, id_of("SELECT ?"))["count"], 60, "{top:#}");
    collector.stop();
}

/// Peak resident memory of a process (VmHWM), bytes.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .unwrap()
        .trim()
        .trim_end_matches(" kB")
        .trim()
        .parse()
        .unwrap();
    kib * 1024
}

/// Admission control: a gzip bomb (200 MiB of one byte, a few hundred KiB
/// on the wire) is INVALID_ARGUMENT without inflating past the 32 MiB
/// limit, 64 concurrent pushes of 8 MiB each are answered
/// INVALID_ARGUMENT or RESOURCE_EXHAUSTED while the collector's memory
/// stays under 256 MiB (at most 8 pushes are decoded at once), and another
/// agent's ordinary batch is stored all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bombs_and_floods_are_refused_with_bounded_memory_and_ingest_goes_on() {
    let collector = Collector::start(&[]);
    let url = collector.http_url();
    let client = ingest_client(&plain(&url)).await.send_compressed(CompressionEncoding::Gzip);
    let with_sample = |agent: &str, bytes: usize| {
        let mut b = batch(agent, 1, vec![window(INSTANCE, 1, now_ms(), vec![digest("SELECT ?", &[1000])])]);
        b.windows[0].digests[0].sample = "a".repeat(bytes);
        b
    };

    let err = push(&mut client.clone(), with_sample("agent-bomb", 200 << 20)).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("size limit"), "{err:?}");

    let large = with_sample("agent-flood", 8 << 20);
    let mut flood = tokio::task::JoinSet::new();
    for _ in 0..64 {
        // A connection each, so the bodies arrive side by side.
        let (url, batch) = (url.clone(), large.clone());
        flood.spawn(async move {
            // Not compressed: no client-side work to spread them out.
            let mut client = ingest_client(&plain(&url)).await;
            push(&mut client, batch).await
        });
    }
    let mut codes = std::collections::BTreeMap::new();
    while let Some(answer) = flood.join_next().await {
        let code = answer.unwrap().map(|_| Code::Ok).unwrap_or_else(|s| s.code());
        *codes.entry(format!("{code:?}")).or_insert(0) += 1;
    }
    assert!(codes.keys().all(|c| c == "InvalidArgument" || c == "ResourceExhausted"), "{codes:?}");
    let peak = peak_rss(collector.pid());
    assert!(peak < 256 << 20, "collector peak RSS {} MiB under the flood: {codes:?}", peak >> 20);

    // An ordinary agent gets through, retrying while the collector is busy.
    let mut ordinary = ingest_client(&plain(&url)).await;
    let ok = batch("agent-ordinary", 1, vec![window("ordinary:3306", 2, now_ms(), vec![digest("SELECT ?", &[1000])])]);
    let started = std::time::Instant::now();
    loop {
        match push(&mut ordinary, ok.clone()).await {
            Ok(answer) => break assert!(!answer.duplicate),
            Err(s) if s.code() == Code::ResourceExhausted && started.elapsed() < Duration::from_secs(30) => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(s) => panic!("an ordinary batch was refused: {s:?}"),
        }
    }
    assert_eq!(row(&top_json(&url, &[]), id_of("SELECT ?"))["count"], 1);
    eprintln!("flood answers {codes:?}, collector peak RSS {} MiB", peak >> 20);
}

/// A batch's bytes with `rows` empty digest rows added to its first window
/// (built as bytes: as structs they would not fit in the test's memory).
fn with_rows(mut b: sqlbee_proto::v1::Batch, rows: usize) -> Vec<u8> {
    let window = with_rows_in_window(b.windows.remove(0), rows);
    let mut bytes = b.encode_to_vec();
    prost::encoding::bytes::encode(4, &window, &mut bytes);
    bytes
}

fn with_rows_in_window(w: sqlbee_proto::v1::InstanceWindow, rows: usize) -> Vec<u8> {
    let mut bytes = w.encode_to_vec();
    for _ in 0..rows {
        // Field 4 (digests), length-delimited, empty.
        bytes.extend_from_slice(&[0x22, 0x00]);
    }
    bytes
}

/// Bytes sent as they are, for a request no well-formed client would make.
#[derive(Clone, Debug, Default, PartialEq)]
struct RawBytes(Vec<u8>);

impl prost::Message for RawBytes {
    fn encode_raw(&self, buf: &mut impl prost::bytes::BufMut) {
        buf.put_slice(&self.0);
    }
    fn merge_field(
        &mut self,
        _tag: u32,
        _wire_type: prost::encoding::WireType,
        _buf: &mut impl prost::bytes::Buf,
        _ctx: prost::encoding::DecodeContext,
    ) -> Result<(), prost::DecodeError> {
        unreachable!("only sent")
    }
    fn encoded_len(&self) -> usize {
        self.0.len()
    }
    fn clear(&mut self) {
        self.0.clear();
    }
}

async fn push_raw(url: &str, bytes: Vec<u8>) -> Result<PushResponse, tonic::Status> {
    let channel = tonic::transport::Endpoint::from_shared(url.to_string()).unwrap().connect().await.unwrap();
    let mut grpc = tonic::client::Grpc::new(channel).send_compressed(CompressionEncoding::Gzip);
    grpc.ready().await.unwrap();
    let path = tonic::codegen::http::uri::PathAndQuery::from_static("/sqlbee.v1.Ingest/Push");
    let codec = sqlbee_proto::codec::SliceCodec::<RawBytes, PushResponse>::default();
    grpc.unary(tonic::Request::new(RawBytes(bytes)), path, codec).await.map(|r| r.into_inner())
}

/// A count bomb: 16 million empty digest rows are 32 MB of protobuf and a
/// few tens of KB gzipped; decoded, they would be several GiB. The push is
/// refused before it is decoded, naming the field, with the collector's
/// peak memory at most 256 MiB over what it held before; so are rows spread
/// under each count limit but past the decoded-size bound. An ordinary
/// batch is stored after them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_count_bomb_is_refused_before_it_is_decoded() {
    let collector = Collector::start(&[]);
    let url = collector.http_url();
    let mut client = ingest_client(&plain(&url)).await.send_compressed(CompressionEncoding::Gzip);
    // Settle first: the idle peak includes the runtime and the store.
    push(&mut client, batch("agent-warm", 1, vec![window("warm:3306", 1, now_ms(), vec![digest("SELECT 1", &[1])])]))
        .await
        .unwrap();
    let idle = peak_rss(collector.pid());

    let bomb = with_rows(batch("agent-bomb", 1, vec![window(INSTANCE, 1, now_ms(), Vec::new())]), 16_000_000);
    assert!(bomb.len() < 32 << 20, "under the message size limit: {} bytes", bomb.len());
    let err = push_raw(&url, bomb).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("windows[0].digests"), "the field is named: {err:?}");

    // 40 windows of 50,000 empty rows each: every count within its limit,
    // but two million rows in one request.
    let mut wide = batch("agent-wide", 1, Vec::new()).encode_to_vec();
    for _ in 0..40 {
        let window = with_rows_in_window(window(INSTANCE, 1, now_ms(), Vec::new()), 50_000);
        prost::encoding::bytes::encode(4, &window, &mut wide);
    }
    let err = push_raw(&url, wide).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("MiB"), "the decoded-size bound: {err:?}");

    let grown = peak_rss(collector.pid()).saturating_sub(idle);
    assert!(grown < 256 << 20, "collector peak RSS grew by {} MiB", grown >> 20);
    let ok = batch("agent-ordinary", 1, vec![window("ordinary:3306", 2, now_ms(), vec![digest("SELECT ?", &[1000])])]);
    assert!(!push(&mut client, ok).await.unwrap().duplicate);
    assert_eq!(row(&top_json(&url, &[]), id_of("SELECT ?"))["count"], 1);
    eprintln!("count bomb refused; collector peak RSS grew by {} MiB", grown >> 20);
}

/// A push whose body trickles in from `from` (a loopback address of its
/// own): its headers and the first bytes of a large message, then a byte
/// every 2 s. Returns the gRPC status the collector ends it with.
async fn trickling_push(from: &str, url: &str) -> (tonic::Code, String) {
    trickling_push_with(from, url, None).await
}

/// `trickling_push`, sent with a bearer token.
async fn trickling_push_with(from: &str, url: &str, token: Option<&str>) -> (tonic::Code, String) {
    let to: std::net::SocketAddr = url.trim_start_matches("http://").parse().unwrap();
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(format!("{from}:0").parse().unwrap()).unwrap();
    let stream = socket.connect(to).await.unwrap();
    let (client, connection) = h2::client::handshake(stream).await.unwrap();
    tokio::spawn(connection);
    let mut client = client.ready().await.unwrap();
    let mut request = tonic::codegen::http::Request::post(format!("http://{to}/sqlbee.v1.Ingest/Push"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    let request = request.body(()).unwrap();
    let (response, mut body) = client.send_request(request, false).unwrap();
    // A gRPC frame header for a 1 MB message, then one byte of it.
    body.send_data(prost::bytes::Bytes::from_static(&[0, 0, 0x0f, 0x42, 0x40, 0x0a]), false).unwrap();
    let trickle = tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(2)).await;
            if body.send_data(prost::bytes::Bytes::from_static(&[0x00]), false).is_err() {
                break;
            }
        }
    });
    let response = tokio::time::timeout(Duration::from_secs(60), response).await.expect("an answer").unwrap();
    let status = |headers: &tonic::codegen::http::HeaderMap| {
        let code = headers.get("grpc-status").and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<i32>().ok());
        // grpc-message is percent-encoded.
        let message = headers.get("grpc-message").and_then(|v| v.to_str().ok()).unwrap_or("").replace("%20", " ");
        code.map(|c| (tonic::Code::from_i32(c), message))
    };
    let answer = match status(response.headers()) {
        Some(answer) => answer,
        None => {
            let mut body = response.into_body();
            while let Some(chunk) = body.data().await {
                let _ = chunk;
            }
            let trailers = body.trailers().await.unwrap().unwrap_or_default();
            status(&trailers).unwrap_or((tonic::Code::Unknown, "no grpc-status".into()))
        }
    };
    trickle.abort();
    answer
}

/// Slow senders hold nothing for long: eight pushes from one address whose
/// bodies trickle in take at most that address's share of the places (the
/// rest are RESOURCE_EXHAUSTED at once), another agent's push is stored
/// meanwhile, and each trickle is cut with UNAVAILABLE (which an agent
/// retries) once its body falls below the minimum rate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trickling_pushes_are_cut_and_other_agents_get_through() {
    let collector = Collector::start(&[]);
    let url = collector.http_url();
    let started = std::time::Instant::now();
    let trickles: Vec<_> = (0..8)
        .map(|_| {
            tokio::spawn({
                let url = url.clone();
                async move { trickling_push("127.0.0.2", &url).await }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut ordinary = ingest_client(&plain(&url)).await;
    let ok = batch("agent-ordinary", 1, vec![window("ordinary:3306", 2, now_ms(), vec![digest("SELECT ?", &[1000])])]);
    let pushed = std::time::Instant::now();
    assert!(!push(&mut ordinary, ok).await.expect("another agent's push is stored").duplicate);
    assert!(pushed.elapsed() < Duration::from_secs(2), "answered in {:?}", pushed.elapsed());
    let mut codes = std::collections::BTreeMap::new();
    for trickle in trickles {
        let (code, message) = trickle.await.unwrap();
        if code == Code::Unavailable {
            assert!(message.contains("too slowly"), "{message}");
        }
        *codes.entry(format!("{code:?}")).or_insert(0) += 1;
    }
    assert_eq!(codes.get("ResourceExhausted"), Some(&4), "beyond the address's share: {codes:?}");
    assert_eq!(codes.get("Unavailable"), Some(&4), "cut for their rate: {codes:?}");
    assert!(started.elapsed() < Duration::from_secs(30), "cut in {:?}", started.elapsed());
    assert_eq!(row(&top_json(&url, &[]), id_of("SELECT ?"))["count"], 1);
}

/// An agent's token speaks for its agent's own instances only: a window
/// for another agent's instance is refused until that agent has been
/// silent past the handover time, an instance pinned to a token (its
/// `instances=`) is refused to every other token, a digest id that is not
/// its text's hash is refused, and an error message one agent sends never
/// shows under another agent's instance. One token's pushes in flight are
/// bounded, and other tokens get through meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_speak_only_for_themselves() {
    let dir = TempDir::new("speaks");
    let tokens = dir.path().join("tokens");
    const A: &str = "agent-a-token-0123456789abcdef0123456789abcdef";
    const B: &str = "agent-b-token-0123456789abcdef0123456789abcdef";
    const P: &str = "pinned-token-0123456789abcdef0123456789abcdef";
    const R: &str = "reader-token-0123456789abcdef0123456789abcdef";
    std::fs::write(
        &tokens,
        format!(
            "ingest {A} agents=agent-a\ningest {B} agents=agent-b\ningest {P} agents=agent-p instances=db-p:3306\n\
             read {R}\n"
        ),
    )
    .unwrap();
    let reader = dir.path().join("reader");
    std::fs::write(&reader, R).unwrap();
    let collector = Collector::start(&[
        "--tokens".into(),
        tokens.display().to_string(),
        "--instance-handover".into(),
        "4s".into(),
        "--max-pushes-per-token".into(),
        "1".into(),
    ]);
    let url = collector.http_url();
    let options = |token: &str| ClientOptions { token: Some(token.into()), ..plain(&url) };
    let mut a = ingest_client(&options(A)).await;
    let mut b = ingest_client(&options(B)).await;
    let mut p = ingest_client(&options(P)).await;
    const INSERT: &str = "INSERT INTO t VALUES (?)";
    let failing = |instance: &str, message: &str| {
        window(instance, 1, now_ms(), vec![waiting(INSERT, &[1000], vec![], vec![error(1062, 1, message)])])
    };
    push(&mut b, batch("agent-b", 1, vec![failing("db-b:3306", "Duplicate entry '1' for key 'PRIMARY'")]))
        .await
        .unwrap();

    // agent-a's window for agent-b's instance.
    let forged = batch("agent-a", 3, vec![failing("db-b:3306", "planted")]);
    let err = push(&mut a, forged.clone()).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(err.message().contains("db-b:3306") && err.message().contains("agent-b"), "{err:?}");
    // An untraced report names an instance too.
    let mut untraced = batch("agent-a", 1, vec![]);
    untraced.agent_windows = vec![sqlbee_proto::v1::AgentWindow {
        window_start_unix_ms: now_ms() - 1000,
        window_end_unix_ms: now_ms(),
        untraced: vec![sqlbee_proto::v1::UntracedServer {
            instance: Some(sqlbee_proto::v1::ServerInstance { name: "db-b:3306".into(), ..Default::default() }),
            reason: "forged".into(),
            kind: "other".into(),
            since_unix_ms: now_ms() - 1000,
            ..Default::default()
        }],
        ..Default::default()
    }];
    assert_eq!(push(&mut a, untraced).await.unwrap_err().code(), Code::PermissionDenied);
    // A digest id under another text.
    let mut planted = batch("agent-a", 1, vec![window("db-a:3306", 1, now_ms(), vec![digest("SELECT ?", &[1000])])]);
    planted.windows[0].digests[0].digest = id_of(INSERT);
    let err = push(&mut a, planted).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("windows[0].digests[0].digest"), "{err:?}");
    // agent-a's own instance, with a newer message for the same digest and code.
    push(&mut a, batch("agent-a", 1, vec![failing("db-a:3306", "planted")])).await.unwrap();
    let token = reader.display().to_string();
    let message = |instance: &str| {
        let top = top_json(&url, &["--token-file", &token, "--instance", instance]);
        assert_eq!(top.as_array().unwrap().len(), 1, "{top:#}");
        top[0]["error_codes"]["1062"]["sample_message"].as_str().unwrap().to_string()
    };
    assert_eq!(message("db-b:3306"), "Duplicate entry '1' for key 'PRIMARY'");
    assert_eq!(message("db-a:3306"), "planted");
    assert_eq!(row(&top_json(&url, &["--token-file", &token, "--instance", "db-b:3306"]), id_of(INSERT))["count"], 1);

    // A pinned instance: refused to every other token, even reported first.
    let err = push(&mut a, batch("agent-a", 2, vec![failing("db-p:3306", "x")])).await.unwrap_err();
    assert!(err.code() == Code::PermissionDenied && err.message().contains("instances="), "{err:?}");
    let err = push(&mut p, batch("agent-p", 1, vec![failing("db-q:3306", "x")])).await.unwrap_err();
    assert!(err.code() == Code::PermissionDenied && err.message().contains("db-p:3306"), "{err:?}");
    push(&mut p, batch("agent-p", 1, vec![failing("db-p:3306", "x")])).await.unwrap();

    // One push per token in flight: a trickling push with agent-b's token
    // holds its place; agent-b's next push waits its turn, agent-a's does not.
    let trickle = tokio::spawn({
        let url = url.clone();
        async move { trickling_push_with("127.0.0.3", &url, Some(B)).await }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let err = push(&mut b, batch("agent-b", 2, vec![failing("db-b:3306", "x")])).await.unwrap_err();
    assert!(err.code() == Code::ResourceExhausted && err.message().contains("token"), "{err:?}");
    push(&mut a, batch("agent-a", 2, vec![failing("db-a:3306", "planted")])).await.unwrap();
    let (code, _) = trickle.await.unwrap();
    assert_eq!(code, Code::Unavailable, "the trickle is cut for its rate");

    // agent-b falls silent: past the handover time, agent-a's retry of the
    // refused batch is stored.
    tokio::time::sleep(Duration::from_secs(4)).await;
    push(&mut a, forged).await.expect("handed over after agent-b's silence");
    let err = push(&mut b, batch("agent-b", 3, vec![failing("db-b:3306", "x")])).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "now agent-a's: {err:?}");
}

/// An instance keeps its agent across a collector restart: the owners are
/// read back from the store, SQLite or ClickHouse.
async fn instance_owners_survive_a_restart(location: &str) {
    let mut collector = Collector::start_at(location, &[]);
    let window_of = |instance: &str| window(instance, 1, now_ms(), vec![digest("SELECT ?", &[1000])]);
    let mut ingest = ingest_client(&plain(&collector.http_url())).await;
    push(&mut ingest, batch("agent-b", 1, vec![window_of("db-b:3306")])).await.unwrap();
    collector.restart();
    let mut ingest = ingest_client(&plain(&collector.http_url())).await;
    let err = push(&mut ingest, batch("agent-a", 1, vec![window_of("db-b:3306")])).await.unwrap_err();
    assert!(err.code() == Code::PermissionDenied && err.message().contains("agent-b"), "{err:?}");
    push(&mut ingest, batch("agent-b", 2, vec![window_of("db-b:3306")])).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instance_owners_survive_a_restart_on_sqlite() {
    let dir = TempDir::new("owners");
    instance_owners_survive_a_restart(&format!("sqlite:{}", dir.path().join("fleet.db").display())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instance_owners_survive_a_restart_on_clickhouse() {
    let Some(server) = xtask::clickhouse::for_test("instance_owners_survive_a_restart_on_clickhouse") else { return };
    instance_owners_survive_a_restart(&server.location(&server.fresh_database("owners"))).await;
}

/// One agent's flood fills its own quota, not the store: past its rows
/// per hour its batches are refused RESOURCE_EXHAUSTED (which it retries),
/// another agent's are stored meanwhile, the store holds only what the
/// quota let through, and the refusals are counted in `sqlbee top` and on
/// the agent-cost page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_fills_its_agents_quota_not_the_store() {
    let collector = Collector::start(&["--agent-quota-rows".into(), "1000".into()]);
    let url = collector.http_url();
    let mut ingest = ingest_client(&plain(&url)).await;
    // 1 window, 299 digest rows and the window's command counts a batch.
    let flood = |sequence: u64| {
        let digests = (0..299).map(|i| digest(&format!("SELECT c{i} FROM flood{sequence}"), &[1000])).collect();
        batch("agent-flood", sequence, vec![window("flood:3306", 1, now_ms() - 1000, digests)])
    };
    let rows = 1 + 299 + flood(1).windows[0].commands.len() as u64;
    assert!(3 * rows <= 1000 && 4 * rows > 1000);
    let mut refused = 0;
    for sequence in 1..=10 {
        match push(&mut ingest, flood(sequence)).await {
            Ok(answer) => assert!(!answer.duplicate),
            Err(status) => {
                assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
                assert!(status.message().contains("quota of 1000 rows"), "{status:?}");
                refused += 1;
            }
        }
    }
    assert_eq!(refused, 7, "three batches fit in 1000 rows");
    let other = batch("agent-quiet", 1, vec![window("quiet:3306", 1, now_ms(), vec![digest("SELECT ?", &[1000])])]);
    push(&mut ingest, other).await.expect("another agent has its own quota");

    let answer = top_answer(&url, &["--instance", "flood:3306", "--limit", "10000"]);
    assert_eq!(answer["digests"].as_array().unwrap().len(), 3 * 299, "only what the quota let through is stored");
    let quotas = answer["quotas"].as_array().unwrap();
    assert_eq!(quotas.len(), 1, "the quiet agent is far from its quota: {quotas:#?}");
    let q = &quotas[0];
    assert_eq!((q["agent_id"].as_str(), q["refused_batches"].as_u64()), (Some("agent-flood"), Some(7)));
    assert_eq!((q["refused_rows"].as_u64(), q["stored_rows"].as_u64()), (Some(7 * rows), Some(3 * rows)));

    let port: u16 = collector.ui.trim_end_matches('/').rsplit(':').next().unwrap().parse().unwrap();
    let page = common::http_get(port, "/cost");
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    let expected = format!("data-agent=\"agent-flood\" data-refused-batches=\"7\" data-refused-rows=\"{}\"", 7 * rows);
    assert!(page.contains(&expected), "the cost page shows the refusals: {page}");
}

/// Reads given up by their clients stop, and ingest never waits behind
/// them: twenty large Top calls over 10,000 digests, in waves, each
/// abandoned after 1 s, then a push is answered within a second, and reads
/// answer again afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoned_reads_do_not_stall_ingest() {
    let collector = Collector::start(&[]);
    let url = collector.http_url();
    let mut ingest = ingest_client(&plain(&url)).await.send_compressed(CompressionEncoding::Gzip);
    let text = "SELECT ".to_string() + &"c, ".repeat(200) + "1 FROM t WHERE id = ?";
    for sequence in 1..=20u64 {
        let digests = (0..2_000u64).map(|i| digest(&format!("{text} -- {sequence} {i}"), &[1000, 2000])).collect();
        let b = batch("agent-many", sequence, vec![window(INSTANCE, 1, now_ms() - 1000 * sequence as i64, digests)]);
        push(&mut ingest, b).await.unwrap();
    }
    // Five waves of four readers, from four addresses (each address may
    // hold two query places), each giving up after 1 s.
    for _wave in 0..5 {
        let mut abandoned = tokio::task::JoinSet::new();
        for reader in 0..4u8 {
            let url = url.clone();
            abandoned.spawn(async move {
                let channel = tonic::transport::Endpoint::from_shared(url)
                    .unwrap()
                    .local_address(Some(std::net::IpAddr::from([127, 0, 0, 10 + reader])))
                    .connect()
                    .await
                    .unwrap();
                let mut query = sqlbee_proto::v1::query_client::QueryClient::new(channel);
                let request = TopRequest { limit: 10_000, ..Default::default() };
                let _ = tokio::time::timeout(Duration::from_secs(1), query.top(request)).await;
            });
        }
        while abandoned.join_next().await.is_some() {}
    }
    let ok = batch("agent-ordinary", 1, vec![window("ordinary:3306", 2, now_ms(), vec![digest("SELECT ?", &[1000])])]);
    let pushed = std::time::Instant::now();
    assert!(!push(&mut ingest, ok).await.unwrap().duplicate);
    assert!(pushed.elapsed() < Duration::from_secs(1), "a push waited {:?} behind abandoned reads", pushed.elapsed());
    let started = std::time::Instant::now();
    loop {
        match query_client(&plain(&url)).await.top(TopRequest { limit: 5, ..Default::default() }).await {
            Ok(top) => break assert_eq!(top.into_inner().digests.len(), 5),
            Err(s) if s.code() == Code::ResourceExhausted && started.elapsed() < Duration::from_secs(60) => {
                tokio::time::sleep(Duration::from_millis(200)).await
            }
            Err(s) => panic!("reads answer again: {s:?}"),
        }
    }
}

/// The exactly-once key is (agent_id, epoch, sequence): a state directory
/// whose counter started again (new epoch) stores its batches, an identical
/// replay is a duplicate, and the same key with other content (a restored
/// backup, a cloned VM, two agents on one directory) is ALREADY_EXISTS,
/// reported and not stored, never taken for a duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn epochs_keep_new_data_and_a_changed_replay_is_an_error() {
    let collector = Collector::start(&[]);
    let url = collector.http_url();
    let mut ingest = ingest_client(&plain(&url)).await;
    let now = now_ms();
    let with = |epoch: u64, durations: &[u64], end: i64| {
        let mut b = batch("agent-epoch", 1, vec![window(INSTANCE, 3, end, vec![digest("SELECT ?", durations)])]);
        b.epoch = epoch;
        b
    };
    let first = with(11, &[1000], now - 5000);
    assert!(!push(&mut ingest, first.clone()).await.unwrap().duplicate);
    assert!(push(&mut ingest, first).await.unwrap().duplicate, "an identical replay is a duplicate");
    // The counter was lost: sequence 1 again, in a new epoch.
    assert!(!push(&mut ingest, with(12, &[1000, 1000], now - 4000)).await.unwrap().duplicate);
    // A restored copy of the first incarnation sends other windows as 1.
    let err = push(&mut ingest, with(11, &[7000, 7000, 7000], now - 3000)).await.unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists, "{err:?}");
    assert!(err.message().contains("other content"), "{err:?}");
    assert_eq!(
        row(&top_json(&url, &[]), id_of("SELECT ?"))["count"],
        3,
        "epoch 11 once, epoch 12 once, the conflict never"
    );
    assert!(collector.stderr_text().contains("other content"), "the collector reports it too");
}

/// A batch carries the hash of its content, taken by the agent that made
/// it; for the batches of agents from before that field the collector
/// takes it itself, with the same function. So a replay matches whichever
/// of the two stored the batch, and other content under a stored key is a
/// conflict either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_carries_its_content_hash_and_older_agents_still_match() {
    let collector = Collector::start(&[]);
    let url = collector.http_url();
    let mut ingest = ingest_client(&plain(&url)).await;
    let now = now_ms();
    let make = |sequence: u64, durations: &[u64]| {
        batch("agent-hash", sequence, vec![window(INSTANCE, 3, now - 5000, vec![digest("SELECT ?", durations)])])
    };
    let hashed = |mut b: sqlbee_proto::v1::Batch| {
        b.content_hash = sqlbee_proto::content_hash(&b);
        b
    };
    // Stored with the agent's hash; the same batch without one matches it.
    assert!(!push(&mut ingest, hashed(make(1, &[1000]))).await.unwrap().duplicate);
    assert!(push(&mut ingest, make(1, &[1000])).await.unwrap().duplicate);
    // Stored without a hash; the same batch with one matches it.
    assert!(!push(&mut ingest, make(2, &[1000, 1000])).await.unwrap().duplicate);
    assert!(push(&mut ingest, hashed(make(2, &[1000, 1000]))).await.unwrap().duplicate);
    for other in [hashed(make(1, &[9000])), make(1, &[9000]), hashed(make(2, &[9000])), make(2, &[9000])] {
        let err = push(&mut ingest, other).await.unwrap_err();
        assert_eq!(err.code(), Code::AlreadyExists, "{err:?}");
    }
    assert_eq!(row(&top_json(&url, &[]), id_of("SELECT ?"))["count"], 3, "batch 1 once, batch 2 once, no conflict");
}

/// The store's filesystem fills up: the collector answers
/// RESOURCE_EXHAUSTED (which the agent retries), never INTERNAL or
/// INVALID_ARGUMENT; every batch it acknowledged is still there after a
/// kill and a restart; and once space returns the refused batches are
/// stored. Needs root to mount a small tmpfs.
#[tokio::test(flavor = "multi_thread")]
async fn a_full_store_disk_refuses_for_now_and_keeps_what_it_acknowledged() {
    if !sqlite_store(
        "a_full_store_disk_refuses_for_now_and_keeps_what_it_acknowledged",
        "it fills the filesystem under the SQLite file",
    ) {
        return;
    }
    if !common::privileged("a_full_store_disk_refuses_for_now_and_keeps_what_it_acknowledged") {
        return;
    }
    let dir = TempDir::new("store-enospc");
    let disk = common::Tmpfs::mount(&dir.path().join("fs"), "3m");
    let mut collector = Collector::start_on_store(&disk.path.join("store.db"), &[]);
    let mut ingest = ingest_client(&plain(&collector.http_url())).await;
    let now = now_ms();
    let texts: Vec<String> = (0..40).map(|i| format!("SELECT c{i} FROM t{i} WHERE id = ?")).collect();
    let make = |sequence: u64| {
        let digests = texts.iter().map(|t| digest(t, &[1000; 2])).collect();
        batch("agent-full", sequence, vec![window(INSTANCE, 100, now - 100_000 + sequence as i64 * 100, digests)])
    };
    let mut acknowledged = Vec::new();
    for sequence in 1..=5 {
        push(&mut ingest, make(sequence)).await.unwrap();
        acknowledged.push(sequence);
    }
    let filler = disk.fill(0);
    let mut refused = Vec::new();
    for sequence in 6..=200 {
        match push(&mut ingest, make(sequence)).await {
            Ok(_) => acknowledged.push(sequence),
            Err(status) => {
                assert!(
                    matches!(status.code(), Code::ResourceExhausted | Code::Unavailable),
                    "a full disk is retryable, not {:?}: {}",
                    status.code(),
                    status.message()
                );
                refused.push(sequence);
                if refused.len() >= 5 {
                    break;
                }
            }
        }
    }
    assert!(!refused.is_empty(), "the store never ran out of space");
    collector.kill9();
    std::fs::remove_file(&filler).unwrap();
    collector.restart();
    let mut ingest = ingest_client(&plain(&collector.http_url())).await;
    let count = |top: &Value| -> u64 { texts.iter().map(|t| row(top, id_of(t))["count"].as_u64().unwrap()).sum() };
    let top = top_json(&collector.http_url(), &["--limit", "100"]);
    assert_eq!(
        count(&top),
        acknowledged.len() as u64 * 80,
        "every acknowledged batch survives the full disk and a kill"
    );
    for sequence in refused.iter().copied() {
        let ack = push(&mut ingest, make(sequence)).await.unwrap();
        assert!(!ack.duplicate, "a refused batch was not stored");
    }
    let top = top_json(&collector.http_url(), &["--limit", "100"]);
    assert_eq!(count(&top), (acknowledged.len() + refused.len()) as u64 * 80);
    collector.stop();
}

/// An agent whose clock runs an hour and a half ahead: its batch is stored,
/// not refused, with its times moved back, the answer says by how much,
/// and the stored agent window carries the correction.
#[tokio::test]
async fn a_clock_ahead_is_corrected_not_refused() {
    let collector = Collector::start(&[]);
    let url = collector.http_url();
    let mut ingest = ingest_client(&plain(&url)).await;
    let ahead = 90 * 60_000;
    let now = now_ms();
    let mut b = batch("agent-ahead", 1, vec![window(INSTANCE, 100, now + ahead, vec![digest("SELECT ?", &[1000; 4])])]);
    b.created_unix_ms = now + ahead;
    b.agent_windows = vec![sqlbee_proto::v1::AgentWindow {
        window_start_unix_ms: now + ahead - 10_000,
        window_end_unix_ms: now + ahead,
        cost: Some(Default::default()),
        ..Default::default()
    }];
    let ack = push(&mut ingest, b).await.unwrap();
    assert!((ack.clock_correction_ms - ahead).abs() < 5_000, "{ack:?}");
    assert!((ack.collector_unix_ms - now).abs() < 5_000, "{ack:?}");
    // Stored where "the last minute" finds it.
    let out = sqlbee_query(&["top", "--collector", &url, "--format", "json", "--since", "1m"]);
    let top: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(row(&top["digests"], id_of("SELECT ?"))["count"], 4, "{top:#}");
    let hosts = sqlbee_query(&["hosts", "--collector", &url, "--format", "json"]);
    let hosts: Value = serde_json::from_slice(&hosts.stdout).unwrap();
    let corrected = hosts[0]["ship"]["clock_correction_ms"].as_i64().unwrap();
    assert!((corrected - ahead).abs() < 5_000, "{hosts:#}");
    assert!(hosts[0]["window_end_unix_ms"].as_i64().unwrap() <= now_ms(), "{hosts:#}");
    collector.stop();
}
