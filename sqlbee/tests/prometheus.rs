//! The metrics endpoint as a real Prometheus (Debian's 2.42) sees it: it
//! must scrape our exposition, parse our escaping and store exactly the
//! values the provider served.
mod common;

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use common::{
    collector::TempDir,
    prometheus::{Prometheus, prometheus_binary},
};
use sqlbee_agent::metrics::{Encoder, MetricType, MetricsServer, Render};

/// A label value that needs every escape the format has.
const TRICKY: &str = "SELECT \"a\\b\"\nFROM t";

/// Serves a counter that grows by one per scrape and remembers every value
/// it served, plus a gauge whose label needs escaping.
fn counting_render(served: Arc<Mutex<Vec<u64>>>) -> Render {
    Arc::new(move || {
        let mut served = served.lock().unwrap();
        let value = served.len() as u64 + 1;
        served.push(value);
        let mut enc = Encoder::new();
        enc.family("sqlbee_test_scrapes_total", "Scrapes served by this test.", MetricType::Counter).sample(&[], value);
        enc.family("sqlbee_test_escape_info", "A label with \"quotes\", a \\ and\na newline.", MetricType::Gauge)
            .sample(&[("text", TRICKY)], 0.25);
        enc.finish()
    })
}

#[test]
fn prometheus_scrapes_what_we_serve() {
    let Some(binary) = prometheus_binary("prometheus_scrapes_what_we_serve") else { return };
    let dir = TempDir::new("prometheus");

    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let server = MetricsServer::bind("127.0.0.1:0").unwrap();
    let target = server.local_addr();
    let served = Arc::new(Mutex::new(Vec::new()));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = runtime.spawn(server.serve(counting_render(served.clone()), async move {
        let _ = stopped.await;
    }));

    let mut prometheus = Prometheus::start(binary, dir.path(), target);

    // Two scrapes at least, so the stored value is one that changed.
    prometheus.wait_for("a second scrape stored", |p| {
        p.query_one("sqlbee_test_scrapes_total").is_some_and(|(_, value)| value >= 2.0)
    });
    let (labels, value) = prometheus.query_one("sqlbee_test_scrapes_total").unwrap();
    let served_now = served.lock().unwrap().clone();
    assert!(served_now.iter().any(|v| *v as f64 == value), "prometheus stored {value}, but we served {served_now:?}");
    assert_eq!(labels["job"], "sqlbee");
    assert_eq!(labels["instance"], target.to_string());

    let (labels, value) = prometheus.query_one("sqlbee_test_escape_info").expect("the escaped series");
    assert_eq!(labels["text"], TRICKY, "label value after Prometheus parsed our escaping");
    assert_eq!(value, 0.25);

    let targets = prometheus.api("/api/v1/targets").expect("targets API");
    let [target_info] = targets["activeTargets"].as_array().unwrap().as_slice() else {
        panic!("expected one target: {targets}")
    };
    assert_eq!(target_info["health"], "up", "{target_info}");
    assert_eq!(target_info["scrapeUrl"], format!("http://{target}/metrics"));
    assert_eq!(target_info["lastError"], "");

    drop(prometheus);
    stop.send(()).unwrap();
    runtime
        .block_on(async { tokio::time::timeout(Duration::from_secs(10), serving).await })
        .expect("metrics server stops on its signal")
        .unwrap()
        .unwrap();
}
