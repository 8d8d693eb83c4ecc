//! A real OpenTelemetry Collector for the OTLP export's tests: upstream's
//! OTLP receiver and file exporter (`xtask/otelcol/`, pinned at one
//! release in its `go.mod` and `go.sum`), built from the Go module proxy
//! by `./x setup` into the tools directory. A test starts one on free
//! loopback ports and reads what it received from the file it writes.
use std::{
    fs,
    io::BufRead as _,
    net::TcpStream,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use crate::{paths::tools_dir, ports::free_port};

/// The collector release every module in `xtask/otelcol/go.mod` is at.
pub const RELEASE: &str = "0.161.0";
/// The Go toolchain fetched from the module proxy when the machine has no
/// `go` (the proxy serves toolchains as modules; nothing else is reachable).
const GO_TOOLCHAIN: &str = "go1.26.8";

fn source_dir() -> PathBuf {
    crate::paths::workspace_root().join("xtask/otelcol")
}

/// The built collector, named by a hash of its sources, so a change to
/// `main.go` or a module pin builds a new one.
fn binary() -> anyhow::Result<PathBuf> {
    let mut hash = 0xcbf2_9ce4_8422_2325u64;
    for file in ["main.go", "go.mod", "go.sum"] {
        let path = source_dir().join(file);
        let bytes = fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
        for b in bytes {
            hash = (hash ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    Ok(tools_dir().join("bin").join(format!("otelcol-sqlbee-test-{RELEASE}-{hash:016x}")))
}

#[derive(Debug, thiserror::Error)]
#[error("the test OpenTelemetry Collector is not built at {path}: run `./x setup`")]
pub struct Missing {
    pub path: String,
}

/// The built collector, when `./x setup` built it from these sources.
pub fn installed() -> Result<PathBuf, Missing> {
    let path = binary().map_err(|e| Missing { path: e.to_string() })?;
    if path.is_file() { Ok(path) } else { Err(Missing { path: path.display().to_string() }) }
}

/// The built collector for `test`; without it, None after saying why the
/// test skips (a panic under `SQLBEE_REQUIRE_PRIVILEGED`, as `./x test`
/// runs, where skipping would hide a broken setup).
pub fn for_test(test: &str) -> Option<PathBuf> {
    match installed() {
        Ok(path) => Some(path),
        Err(why) => {
            if std::env::var_os("SQLBEE_REQUIRE_PRIVILEGED").is_some() {
                panic!("{test}: needs the test OpenTelemetry Collector, and SQLBEE_REQUIRE_PRIVILEGED is set: {why}");
            }
            eprintln!("skipping {test}: {why}");
            None
        }
    }
}

/// Builds the collector unless this exact one is built.
pub fn install() -> anyhow::Result<PathBuf> {
    let path = binary()?;
    if path.is_file() {
        println!("ok  OpenTelemetry Collector {RELEASE} ({})", path.display());
        return Ok(path);
    }
    let go = go()?;
    println!(
        "==> go build the OpenTelemetry Collector {RELEASE} (OTLP receiver, file exporter) into {}",
        path.display()
    );
    fs::create_dir_all(path.parent().unwrap_or(Path::new("."))).context("creating the tools directory")?;
    let status = Command::new(&go)
        .args(["build", "-trimpath", "-mod=readonly", "-o"])
        .arg(&path)
        .arg(".")
        .current_dir(source_dir())
        .env("GOTOOLCHAIN", "local")
        .env("CGO_ENABLED", "0")
        .status()
        .with_context(|| format!("running {}", go.display()))?;
    if !status.success() {
        let _ = fs::remove_file(&path);
        bail!("go build of xtask/otelcol failed ({status})");
    }
    Ok(path)
}

/// The machine's `go`, or one fetched from the module proxy into the
/// tools directory.
fn go() -> anyhow::Result<PathBuf> {
    let candidates = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).map(|d| d.join("go")).collect::<Vec<_>>())
        .unwrap_or_default();
    let fetched = tools_dir().join(format!("{GO_TOOLCHAIN}/bin/go"));
    for go in candidates.into_iter().chain([PathBuf::from("/usr/local/go/bin/go"), fetched.clone()]) {
        if go.is_file() {
            return Ok(go);
        }
    }
    let version = format!("v0.0.1-{GO_TOOLCHAIN}.linux-amd64");
    let url = format!("https://proxy.golang.org/golang.org/toolchain/@v/{version}.zip");
    let zip = tools_dir().join(format!("{GO_TOOLCHAIN}.zip"));
    println!("==> no go on this machine: fetching {url}");
    let ok = Command::new("curl").args(["-fsSL", "--retry", "3", "-o"]).arg(&zip).arg(&url).status()?.success();
    if !ok {
        bail!("fetching the Go toolchain from {url} failed");
    }
    // The zip holds `golang.org/toolchain@<version>/...`: unpack it and
    // give the tree its own name.
    let unpack = tools_dir().join(format!("{GO_TOOLCHAIN}.unpack"));
    let _ = fs::remove_dir_all(&unpack);
    let ok = Command::new("python3").args(["-m", "zipfile", "-e"]).arg(&zip).arg(&unpack).status()?.success();
    if !ok {
        bail!("unpacking {} failed", zip.display());
    }
    let tree = unpack.join(format!("golang.org/toolchain@{version}"));
    let target = tools_dir().join(GO_TOOLCHAIN);
    let _ = fs::remove_dir_all(&target);
    fs::rename(&tree, &target).with_context(|| format!("moving {} to {}", tree.display(), target.display()))?;
    let _ = fs::remove_dir_all(&unpack);
    let _ = fs::remove_file(&zip);
    // zipfile keeps no modes.
    Command::new("chmod").arg("-R").arg("u+x").arg(target.join("bin")).arg(target.join("pkg/tool")).status()?;
    Ok(fetched)
}

/// One running collector: OTLP over HTTP and gRPC on loopback, everything
/// it receives appended to `received.jsonl` in its directory.
pub struct OtelCollector {
    dir: PathBuf,
    binary: PathBuf,
    pub http_port: u16,
    pub grpc_port: u16,
    /// Certificate and key (PEM) both receivers serve TLS with.
    tls: Option<(PathBuf, PathBuf)>,
    child: Option<Child>,
}

impl OtelCollector {
    /// Starts one in `dir` (made if missing), with the file exporter's
    /// output and the collector's own log there.
    pub fn start(dir: &Path) -> anyhow::Result<OtelCollector> {
        Self::start_with(dir, None)
    }

    /// As `start`, both receivers over TLS with this certificate and key.
    pub fn start_tls(dir: &Path, cert: &Path, key: &Path) -> anyhow::Result<OtelCollector> {
        Self::start_with(dir, Some((cert.to_path_buf(), key.to_path_buf())))
    }

    fn start_with(dir: &Path, tls: Option<(PathBuf, PathBuf)>) -> anyhow::Result<OtelCollector> {
        let binary = installed()?;
        fs::create_dir_all(dir)?;
        let mut collector = OtelCollector {
            dir: dir.to_path_buf(),
            binary,
            http_port: free_port()?,
            grpc_port: free_port()?,
            tls,
            child: None,
        };
        collector.write_config()?;
        collector.run()?;
        Ok(collector)
    }

    fn scheme(&self) -> &'static str {
        if self.tls.is_some() { "https://localhost" } else { "http://127.0.0.1" }
    }

    pub fn http_endpoint(&self) -> String {
        format!("{}:{}", self.scheme(), self.http_port)
    }

    pub fn grpc_endpoint(&self) -> String {
        format!("{}:{}", self.scheme(), self.grpc_port)
    }

    fn received_path(&self) -> PathBuf {
        self.dir.join("received.jsonl")
    }

    fn write_config(&self) -> anyhow::Result<()> {
        let tls = match &self.tls {
            Some((cert, key)) => {
                format!(
                    "\n        tls:\n          cert_file: {}\n          key_file: {}",
                    cert.display(),
                    key.display()
                )
            }
            None => String::new(),
        };
        let config = format!(
            "receivers:\n  otlp:\n    protocols:\n      http:\n        endpoint: 127.0.0.1:{http}{tls}\n      grpc:\n        \
             endpoint: 127.0.0.1:{grpc}{tls}\nexporters:\n  file:\n    path: {out}\n    flush_interval: 100ms\n    append: true\nservice:\n  \
             telemetry:\n    metrics:\n      level: none\n  pipelines:\n    metrics:\n      receivers: [otlp]\n      \
             exporters: [file]\n    logs:\n      receivers: [otlp]\n      exporters: [file]\n",
            http = self.http_port,
            grpc = self.grpc_port,
            out = self.received_path().display(),
        );
        fs::write(self.dir.join("config.yaml"), config).context("writing the OpenTelemetry Collector's config")
    }

    fn run(&mut self) -> anyhow::Result<()> {
        let log = fs::OpenOptions::new().create(true).append(true).open(self.dir.join("otelcol.log"))?;
        let child = Command::new(&self.binary)
            .arg("--config")
            .arg(self.dir.join("config.yaml"))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", self.binary.display()))?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        let ready = |port: u16| TcpStream::connect(("127.0.0.1", port)).is_ok();
        while !(ready(self.http_port) && ready(self.grpc_port)) {
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                bail!("the OpenTelemetry Collector exited ({status}); see {}", self.dir.join("otelcol.log").display());
            }
            if Instant::now() > deadline {
                bail!("the OpenTelemetry Collector did not listen within 30 s");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// Stops it (SIGTERM, so the file exporter flushes what it holds).
    pub fn stop(&mut self) -> anyhow::Result<()> {
        if let Some(mut child) = self.child.take() {
            // SAFETY: signalling our own child by its pid.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(15);
            while child.try_wait()?.is_none() {
                if Instant::now() > deadline {
                    let _ = child.kill();
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.wait();
        }
        Ok(())
    }

    /// Starts it again on the same ports and file.
    pub fn start_again(&mut self) -> anyhow::Result<()> {
        self.stop()?;
        self.run()
    }

    /// Every export request it wrote, in order, as OTLP/JSON.
    pub fn received(&self) -> anyhow::Result<Vec<serde_json::Value>> {
        let file = match fs::File::open(self.received_path()) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e.into()),
        };
        let mut out = Vec::new();
        for line in std::io::BufReader::new(file).lines() {
            let line = line?;
            if line.trim().is_empty() {
                continue;
            }
            // A line cut by a flush in progress is read next time.
            if let Ok(value) = serde_json::from_str(&line) {
                out.push(value);
            }
        }
        Ok(out)
    }
}

impl Drop for OtelCollector {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}
