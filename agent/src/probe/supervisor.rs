//! Keeps the set of attached servers equal to the set of running ones:
//! attaches new servers, re-attaches restarted ones (new pid or start
//! time), detaches vanished ones after a last drain. A server it cannot
//! trace is kept in view: reported in every window (`untraced`) and tried
//! again on a back-off, since a new build or a file may yet appear.
use std::{
    collections::HashMap,
    os::fd::OwnedFd,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant, SystemTime},
};

use tracing::{debug, info, warn};

use super::{AttachedServer, ProbeBatch, ProbeConfig, ProbeError, Stopped, UntracedServer, calibrate, link_mode};
use crate::{
    budget::{
        DutyConfig, Overhead, ProbeCost, QueryCounter,
        calibrate::{FALLBACK_TRAP, trap_cost},
    },
    discover::{BinaryIdentity, BinaryInfo, ServerProcess, identify_binary, inspect_binary},
};

/// First retry of a server that could not be traced, doubled per failure
/// up to `RETRY_MAX`: a server whose build cannot be traced costs one ELF
/// read per retry, never a busy loop.
const RETRY_FIRST: Duration = Duration::from_secs(10);
const RETRY_MAX: Duration = Duration::from_secs(600);

/// How long the value probes stay attached per capture at most, how many
/// values they copy at most (the kernel side stops there; once the agent
/// has them it detaches early), and how often a server gets a capture that
/// caught values: while attached, every value of every prepared statement traps
/// once more, and its statement goes out as a record. A capture that
/// caught nothing cost nothing, and the next may come sooner.
const VALUE_CAPTURE: Duration = Duration::from_secs(2);
const VALUE_CAPTURE_MAX: u64 = 2_000;
const VALUE_CAPTURE_EVERY: Duration = Duration::from_secs(60);
const VALUE_CAPTURE_AGAIN: Duration = Duration::from_secs(5);

/// One server's value captures.
struct ValueCapture {
    began: Instant,
    /// `values_learned` when it began.
    learned: u64,
    /// When the next may begin.
    next: Instant,
}

/// A server that could not be traced and when to try it again.
struct Refusal {
    untraced: UntracedServer,
    next_try: Instant,
}

impl Refusal {
    fn retry_after(attempts: u32) -> Duration {
        RETRY_FIRST.saturating_mul(1 << attempts.saturating_sub(1).min(10)).min(RETRY_MAX)
    }
}

pub struct Supervisor {
    config: ProbeConfig,
    attached: HashMap<u32, AttachedServer>,
    overheads: HashMap<u32, Overhead>,
    /// Servers we failed to attach to, by (pid, start time): reported in
    /// every window and retried on a back-off.
    refused: HashMap<(u32, u64), Refusal>,
    /// Measured trap price in ns; 0 until measured (`FALLBACK_TRAP` then).
    trap: Arc<AtomicU64>,
    /// Keeps BPF run-time statistics on while the agent runs.
    _stats: Option<OwnedFd>,
    /// See `calibrate::hold_task_events_on`; none with multi links.
    _task_events: Option<OwnedFd>,
    /// Shedding step passed to every server's programs.
    shedding: u32,
    /// Ring-buffer drops seen at the last window end, per server.
    dropped: HashMap<u32, u64>,
    dropped_since_check: bool,
    /// Program runs the kernel skipped, as of the last window end, per server.
    skipped: HashMap<u32, u64>,
    /// Each server's last value capture.
    value_captures: HashMap<u32, ValueCapture>,
    /// When the running servers were last listed (`reconcile`).
    last_scan: SystemTime,
}

