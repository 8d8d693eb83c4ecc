//! The metrics endpoint as a real Prometheus (Debian's 2.42) sees it: it
//! must scrape our exposition, parse our escaping and store exactly the
//! values the provider served.
mod common;

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use common::collector::TempDir;
use serde_json::Value;
use sqlbee::metrics::{Encoder, MetricType, MetricsServer, Render};

const PROMETHEUS: &str = "/usr/bin/prometheus";
const WAIT: Duration = Duration::from_secs(30);

/// A label value that needs every escape the format has.
const TRICKY: &str = "SELECT \"a\\b\"\nFROM t";

/// The Prometheus binary, or why this test cannot run: a skip, unless
/// SQLBEE_REQUIRE_PRIVILEGED says every test must run here.
fn prometheus_binary(test: &str) -> Option<&'static Path> {
    let path = Path::new(PROMETHEUS);
    if path.exists() {
        return Some(path);
    }
    if std::env::var_os("SQLBEE_REQUIRE_PRIVILEGED").is_some() {
        panic!("{test}: {PROMETHEUS} is missing and SQLBEE_REQUIRE_PRIVILEGED is set; `cargo xtask setup` installs it");
    }
    eprintln!("skipping {test}: {PROMETHEUS} is missing (`cargo xtask setup` installs it)");
    None
}

/// A running Prometheus, killed when dropped (also when the test panics).
struct Prometheus {
    child: Child,
    addr: SocketAddr,
    log: PathBuf,
}

impl Prometheus {
    fn start(binary: &Path, dir: &Path, target: SocketAddr) -> Prometheus {
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n\
                 scrape_configs:\n  - job_name: sqlbee\n    static_configs:\n      - targets: ['{target}']\n"
            ),
        )
        .unwrap();
        let addr = free_port();
        let log = dir.join("prometheus.log");
        let log_file = std::fs::File::create(&log).unwrap();
        let child = Command::new(binary)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address={addr}"))
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().unwrap())
            .stderr(log_file)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", binary.display()));
        let mut prometheus = Prometheus { child, addr, log };
        prometheus.wait_for("readiness", |p| http_get(p.addr, "/-/ready").is_some_and(|(status, _)| status == 200));
        prometheus
    }

    /// Polls `ready` until it holds, failing with Prometheus' own log if it
    /// never does or Prometheus exits.
    fn wait_for(&mut self, what: &str, mut ready: impl FnMut(&Prometheus) -> bool) {
        let started = Instant::now();
        loop {
            if ready(self) {
                return;
            }
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("prometheus exited ({status}) while waiting for {what}:\n{}", self.log_text());
            }
            assert!(started.elapsed() < WAIT, "prometheus: no {what} within {WAIT:?}:\n{}", self.log_text());
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// A JSON API call; `None` until the API answers with success.
    fn api(&self, path_and_query: &str) -> Option<Value> {
        let (status, body) = http_get(self.addr, path_and_query)?;
        let json: Value = serde_json::from_str(&body).ok()?;
        (status == 200 && json["status"] == "success").then(|| json["data"].clone())
    }

    /// The newest value of an instant-vector query with one series.
    fn query_one(&self, query: &str) -> Option<(Value, f64)> {
        let data = self.api(&format!("/api/v1/query?query={query}"))?;
        let [series] = data["result"].as_array()?.as_slice() else { return None };
        let value = series["value"][1].as_str()?.parse().ok()?;
        Some((series["metric"].clone(), value))
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap()
}

/// A plain HTTP/1.0 GET: no keep-alive and no chunked encoding to undo.
/// `None` while nothing listens or the answer is cut short.
fn http_get(addr: SocketAddr, path_and_query: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(stream, "GET {path_and_query} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, body.to_string()))
}

/// Serves a counter that grows by one per scrape and remembers every value
/// it served, plus a gauge whose label needs escaping.
fn counting_render(served: Arc<Mutex<Vec<u64>>>) -> Render {
    Arc::new(move || {
        let mut served = served.lock().unwrap();
        let value = served.len() as u64 + 1;
        served.push(value);
        let mut enc = Encoder::new();
        enc.family("sqlbee_test_scrapes_total", "Scrapes served by this test.", MetricType::Counter)
            .sample(&[], value);
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
    assert!(
        served_now.iter().any(|v| *v as f64 == value),
        "prometheus stored {value}, but we served {served_now:?}"
    );
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
