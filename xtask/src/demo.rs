//! The README's run command: a private MariaDB under a short mixed
//! workload, watched by `sqlbee agent`, which ships to an embedded
//! `sqlbee collector` (SQLite). It ends with the collector's top-digest
//! table, then keeps the collector's web UI serving until Ctrl-C (or ends
//! at once with `--no-serve`).
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

/// The web UI's usual port, or any free one when it is taken.
const UI_PORT: u16 = 7879;

/// Waits for a file a child writes once it is ready, failing if the child
/// exits first.
fn wait_ready(path: &std::path::Path, child: &mut std::process::Child, what: &str) -> anyhow::Result<String> {
    let started = Instant::now();
    loop {
        if let Ok(text) = std::fs::read_to_string(path)
            && !text.trim().is_empty()
        {
            return Ok(text.trim().to_string());
        }
        if let Some(status) = child.try_wait()? {
            bail!("{what} exited before it was ready ({status})");
        }
        if started.elapsed() > Duration::from_secs(30) {
            bail!("{what} was not ready within 30 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Blocks until SIGINT or SIGTERM reaches this process.
fn wait_for_interrupt() {
    // SAFETY: a signal set on the stack, blocked for this thread, then
    // waited for synchronously; no handler runs.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        let mut signal = 0;
        libc::sigwait(&set, &mut signal);
    }
}

pub fn run(seconds: u32, serve: bool) -> anyhow::Result<()> {
    let sqlbee = build_agent()?;
    println!("==> starting a private MariaDB (own datadir, socket and port)");
    let server = PrivateServer::start("demo", &[])?;
    println!("    pid {} port {} socket {}", server.pid(), server.port, server.socket.display());

    let ui_listen = match std::net::TcpListener::bind(("127.0.0.1", UI_PORT)) {
        Ok(_) => format!("127.0.0.1:{UI_PORT}"),
        Err(_) => "127.0.0.1:0".to_string(),
    };
    let (collector_ready, ui_ready) = (server.dir().join("collector.ready"), server.dir().join("ui.ready"));
    println!("==> starting an embedded sqlbee collector (SQLite in {})", server.dir().display());
    let mut collector = Command::new(&sqlbee)
        .args(["collector", "--listen", "127.0.0.1:0", "--http-listen", &ui_listen])
        .arg(format!("--store=sqlite:{}", server.dir().join("collector.db").display()))
        .arg("--ready-file")
        .arg(&collector_ready)
        .arg("--http-ready-file")
        .arg(&ui_ready)
        .env("SQLBEE_LOG", "warn")
        .spawn()
        .context("starting sqlbee collector")?;
    let stop_collector = |collector: &mut std::process::Child| {
        // SAFETY: plain kill(2) on our own child.
        unsafe { libc::kill(collector.id() as i32, libc::SIGTERM) };
        let _ = collector.wait();
    };
    let collector_addr = match wait_ready(&collector_ready, &mut collector, "sqlbee collector") {
        Ok(addr) => addr,
        Err(error) => {
            stop_collector(&mut collector);
            return Err(error);
        }
    };
    let ui = std::fs::read_to_string(&ui_ready).unwrap_or_default().trim().to_string();
    let result = watch(&sqlbee, &server, seconds, &format!("http://{collector_addr}"));
    if let Err(error) = result {
        stop_collector(&mut collector);
        return Err(error);
    }
    if serve {
        println!("\n==> the collector's web UI: {ui}top?since=15m");
        println!("    (fleet overview at {ui}; Ctrl-C stops the collector and the private MariaDB)");
        wait_for_interrupt();
        println!("\n==> stopping");
    } else {
        println!("\n==> the collector's web UI was at {ui} (without --no-serve it stays up until Ctrl-C)");
    }
    stop_collector(&mut collector);
    Ok(())
}

/// The workload under a shipping agent, then the collector's top table.
fn watch(sqlbee: &std::path::Path, server: &PrivateServer, seconds: u32, collector: &str) -> anyhow::Result<()> {
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
    bench.prepare(server)?;

    let ready = server.dir().join("agent.ready");
    println!("==> starting sqlbee agent --pid {} --collector {collector}", server.pid());
    let mut agent = Command::new(sqlbee)
        .args(["agent", "--window", "5s", "--collector", collector])
        .arg(format!("--state-dir={}", server.dir().join("agent-state").display()))
        .arg(format!("--pid={}", server.pid()))
        .arg("--ready-file")
        .arg(&ready)
        .stdout(Stdio::inherit())
        .spawn()
        .context("starting sqlbee")?;
    let started = Instant::now();
    while !ready.exists() {
        if let Some(status) = agent.try_wait()? {
            // Its own error is on stderr just above, and says what to do.
            bail!("sqlbee agent exited before attaching ({status}); its error is printed above");
        }
        if started.elapsed() > Duration::from_secs(30) {
            bail!("sqlbee agent did not attach within 30 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let before = server.global_status()?;

    println!("==> sysbench oltp_read_write, prepared statements, {seconds} s");
    bench.run(server)?;
    bench.ps_mode = "disable";
    println!("==> sysbench oltp_read_write, text protocol, {seconds} s");
    bench.run(server)?;
    println!("==> a slow statement, an error and a few hand-written ones");
    server.sql("SELECT SLEEP(0.5)")?;
    let _ = server.sql("SELECT * FROM sbtest.no_such_table");
    server.sql("CREATE TABLE IF NOT EXISTS sbtest.demo (id INT PRIMARY KEY, note VARCHAR(64))")?;
    server.sql(
        "INSERT INTO sbtest.demo VALUES (1, 'a'), (2, 'b'), (3, 'c') ON DUPLICATE KEY UPDATE note = VALUES(note)",
    )?;
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
    println!("==> sqlbee top --collector {collector} (what the collector stored)");
    let top = Command::new(sqlbee)
        .args(["top", "--collector", collector, "--since", "1h", "--limit", "25"])
        .status()
        .context("running sqlbee top")?;
    if !top.success() {
        bail!("sqlbee top exited with {top}");
    }
    Ok(())
}
