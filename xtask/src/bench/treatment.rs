//! What each treatment turns on, as data, and the tracer process a
//! treatment runs beside mysqld (sqlbee or bpftrace). This module starts
//! and stops tracers; it never measures anything and never touches the
//! server's settings.
use std::{
    fs,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use crate::mariadb::PrivateServer;

/// One arm compared against a fresh control run in every pair.
#[derive(Debug)]
pub struct Treatment {
    pub name: &'static str,
    /// One line for the report.
    pub about: &'static str,
    pub setup: Setup,
}

#[derive(Debug)]
pub enum Setup {
    /// `sqlbee agent` with `flags` (an agent that rejects one fails the
    /// run), plus each of `if_known` that this build lists in its `--help`:
    /// for settings that are flags in one build and the default in another.
    Agent { flags: &'static [&'static str], if_known: &'static [&'static str] },
    /// Global settings: SQL that turns the setting on before the run and
    /// SQL that turns it off after it. `base`: start-up flags the SQL
    /// needs, which every arm's server then starts with; `off` is applied
    /// right after each start, so the other arms run with it off too.
    ServerSql { base: &'static [&'static str], on: &'static str, off: &'static str },
    /// mariadbd flags that only take effect at start-up. The treatment run
    /// gets a restarted server, so its control run gets one too.
    ServerFlags(&'static [&'static str]),
    /// A bpftrace program. `{binary}` is replaced by mysqld's executable,
    /// `{pid}` by its pid and `{name}` by the mangled symbol of each free
    /// function in `symbols`. bpftrace 0.17 attaches uprobes to every
    /// process running the binary, `-p` or not, so the program filters on
    /// `{pid}` to count only the measured server (the others still trap).
    Bpftrace { symbols: &'static [&'static str], program: &'static str },
}