impl Supervisor {
    pub fn new(config: ProbeConfig, stats: Option<OwnedFd>) -> Self {
        // Only classic uprobes make per-task perf events; for them one is
        // held open (see `hold_task_events_on`). Multi links need none.
        let task_events = if link_mode::multi_links() {
            None
        } else {
            // The first one on a host can wait seconds for the kernel.
            debug!("opening the per-task perf event");
            calibrate::hold_task_events_on()
                .map_err(|e| warn!(error = %e, "no per-task perf event; attaching may wait for the kernel under load"))
                .ok()
        };
        // Measured off the probe thread: attaching to the servers must not
        // wait for it (a statement running at start is timed from its own
        // start only if the probes are in place before it ends).
        let trap = Arc::new(AtomicU64::new(0));
        let measured = trap.clone();
        let spawned =
            std::thread::Builder::new().name("calibrate".into()).spawn(
                move || match calibrate::CalibrationProbe::load().and_then(|mut probe| trap_cost(&mut probe)) {
                    Ok(cost) => {
                        info!(trap_ns = cost.as_nanos() as u64, "measured the price of one uprobe trap on this host");
                        measured.store(cost.as_nanos() as u64, Ordering::Relaxed);
                    }
                    Err(e) => {
                        warn!(error = %e, fallback_ns = FALLBACK_TRAP.as_nanos() as u64, "trap calibration failed")
                    }
                },
            );
        if let Err(e) = spawned {
            warn!(error = %e, "no calibration thread; the trap price is assumed");
        }
        Self {
            config,
            attached: HashMap::new(),
            overheads: HashMap::new(),
            refused: HashMap::new(),
            trap,
            _stats: stats,
            _task_events: task_events,
            shedding: 0,
            dropped: HashMap::new(),
            dropped_since_check: false,
            skipped: HashMap::new(),
            value_captures: HashMap::new(),
            last_scan: SystemTime::now(),
        }
    }

