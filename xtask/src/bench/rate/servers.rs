//! The servers `bench-rate` measures: MariaDB 10.11 on the host (Debian's
//! mariadbd as a private server) and MariaDB 11.8 in a podman container
//! from the test image. Both look alike to the bench: a host pid to watch,
//! a client target, SQL, and a directory for tracer files. This module
//! starts, restarts and removes servers; it never measures.
use std::{
    fs,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use crate::{
    image::{MARIADB_11_8_IMAGE, podman},
    mariadb::PrivateServer,
    sysbench::Target,
};

/// Which server a `--servers` entry names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `10.11`: the host's mariadbd as a private server.
    Host,
    /// `11.8`: the test image's mariadbd in a container.
    Container,
}

impl Kind {
    pub fn parse(name: &str) -> anyhow::Result<Kind> {
        match name {
            "10.11" => Ok(Kind::Host),
            "11.8" => Ok(Kind::Container),
            other => bail!(
                "--servers: unknown server {other:?}; expected 10.11 (the host's mariadbd) or 11.8 (the test image)"
            ),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Kind::Host => "10.11",
            Kind::Container => "11.8",
        }
    }

    /// Whether the server can be restarted with other start-up flags
    /// (a treatment like performance-schema needs it).
    pub fn restartable(self) -> bool {
        self == Kind::Host
    }
}

/// One running server under test.
pub enum Server {
    Host { server: PrivateServer, base: Vec<String> },
    Container(Container),
}

impl Server {
    /// Starts the server of `kind` with mariadbd flags `base`. Ok(None)
    /// when the 11.8 image has not been built: the bench goes on without it.
    pub fn start(kind: Kind, base: &[&str]) -> anyhow::Result<Option<Server>> {
        match kind {
            Kind::Host => {
                let server = PrivateServer::start("bench-rate", base)?;
                Ok(Some(Server::Host { server, base: base.iter().map(|s| s.to_string()).collect() }))
            }
            Kind::Container => Container::start(MARIADB_11_8_IMAGE, base).map(|c| c.map(Server::Container)),
        }
    }

    /// mariadbd's pid on this host (for a container, seen from outside).
    pub fn pid(&self) -> u32 {
        match self {
            Server::Host { server, .. } => server.pid(),
            Server::Container(c) => c.pid,
        }
    }

    /// A directory of ours for tracer files.
    pub fn dir(&self) -> &Path {
        match self {
            Server::Host { server, .. } => server.dir(),
            Server::Container(c) => &c.dir,
        }
    }

    pub fn target(&self) -> Target {
        match self {
            Server::Host { server, .. } => Target::from(server),
            Server::Container(c) => c.target(),
        }
    }

    pub fn sql(&self, sql: &str) -> anyhow::Result<String> {
        self.target().sql(sql)
    }

    /// Restarts the server with `flags` on top of its base flags (none:
    /// back to the base). Only the host's server can.
    pub fn restart_with(&mut self, flags: &[&str]) -> anyhow::Result<()> {
        match self {
            Server::Host { server, base } => {
                let args: Vec<&str> = base.iter().map(String::as_str).chain(flags.iter().copied()).collect();
                server.restart_with_args(&args).context("restarting mariadbd")
            }
            Server::Container(_) => bail!("the container's server is not restarted with other flags"),
        }
    }

    /// What the server's image or binary is, for the report.
    pub fn origin(&self) -> String {
        match self {
            Server::Host { .. } => "the host's /usr/sbin/mariadbd (Debian), private datadir, unix socket".into(),
            Server::Container(c) => {
                format!("{} in container {} (runc, no CPU limit), TCP 127.0.0.1:{}", c.image, c.name, c.port)
            }
        }
    }
}

/// MariaDB in a podman container, published on a free 127.0.0.1 port,
/// with a user for sysbench. Removed when dropped, also after an error.
pub struct Container {
    pub name: String,
    pub image: &'static str,
    pub port: u16,
    pub pid: u32,
    pub dir: PathBuf,
}