pub const TREATMENTS: &[Treatment] = &[
    Treatment {
        name: "sqlbee",
        about: "sqlbee agent, default probes",
        setup: Setup::Agent { flags: &[], if_known: &[] },
    },
    // Builds without `--all-probes` attach every optional probe by default.
    Treatment {
        name: "sqlbee-all",
        about: "sqlbee agent, every optional probe on",
        setup: Setup::Agent { flags: &[], if_known: &["--all-probes"] },
    },
    // The wait probes' own cost on the one-trap design. A required flag, not
    // `if_known`: builds without it attach the command probe too, which
    // would measure something else under this name. `--wait-probes` also
    // turns the kernel digests off, so `sqlbee-events` is the baseline
    // that leaves only the wait traps as the difference.
    Treatment {
        name: "sqlbee-waits",
        about: "sqlbee agent, default probes plus the wait probes (no kernel digests)",
        setup: Setup::Agent { flags: &["--wait-probes"], if_known: &[] },
    },
    // The lean tier: every statement counted and timed with its digest,
    // errors, schema and account, none of the server's own figures read.
    Treatment {
        name: "sqlbee-lean",
        about: "sqlbee agent, default probes, --figures lean (none of the server's own figures, no CPU time)",
        setup: Setup::Agent { flags: &["--figures=lean"], if_known: &[] },
    },
    // Statements ended at the server's answer: no trap in mysqld, the
    // sendto and write tracepoints instead (every syscall on the host takes
    // the kernel's tracing path).
    Treatment {
        name: "sqlbee-send",
        about: "sqlbee agent, default probes, --statement-hook send (statements end at the answer's syscall, no trap)",
        setup: Setup::Agent { flags: &["--statement-hook=send"], if_known: &[] },
    },
    // The same on the raw sys_enter tracepoint: a program run at every
    // syscall on the host.
    Treatment {
        name: "sqlbee-send-raw",
        about: "sqlbee agent, default probes, --statement-hook send-raw (the raw sys_enter tracepoint, every syscall)",
        setup: Setup::Agent { flags: &["--statement-hook=send-raw"], if_known: &[] },
    },
    // The design before kernel digests, for the side-by-side cost.
    Treatment {
        name: "sqlbee-events",
        about: "sqlbee agent sending every statement to user space (no kernel digests)",
        setup: Setup::Agent { flags: &[], if_known: &["--kernel-digests=0"] },
    },
    // Plans at their default pace: every digest is new to a fresh agent, so
    // it explains one statement a second for the whole run. `{dir}` is the
    // server's directory, where the rate bench writes the login.
    Treatment {
        name: "sqlbee-plans",
        about: "sqlbee agent with --server-login (EXPLAIN at the default 1 per second), 10 s windows",
        setup: Setup::Agent { flags: &["--server-login={dir}/sqlbee-login.toml", "--window=10s"], if_known: &[] },
    },
    Treatment {
        name: "sqlbee-budget",
        about: "sqlbee agent held to 1% of mysqld's CPU, 10 s windows (the default: the duty is learned window by window)",
        setup: Setup::Agent { flags: &["--mysqld-overhead-budget", "1%", "--window=10s"], if_known: &[] },
    },
    // An A/A arm for arms that need start-up flags: what restarting the
    // server, or (with `bench-rate --sibling-servers`) running on a second
    // server started like the first, changes by itself. The flag repeats
    // the base's, so only the server differs.
    Treatment {
        name: CONTROL_ELSEWHERE,
        about: "nothing attached, on mariadbd restarted with control's own flags (with --sibling-servers: on a second \
                server started with them): what the other server alone changes",
        setup: Setup::ServerFlags(&["--performance-schema=OFF"]),
    },
    Treatment {
        name: "performance-schema",
        about: "mariadbd restarted with --performance-schema=ON (its control restarted with it OFF)",
        setup: Setup::ServerFlags(&["--performance-schema=ON"]),
    },
    // MariaDB's defaults leave every statement consumer off; the article
    // this project started from measured performance_schema with statement
    // events kept, the way a DBA turns it on to read statement history.
    Treatment {
        name: "performance-schema-statements",
        about: "mariadbd restarted with performance_schema on, every statement instrument and the statement \
                consumers (current, history, history_long) on (its control restarted with it OFF)",
        setup: Setup::ServerFlags(&[
            "--performance-schema=ON",
            "--performance-schema-instrument=statement/%=ON",
            "--performance-schema-consumer-events-statements-current=ON",
            "--performance-schema-consumer-events-statements-history=ON",
            "--performance-schema-consumer-events-statements-history-long=ON",
        ]),
    },
    // The same configuration turned on and off at run time, so its rounds
    // need no restarts: every arm's server starts with performance_schema
    // on and everything in it turned off. The control then pays
    // performance_schema's fixed cost too, so this arm's cost is, if
    // anything, understated.
    Treatment {
        name: "performance-schema-live",
        about: "performance_schema turned on at run time as performance-schema-statements starts it (MariaDB's \
                default instruments and consumers, every statement instrument, the statement consumers current, \
                history, history_long), on a server every arm shares that starts with performance_schema ON and \
                runs the other arms with all of it turned off",
        setup: Setup::ServerSql { base: &["--performance-schema=ON"], on: PS_LIVE_ON, off: PS_LIVE_OFF },
    },
    Treatment {
        name: "slow-log",
        about: "slow query log to a file with long_query_time=0 (every statement)",
        setup: Setup::ServerSql {
            base: &[],
            on: "SET GLOBAL log_output = 'FILE', long_query_time = 0, slow_query_log = 1",
            off: "SET GLOBAL slow_query_log = 0, long_query_time = 10",
        },
    },
    Treatment {
        name: "general-log",
        about: "general query log to a file",
        setup: Setup::ServerSql {
            base: &[],
            on: "SET GLOBAL log_output = 'FILE', general_log = 1",
            off: "SET GLOBAL general_log = 0",
        },
    },
    Treatment {
        name: "bpftrace-pair",
        about: "bpftrace: uprobe + uretprobe on dispatch_command, latency histogram in the kernel",
        setup: Setup::Bpftrace {
            symbols: &["dispatch_command"],
            program: "uprobe:{binary}:{dispatch_command} /pid == {pid}/ { @start[tid] = nsecs; }\n\
                      uretprobe:{binary}:{dispatch_command} /@start[tid]/ {\n  \
                      @lat = hist(nsecs - @start[tid]);\n  delete(@start[tid]);\n}\n",
        },
    },
    Treatment {
        name: "bpftrace-count",
        about: "bpftrace: one counting uprobe at the entry of log_slow_statement (the one-trap floor)",
        setup: Setup::Bpftrace {
            symbols: &["log_slow_statement"],
            program: "uprobe:{binary}:{log_slow_statement} /pid == {pid}/ { @ = count(); }\n",
        },
    },
    // What a design that never traps the server would pay at the least: a
    // syscall tracepoint turned on sends every syscall of every task
    // through the kernel's tracing path, and mysqld answers each statement
    // with one `sendto`.
    Treatment {
        name: "bpftrace-sendto",
        about: "bpftrace: one counting syscall tracepoint at sendto's entry (the floor of a design without a trap)",
        setup: Setup::Bpftrace {
            symbols: &[],
            program: "tracepoint:syscalls:sys_enter_sendto /pid == {pid}/ { @ = count(); }\n",
        },
    },
];