    /// Attaches the value probes of the servers in `wanted` (for
    /// `VALUE_CAPTURE`, at most once per `VALUE_CAPTURE_EVERY`) and detaches
    /// them when the time is up. Returns why a wanted server cannot give
    /// values, for those that cannot.
    pub fn capture_values(&mut self, wanted: &[u32]) -> HashMap<u32, &'static str> {
        let now = Instant::now();
        let mut unavailable = HashMap::new();
        self.value_captures.retain(|pid, _| self.attached.contains_key(pid));
        for (pid, server) in &mut self.attached {
            let capture = self.value_captures.get_mut(pid);
            if server.capturing_values() {
                let caught = capture.as_ref().map_or(0, |c| server.values_learned() - c.learned);
                let over = capture.as_ref().is_none_or(|c| now.duration_since(c.began) >= VALUE_CAPTURE);
                if over || caught >= VALUE_CAPTURE_MAX {
                    info!(pid, caught, "value capture over");
                    if let Some(capture) = capture {
                        capture.next = now + if caught > 0 { VALUE_CAPTURE_EVERY } else { VALUE_CAPTURE_AGAIN };
                    }
                    if let Err(e) = server.capture_values(false, 0) {
                        warn!(pid, error = %e, "detaching the value probes failed");
                    }
                }
                continue;
            }
            if !wanted.contains(pid) {
                continue;
            }
            if let Some(why) = server.values_unavailable() {
                unavailable.insert(*pid, why);
                continue;
            }
            if capture.is_some_and(|c| now < c.next) {
                continue;
            }
            self.value_captures.insert(*pid, ValueCapture { began: now, learned: server.values_learned(), next: now });
            match server.capture_values(true, VALUE_CAPTURE_MAX) {
                Ok(()) => {
                    info!(pid, seconds = VALUE_CAPTURE.as_secs(), "capturing prepared statements' values for plans")
                }
                Err(e) => warn!(pid, error = %e, "attaching the value probes failed"),
            }
        }
        unavailable
    }

    pub fn attached(&self) -> impl Iterator<Item = &ServerProcess> {
        self.attached.values().map(|a| &a.server)
    }

    /// The traced servers with what was learned of each one's binary.
    pub fn traced(&self) -> impl Iterator<Item = (&ServerProcess, &BinaryInfo)> {
        self.attached.values().map(|a| (&a.server, &a.binary))
    }

    /// Attaches one server now, returning the error instead of logging it.
    pub fn attach(&mut self, server: ServerProcess) -> Result<(), ProbeError> {
        let started = Instant::now();
        let binary = inspect_binary(&server.binary)?;
        let inspected_ms = started.elapsed().as_millis() as u64;
        for (fields, why) in &binary.missing_fields {
            warn!(pid = server.pid, fields, why = %why, "this build's figures are left out of every record, not guessed");
        }
        if !binary.single_stepped.is_empty() {
            warn!(pid = server.pid, points = ?binary.single_stepped,
                "probe points start with an instruction the kernel must single-step; each hit costs ~15x more");
        }
        let pid = server.pid;
        debug!(pid, layout = ?binary.layout, "layout learned from the binary");
        let mut attached = AttachedServer::attach(server, binary, self.config.clone())?;
        attached.set_shedding(self.shedding)?;
        let budget = self.config.overhead_budget.map(|budget| DutyConfig { budget, period: self.config.duty_period });
        let counter = attached.binary.query_counter.and_then(|v| QueryCounter::locate(pid, v));
        if counter.is_none() {
            warn!(
                pid,
                "cannot read the server's query counter (global_query_id): windows carry no server count, \
                and budget mode scales its samples by attached time"
            );
        }
        self.overheads.insert(pid, Overhead::new(pid, self.trap.clone(), budget, counter, Instant::now()));
        // What verifying each program took: a restarted server is traced
        // again only after it.
        let programs: Vec<String> = attached
            .programs
            .loaded
            .iter()
            .map(|l| {
                let insns = l.verified_insns.map_or("?".to_string(), |n| n.to_string());
                format!("{}:{insns}insns/{}ms", l.program, l.load_time.as_millis())
            })
            .collect();
        let left_out: Vec<&str> = attached.programs.left_out.iter().map(|l| l.program).collect();
        info!(pid, instance = %attached.server.instance, binary = %attached.server.binary.display(),
            build_id = attached.binary.build_id.as_deref().unwrap_or("-"),
            query_offset = attached.binary.layout.query_offset, inspected_ms,
            attached_ms = started.elapsed().as_millis() as u64, programs = programs.join(" "),
            left_out = left_out.join(" "), "attached");
        self.attached.insert(pid, attached);
        Ok(())
    }

    /// Brings the attached set in line with `running`; batches of servers
    /// that went away are appended to `out`.
    pub fn reconcile(&mut self, running: &[ServerProcess], out: &mut Vec<ProbeBatch>) {
        let gone: Vec<u32> = self
            .attached
            .iter()
            .filter(|(pid, a)| !running.iter().any(|s| s.pid == **pid && s.start_ticks == a.server.start_ticks))
            .map(|(pid, _)| *pid)
            .collect();
        let noticed = SystemTime::now();
        for pid in gone {
            if let Some(mut attached) = self.attached.remove(&pid) {
                self.dropped.remove(&pid);
                self.skipped.remove(&pid);
                let mut last = final_batch(&mut attached, self.overheads.remove(&pid));
                // Every attached server was running at the rescan before.
                last.stopped = Some(Stopped { last_seen: self.last_scan, noticed });
                out.push(last);
                info!(pid, instance = %attached.server.instance, "server went away; detached");
            }
        }
        self.last_scan = noticed;
        self.refused.retain(|(pid, ticks), _| running.iter().any(|s| s.pid == *pid && s.start_ticks == *ticks));
        let now = Instant::now();
        for server in running {
            let key = (server.pid, server.start_ticks);
            if self.attached.contains_key(&server.pid) || self.refused.get(&key).is_some_and(|r| r.next_try > now) {
                continue;
            }
            let earlier = self.refused.remove(&key);
            match self.attach(server.clone()) {
                Ok(()) => {
                    if let Some(r) = earlier {
                        info!(pid = server.pid, instance = %server.instance, attempts = r.untraced.attempts + 1,
                            "traced after all");
                    }
                }
                Err(err) => {
                    let attempts = earlier.as_ref().map_or(0, |r| r.untraced.attempts) + 1;
                    let retry = Refusal::retry_after(attempts);
                    let reason = err.to_string();
                    match &earlier {
                        Some(r) if r.untraced.reason == reason => {
                            debug!(
                                pid = server.pid,
                                attempts,
                                retry_s = retry.as_secs(),
                                "still cannot trace this server"
                            )
                        }
                        _ => warn!(pid = server.pid, instance = %server.instance, error = %err, kind = err.kind(),
                            retry_s = retry.as_secs(), "cannot trace this server; reported in every window and tried again"),
                    }
                    let binary =
                        earlier.as_ref().map_or_else(|| identify_binary(&server.binary), |r| r.untraced.binary.clone());
                    let since = earlier.as_ref().map_or_else(SystemTime::now, |r| r.untraced.since);
                    let untraced =
                        UntracedServer { server: server.clone(), reason, kind: err.kind(), binary, since, attempts };
                    self.refused.insert(key, Refusal { untraced, next_try: now + retry });
                }
            }
        }
    }

    /// Servers found but not traced, with why (stable order: by pid).
    pub fn untraced(&self) -> Vec<UntracedServer> {
        let mut out: Vec<UntracedServer> = self.refused.values().map(|r| r.untraced.clone()).collect();
        out.sort_by_key(|u| u.server.pid);
        out
    }

    /// Drains every attached server; at a window end (`window_end`) also
    /// closes the kernel digests' epoch and reads the counters.
    pub fn drain(&mut self, window_end: bool, out: &mut Vec<ProbeBatch>) {
        let now = Instant::now();
        for (pid, attached) in self.attached.iter_mut() {
            if let Some(overhead) = self.overheads.get_mut(pid)
                && let Some(on) = overhead.tick(now)
            {
                let switched =
                    if on { attached.try_reattach() } else { attached.detach_in_background().map(|()| true) };
                match switched {
                    Ok(true) if on => overhead.attached(Instant::now()),
                    Ok(true) => {}
                    Ok(false) => overhead.stay_detached(now),
                    Err(e) => warn!(pid, error = %e, attach = on, "budget mode could not switch the probes"),
                }
            }
            if let Some(overhead) = self.overheads.get_mut(pid)
                && attached.detach_settled()
            {
                overhead.detached();
            }
            let (mut kernel, mut forgotten) = (Vec::new(), Vec::new());
            if window_end && let Err(e) = attached.flip(&mut kernel, &mut forgotten) {
                warn!(pid = attached.server.pid, error = %e, "reading kernel digests failed");
            }
            let (mut statements, mut long_waits) = (Vec::new(), Vec::new());
            let mut applied = Vec::new();
            let bad = attached.drain(&mut statements, &mut long_waits) + attached.drain_applied(&mut applied);
            if bad > 0 {
                warn!(pid = attached.server.pid, bad, "undecodable ring buffer records");
            }
            let counters = if window_end { read_counters(attached) } else { None };
            if let Some(c) = &counters
                && self.dropped.insert(*pid, c.dropped).is_some_and(|before| c.dropped > before)
            {
                self.dropped_since_check = true;
            }
            if let Some(now) = counters.as_ref().and_then(|c| c.skipped_runs) {
                let before = self.skipped.insert(*pid, now).unwrap_or(0);
                if now > before {
                    warn!(
                        pid = *pid,
                        skipped = now - before,
                        "the kernel skipped runs of the programs (another BPF program or a bpf() call was in progress \
                         on that CPU): the statement counts may be short by up to this many"
                    );
                }
            }
            let cost = counters.as_ref().and_then(|c| {
                Some(self.overheads.get_mut(pid)?.close_window(program_totals(attached), c.statements, now))
            });
            if statements.is_empty()
                && long_waits.is_empty()
                && applied.is_empty()
                && counters.is_none()
                && kernel.is_empty()
            {
                continue;
            }
            out.push(ProbeBatch {
                server: attached.server.clone(),
                binary: identity(attached),
                readable: attached.readable,
                programs: attached.programs.clone(),
                statements,
                long_waits,
                applied,
                counters,
                kernel,
                forgotten,
                cost,
                detached: false,
                stopped: None,
            });
        }
    }

    /// Waits `interval` for the next drain; meanwhile names the clients of
    /// new connections as the kernel announces them, so a connection that
    /// lasts a few milliseconds is named while its socket is still open.
    pub fn wait_naming_clients(&mut self, interval: Duration) {
        let deadline = Instant::now() + interval;
        loop {
            let mut fds: Vec<libc::pollfd> = self
                .attached
                .values()
                .filter_map(|a| a.names_fd())
                .map(|fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 })
                .collect();
            let left = deadline.saturating_duration_since(Instant::now());
            if fds.is_empty() {
                std::thread::sleep(left);
                return;
            }
            if left.is_zero() {
                return;
            }
            let ms = left.as_millis().clamp(1, i32::MAX as u128) as i32;
            // SAFETY: `fds` is a live array of `fds.len()` pollfds.
            let ready = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
            if ready < 0 {
                // Interrupted: wait out the rest without naming early.
                std::thread::sleep(deadline.saturating_duration_since(Instant::now()));
                return;
            }
            if ready > 0 {
                for attached in self.attached.values_mut() {
                    attached.name_clients_now();
                }
                // Records that need no wakeup keep the ring readable until
                // the next drain: wait a little before looking again.
                std::thread::sleep(Duration::from_millis(1).min(deadline.saturating_duration_since(Instant::now())));
            }
        }
    }

    /// Whether any ring buffer dropped records since the last call.
    pub fn take_dropped(&mut self) -> bool {
        std::mem::take(&mut self.dropped_since_check)
    }

    /// Passes the agent's shedding step to every server's programs.
    pub fn set_shedding(&mut self, step: u32) {
        if step == self.shedding {
            return;
        }
        self.shedding = step;
        for (pid, attached) in self.attached.iter_mut() {
            if let Err(e) = attached.set_shedding(step) {
                warn!(pid, error = %e, step, "could not pass the shedding step on");
            }
        }
    }

    /// Drains and detaches everything (shutdown).
    pub fn detach_all(&mut self, out: &mut Vec<ProbeBatch>) {
        for (pid, mut attached) in self.attached.drain() {
            out.push(final_batch(&mut attached, self.overheads.remove(&pid)));
        }
    }
}

