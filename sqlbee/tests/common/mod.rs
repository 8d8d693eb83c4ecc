//! Harness shared by the integration tests: the real `sqlbee` binary, real
//! private MariaDB servers (from `xtask::mariadb`) and helpers to read the
//! agent's JSON lines.
#![allow(dead_code)]

pub mod browser;
pub mod collector;
pub mod prometheus;
pub mod replication;

use std::{
    collections::HashMap,
    path::PathBuf,
    process::{Child, Command},
    time::{Duration, Instant},
};

use serde_json::Value;
pub use xtask::mariadb::PrivateServer;

/// A root connection to a private server, over its socket.
pub fn root_conn(server: &PrivateServer) -> mysql::Conn {
    let opts =
        mysql::OptsBuilder::new().socket(Some(server.socket.to_str().unwrap())).user(Some("root")).prefer_socket(true);
    mysql::Conn::new(opts).unwrap()
}

/// A `--server-login` file the agent accepts (0600, owned by the agent's user).
pub fn login_file(dir: &std::path::Path, user: &str, password: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(format!("login-{user}.toml"));
    std::fs::write(&path, format!("user = \"{user}\"\npassword = \"{password}\"\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path
}

/// True when this process can load eBPF programs. Without root the test
/// says why it skips, unless SQLBEE_REQUIRE_PRIVILEGED is set (as `./x test`
/// and CI do), in which case not being able to run is a failure.
pub fn privileged(test: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        if std::env::var_os("SQLBEE_REQUIRE_PRIVILEGED").is_some() {
            panic!("{test}: needs root to load eBPF programs, and SQLBEE_REQUIRE_PRIVILEGED is set");
        }
        eprintln!("skipping {test}: needs root to load eBPF programs and attach uprobes");
    } else {
        keep_task_events_on();
    }
    root
}

/// Keeps one per-task perf event open for the whole test binary when the
/// agent attaches classic uprobes (a kernel without multi-uprobe links).
/// The kernel switches its per-task event hooks on when the first such
/// event on the host appears and off some time after the last one goes,
/// and switching them on waits for an RCU grace period, which took 25 s
/// and more on this busy 2-core VM. Each such agent holds one for its own
/// life (see `calibrate::hold_task_events_on`), but between two tests none
/// would be left: every agent started by a test would pay the switch again.
fn keep_task_events_on() {
    static HELD: std::sync::OnceLock<Option<std::os::fd::OwnedFd>> = std::sync::OnceLock::new();
    HELD.get_or_init(|| {
        (!sqlbee_agent::probe::multi_links()).then(sqlbee_agent::probe::hold_task_events_on).and_then(Result::ok)
    });
}

pub fn sqlbee() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_sqlbee"))
}

/// A running `sqlbee agent` whose stdout goes to a file.
pub struct Agent {
    child: Option<Child>,
    stdout: PathBuf,
    stderr: PathBuf,
}

pub struct AgentOutput {
    pub lines: Vec<Value>,
    pub stderr: String,
    pub success: bool,
}