/// The A/A arm of server-flag arms.
pub const CONTROL_ELSEWHERE: &str = "control-elsewhere";

/// Turns every instrument and consumer off. Its first run after a start
/// keeps what the server started with (its defaults) for `PS_LIVE_ON`:
/// INSERT IGNORE leaves the rows of the first run in place. The memory
/// instruments stay as they are, as they count allocations only.
const PS_LIVE_OFF: &str = "CREATE DATABASE IF NOT EXISTS sqlbee_bench; \
    CREATE TABLE IF NOT EXISTS sqlbee_bench.ps_instruments \
      (NAME VARCHAR(128) PRIMARY KEY, ENABLED VARCHAR(3), TIMED VARCHAR(3)) ENGINE=Aria; \
    CREATE TABLE IF NOT EXISTS sqlbee_bench.ps_consumers (NAME VARCHAR(64) PRIMARY KEY, ENABLED VARCHAR(3)) ENGINE=Aria; \
    INSERT IGNORE INTO sqlbee_bench.ps_instruments SELECT NAME, ENABLED, TIMED FROM performance_schema.setup_instruments; \
    INSERT IGNORE INTO sqlbee_bench.ps_consumers SELECT NAME, ENABLED FROM performance_schema.setup_consumers; \
    UPDATE performance_schema.setup_instruments SET ENABLED = 'NO', TIMED = 'NO' WHERE NAME NOT LIKE 'memory/%'; \
    UPDATE performance_schema.setup_consumers SET ENABLED = 'NO'";

/// Back to the defaults `PS_LIVE_OFF` kept, then what
/// `performance-schema-statements` adds to them at start-up.
const PS_LIVE_ON: &str = "UPDATE performance_schema.setup_instruments i JOIN sqlbee_bench.ps_instruments d \
      ON d.NAME = i.NAME SET i.ENABLED = d.ENABLED, i.TIMED = d.TIMED; \
    UPDATE performance_schema.setup_consumers c JOIN sqlbee_bench.ps_consumers d \
      ON d.NAME = c.NAME SET c.ENABLED = d.ENABLED; \
    UPDATE performance_schema.setup_instruments SET ENABLED = 'YES', TIMED = 'YES' WHERE NAME LIKE 'statement/%'; \
    UPDATE performance_schema.setup_consumers SET ENABLED = 'YES' \
      WHERE NAME IN ('events_statements_current', 'events_statements_history', 'events_statements_history_long')";

/// The login the `sqlbee-plans` arm's agent uses: one that may explain
/// sysbench's statements, created with `sql` on the server, in a file in
/// `dir` only its owner reads.
pub fn write_plans_login(dir: &Path, sql: impl Fn(&str) -> anyhow::Result<String>) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    sql("CREATE USER IF NOT EXISTS 'sqlbee_bench'@'localhost' IDENTIFIED BY 'sqlbee-bench'; \
         GRANT SELECT, INSERT, UPDATE, DELETE ON sbtest.* TO 'sqlbee_bench'@'localhost'")?;
    let path = dir.join("sqlbee-login.toml");
    fs::write(&path, "user = \"sqlbee_bench\"\npassword = \"sqlbee-bench\"\n")?;
    fs::set_permissions(&path, fs::Permissions::from_mode(0o600))?;
    Ok(())
}