/// sysbench's account in the container: its root logs in only from
/// inside (unix_socket), and the bench connects from the host.
const USER: &str = "sqlbee";
const PASSWORD: &str = "sqlbee";

impl Container {
    fn start(image: &'static str, base: &[&str]) -> anyhow::Result<Option<Container>> {
        let exists = podman().args(["image", "exists", image]).status().context("running podman (run `./x setup`)")?;
        if !exists.success() {
            eprintln!("    skipping MariaDB 11.8: the image {image} is missing; `./x image` builds it");
            return Ok(None);
        }
        let name = format!("sqlbee-bench-rate-11-8-{}", std::process::id());
        let _ = podman().args(["rm", "-f", "-v", &name]).output();
        let dir = std::env::temp_dir().join(&name);
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir)?;
        // From here on Drop removes the container and the directory.
        let mut container = Container { name, image, port: 0, pid: 0, dir };
        let out = podman()
            .args(["run", "-d", "--name", &container.name, "-p", "127.0.0.1::3306", image])
            .args(base)
            .output()
            .context("running podman")?;
        if !out.status.success() {
            bail!("podman run {image} failed: {}", String::from_utf8_lossy(&out.stderr).trim());
        }
        container.wait_ready(Duration::from_secs(90))?;
        container.exec_sql(&format!(
            "CREATE USER IF NOT EXISTS {USER}@'%' IDENTIFIED BY '{PASSWORD}'; GRANT ALL ON *.* TO {USER}@'%'; \
             CREATE DATABASE IF NOT EXISTS sbtest"
        ))?;
        let port = container.podman_output(&["port", &container.name, "3306"])?;
        container.port = port
            .lines()
            .next()
            .and_then(|l| l.trim().rsplit(':').next()?.parse().ok())
            .with_context(|| format!("podman port {} 3306 printed {port:?}", container.name))?;
        let pid = container.podman_output(&["inspect", "--format", "{{.State.Pid}}", &container.name])?;
        container.pid = pid.trim().parse().with_context(|| format!("podman inspect printed pid {pid:?}"))?;
        // The image's entrypoint execs mariadbd, so the container's first
        // process is the server itself.
        let comm = fs::read_to_string(format!("/proc/{}/comm", container.pid)).unwrap_or_default();
        if comm.trim() != "mariadbd" {
            bail!(
                "the container's process {} is {:?}, not mariadbd: the image's entrypoint changed?",
                container.pid,
                comm.trim()
            );
        }
        Ok(Some(container))
    }

    fn podman_output(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = podman().args(args).output().context("running podman")?;
        if !out.status.success() {
            bail!("podman {} failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// SQL as the container's root, from inside (for what sysbench's user
    /// cannot do before it exists).
    fn exec_sql(&self, sql: &str) -> anyhow::Result<String> {
        self.podman_output(&["exec", &self.name, "mariadb", "--batch", "--skip-column-names", "-e", sql])
    }

    fn wait_ready(&self, limit: Duration) -> anyhow::Result<()> {
        let started = Instant::now();
        loop {
            if self.exec_sql("SELECT 1").is_ok() {
                return Ok(());
            }
            let running =
                self.podman_output(&["inspect", "--format", "{{.State.Running}}", &self.name]).unwrap_or_default();
            if running.trim() != "true" || started.elapsed() > limit {
                let logs = podman().args(["logs", "--tail", "5", &self.name]).output().ok();
                let tail =
                    logs.map(|o| String::from_utf8_lossy(&o.stderr).trim().replace('\n', " / ")).unwrap_or_default();
                bail!("MariaDB in container {} did not start (running: {}): {tail}", self.name, running.trim());
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    fn target(&self) -> Target {
        Target::Tcp { host: "127.0.0.1".into(), port: self.port, user: USER.into(), password: PASSWORD.into() }
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = podman().args(["rm", "-f", "-v", "--time", "10", &self.name]).output();
        let _ = fs::remove_dir_all(&self.dir);
    }
}
