//! sysbench runs against a private server.
use std::process::{Child, Command, Stdio};

use anyhow::{Context as _, bail};

use crate::mariadb::PrivateServer;

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
    fn command(&self, server: &PrivateServer, action: &str) -> Command {
        let mut cmd = Command::new("sysbench");
        cmd.arg(&self.script)
            .arg("--db-driver=mysql")
            .arg(format!("--mysql-socket={}", server.socket.display()))
            .arg("--mysql-user=root")
            .arg("--mysql-db=sbtest")
            .arg(format!("--tables={}", self.tables))
            .arg(format!("--table-size={}", self.table_size))
            .arg(format!("--threads={}", self.threads))
            .arg(format!("--time={}", self.seconds))
            .arg(format!("--db-ps-mode={}", self.ps_mode))
            .arg("--report-interval=0")
            .arg(format!("--rate={}", self.rate))
            .arg(action);
        cmd
    }

    pub fn prepare(&self, server: &PrivateServer) -> anyhow::Result<()> {
        server.sql("CREATE DATABASE IF NOT EXISTS sbtest")?;
        let out = self.command(server, "prepare").output().context("running sysbench (run `./x setup`)")?;
        if !out.status.success() {
            bail!("sysbench prepare failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(())
    }

    /// Starts `run` in the background; its stdout is the report.
    pub fn spawn(&self, server: &PrivateServer) -> anyhow::Result<Child> {
        self.command(server, "run")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting sysbench")
    }

    pub fn run(&self, server: &PrivateServer) -> anyhow::Result<String> {
        let out = self.spawn(server)?.wait_with_output()?;
        if !out.status.success() {
            // sysbench reports some fatal errors (a --rate it cannot keep
            // up with) on stdout.
            let text = String::from_utf8_lossy(if out.stderr.is_empty() { &out.stdout } else { &out.stderr }).into_owned();
            let tail: Vec<&str> = text.lines().rev().filter(|l| !l.trim().is_empty()).take(3).collect();
            bail!("sysbench run failed ({}): {}", out.status, tail.into_iter().rev().collect::<Vec<_>>().join(" / "));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}
