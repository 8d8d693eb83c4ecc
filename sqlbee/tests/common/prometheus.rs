//! A real Prometheus (Debian's 2.42) for the tests that check what it
//! makes of the agent's page: started on a free loopback port, scraping one
//! target every second, killed when dropped.
use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;

pub const PROMETHEUS: &str = "/usr/bin/prometheus";
pub const WAIT: Duration = Duration::from_secs(30);

/// The Prometheus binary, or why this test cannot run: a skip, unless
/// SQLBEE_REQUIRE_PRIVILEGED says every test must run here.
pub fn prometheus_binary(test: &str) -> Option<&'static Path> {
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
pub struct Prometheus {
    child: Child,
    pub addr: SocketAddr,
    log: PathBuf,
}

impl Prometheus {
    pub fn start(binary: &Path, dir: &Path, target: SocketAddr) -> Prometheus {
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
    pub fn wait_for(&mut self, what: &str, mut ready: impl FnMut(&Prometheus) -> bool) {
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
    pub fn api(&self, path_and_query: &str) -> Option<Value> {
        let (status, body) = http_get(self.addr, path_and_query)?;
        let json: Value = serde_json::from_str(&body).ok()?;
        (status == 200 && json["status"] == "success").then(|| json["data"].clone())
    }

    /// The newest value of an instant-vector query with one series.
    pub fn query_one(&self, query: &str) -> Option<(Value, f64)> {
        let data = self.api(&format!("/api/v1/query?query={query}"))?;
        let [series] = data["result"].as_array()?.as_slice() else { return None };
        let value = series["value"][1].as_str()?.parse().ok()?;
        Some((series["metric"].clone(), value))
    }

    /// An instant query at the newest data, any PromQL: the result
    /// array, or Prometheus' own error.
    pub fn query(&self, expr: &str) -> Result<Vec<Value>, String> {
        let (status, body) = http_get(self.addr, &format!("/api/v1/query?query={}", percent_encoded(expr)))
            .ok_or_else(|| "no answer from the query API".to_string())?;
        let json: Value = serde_json::from_str(&body).map_err(|e| format!("HTTP {status}, not JSON ({e}): {body}"))?;
        if status != 200 || json["status"] != "success" {
            return Err(format!("HTTP {status}: {} {}", json["errorType"], json["error"]));
        }
        json["data"]["result"].as_array().cloned().ok_or_else(|| format!("not a vector: {body}"))
    }

    pub fn log_text(&self) -> String {
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

/// A query string value: everything but unreserved characters escaped.
fn percent_encoded(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}