/// What `cargo xtask bench --treatments all` runs: every treatment but
/// those that need start-up flags on every arm's server (`bench-rate`'s).
pub fn all_for_bench() -> impl Iterator<Item = &'static Treatment> {
    TREATMENTS.iter().filter(|t| t.base_flags().is_empty())
}

pub fn treatment(name: &str) -> anyhow::Result<&'static Treatment> {
    TREATMENTS.iter().find(|t| t.name == name).with_context(|| {
        let names: Vec<&str> = TREATMENTS.iter().map(|t| t.name).collect();
        format!("unknown treatment {name:?}: use `all` or some of {}", names.join(", "))
    })
}

impl Treatment {
    /// Whether a separate process (sqlbee or bpftrace) does the watching,
    /// so the agent columns of the report apply.
    pub fn has_tracer(&self) -> bool {
        matches!(self.setup, Setup::Agent { .. } | Setup::Bpftrace { .. })
    }

    /// Start-up flags the treatment run needs (empty: the base server).
    pub fn server_flags(&self) -> &'static [&'static str] {
        match self.setup {
            Setup::ServerFlags(flags) => flags,
            _ => &[],
        }
    }

    /// Start-up flags every arm's server needs for this treatment to be
    /// turned on and off at run time.
    pub fn base_flags(&self) -> &'static [&'static str] {
        match self.setup {
            Setup::ServerSql { base, .. } => base,
            _ => &[],
        }
    }
}

/// The sqlbee binary under test and the agent flags it knows.
pub struct AgentBinary {
    pub path: PathBuf,
    help: String,
}

impl AgentBinary {
    pub fn new(path: PathBuf) -> anyhow::Result<AgentBinary> {
        let out = Command::new(&path)
            .args(["agent", "--help"])
            .output()
            .with_context(|| format!("running {} agent --help", path.display()))?;
        if !out.status.success() {
            bail!("{} agent --help failed: {}", path.display(), String::from_utf8_lossy(&out.stderr).trim());
        }
        Ok(AgentBinary { path, help: String::from_utf8_lossy(&out.stdout).into_owned() })
    }

    /// Whether `--help` lists the flag (`--name` of `--name=value`).
    fn knows(&self, flag: &str) -> bool {
        let flag = flag.split('=').next().unwrap_or(flag);
        self.help.match_indices(flag).any(|(i, _)| {
            let before = self.help[..i].chars().next_back();
            let after = self.help[i + flag.len()..].chars().next();
            before.is_none_or(|c| c.is_whitespace() || c == ',')
                && after.is_none_or(|c| !c.is_ascii_alphanumeric() && c != '-')
        })
    }

    /// The agent flags `treatment` runs with on this build.
    pub fn flags(&self, treatment: &Treatment) -> Vec<&'static str> {
        match treatment.setup {
            Setup::Agent { flags, if_known } => {
                flags.iter().chain(if_known.iter().filter(|f| self.knows(f))).copied().collect()
            }
            _ => Vec::new(),
        }
    }
}

const BPFTRACE: &str = "/usr/bin/bpftrace";
/// Printed by the program's BEGIN probe, which bpftrace fires only after
/// every other probe is attached (its "Attaching N probes..." line comes
/// before the attaching).
const BPFTRACE_READY: &str = "sqlbee-bench: attached";

/// The server process a tracer watches, and a directory for the tracer's
/// files (ready file, output, logs). A private server is one; a server in
/// a container is another, watched through its host pid.
#[derive(Clone, Copy, Debug)]
pub struct Watched<'a> {
    pub pid: u32,
    pub dir: &'a Path,
}

impl<'a> From<&'a PrivateServer> for Watched<'a> {
    fn from(server: &'a PrivateServer) -> Watched<'a> {
        Watched { pid: server.pid(), dir: server.dir() }
    }
}

/// sqlbee or bpftrace watching the server for one run, its stdout and
/// stderr in files so nothing blocks on a pipe.
pub struct Tracer {
    child: Child,
    kind: TracerKind,
    stdout: PathBuf,
    stderr: PathBuf,
}

#[derive(Clone, Copy, PartialEq)]
enum TracerKind {
    Agent,
    Bpftrace,
}

