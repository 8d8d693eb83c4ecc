//! A private MariaDB server on its own datadir, socket and port, for tests,
//! the demo and benchmarks. It never touches another instance: the port is
//! picked free on 127.0.0.1 and everything lives under one directory that
//! is removed when the handle drops.
use std::{
    collections::HashMap,
    fs,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::atomic::{AtomicU32, Ordering},
    time::{Duration, Instant},
};

use anyhow::{Context as _, anyhow, bail};

pub struct PrivateServer {
    pub dir: PathBuf,
    pub socket: PathBuf,
    pub port: u16,
    extra_args: Vec<String>,
    /// The server binary: `mariadbd` from PATH unless started with another.
    binary: PathBuf,
    child: Option<Child>,
}

static SEQUENCE: AtomicU32 = AtomicU32::new(0);

/// A system database installed once per machine and MariaDB version, then
/// copied: `mariadb-install-db` takes seconds, a copy milliseconds.
fn template_datadir() -> anyhow::Result<PathBuf> {
    let version = Command::new("mariadbd")
        .arg("--version")
        .output()
        .context("mariadbd not found: run `./x setup` (installs Debian's mariadb-server)")?;
    let version = String::from_utf8_lossy(&version.stdout);
    let tag: String = version
        .split_whitespace()
        .nth(2)
        .unwrap_or("unknown")
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '.' { c } else { '_' })
        .collect();
    let base = std::env::temp_dir().join(format!("sqlbee-mariadb-template-{tag}"));
    let ready = base.join(".ready");
    if ready.exists() {
        return Ok(base.join("data"));
    }
    fs::create_dir_all(&base)?;
    let lock = fs::File::create(base.join(".lock"))?;
    lock.lock().context("locking the template datadir")?;
    if !ready.exists() {
        let data = base.join("data");
        let _ = fs::remove_dir_all(&data);
        let out = Command::new("mariadb-install-db")
            .args(["--user=root", "--auth-root-authentication-method=normal", "--skip-test-db"])
            .arg(format!("--datadir={}", data.display()))
            .output()
            .context("running mariadb-install-db")?;
        if !out.status.success() {
            bail!("mariadb-install-db failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        fs::write(&ready, b"")?;
    }
    Ok(base.join("data"))
}

impl PrivateServer {
    /// Starts a server; `extra_args` are passed to mariadbd as they are.
    pub fn start(name: &str, extra_args: &[&str]) -> anyhow::Result<Self> {
        Self::start_with_binary(name, Path::new("mariadbd"), extra_args)
    }

    /// `start` with another server binary (a copy, another build).
    pub fn start_with_binary(name: &str, binary: &Path, extra_args: &[&str]) -> anyhow::Result<Self> {
        let template = template_datadir()?;
        let n = SEQUENCE.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("sqlbee-{name}-{}-{n}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir)?;
        let status = Command::new("cp").arg("-a").arg(&template).arg(dir.join("data")).status()?;
        if !status.success() {
            bail!("copying the template datadir failed");
        }
        let mut server = Self {
            socket: dir.join("mysqld.sock"),
            dir,
            port: crate::ports::free_port()?,
            extra_args: extra_args.iter().map(|s| s.to_string()).collect(),
            binary: binary.to_path_buf(),
            child: None,
        };
        server.spawn()?;
        Ok(server)
    }

    fn spawn(&mut self) -> anyhow::Result<()> {
        let log = fs::OpenOptions::new().create(true).append(true).open(self.dir.join("error.log"))?;
        let mut cmd = Command::new(&self.binary);
        cmd.arg("--no-defaults")
            .arg("--user=root")
            .arg(format!("--datadir={}", self.dir.join("data").display()))
            .arg(format!("--socket={}", self.socket.display()))
            .arg(format!("--port={}", self.port))
            .arg(format!("--pid-file={}", self.dir.join("mysqld.pid").display()))
            .args([
                "--bind-address=127.0.0.1",
                "--skip-log-bin",
                "--innodb-buffer-pool-size=256M",
                "--max-connections=500",
            ])
            .args(&self.extra_args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        let child = cmd.spawn().context("starting mariadbd")?;
        self.child = Some(child);
        self.wait_ready(Duration::from_secs(60))
    }

    fn wait_ready(&mut self, limit: Duration) -> anyhow::Result<()> {
        let started = Instant::now();
        loop {
            if let Some(child) = self.child.as_mut()
                && let Some(status) = child.try_wait()?
            {
                bail!("mariadbd exited during start-up ({status}); see {}", self.dir.join("error.log").display());
            }
            if self.socket.exists() && self.sql("SELECT 1").is_ok() {
                return Ok(());
            }
            if started.elapsed() > limit {
                bail!("mariadbd not ready after {limit:?}; see {}", self.dir.join("error.log").display());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// Kills the server with SIGKILL (a crash), keeping its datadir.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = fs::remove_file(&self.socket);
    }

    /// Starts the server again on the same datadir, socket and port.
    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.kill();
        self.spawn()
    }

    /// Shuts the server down cleanly and starts it again on the same
    /// datadir, socket and port with `extra_args` in place of the ones it
    /// was started with (for settings that need a restart, such as
    /// `--performance-schema`).
    pub fn restart_with_args(&mut self, extra_args: &[&str]) -> anyhow::Result<()> {
        self.shut_down()?;
        self.extra_args = extra_args.iter().map(|s| s.to_string()).collect();
        self.spawn()
    }

    /// Shuts the server down cleanly and starts `binary` (another build) on
    /// the same datadir, socket, port and arguments: an in-place upgrade.
    pub fn restart_with_binary(&mut self, binary: &Path) -> anyhow::Result<()> {
        self.shut_down()?;
        self.binary = binary.to_path_buf();
        self.spawn()
    }

    /// Shuts the server down cleanly (SIGKILL after 60 s), keeping its
    /// datadir until the handle drops.
    pub fn shut_down(&mut self) -> anyhow::Result<()> {
        if let Some(mut child) = self.child.take() {
            // SAFETY: kill(2) on our own child.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(60);
            while child.try_wait()?.is_none() {
                if Instant::now() > deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        let _ = fs::remove_file(&self.socket);
        Ok(())
    }

    /// Runs SQL through the `mariadb` client, returning tab-separated rows.
    pub fn sql(&self, sql: &str) -> anyhow::Result<String> {
        let out = Command::new("mariadb")
            .arg(format!("--socket={}", self.socket.display()))
            .args(["-uroot", "--batch", "--skip-column-names", "-e", sql])
            .output()
            .context("running the mariadb client (is mariadb-client installed?)")?;
        if !out.status.success() {
            return Err(anyhow!("{sql}: {}", String::from_utf8_lossy(&out.stderr).trim()));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `SHOW GLOBAL STATUS` as numbers (non-numeric values are skipped).
    pub fn global_status(&self) -> anyhow::Result<HashMap<String, u64>> {
        let text = self.sql("SHOW GLOBAL STATUS")?;
        Ok(text
            .lines()
            .filter_map(|line| {
                let (k, v) = line.split_once('\t')?;
                Some((k.to_string(), v.trim().parse().ok()?))
            })
            .collect())
    }

    /// `mysql://` URL for client libraries, over the unix socket.
    pub fn url(&self) -> String {
        format!("mysql://root@localhost:{}/?socket={}", self.port, self.socket.display())
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for PrivateServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SIGTERM first: a clean shutdown is quick on a small datadir.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if matches!(child.try_wait(), Ok(Some(_))) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::env::var_os("SQLBEE_KEEP_TEST_DIRS").is_none() {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}
