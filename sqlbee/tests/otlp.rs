//! The OTLP export (`sqlbee collector --otlp-endpoint`) against a real
//! OpenTelemetry Collector (upstream's OTLP receiver and file exporter,
//! built by `./x setup` from the Go module proxy): batches pushed over
//! gRPC as agents push them, and what the receiver wrote compared step by
//! step with `sqlbee top` over the same range and with the latencies that
//! were pushed, bucket by bucket; the changes and long statements pushed
//! arrive as log records, each once, as `sqlbee events` and `sqlbee long`
//! list them. The receiver is stopped and started again mid-run, and the
//! collector is killed and started again: every step arrives once, none
//! missing, none twice.
mod common;

use std::{
    collections::{BTreeMap, BTreeSet},
    time::{Duration, Instant},
};

use serde_json::Value;
use sqlbee_figures::histogram::{bucket_high, bucket_of};
use sqlbee_proto::v1::{Change, LongStatement};
use xtask::otelcol::OtelCollector;

use common::collector::*;

const STEP_MS: i64 = 2_000;
const ALTER: &str = "ALTER TABLE `shop`.`orders` ADD INDEX `ix` (`v`)";
const INSTANCES: [&str; 2] = ["otlp-a:3306", "otlp-b:3306"];
/// Each push's digests, busiest first by total time, and their latencies:
/// with `--otlp-max-digests 2` the last one is exported as `other`.
const DIGESTS: [(&str, &[u64]); 3] = [
    ("SELECT `v` FROM `shop`.`orders` WHERE `id` = ?", &[3_000_000, 2_500_000, 4_100_000, 3_000_000, 2_900_000]),
    ("UPDATE `shop`.`stock` SET `n` = `n` - ? WHERE `sku` = ?", &[900_000, 1_200_000, 800_000]),
    ("SELECT ?", &[20_000, 35_000]),
];

/// One digest's exported point, or what it should be.
#[derive(Clone, Debug, Default, PartialEq)]
struct Point {
    count: u64,
    errors: u64,
    sum_ns: u64,
    /// Latency bucket upper bound (ns) to count, from the OTLP bounds.
    buckets: BTreeMap<u64, u64>,
}

/// (instance, step start ms, `sqlbee.digest`) -> point, as received.
type Received = BTreeMap<(String, i64, String), Point>;

fn attribute<'a>(attributes: &'a Value, key: &str) -> Option<&'a str> {
    attributes.as_array()?.iter().find(|kv| kv["key"] == key)?["value"]["stringValue"].as_str()
}

fn number(value: &Value) -> u64 {
    match value {
        Value::String(s) => s.parse().unwrap(),
        other => other.as_u64().unwrap_or_else(|| panic!("not a count: {other}")),
    }
}

/// Every point the receiver wrote, failing on one written twice.
fn received(otel: &OtelCollector) -> Received {
    let mut out = Received::new();
    let mut seen = BTreeSet::new();
    for request in otel.received().unwrap() {
        for resource in request["resourceMetrics"].as_array().into_iter().flatten() {
            let instance = attribute(&resource["resource"]["attributes"], "sqlbee.instance").unwrap().to_string();
            assert_eq!(attribute(&resource["resource"]["attributes"], "service.name"), Some("sqlbee"));
            for metric in
                resource["scopeMetrics"].as_array().into_iter().flatten().flat_map(|s| s["metrics"].as_array().unwrap())
            {
                let name = metric["name"].as_str().unwrap();
                let (points, kind) = if metric["histogram"].is_object() {
                    (&metric["histogram"]["dataPoints"], "histogram")
                } else {
                    (&metric["sum"]["dataPoints"], "sum")
                };
                for p in points.as_array().into_iter().flatten() {
                    let start = number(&p["startTimeUnixNano"]) / 1_000_000;
                    let end = number(&p["timeUnixNano"]) / 1_000_000;
                    assert_eq!(end - start, STEP_MS as u64, "a point covers one step: {p}");
                    let digest = attribute(&p["attributes"], "sqlbee.digest").unwrap().to_string();
                    assert!(
                        seen.insert((instance.clone(), start, digest.clone(), name.to_string())),
                        "{name} of {instance} {digest} at {start} arrived twice"
                    );
                    let entry = out.entry((instance.clone(), start as i64, digest)).or_default();
                    match (name, kind) {
                        ("db.client.operation.duration", "histogram") => {
                            assert_eq!(metric["unit"], "s");
                            assert_eq!(metric["histogram"]["aggregationTemporality"], 1, "delta");
                            let bounds: Vec<f64> =
                                p["explicitBounds"].as_array().unwrap().iter().map(|b| b.as_f64().unwrap()).collect();
                            let counts: Vec<u64> = p["bucketCounts"].as_array().unwrap().iter().map(number).collect();
                            assert_eq!(counts.len(), bounds.len() + 1);
                            assert_eq!(counts.iter().sum::<u64>(), number(&p["count"]));
                            entry.sum_ns = (p["sum"].as_f64().unwrap() * 1e9).round() as u64;
                            for (i, &n) in counts.iter().enumerate().filter(|(_, n)| **n > 0) {
                                // The last OTLP bucket is sqlbee's highest one:
                                // the bound just below it closes the one before.
                                let high = match bounds.get(i) {
                                    Some(b) => (b * 1e9).round() as u64,
                                    None => u64::MAX,
                                };
                                entry.buckets.insert(high, n);
                            }
                        }
                        ("sqlbee.statement.count", "sum") => entry.count = number(&p["asInt"]),
                        ("sqlbee.statement.errors", "sum") => entry.errors = number(&p["asInt"]),
                        _ => {}
                    }
                }
            }
        }
    }
    out
}