impl std::fmt::Display for TracerKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TracerKind::Agent => "sqlbee agent",
            TracerKind::Bpftrace => "bpftrace",
        })
    }
}

impl Tracer {
    /// Starts the tracer of `treatment` (None for server-side treatments)
    /// and waits until its probes are attached.
    pub fn start<'a>(
        treatment: &Treatment,
        sqlbee: &AgentBinary,
        server: impl Into<Watched<'a>>,
        tag: &str,
    ) -> anyhow::Result<Option<Tracer>> {
        let server = server.into();
        match treatment.setup {
            Setup::Agent { .. } => Self::agent(&sqlbee.path, &sqlbee.flags(treatment), "1h", server, tag).map(Some),
            Setup::Bpftrace { symbols, program } => Self::bpftrace(symbols, program, server, tag).map(Some),
            Setup::ServerSql { .. } | Setup::ServerFlags(_) => Ok(None),
        }
    }

    /// `sqlbee agent` on `server` with `flags`, closing a window every
    /// `window`, once its probes are attached.
    pub fn agent<'a>(
        sqlbee: &Path,
        flags: &[&str],
        window: &str,
        server: impl Into<Watched<'a>>,
        tag: &str,
    ) -> anyhow::Result<Tracer> {
        let server = server.into();
        let ready = server.dir.join(format!("{tag}.ready"));
        let _ = fs::remove_file(&ready);
        let (stdout, stderr) = (server.dir.join(format!("{tag}.jsonl")), server.dir.join(format!("{tag}.log")));
        // A treatment's own window wins; `{dir}` is this server's directory.
        let window: &[&str] = if flags.iter().any(|f| f.starts_with("--window")) { &[] } else { &["--window", window] };
        let flags: Vec<String> = flags.iter().map(|f| f.replace("{dir}", &server.dir.display().to_string())).collect();
        let child = Command::new(sqlbee)
            .args(["agent", "--output", "jsonl"])
            .args(window)
            .args(&flags)
            .arg(format!("--pid={}", server.pid))
            .arg("--ready-file")
            .arg(&ready)
            .stdin(Stdio::null())
            .stdout(fs::File::create(&stdout)?)
            .stderr(fs::File::create(&stderr)?)
            .spawn()
            .with_context(|| format!("starting {}", sqlbee.display()))?;
        let mut tracer = Tracer { child, kind: TracerKind::Agent, stdout, stderr };
        tracer.wait_until(|| ready.exists())?;
        Ok(tracer)
    }

    /// bpftrace running `program` on `server`, once its probes are attached.
    pub fn bpftrace(symbols: &[&str], program: &str, server: Watched, tag: &str) -> anyhow::Result<Tracer> {
        if !Path::new(BPFTRACE).exists() {
            bail!("bpftrace is not installed at {BPFTRACE}; `./x setup` installs it");
        }
        let (binary, same_root) = server_binary(server.pid)?;
        let mut text = format!("BEGIN {{ printf(\"{BPFTRACE_READY}\\n\"); }}\n{program}");
        text = text.replace("{binary}", &binary.to_string_lossy()).replace("{pid}", &server.pid.to_string());
        for name in symbols {
            text = text.replace(&format!("{{{name}}}"), &mangled_symbol(&binary, name)?);
        }
        if text.contains("tracepoint:") {
            mount_tracefs()?;
        }
        let script = server.dir.join(format!("{tag}.bt"));
        fs::write(&script, text)?;
        let (stdout, stderr) = (server.dir.join(format!("{tag}.out")), server.dir.join(format!("{tag}.err")));
        let mut cmd = Command::new(BPFTRACE);
        // `-p` makes bpftrace exit with the server; it does not scope
        // uprobes. A server in another mount namespace (a container) is
        // traced through its /proc/PID/root path and without `-p`, which
        // would also have bpftrace map probe paths into that namespace
        // (how differs between bpftrace versions); the program filters on
        // the pid either way.
        if same_root {
            cmd.arg("-p").arg(server.pid.to_string());
        }
        let child = cmd
            .arg(&script)
            .stdin(Stdio::null())
            .stdout(fs::File::create(&stdout)?)
            .stderr(fs::File::create(&stderr)?)
            .spawn()
            .context("starting bpftrace")?;
        let mut tracer = Tracer { child, kind: TracerKind::Bpftrace, stdout, stderr };
        let out = tracer.stdout.clone();
        tracer.wait_until(|| fs::read_to_string(&out).is_ok_and(|s| s.contains(BPFTRACE_READY)))?;
        Ok(tracer)
    }

    fn wait_until(&mut self, attached: impl Fn() -> bool) -> anyhow::Result<()> {
        let started = Instant::now();
        while !attached() {
            if let Some(status) = self.child.try_wait()? {
                bail!("{} exited before attaching ({status}): {}", self.kind, self.stderr_tail());
            }
            if started.elapsed() > Duration::from_secs(60) {
                bail!("{} did not attach within 60 s: {}", self.kind, self.stderr_tail());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// The last lines of stderr, without bpftrace's harmless memlock notice.
    fn stderr_tail(&self) -> String {
        let text = fs::read_to_string(&self.stderr).unwrap_or_default();
        let lines: Vec<&str> = text.lines().filter(|l| !l.contains("RLIMIT_MEMLOCK") && !l.trim().is_empty()).collect();
        let tail = lines[lines.len().saturating_sub(5)..].join(" / ");
        if tail.is_empty() { "(no error output)".into() } else { tail }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Stops the tracer the way its user would (SIGTERM for sqlbee, which
    /// writes its last window; SIGINT for bpftrace, which prints its maps)
    /// and returns how many statements it saw.
    pub fn stop(self) -> anyhow::Result<u64> {
        let kind = self.kind;
        let text = self.stop_output()?;
        Ok(if kind == TracerKind::Bpftrace { bpftrace_count(&text) } else { agent_statements(&text) })
    }

    /// As `stop`, returning what the tracer printed.
    pub fn stop_output(mut self) -> anyhow::Result<String> {
        let signal = if self.kind == TracerKind::Bpftrace { libc::SIGINT } else { libc::SIGTERM };
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(self.child.id() as i32, signal) };
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(status) = self.child.try_wait()? {
                break status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                bail!("{} did not stop within 30 s of signal {signal}", self.kind);
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        if !status.success() {
            bail!("{} exited with {status}: {}", self.kind, self.stderr_tail());
        }
        Ok(fs::read_to_string(&self.stdout).unwrap_or_default())
    }

    /// The tracer's exit status, if it has exited.
    pub fn exited(&mut self) -> anyhow::Result<Option<std::process::ExitStatus>> {
        Ok(self.child.try_wait()?)
    }
}

impl Drop for Tracer {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

const TRACEFS: &str = "/sys/kernel/tracing";

/// bpftrace finds a tracepoint's id in tracefs, which a fresh machine of
/// ours does not mount.
fn mount_tracefs() -> anyhow::Result<()> {
    if Path::new(TRACEFS).join("events").exists() {
        return Ok(());
    }
    let status = Command::new("mount").args(["-t", "tracefs", "nodev", TRACEFS]).status().context("running mount")?;
    if !status.success() {
        bail!("mounting tracefs at {TRACEFS} failed ({status}); bpftrace needs it for tracepoints");
    }
    Ok(())
}

/// A path on this host to the file process `pid` runs, and whether it is
/// the path the process itself sees (the server shares our root: the host,
/// or a chroot, whose exe link already names the host's file). A server in
/// a container names a file of its own root, reached as
/// /proc/PID/root/<path>; each candidate must be the very file running
/// (same device and inode as /proc/PID/exe) or it is not used.
fn server_binary(pid: u32) -> anyhow::Result<(PathBuf, bool)> {
    use std::os::unix::fs::MetadataExt as _;
    let exe = format!("/proc/{pid}/exe");
    let running = fs::metadata(&exe).with_context(|| format!("reading {exe}: is mysqld (pid {pid}) running?"))?;
    let link = fs::read_link(&exe).with_context(|| format!("reading the link {exe}"))?;
    let same = |path: &Path| fs::metadata(path).is_ok_and(|m| m.dev() == running.dev() && m.ino() == running.ino());
    if same(&link) {
        return Ok((link, true));
    }
    let in_root = Path::new(&format!("/proc/{pid}/root")).join(link.strip_prefix("/").unwrap_or(&link));
    if same(&in_root) {
        return Ok((in_root, false));
    }
    bail!("{exe} names {}, which is neither on this host nor in the process's root", link.display())
}

/// The mangled name of the free function `name` in `binary`'s dynamic
/// symbols: `_Z<len><name>` followed by its parameter types. Refuses
/// overloads rather than pick one silently.
fn mangled_symbol(binary: &Path, name: &str) -> anyhow::Result<String> {
    let out = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(binary)
        .output()
        .context("running nm (binutils) to find mysqld's symbols")?;
    let prefix = format!("_Z{}{name}", name.len());
    let found: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2))
        .filter(|s| s.starts_with(&prefix))
        .map(str::to_string)
        .collect();
    match found.as_slice() {
        [one] => Ok(one.clone()),
        [] => bail!("{} exports no function {name}: this treatment expects MariaDB's dispatch path", binary.display()),
        many => bail!(
            "{} has several overloads of {name} ({}); name one in the treatment table",
            binary.display(),
            many.join(", ")
        ),
    }
}

/// Statements in the agent's summary lines, summed over windows.
fn agent_statements(jsonl: &str) -> u64 {
    let key = "\"statements\":";
    jsonl
        .lines()
        .filter(|l| l.contains("\"type\":\"summary\""))
        .filter_map(|l| {
            let i = l.find(key)? + key.len();
            l[i..].split(|c: char| !c.is_ascii_digit()).next()?.parse::<u64>().ok()
        })
        .sum()
}

/// What bpftrace printed at exit: `@: N` for a count, or the bucket counts
/// of a histogram (`[2K, 4K)   17 |@@@ |`) added up.
fn bpftrace_count(out: &str) -> u64 {
    out.lines()
        .filter_map(|l| {
            if let Some(n) = l.strip_prefix("@: ") {
                return n.trim().parse::<u64>().ok();
            }
            let (_, rest) = l.strip_prefix('[')?.split_once(')')?;
            rest.split_whitespace().next()?.parse().ok()
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bpftrace_output_is_counted() {
        assert_eq!(bpftrace_count("Attaching 2 probes...\n\n\n@: 3\n"), 3);
        let hist = "@lat: \n[2K, 4K)               1 |@@@@      |\n[4K, 8K)               0 |          |\n[128K, 256K)           2 |@@@@@@@@@@|\n";
        assert_eq!(bpftrace_count(hist), 3);
    }

    #[test]
    fn optional_agent_flags_follow_the_build() {
        let agent = AgentBinary {
            path: PathBuf::new(),
            help: "      --no-wait-probes\n          Do not attach\n      --window <WINDOW>\n".into(),
        };
        assert!(agent.knows("--no-wait-probes") && agent.knows("--window"));
        assert!(!agent.knows("--wait-probes") && !agent.knows("--all-probes") && !agent.knows("--win"));
        assert!(agent.flags(treatment("sqlbee-events").unwrap()).is_empty(), "a build without --kernel-digests");
        let newer = AgentBinary { path: PathBuf::new(), help: "      --kernel-digests <KERNEL_DIGESTS>\n".into() };
        assert_eq!(newer.flags(treatment("sqlbee-events").unwrap()), ["--kernel-digests=0"]);
        assert!(agent.flags(treatment("sqlbee-all").unwrap()).is_empty());
        assert_eq!(
            agent.flags(treatment("sqlbee-budget").unwrap()),
            ["--mysqld-overhead-budget", "1%", "--window=10s"]
        );
        assert_eq!(agent.flags(treatment("sqlbee-waits").unwrap()), ["--wait-probes"]);
        assert_eq!(newer.flags(treatment("sqlbee-waits").unwrap()), ["--wait-probes"]);
    }

    #[test]
    fn every_treatment_has_a_unique_name() {
        for (i, t) in TREATMENTS.iter().enumerate() {
            assert!(TREATMENTS[..i].iter().all(|u| u.name != t.name), "{} twice", t.name);
            assert!(t.name != "control" && t.name != "all", "{} is reserved", t.name);
        }
    }
}