fn read_counters(attached: &AttachedServer) -> Option<crate::probe::Counters> {
    match attached.counters() {
        Ok(c) => Some(c),
        Err(err) => {
            warn!(pid = attached.server.pid, error = %err, "reading kernel counters failed");
            None
        }
    }
}

fn identity(attached: &AttachedServer) -> BinaryIdentity {
    BinaryIdentity { build_id: attached.binary.build_id.clone(), version: attached.binary.version.clone() }
}

/// Run time of all of a server's programs so far, and their runs that
/// trapped in the server (what the cost adds a trap's price for).
fn program_totals(attached: &AttachedServer) -> (Duration, u64) {
    attached.program_stats().iter().fold((Duration::ZERO, 0), |(t, n), (name, time, runs)| {
        (t + *time, n + if super::programs::traps(name) { *runs } else { 0 })
    })
}

/// Everything left, read after the programs are gone so that counters,
/// records and kernel digests agree exactly.
fn final_batch(attached: &mut AttachedServer, overhead: Option<Overhead>) -> ProbeBatch {
    let programs = program_totals(attached);
    attached.detach_programs();
    let (mut statements, mut long_waits) = (Vec::new(), Vec::new());
    attached.drain(&mut statements, &mut long_waits);
    let mut applied = Vec::new();
    attached.drain_applied(&mut applied);
    attached.release_all_held(&mut statements);
    let counters = read_counters(attached);
    let mut kernel = Vec::new();
    if let Err(e) = attached.collect_all(&mut kernel) {
        warn!(pid = attached.server.pid, error = %e, "reading kernel digests failed");
    }
    let cost: Option<ProbeCost> =
        overhead.zip(counters.as_ref()).map(|(mut o, c)| o.close_window(programs, c.statements, Instant::now()));
    ProbeBatch {
        server: attached.server.clone(),
        binary: identity(attached),
        readable: attached.readable,
        programs: attached.programs.clone(),
        statements,
        long_waits,
        applied,
        counters,
        kernel,
        forgotten: Vec::new(),
        cost,
        detached: true,
        stopped: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn untraced_servers_are_retried_on_a_doubling_back_off() {
        let waits: Vec<u64> = (1..=9).map(|n| Refusal::retry_after(n).as_secs()).collect();
        assert_eq!(waits, [10, 20, 40, 80, 160, 320, 600, 600, 600]);
        assert_eq!(Refusal::retry_after(u32::MAX), RETRY_MAX);
    }
}
