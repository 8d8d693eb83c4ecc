//! Private ClickHouse servers for the ClickHouse store's tests, on free
//! ports, each with its data, logs and a copy of the packaged config under
//! one temporary directory. One is shared by the whole test process
//! (`shared`): each store under test gets a fresh database on it
//! (`fresh_database`), so tests never see each other's rows.
//! `SQLBEE_TEST_CLICKHOUSE=http://HOST:PORT` uses a running server instead.
//! A test that stops the server under a collector gets one of its own
//! (`private`), which `stop` and `start` again on the same data and ports.
//!
//! Each server is run by a thread that owns its process and asks the
//! kernel to kill it when that thread ends (PR_SET_PDEATHSIG), so a
//! finished or crashed test binary never leaves one behind. The shared
//! server's thread lives as long as the process; a private one's ends, and
//! kills its server, when the `PrivateClickHouse` is dropped.
use std::{
    fs,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        Mutex, OnceLock,
        atomic::{AtomicU32, Ordering},
        mpsc,
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
    /// The thread that runs the server; None for one found through
    /// SQLBEE_TEST_CLICKHOUSE, which is not ours to stop.
    runner: Option<Runner>,
    /// Removed on drop: only a private server's.
    remove_dir: bool,
}

/// What the runner thread is asked to do; each order carries where to
/// answer.
enum Order {
    Start(mpsc::Sender<std::io::Result<u32>>),
    Stop(mpsc::Sender<()>),
}

static SHARED: OnceLock<Result<PrivateClickHouse, String>> = OnceLock::new();
/// How long a started server (or ZooKeeper) may take to answer: seconds
/// when idle, much longer when every test of a run starts its servers at
/// once on two cores.
pub(crate) const READY_WITHIN: Duration = Duration::from_secs(120);
static DATABASES: AtomicU32 = AtomicU32::new(0);