impl Agent {
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// Names of the BPF programs this agent holds open (program ids from
    /// its fds' fdinfo, so other agents on the machine do not count).
    pub fn programs(&self) -> Vec<String> {
        let fdinfo = PathBuf::from(format!("/proc/{}/fdinfo", self.pid()));
        // A program may sit behind several fds (program and link).
        let ids: std::collections::BTreeSet<String> = std::fs::read_dir(&fdinfo)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| std::fs::read_to_string(e.path()).ok())
            .filter_map(|info| info.lines().find_map(|l| l.strip_prefix("prog_id:").map(|v| v.trim().to_string())))
            .collect();
        ids.iter()
            .filter_map(|id| {
                let out = std::process::Command::new("bpftool").args(["-j", "prog", "show", "id", id]).output().ok()?;
                let prog: Value = serde_json::from_slice(&out.stdout).ok()?;
                prog["name"].as_str().map(str::to_string)
            })
            .collect()
    }

    /// Starts `sqlbee agent` with `args` and waits until it has attached.
    pub fn start(dir: &std::path::Path, args: &[String]) -> Agent {
        Agent::start_with_env(dir, args, &[])
    }

    /// `start` with extra environment variables.
    pub fn start_with_env(dir: &std::path::Path, args: &[String], env: &[(&str, &str)]) -> Agent {
        let ready = dir.join(format!("agent-{}.ready", rand_suffix()));
        let stdout = dir.join(format!("agent-{}.jsonl", rand_suffix()));
        let stderr = dir.join(format!("agent-{}.log", rand_suffix()));
        let child = Command::new(sqlbee())
            .arg("agent")
            .args(["--output", "jsonl", "--drain-interval", "20ms"])
            .args(args)
            .arg("--ready-file")
            .arg(&ready)
            .env("SQLBEE_LOG", std::env::var("SQLBEE_TEST_AGENT_LOG").unwrap_or_else(|_| "info".into()))
            .envs(env.iter().copied())
            .stdout(std::fs::File::create(&stdout).unwrap())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .expect("starting sqlbee");
        let mut agent = Agent { child: Some(child), stdout, stderr };
        let started = Instant::now();
        while !ready.exists() {
            if let Some(status) = agent.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("sqlbee exited before attaching ({status}): {}", agent.stderr_text());
            }
            assert!(started.elapsed() < Duration::from_secs(60), "sqlbee did not attach: {}", agent.stderr_text());
            std::thread::sleep(Duration::from_millis(20));
        }
        agent
    }

    /// A crash: SIGKILL, no final window, nothing flushed.
    pub fn kill9(mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn stderr_text(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// Waits until the agent has attached the server process `pid` (a
    /// server that started, or restarted, after the agent). How soon is the
    /// benchmarks' business: a debug build on two busy cores took 1.6-2.1 s.
    pub fn wait_attached(&self, pid: u32) {
        let attached = format!("pid={pid} ");
        let started = Instant::now();
        while !strip_ansi(&self.stderr_text()).lines().any(|l| l.contains(" attached ") && l.contains(&attached)) {
            assert!(started.elapsed() < Duration::from_secs(30), "pid {pid} not attached:\n{}", self.stderr_text());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Log and the window summaries written so far, for failure messages.
    pub fn progress(&self) -> String {
        let stdout = std::fs::read_to_string(&self.stdout).unwrap_or_default();
        let summaries: Vec<&str> = stdout.lines().filter(|l| l.contains(r#""type":"summary""#)).collect();
        format!("{}\n{} windows so far:\n{}", self.stderr_text(), summaries.len(), summaries.join("\n"))
    }

    /// The JSON lines written so far (a line still being written is left out).
    pub fn lines_so_far(&self) -> Vec<Value> {
        let text = std::fs::read_to_string(&self.stdout).unwrap_or_default();
        text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
    }

    /// SIGTERM, wait for the final window, parse everything it wrote.
    pub fn stop(mut self) -> AgentOutput {
        let mut child = self.child.take().unwrap();
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let status = child.wait().unwrap();
        let text = std::fs::read_to_string(&self.stdout).unwrap();
        let lines = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad JSON line {l:?}: {e}")))
            .collect();
        AgentOutput { lines, stderr: self.stderr_text(), success: status.success() }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The agent's log without the colour codes tracing adds, so tests can
/// match `field=value`.
pub fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn rand_suffix() -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    format!("{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed))
}

impl AgentOutput {
    pub fn of_type<'a>(&'a self, kind: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
        self.lines.iter().filter(move |l| l["type"] == kind)
    }

    /// Count per digest text, summed over windows, for one instance (or all).
    pub fn digest_counts(&self, instance: Option<&str>) -> HashMap<String, u64> {
        let mut counts = HashMap::new();
        for line in self.of_type("digest") {
            if instance.is_some_and(|i| line["instance"] != i) {
                continue;
            }
            *counts.entry(line["digest_text"].as_str().unwrap().to_string()).or_default() +=
                line["count"].as_u64().unwrap();
        }
        counts
    }

    /// Digest rows for one digest text, over all windows.
    pub fn digest_rows<'a>(&'a self, text: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
        self.of_type("digest").filter(move |l| l["digest_text"] == text)
    }

    /// A summary field summed over windows for one instance (or all).
    pub fn summary_total(&self, instance: Option<&str>, field: &str) -> u64 {
        self.of_type("summary")
            .filter(|l| instance.is_none_or(|i| l["instance"] == i))
            .map(|l| l[field].as_u64().unwrap_or(0))
            .sum()
    }

    /// Per-command totals over windows for one instance (or all).
    pub fn commands(&self, instance: Option<&str>) -> HashMap<String, u64> {
        let mut totals = HashMap::new();
        for line in self.of_type("summary") {
            if instance.is_some_and(|i| line["instance"] != i) {
                continue;
            }
            for (command, n) in line["commands"].as_object().unwrap() {
                *totals.entry(command.clone()).or_default() += n.as_u64().unwrap();
            }
        }
        totals
    }
}

/// Held by tests of one file that must not run side by side: each drives
/// its own server hard, and on two cores a crowd of them starves the agents
/// under test (their windows and attaches then lag by seconds).
pub fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// A client workload running in the background (sysbench) that can be
/// frozen, so the server's status counters can be read at a moment when no
/// statement of it is in flight. Killed when dropped.
pub struct Workload(Child);

impl Workload {
    pub fn new(child: Child) -> Workload {
        Workload(child)
    }

    /// sysbench `script` on two small tables, prepared and started in the
    /// background with `threads` clients for at most `seconds`.
    pub fn sysbench(
        server: &PrivateServer,
        script: &str,
        threads: u32,
        seconds: u32,
        ps_mode: &'static str,
    ) -> Workload {
        Workload::sysbench_with(server, script, threads, seconds, ps_mode, &[], None)
    }

    /// `sysbench` with more of sysbench's options for its run, in `dir`
    /// (see `Sysbench::spawn_with`).
    pub fn sysbench_with(
        server: &PrivateServer,
        script: &str,
        threads: u32,
        seconds: u32,
        ps_mode: &'static str,
        extra: &[&str],
        dir: Option<&std::path::Path>,
    ) -> Workload {
        let bench = xtask::sysbench::Sysbench {
            script: script.into(),
            tables: 2,
            table_size: 1000,
            threads,
            seconds,
            ps_mode,
            rate: 0,
        };
        bench.prepare(server).unwrap();
        Workload::new(bench.spawn_with(server, extra, dir).unwrap())
    }

    fn signal(&self, sig: libc::c_int) {
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(self.0.id() as i32, sig) };
    }

    /// SIGSTOP, then a moment for statements already sent to finish.
    pub fn pause(&self) {
        self.signal(libc::SIGSTOP);
        std::thread::sleep(Duration::from_millis(300));
    }

    pub fn resume(&self) {
        self.signal(libc::SIGCONT);
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Reads `SHOW GLOBAL STATUS` before an agent starts. MariaDB sends the
/// result before it runs `log_slow_statement`, so the reading connection's
/// statement may still be finishing when the client returns; the pause keeps
/// that end from landing after the agent attached (it would count as an
/// unmatched statement).
pub fn status_before_agent(server: &PrivateServer) -> HashMap<String, u64> {
    let status = server.global_status().unwrap();
    std::thread::sleep(Duration::from_millis(250));
    status
}

/// Commands MariaDB does not count in `Questions` (CF_SKIP_QUESTIONS).
pub const NOT_QUESTIONS: [&str; 6] =
    ["COM_STMT_PREPARE", "COM_STMT_CLOSE", "COM_STMT_RESET", "COM_STMT_SEND_LONG_DATA", "COM_PING", "COM_STATISTICS"];

pub fn delta(before: &HashMap<String, u64>, after: &HashMap<String, u64>, key: &str) -> u64 {
    after.get(key).copied().unwrap_or(0) - before.get(key).copied().unwrap_or(0)
}

pub fn instance_of(server: &PrivateServer) -> String {
    format!("{}:{}", sqlbee_agent::procfs::hostname(), server.port)
}

/// A small tmpfs of its own, to run out of space on purpose (needs root:
/// mount). Unmounted when dropped.
pub struct Tmpfs {
    pub path: std::path::PathBuf,
}

impl Tmpfs {
    pub fn mount(path: &std::path::Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(path).unwrap();
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size},mode=0700"), "tmpfs"])
            .arg(path)
            .status()
            .unwrap();
        assert!(status.success(), "mount -t tmpfs {}", path.display());
        Tmpfs { path: path.to_path_buf() }
    }

    pub fn available(&self) -> u64 {
        sqlbee_agent::ship::disk_floor::space(&self.path).unwrap().available
    }

    /// Takes all but `leave` bytes of the free space with a filler file.
    pub fn fill(&self, leave: u64) -> std::path::PathBuf {
        use std::io::Write;
        let filler = self.path.join("filler");
        let mut file = std::fs::OpenOptions::new().create(true).append(true).open(&filler).unwrap();
        let chunk = vec![0x5au8; 4096];
        while self.available() > leave {
            let n = (self.available() - leave).min(chunk.len() as u64) as usize;
            if file.write_all(&chunk[..n]).is_err() {
                break;
            }
        }
        filler
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg("-l").arg(&self.path).status();
    }
}

/// A file under `docker/`.
pub fn docker(path: &str) -> String {
    let file = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docker").join(path);
    std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()))
}

/// The quoted items of the `[...]` after `key`, for each line that starts
/// with it, in file order.
pub fn lists(text: &str, key: &str) -> Vec<Vec<String>> {
    text.lines()
        .filter_map(|l| l.trim().strip_prefix(key))
        .filter_map(|rest| {
            let inner = rest.split_once('[')?.1.split_once(']')?.0;
            Some(inner.split(',').map(|i| i.trim().trim_matches('"').to_string()).filter(|i| !i.is_empty()).collect())
        })
        .collect()
}

/// The capabilities the agent's containers are given, as the sidecar
/// manifest says, as `CAP_` names.
pub fn agent_capabilities() -> Vec<String> {
    let caps = lists(&docker("k8s/sidecar.yaml"), "add:");
    assert_eq!(caps.len(), 1, "one capability list in the sidecar manifest");
    caps[0].iter().map(|c| format!("CAP_{c}")).collect()
}

/// A port nobody listens on right now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A plain HTTP/1.1 GET on loopback: status line, headers and body.
pub fn http_get(port: u16, path: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(stream, "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").unwrap();
    let mut body = String::new();
    stream.read_to_string(&mut body).unwrap();
    body
}
