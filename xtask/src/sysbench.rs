//! sysbench runs against a server: a private one over its socket, or any
//! server over TCP (one in a container, published on a host port).
use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
};

use anyhow::{Context as _, anyhow, bail};

use crate::mariadb::PrivateServer;

/// Where a client reaches a server and as whom.
#[derive(Clone, Debug)]
pub enum Target {
    /// A unix socket, as root (a private server's).
    Socket(PathBuf),
    /// TCP with a password: a server whose root only logs in from inside
    /// (a container's root authenticates by unix_socket).
    Tcp { host: String, port: u16, user: String, password: String },
}

impl From<&PrivateServer> for Target {
    fn from(server: &PrivateServer) -> Target {
        Target::Socket(server.socket.clone())
    }
}

impl Target {
    /// The connection options in the spelling `prefix` selects: `--mysql-`
    /// for sysbench, `--` for the mariadb client.
    fn args(&self, prefix: &str) -> Vec<String> {
        match self {
            Target::Socket(socket) => {
                vec![format!("{prefix}socket={}", socket.display()), format!("{prefix}user=root")]
            }
            Target::Tcp { host, port, user, password } => vec![
                format!("{prefix}host={host}"),
                format!("{prefix}port={port}"),
                format!("{prefix}user={user}"),
                format!("{prefix}password={password}"),
            ],
        }
    }

    /// Runs SQL through the host's `mariadb` client, returning
    /// tab-separated rows.
    pub fn sql(&self, sql: &str) -> anyhow::Result<String> {
        let mut cmd = Command::new("mariadb");
        cmd.args(self.args("--"));
        if matches!(self, Target::Tcp { .. }) {
            // A host name of localhost would mean the socket to the client.
            cmd.arg("--protocol=TCP");
        }
        let out = cmd
            .args(["--batch", "--skip-column-names", "-e", sql])
            .output()
            .context("running the mariadb client (is mariadb-client installed?)")?;
        if !out.status.success() {
            return Err(anyhow!("{sql}: {}", String::from_utf8_lossy(&out.stderr).trim()));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

#[derive(Clone, Debug)]
pub struct Sysbench {
    pub script: String,
    pub tables: u32,
    pub table_size: u32,
    pub threads: u32,
    pub seconds: u32,
    /// `auto` (server-side prepared statements) or `disable` (text).
    pub ps_mode: &'static str,
    /// Events per second to hold to; 0: as fast as possible.
    pub rate: u32,
}

impl Sysbench {
    fn command(&self, target: &Target, action: &str, extra: &[&str]) -> Command {
        let mut cmd = Command::new("sysbench");
        cmd.arg(&self.script)
            .arg("--db-driver=mysql")
            .args(target.args("--mysql-"))
            .arg("--mysql-db=sbtest")
            .arg(format!("--tables={}", self.tables))
            .arg(format!("--table-size={}", self.table_size))
            .arg(format!("--threads={}", self.threads))
            .arg(format!("--time={}", self.seconds))
            .arg(format!("--db-ps-mode={}", self.ps_mode))
            .arg("--report-interval=0")
            .arg(format!("--rate={}", self.rate))
            .args(extra)
            .arg(action);
        cmd
    }

    /// Creates the `sbtest` database (the user needs the right to) and
    /// sysbench's tables in it.
    pub fn prepare(&self, target: impl Into<Target>) -> anyhow::Result<()> {
        let target = target.into();
        target.sql("CREATE DATABASE IF NOT EXISTS sbtest")?;
        let out = self.command(&target, "prepare", &[]).output().context("running sysbench (run `./x setup`)")?;
        if !out.status.success() {
            bail!("sysbench prepare failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(())
    }

    /// Starts `run` in the background; its stdout is the report.
    pub fn spawn(&self, target: impl Into<Target>) -> anyhow::Result<Child> {
        self.spawn_with(target, &[], None)
    }

    /// `spawn` with more of sysbench's options, run in `dir` if given:
    /// `--mysql-ssl=on` reads the client's `client-key.pem`,
    /// `client-cert.pem` and `cacert.pem` from the working directory.
    pub fn spawn_with(&self, target: impl Into<Target>, extra: &[&str], dir: Option<&Path>) -> anyhow::Result<Child> {
        let mut cmd = self.command(&target.into(), "run", extra);
        if let Some(dir) = dir {
            cmd.current_dir(dir);
        }
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().context("starting sysbench")
    }

    pub fn run(&self, target: impl Into<Target>) -> anyhow::Result<String> {
        let out = self.spawn(target)?.wait_with_output()?;
        if !out.status.success() {
            // sysbench reports some fatal errors (a --rate it cannot keep
            // up with) on stdout.
            let text =
                String::from_utf8_lossy(if out.stderr.is_empty() { &out.stdout } else { &out.stderr }).into_owned();
            let tail: Vec<&str> = text.lines().rev().filter(|l| !l.trim().is_empty()).take(3).collect();
            bail!("sysbench run failed ({}): {}", out.status, tail.into_iter().rev().collect::<Vec<_>>().join(" / "));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}