/// The points the pushed windows make of one instance's step: each
/// digest's own, the third one's as `other`.
fn expected(pushes: &[(String, i64)], instance: &str, start: i64) -> BTreeMap<String, Point> {
    let mut out: BTreeMap<String, Point> = BTreeMap::new();
    for (_, end) in pushes.iter().filter(|(i, end)| i == instance && (start..start + STEP_MS).contains(end)) {
        let _ = end;
        for (rank, (text, latencies)) in DIGESTS.iter().enumerate() {
            let key = if rank < 2 { format!("{:016x}", id_of(text)) } else { "other".to_string() };
            let p = out.entry(key).or_default();
            p.count += latencies.len() as u64;
            p.sum_ns += latencies.iter().sum::<u64>();
            for &ns in latencies.iter() {
                *p.buckets.entry(bucket_high(bucket_of(ns))).or_default() += 1;
            }
        }
    }
    // The highest bucket of a point is OTLP's open one.
    for p in out.values_mut() {
        if let Some((&high, &n)) = p.buckets.last_key_value() {
            p.buckets.remove(&high);
            p.buckets.insert(u64::MAX, n);
        }
    }
    out
}

/// `sqlbee top` over one instance's step: (digest id, count, sum) busiest first.
fn top_of(collector: &Collector, instance: &str, start: i64) -> Vec<(String, u64, u64)> {
    let (since, until) = (start.to_string(), (start + STEP_MS).to_string());
    let digests = top_json(&collector.http_url(), &["--instance", instance, "--since", &since, "--until", &until]);
    digests
        .as_array()
        .unwrap()
        .iter()
        .map(|d| (d["digest"].as_str().unwrap().to_string(), number(&d["count"]), number(&d["sum_ns"])))
        .collect()
}

struct Run {
    pushes: Vec<(String, i64)>,
    sequence: u64,
    /// Connection ids of the changes and long statements pushed (every
    /// fourth push brings one of each, to the first instance).
    changes: Vec<u64>,
    long: Vec<u64>,
}

