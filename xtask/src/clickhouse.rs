//! A private ClickHouse server for the ClickHouse store's tests: one per
//! test process, on free ports, with its data, logs and a copy of the
//! packaged config under one temporary directory. Each store under test
//! gets a fresh database on it (`fresh_database`), so tests never see each
//! other's rows. `SQLBEE_TEST_CLICKHOUSE=http://HOST:PORT` uses a running
//! server instead.
//!
//! The server is started from a thread that lives as long as the process
//! and asks the kernel to kill it when that thread ends (PR_SET_PDEATHSIG),
//! so a finished or crashed test binary never leaves one behind.
use std::{
    fs,
    net::TcpListener,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{
        OnceLock,
        atomic::{AtomicU32, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

/// The user with a password that the private server also knows, for tests
/// of the store's credentials.
pub const PASSWORD_USER: &str = "sqlbee_pw";
pub const PASSWORD: &str = "not-in-any-log-7f3a";

pub struct PrivateClickHouse {
    /// `http://127.0.0.1:PORT`, no trailing slash.
    pub url: String,
    pub host_port: String,
    pub dir: Option<PathBuf>,
}

static SHARED: OnceLock<Result<PrivateClickHouse, String>> = OnceLock::new();
static DATABASES: AtomicU32 = AtomicU32::new(0);

impl PrivateClickHouse {
    /// The process's server, started on first use. Err says why there is
    /// none (not installed, failed to start).
    pub fn shared() -> Result<&'static PrivateClickHouse, String> {
        SHARED.get_or_init(|| Self::start().map_err(|e| format!("{e:#}"))).as_ref().map_err(Clone::clone)
    }

    /// A database name nobody used yet: the store creates it.
    pub fn fresh_database(&self, name: &str) -> String {
        let clean: String = name.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
        format!("sqlbee_{clean}_{}_{}", std::process::id(), DATABASES.fetch_add(1, Ordering::Relaxed))
    }

    /// `clickhouse://HOST:PORT/DATABASE` for `--store`.
    pub fn location(&self, database: &str) -> String {
        format!("clickhouse://{}/{database}", self.host_port)
    }

    /// Runs one statement over HTTP with curl (for checks outside the store).
    pub fn sql(&self, sql: &str) -> anyhow::Result<String> {
        let out = Command::new("curl")
            .args(["-sS", "--fail-with-body", "--data-binary", "@-"])
            .arg(format!("{}/", self.url))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .and_then(|mut child| {
                use std::io::Write as _;
                child.stdin.take().expect("stdin").write_all(sql.as_bytes())?;
                child.wait_with_output()
            })
            .context("running curl")?;
        if !out.status.success() {
            bail!("{sql}: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn start() -> anyhow::Result<PrivateClickHouse> {
        if let Ok(url) = std::env::var("SQLBEE_TEST_CLICKHOUSE") {
            let url = url.trim_end_matches('/').to_string();
            let host_port = url.split("://").nth(1).unwrap_or(&url).to_string();
            return Ok(PrivateClickHouse { url, host_port, dir: None });
        }
        let packaged = Path::new("/etc/clickhouse-server/config.xml");
        if !packaged.exists() || Command::new("clickhouse-server").arg("--help").output().is_err() {
            bail!("clickhouse-server is not installed: run `./x setup` (installs Debian's clickhouse-server)");
        }
        let dir = std::env::temp_dir().join(format!("sqlbee-clickhouse-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("log"))?;
        let ports = [free_port()?, free_port()?, free_port()?];
        let config = fs::read_to_string(packaged)?
            .replace("<http_port>8123</http_port>", &format!("<http_port>{}</http_port>", ports[0]))
            .replace("<tcp_port>9000</tcp_port>", &format!("<tcp_port>{}</tcp_port>", ports[1]))
            .replace(
                "<interserver_http_port>9009</interserver_http_port>",
                &format!("<interserver_http_port>{}</interserver_http_port>", ports[2]),
            )
            .replace("<listen_host>::1</listen_host>", "")
            .replace("/var/lib/clickhouse/", &format!("{}/data/", dir.display()))
            .replace("/var/log/clickhouse-server/", &format!("{}/log/", dir.display()))
            .replace("<level>warning</level>", "<level>error</level>");
        for (port, tag) in ports.iter().zip(["http_port", "tcp_port", "interserver_http_port"]) {
            if !config.contains(&format!("<{tag}>{port}</{tag}>")) {
                bail!("the packaged config has no <{tag}> to move to a private port");
            }
        }
        fs::write(dir.join("config.xml"), config)?;
        let users = fs::read_to_string("/etc/clickhouse-server/users.xml")?;
        let with_password = format!(
            "<users>\n<{PASSWORD_USER}><password>{PASSWORD}</password><networks><ip>::/0</ip></networks>\
             <profile>default</profile><quota>default</quota></{PASSWORD_USER}>"
        );
        fs::write(dir.join("users.xml"), users.replacen("<users>", &with_password, 1))?;
        let (tx, rx) = std::sync::mpsc::channel();
        let config_path = dir.join("config.xml");
        let stderr_path = dir.join("log/stderr.log");
        std::thread::Builder::new().name("clickhouse-server".into()).spawn(move || {
            let log = fs::File::create(&stderr_path);
            let spawned = log.and_then(|log| {
                let mut cmd = Command::new("clickhouse-server");
                cmd.arg(format!("--config-file={}", config_path.display()))
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(log);
                use std::os::unix::process::CommandExt as _;
                // SAFETY: prctl is async-signal-safe and touches only the child.
                unsafe {
                    cmd.pre_exec(|| {
                        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                        Ok(())
                    });
                }
                cmd.spawn()
            });
            match spawned {
                Ok(child) => {
                    let _ = tx.send(Ok(child.id()));
                    // This thread must outlive the server (see the module comment).
                    loop {
                        std::thread::park();
                    }
                }
                Err(e) => {
                    let _ = tx.send(Err(e));
                }
            }
        })?;
        rx.recv()?.context("starting clickhouse-server")?;
        let server = PrivateClickHouse {
            url: format!("http://127.0.0.1:{}", ports[0]),
            host_port: format!("127.0.0.1:{}", ports[0]),
            dir: Some(dir.clone()),
        };
        let started = Instant::now();
        loop {
            if server.sql("SELECT 1").is_ok_and(|out| out.trim() == "1") {
                return Ok(server);
            }
            if started.elapsed() > Duration::from_secs(60) {
                let log = fs::read_to_string(dir.join("log/clickhouse-server.err.log")).unwrap_or_default();
                bail!("clickhouse-server did not answer within 60 s: {}", log.lines().rev().take(20).collect::<Vec<_>>().join("\n"));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

fn free_port() -> anyhow::Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").context("binding a probe socket to find a free port")?;
    Ok(listener.local_addr()?.port())
}

/// The shared server for a test named `test`, or None after saying why it
/// skips; under SQLBEE_REQUIRE_PRIVILEGED (CI, `./x test`) a missing
/// server is a failure instead.
pub fn for_test(test: &str) -> Option<&'static PrivateClickHouse> {
    match PrivateClickHouse::shared() {
        Ok(server) => Some(server),
        Err(why) => {
            if std::env::var_os("SQLBEE_REQUIRE_PRIVILEGED").is_some() {
                panic!("{test}: needs a ClickHouse server, and SQLBEE_REQUIRE_PRIVILEGED is set: {why}");
            }
            eprintln!("skipping {test}: {why}");
            None
        }
    }
}
