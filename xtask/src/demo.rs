//! The README's run command: a private MariaDB under a short mixed
//! workload, watched by `sqlbee agent`, ending in its top-digest table.
use std::{
    path::PathBuf,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use xtask::{mariadb::PrivateServer, paths::workspace_root, sysbench::Sysbench};

use crate::cargo;

pub fn build_agent() -> anyhow::Result<PathBuf> {
    println!("==> building sqlbee (release)");
    let status = cargo().args(["build", "--release", "-p", "sqlbee"]).status()?;
    if !status.success() {
        bail!("building sqlbee failed");
    }
    Ok(workspace_root().join("target/release/sqlbee"))
}

pub fn run(seconds: u32) -> anyhow::Result<()> {
    let sqlbee = build_agent()?;
    println!("==> starting a private MariaDB (own datadir, socket and port)");
    let server = PrivateServer::start("demo", &[])?;
    println!("    pid {} port {} socket {}", server.pid(), server.port, server.socket.display());
    let mut bench = Sysbench {
        script: "oltp_read_write".into(),
        tables: 2,
        table_size: 10_000,
        threads: 4,
        seconds,
        ps_mode: "auto",
        rate: 0,
    };
    println!("==> sysbench prepare ({} tables x {} rows)", bench.tables, bench.table_size);
    bench.prepare(&server)?;

    let ready = server.dir().join("agent.ready");
    println!("==> starting sqlbee agent --pid {}", server.pid());
    let mut agent = Command::new(&sqlbee)
        .args(["agent", "--output", "table", "--window", "1h", "--table-rows", "25"])
        .arg(format!("--pid={}", server.pid()))
        .arg("--ready-file")
        .arg(&ready)
        .stdout(Stdio::inherit())
        .spawn()
        .context("starting sqlbee")?;
    let started = Instant::now();
    while !ready.exists() {
        if let Some(status) = agent.try_wait()? {
            bail!("sqlbee agent exited before attaching ({status}); it needs root");
        }
        if started.elapsed() > Duration::from_secs(30) {
            bail!("sqlbee agent did not attach within 30 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let before = server.global_status()?;

    println!("==> sysbench oltp_read_write, prepared statements, {seconds} s");
    bench.run(&server)?;
    bench.ps_mode = "disable";
    println!("==> sysbench oltp_read_write, text protocol, {seconds} s");
    bench.run(&server)?;
    println!("==> a slow statement, an error and a few hand-written ones");
    server.sql("SELECT SLEEP(0.5)")?;
    let _ = server.sql("SELECT * FROM sbtest.no_such_table");
    server.sql("CREATE TABLE IF NOT EXISTS sbtest.demo (id INT PRIMARY KEY, note VARCHAR(64))")?;
    server.sql("INSERT INTO sbtest.demo VALUES (1, 'a'), (2, 'b'), (3, 'c') ON DUPLICATE KEY UPDATE note = VALUES(note)")?;
    server.sql("SELECT note FROM sbtest.demo WHERE id IN (1, 2, 3)")?;

    // SAFETY: plain kill(2) on our own child.
    unsafe { libc::kill(agent.id() as i32, libc::SIGTERM) };
    let status = agent.wait()?;
    let after = server.global_status()?;
    let delta = |k: &str| after.get(k).copied().unwrap_or(0).saturating_sub(before.get(k).copied().unwrap_or(0));
    println!(
        "server's own counters over the same span: Questions +{}, Com_stmt_execute +{}, Com_stmt_prepare +{}",
        delta("Questions"),
        delta("Com_stmt_execute"),
        delta("Com_stmt_prepare")
    );
    if !status.success() {
        bail!("sqlbee agent exited with {status}");
    }
    Ok(())
}