impl PrivateClickHouse {
    /// The process's server, started on first use. Err says why there is
    /// none (not installed, failed to start).
    pub fn shared() -> Result<&'static PrivateClickHouse, String> {
        SHARED.get_or_init(|| Self::start_shared().map_err(|e| format!("{e:#}"))).as_ref().map_err(Clone::clone)
    }

    /// A server of the caller's own, which it may `stop` and `start`
    /// (never SQLBEE_TEST_CLICKHOUSE's: that one is not ours to stop).
    pub fn private(name: &str) -> anyhow::Result<PrivateClickHouse> {
        let clean: String = name.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
        let n = DATABASES.fetch_add(1, Ordering::Relaxed);
        let mut server = Self::launch(&format!("sqlbee-clickhouse-{}-{clean}-{n}", std::process::id()))?;
        server.remove_dir = true;
        Ok(server)
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

    /// Kills the server (SIGKILL: an outage as abrupt as a crash, in the
    /// middle of whatever insert it was taking) and waits until it is gone
    /// and its port refuses connections.
    pub fn stop(&self) -> anyhow::Result<()> {
        self.runner()?.stop()?;
        let started = Instant::now();
        while std::net::TcpStream::connect(&self.host_port).is_ok() {
            if started.elapsed() > Duration::from_secs(10) {
                bail!("{} still accepts connections 10 s after its server was killed", self.host_port);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// Starts the server again on the same data directory and ports, and
    /// waits until it answers.
    pub fn start(&self) -> anyhow::Result<()> {
        self.runner()?.start().context("starting clickhouse-server")?;
        self.wait_ready()
    }

    fn runner(&self) -> anyhow::Result<&Runner> {
        match &self.runner {
            Some(runner) => Ok(runner),
            None => bail!("{} is SQLBEE_TEST_CLICKHOUSE's server, not ours to stop or start", self.url),
        }
    }

    fn wait_ready(&self) -> anyhow::Result<()> {
        let started = Instant::now();
        loop {
            if self.sql("SELECT 1").is_ok_and(|out| out.trim() == "1") {
                return Ok(());
            }
            if started.elapsed() > READY_WITHIN {
                let dir = self.dir.clone().unwrap_or_default();
                let log = fs::read_to_string(dir.join("log/clickhouse-server.err.log")).unwrap_or_default();
                bail!(
                    "clickhouse-server on {} did not answer within {READY_WITHIN:?}: {}",
                    self.host_port,
                    log.lines().rev().take(20).collect::<Vec<_>>().join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn start_shared() -> anyhow::Result<PrivateClickHouse> {
        if let Ok(url) = std::env::var("SQLBEE_TEST_CLICKHOUSE") {
            let url = url.trim_end_matches('/').to_string();
            let host_port = url.split("://").nth(1).unwrap_or(&url).to_string();
            return Ok(PrivateClickHouse { url, host_port, dir: None, runner: None, remove_dir: false });
        }
        Self::launch(&format!("sqlbee-clickhouse-{}", std::process::id()))
    }

    /// Writes a config for free ports under a new temporary directory
    /// named `dir_name`, starts the server's runner thread and the server,
    /// and waits until it answers.
    fn launch(dir_name: &str) -> anyhow::Result<PrivateClickHouse> {
        remove_orphaned_dirs();
        let dir = std::env::temp_dir().join(dir_name);
        twice(dir_name, || {
            let _ = fs::remove_dir_all(&dir);
            let server = Self::prepare(&dir, Ports::free()?, None)?;
            server.start()?;
            Ok(server)
        })
    }

    /// Writes a server's config under `dir` for `ports`, with `include`
    /// (the text of a substitutions file: a cluster's servers, ZooKeeper,
    /// macros) when given, and starts its runner thread but not the server.
    pub(crate) fn prepare(dir: &Path, ports: Ports, include: Option<&str>) -> anyhow::Result<PrivateClickHouse> {
        let packaged = Path::new("/etc/clickhouse-server/config.xml");
        if !packaged.exists() || Command::new("clickhouse-server").arg("--help").output().is_err() {
            bail!("clickhouse-server is not installed: run `./x setup` (installs Debian's clickhouse-server)");
        }
        fs::create_dir_all(dir.join("log"))?;
        let include_from = match include {
            Some(text) => {
                let path = dir.join("substitutions.xml");
                fs::write(&path, text)?;
                format!("    <include_from>{}</include_from>\n", path.display())
            }
            None => String::new(),
        };
        let config = fs::read_to_string(packaged)?
            .replace("<http_port>8123</http_port>", &format!("<http_port>{}</http_port>", ports.http))
            .replace("<tcp_port>9000</tcp_port>", &format!("<tcp_port>{}</tcp_port>", ports.tcp))
            .replace(
                "<interserver_http_port>9009</interserver_http_port>",
                &format!("<interserver_http_port>{}</interserver_http_port>", ports.interserver),
            )
            .replace("<listen_host>::1</listen_host>", "")
            .replace("/var/lib/clickhouse/", &format!("{}/data/", dir.display()))
            .replace("/var/log/clickhouse-server/", &format!("{}/log/", dir.display()))
            .replace("<level>warning</level>", "<level>error</level>")
            // Parts merged away are deleted after 30 s, not 8 minutes: a
            // load run writes many small parts, and their old copies would
            // fill a small disk long before they go.
            .replace(
                "</yandex>",
                &format!(
                    "    <merge_tree><old_parts_lifetime>30</old_parts_lifetime></merge_tree>\n{include_from}</yandex>"
                ),
            );
        for (port, tag) in
            [ports.http, ports.tcp, ports.interserver].iter().zip(["http_port", "tcp_port", "interserver_http_port"])
        {
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
        let config_path = dir.join("config.xml");
        let runner = Runner::spawn("clickhouse-server", dir.join("log/stderr.log"), move || {
            let mut cmd = Command::new("clickhouse-server");
            cmd.arg(format!("--config-file={}", config_path.display()));
            cmd
        })?;
        Ok(PrivateClickHouse {
            url: format!("http://127.0.0.1:{}", ports.http),
            host_port: format!("127.0.0.1:{}", ports.http),
            dir: Some(dir.to_path_buf()),
            runner: Some(runner),
            remove_dir: false,
        })
    }
}

/// A server's three ports.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ports {
    pub http: u16,
    pub tcp: u16,
    pub interserver: u16,
}

impl Ports {
    pub(crate) fn free() -> anyhow::Result<Ports> {
        Ok(Ports {
            http: crate::ports::free_port()?,
            tcp: crate::ports::free_port()?,
            interserver: crate::ports::free_port()?,
        })
    }
}

/// A thread that owns one server process (see the module comment) and
/// starts and kills it as ordered.
pub(crate) struct Runner(Mutex<mpsc::Sender<Order>>);

impl Runner {
    /// `command` builds the process's command line each time it starts;
    /// its stderr is appended to `stderr`.
    pub(crate) fn spawn(
        name: &str,
        stderr: PathBuf,
        command: impl Fn() -> Command + Send + 'static,
    ) -> anyhow::Result<Runner> {
        let (orders, inbox) = mpsc::channel();
        std::thread::Builder::new().name(name.into()).spawn(move || run_process(&command, &stderr, inbox))?;
        Ok(Runner(Mutex::new(orders)))
    }

    /// Starts the process (killing a running one first); its pid.
    pub(crate) fn start(&self) -> anyhow::Result<u32> {
        let (tx, rx) = mpsc::channel();
        self.order(Order::Start(tx))?;
        Ok(rx.recv().context("the runner thread is gone")??)
    }

    /// Kills the process (SIGKILL) and waits for it.
    pub(crate) fn stop(&self) -> anyhow::Result<()> {
        let (tx, rx) = mpsc::channel();
        self.order(Order::Stop(tx))?;
        rx.recv().context("the runner thread is gone")
    }

    fn order(&self, order: Order) -> anyhow::Result<()> {
        self.0
            .lock()
            .map_err(|_| anyhow::anyhow!("the runner's lock is poisoned"))?
            .send(order)
            .map_err(|_| anyhow::anyhow!("the runner thread is gone"))
    }
}

/// The runner thread: starts and kills the process as ordered, and kills
/// it when every sender is gone. The process must be its child, spawned on
/// this thread (see the module comment).
fn run_process(command: &dyn Fn() -> Command, stderr: &Path, inbox: mpsc::Receiver<Order>) {
    let mut running: Option<Child> = None;
    let kill = |running: &mut Option<Child>| {
        if let Some(mut child) = running.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    };
    while let Ok(order) = inbox.recv() {
        match order {
            Order::Start(answer) => {
                kill(&mut running);
                let spawned = fs::OpenOptions::new().create(true).append(true).open(stderr).and_then(|log| {
                    let mut cmd = command();
                    cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(log);
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
                let _ = answer.send(spawned.map(|child| {
                    let pid = child.id();
                    running = Some(child);
                    pid
                }));
            }
            Order::Stop(answer) => {
                kill(&mut running);
                let _ = answer.send(());
            }
        }
    }
    kill(&mut running);
}

/// The shared server is a static, and statics are never dropped: its
/// server dies with the test process, but its directory (100 MiB and more)
/// stays. Directories whose process is gone are removed before a new one
/// is made, so test runs do not fill the disk one by one.
pub(crate) fn remove_orphaned_dirs() {
    let Ok(entries) = fs::read_dir(std::env::temp_dir()) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix("sqlbee-clickhouse-")) else { continue };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else { continue };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}

impl Drop for PrivateClickHouse {
    fn drop(&mut self) {
        if self.remove_dir {
            // Its server must be gone before its files.
            let _ = self.stop();
            if let Some(dir) = &self.dir {
                let _ = fs::remove_dir_all(dir);
            }
        }
    }
}

/// `launch` again on fresh ports when it fails once: a port found free
/// can be taken before the server binds it (the tests start servers and
/// open connections in parallel), and a loaded machine can miss a
/// readiness wait. The first failure is printed, so a flaky start shows
/// in the test's output instead of passing silently.
pub(crate) fn twice<T>(what: &str, mut launch: impl FnMut() -> anyhow::Result<T>) -> anyhow::Result<T> {
    launch().or_else(|first| {
        eprintln!("{what} did not start, trying once more on fresh ports: {first:#}");
        launch().with_context(|| format!("the first attempt failed too: {first:#}"))
    })
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

/// A server of its own for a test named `test` that stops and starts it,
/// or None after saying why it skips (a failure under
/// SQLBEE_REQUIRE_PRIVILEGED, as in `for_test`).
pub fn private_for_test(test: &str) -> Option<PrivateClickHouse> {
    match PrivateClickHouse::private(test) {
        Ok(server) => Some(server),
        Err(why) => {
            if std::env::var_os("SQLBEE_REQUIRE_PRIVILEGED").is_some() {
                panic!("{test}: needs a ClickHouse server, and SQLBEE_REQUIRE_PRIVILEGED is set: {why:#}");
            }
            eprintln!("skipping {test}: {why:#}");
            None
        }
    }
}