impl Run {
    /// Pushes one window of each instance ending now, every 250 ms, for
    /// `for_how_long`, retrying what the collector does not take (it may be
    /// starting again), as an agent does.
    async fn push_for(&mut self, collector: &Collector, for_how_long: Duration) {
        let until = Instant::now() + for_how_long;
        let mut ingest = ingest_client(&plain(&collector.http_url())).await;
        while Instant::now() < until {
            let end = now_ms();
            let windows: Vec<_> = INSTANCES
                .iter()
                .map(|instance| {
                    let digests = DIGESTS.iter().map(|(text, latencies)| digest(text, latencies)).collect();
                    let mut w = window(instance, 4242, end, digests);
                    w.window_start_unix_ms = end - 250;
                    if let Some(server) = w.instance.as_mut() {
                        server.start_time_unix_ms = 1_700_000_000_000;
                        server.server_version = "11.8.3-MariaDB".into();
                    }
                    w
                })
                .collect::<Vec<_>>();
            let mut windows = windows;
            if self.sequence % 4 == 0 {
                let n = self.sequence;
                // A change and a long statement that end just before the
                // window does, as an agent reports them.
                windows[0].changes = vec![Change {
                    kind: "schema".into(),
                    action: "ALTER TABLE".into(),
                    objects: vec!["shop.orders".into(), format!("index ix_{n}")],
                    connection_id: 500 + n,
                    digest: id_of(ALTER),
                    digest_text: ALTER.into(),
                    user: "deploy".into(),
                    host: "10.0.0.9".into(),
                    start_unix_ms: end - 60,
                    duration_ns: 20_000_000,
                    ..Default::default()
                }];
                windows[0].long_statements = vec![LongStatement {
                    connection_id: 900 + n,
                    digest: id_of(DIGESTS[0].0),
                    digest_text: DIGESTS[0].0.into(),
                    schema: "shop".into(),
                    user: "app".into(),
                    host: "10.0.0.7".into(),
                    start_unix_ms: end - 1_540,
                    duration_ns: 1_500_000_000,
                    outcome: if n % 8 == 0 { "killed" } else { "long" }.into(),
                    ..Default::default()
                }];
                self.changes.push(500 + n);
                self.long.push(900 + n);
            }
            self.sequence += 1;
            let batch = batch("otlp-agent", self.sequence, windows);
            push(&mut ingest, batch.clone()).await.expect("the batch is stored");
            if self.sequence % 5 == 0 {
                // An agent that lost the answer sends the batch again: the
                // store keeps it once, and the export counts it once.
                let again = push(&mut ingest, batch).await.expect("the batch is answered again");
                assert!(again.duplicate, "a batch sent twice is a duplicate");
            }
            self.pushes.extend(INSTANCES.iter().map(|i| (i.to_string(), end)));
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

/// Every log record the receiver wrote: (event name, instance,
/// attributes as key -> string value).
fn received_logs(otel: &OtelCollector) -> Vec<(String, String, BTreeMap<String, String>)> {
    let mut out = Vec::new();
    for request in otel.received().unwrap() {
        for resource in request["resourceLogs"].as_array().into_iter().flatten() {
            let instance = attribute(&resource["resource"]["attributes"], "sqlbee.instance").unwrap().to_string();
            for record in
                resource["scopeLogs"].as_array().into_iter().flatten().flat_map(|s| s["logRecords"].as_array().unwrap())
            {
                let attributes = record["attributes"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|kv| {
                        let v = &kv["value"];
                        let text = v["stringValue"].as_str().map(str::to_string).unwrap_or_else(|| {
                            v.get("intValue")
                                .or(v.get("doubleValue"))
                                .map(|x| x.to_string().trim_matches('"').to_string())
                                .unwrap_or_default()
                        });
                        (kv["key"].as_str().unwrap().to_string(), text)
                    })
                    .collect();
                out.push((record["eventName"].as_str().unwrap_or("").to_string(), instance.clone(), attributes));
            }
        }
    }
    out
}

/// The changes and long statements pushed arrived as log records, each
/// once, with the ids `sqlbee events` and `sqlbee long` give them.
fn check_logs(collector: &Collector, otel: &OtelCollector, run: &Run) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let logs = loop {
        let logs = received_logs(otel);
        if logs.len() >= run.changes.len() + run.long.len() || Instant::now() > deadline {
            break logs;
        }
        std::thread::sleep(Duration::from_millis(300));
    };
    let url = collector.http_url();
    let events: Value = {
        let out =
            sqlbee_query(&["events", "--collector", &url, "--kind", "change", "--since", "all", "--format", "json"]);
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let stored_changes: BTreeSet<String> =
        events["events"].as_array().unwrap().iter().map(|e| e["id"].as_str().unwrap().to_string()).collect();
    assert_eq!(stored_changes.len(), run.changes.len(), "sqlbee events lists every change pushed: {events}");
    let exported: Vec<String> = logs
        .iter()
        .filter(|(name, _, a)| {
            name == "sqlbee.event" && a.get("sqlbee.event.kind").map(String::as_str) == Some("change")
        })
        .map(|(_, instance, a)| {
            assert_eq!(instance, INSTANCES[0]);
            assert_eq!(a["sqlbee.change.action"], "ALTER TABLE");
            assert_eq!(a["sqlbee.account"], "deploy@10.0.0.9");
            a["sqlbee.event.id"].clone()
        })
        .collect();
    assert_eq!(exported.iter().cloned().collect::<BTreeSet<_>>(), stored_changes, "each change as a log record");
    assert_eq!(exported.len(), stored_changes.len(), "no change twice");
    let long: Vec<u64> = logs
        .iter()
        .filter(|(name, _, _)| name == "sqlbee.long_statement")
        .map(|(_, _, a)| {
            assert_eq!(a["sqlbee.statement.duration_s"], "1.5");
            assert!(!a.contains_key("db.query.text"), "no text without --otlp-query-text");
            a["sqlbee.connection.id"].parse().unwrap()
        })
        .collect();
    let mut sorted = long.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, run.long, "each long statement once");
    let listed = sqlbee_query(&["long", "--collector", &url, "--since", "all", "--format", "json"]);
    let listed: Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(listed["statements"].as_array().map(Vec::len), Some(run.long.len()), "{listed}");
}

/// Waits until the receiver holds every step up to the last push's.
fn wait_for_last_step(otel: &OtelCollector, pushes: &[(String, i64)]) -> Received {
    let last = pushes.iter().map(|(_, end)| *end).max().unwrap();
    let last_step = last.div_euclid(STEP_MS) * STEP_MS;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let got = received(otel);
        if INSTANCES.iter().all(|i| got.keys().any(|(inst, start, _)| inst == i && *start == last_step)) {
            return got;
        }
        assert!(Instant::now() < deadline, "the step of the last push ({last_step}) never arrived");
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// Every step from the first exported to the last, of each instance:
/// exported exactly when `sqlbee top` has statements in it, and then
/// equal to it and to what was pushed.
fn check_every_step(collector: &Collector, got: &Received, pushes: &[(String, i64)]) -> usize {
    let mut checked = 0;
    for instance in INSTANCES {
        let steps: BTreeSet<i64> = got.keys().filter(|(i, _, _)| i == instance).map(|(_, s, _)| *s).collect();
        let (first, last) = (*steps.first().unwrap(), *steps.last().unwrap());
        // The export began before the first push, so its step is there:
        // nothing written before a restart went missing.
        let first_push = pushes.iter().filter(|(i, _)| i == instance).map(|(_, end)| *end).min().unwrap();
        assert!(first <= first_push.div_euclid(STEP_MS) * STEP_MS, "{instance}: the first push's step is missing");
        let mut start = first;
        while start <= last {
            let exported: BTreeMap<String, Point> = got
                .iter()
                .filter(|((i, s, _), _)| i == instance && *s == start)
                .map(|((_, _, d), p)| (d.clone(), p.clone()))
                .collect();
            let top = top_of(collector, instance, start);
            assert_eq!(
                exported.is_empty(),
                top.is_empty(),
                "{instance} step {start}: exported {exported:?}, top {top:?}"
            );
            if !top.is_empty() {
                // The two busiest as top says, and the rest together.
                for (rank, (digest, count, sum_ns)) in top.iter().enumerate().take(2) {
                    let p = &exported[digest];
                    assert_eq!(
                        (p.count, p.sum_ns),
                        (*count, *sum_ns),
                        "{instance} step {start} digest {digest} (rank {rank})"
                    );
                }
                let rest: (u64, u64) = top.iter().skip(2).fold((0, 0), |a, d| (a.0 + d.1, a.1 + d.2));
                let other = &exported["other"];
                assert_eq!((other.count, other.sum_ns), rest, "{instance} step {start}: the other point");
                assert_eq!(exported, expected(pushes, instance, start), "{instance} step {start}: buckets as pushed");
                checked += 1;
            }
            start += STEP_MS;
        }
    }
    checked
}

fn collector_args(otel_url: &str, protocol: &str) -> Vec<String> {
    [
        "--otlp-endpoint",
        otel_url,
        "--otlp-protocol",
        protocol,
        "--otlp-step",
        "2s",
        "--otlp-delay",
        "1s",
        "--otlp-max-digests",
        "2",
        "--detect-every",
        "off",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_step_arrives_once_as_top_says_through_receiver_and_collector_restarts() {
    if xtask::otelcol::for_test("otlp").is_none() {
        return;
    }
    let dir = TempDir::new("otlp-http");
    let mut otel = OtelCollector::start(&dir.path().join("otelcol")).expect("the OpenTelemetry Collector starts");
    let mut collector = Collector::start(&collector_args(&otel.http_endpoint(), "http/protobuf"));
    let mut run = Run { pushes: Vec::new(), sequence: 0, changes: Vec::new(), long: Vec::new() };

    run.push_for(&collector, Duration::from_secs(5)).await;
    // The receiver goes away for a few steps: the export waits and retries.
    otel.stop().unwrap();
    run.push_for(&collector, Duration::from_secs(5)).await;
    otel.start_again().expect("the OpenTelemetry Collector starts again");
    run.push_for(&collector, Duration::from_secs(3)).await;
    // The collector crashes: it goes on from its mark in the store.
    collector.restart();
    run.push_for(&collector, Duration::from_secs(5)).await;

    let got = wait_for_last_step(&otel, &run.pushes);
    let checked = check_every_step(&collector, &got, &run.pushes);
    assert!(checked >= 2 * 7, "only {checked} steps held statements");
    eprintln!("{checked} steps compared");
    check_logs(&collector, &otel, &run);

    // The cost page says what the export sent, per signal.
    let page = ureq::get(&format!("{}cost", collector.ui)).call().unwrap().body_mut().read_to_string().unwrap();
    for signal in ["metrics", "logs"] {
        let row = page
            .split(&format!("data-signal=\"{signal}\" data-items=\""))
            .nth(1)
            .unwrap_or_else(|| panic!("no {signal} row: {page}"));
        let items: u64 = row.split('"').next().unwrap().parse().unwrap();
        assert!(items > 0, "{signal}: nothing counted as sent");
    }

    let metrics_text = collector.stderr_text();
    assert!(metrics_text.contains("OTLP export on"), "{metrics_text}");
    assert!(metrics_text.contains("OTLP export: will retry"), "the receiver's absence was noticed: {metrics_text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_sends_the_same_points() {
    if xtask::otelcol::for_test("otlp").is_none() {
        return;
    }
    let dir = TempDir::new("otlp-grpc");
    let otel = OtelCollector::start(&dir.path().join("otelcol")).expect("the OpenTelemetry Collector starts");
    let collector = Collector::start(&collector_args(&otel.grpc_endpoint(), "grpc"));
    let mut run = Run { pushes: Vec::new(), sequence: 0, changes: Vec::new(), long: Vec::new() };
    run.push_for(&collector, Duration::from_secs(6)).await;
    let got = wait_for_last_step(&otel, &run.pushes);
    let checked = check_every_step(&collector, &got, &run.pushes);
    assert!(checked >= 2 * 2, "only {checked} steps held statements");
    check_logs(&collector, &otel, &run);
}

/// A CA and a certificate for `localhost` it signed, written into `dir`:
/// (CA, certificate, key).
fn certificates(dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf, std::path::PathBuf) {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
    let mut params = CertificateParams::new(Vec::new()).unwrap();
    params.distinguished_name.push(DnType::CommonName, "sqlbee OTLP test CA");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let authority = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["localhost".to_string()]).unwrap().signed_by(&key, &authority).unwrap();
    let paths = (dir.join("ca.crt"), dir.join("receiver.crt"), dir.join("receiver.key"));
    std::fs::write(&paths.0, authority.pem()).unwrap();
    std::fs::write(&paths.1, leaf.pem()).unwrap();
    std::fs::write(&paths.2, key.serialize_pem()).unwrap();
    paths
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_needs_the_receivers_ca_and_then_sends_the_same_points() {
    if xtask::otelcol::for_test("otlp").is_none() {
        return;
    }
    let dir = TempDir::new("otlp-tls");
    let (ca, cert, key) = certificates(dir.path());
    let otel =
        OtelCollector::start_tls(&dir.path().join("otelcol"), &cert, &key).expect("the OpenTelemetry Collector starts");
    // Without the CA, the receiver's certificate is not trusted: nothing
    // is sent, nothing is dropped, and the log says why.
    let untrusting = Collector::start(&collector_args(&otel.http_endpoint(), "http/protobuf"));
    let mut run = Run { pushes: Vec::new(), sequence: 0, changes: Vec::new(), long: Vec::new() };
    run.push_for(&untrusting, Duration::from_secs(5)).await;
    let log = untrusting.stderr_text();
    assert!(log.contains("OTLP export: will retry") && log.to_lowercase().contains("certificate"), "{log}");
    assert!(received(&otel).is_empty(), "nothing reached the receiver");
    drop(untrusting);

    let mut args = collector_args(&otel.http_endpoint(), "http/protobuf");
    args.extend(["--otlp-ca".to_string(), ca.display().to_string()]);
    let collector = Collector::start(&args);
    let mut run = Run { pushes: Vec::new(), sequence: 0, changes: Vec::new(), long: Vec::new() };
    run.push_for(&collector, Duration::from_secs(5)).await;
    let got = wait_for_last_step(&otel, &run.pushes);
    let checked = check_every_step(&collector, &got, &run.pushes);
    assert!(checked >= 2 * 2, "only {checked} steps held statements");
    check_logs(&collector, &otel, &run);
}
