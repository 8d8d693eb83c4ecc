//! Keeps the set of attached servers equal to the set of running ones:
//! attaches new servers, re-attaches restarted ones (new pid or start
//! time), detaches vanished ones after a last drain.
use std::collections::HashMap;

use tracing::{info, warn};

use super::{AttachedServer, ProbeBatch, ProbeConfig, ProbeError};
use crate::discover::{ServerProcess, inspect_binary};

pub struct Supervisor {
    config: ProbeConfig,
    attached: HashMap<u32, AttachedServer>,
    /// Servers we failed to attach to, so the error is logged once per life.
    refused: HashMap<(u32, u64), String>,
}

impl Supervisor {
    pub fn new(config: ProbeConfig) -> Self {
        Self { config, attached: HashMap::new(), refused: HashMap::new() }
    }

    pub fn attached(&self) -> impl Iterator<Item = &ServerProcess> {
        self.attached.values().map(|a| &a.server)
    }

    /// Attaches one server now, returning the error instead of logging it.
    pub fn attach(&mut self, server: ServerProcess) -> Result<(), ProbeError> {
        let started = std::time::Instant::now();
        let binary = inspect_binary(&server.binary)?;
        let inspected_ms = started.elapsed().as_millis() as u64;
        if !binary.single_stepped.is_empty() {
            warn!(pid = server.pid, points = ?binary.single_stepped,
                "probe points start with an instruction the kernel must single-step; each hit costs ~15x more");
        }
        let pid = server.pid;
        let attached = AttachedServer::attach(server, binary, self.config)?;
        info!(pid, instance = %attached.server.instance, binary = %attached.server.binary.display(),
            build_id = attached.binary.build_id.as_deref().unwrap_or("-"),
            query_offset = attached.binary.layout.query_offset, inspected_ms,
            attached_ms = started.elapsed().as_millis() as u64, "attached");
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
        for pid in gone {
            if let Some(mut attached) = self.attached.remove(&pid) {
                out.push(final_batch(&mut attached));
                info!(pid, instance = %attached.server.instance, "server went away; detached");
            }
        }
        self.refused.retain(|(pid, ticks), _| running.iter().any(|s| s.pid == *pid && s.start_ticks == *ticks));
        for server in running {
            if self.attached.contains_key(&server.pid) || self.refused.contains_key(&(server.pid, server.start_ticks)) {
                continue;
            }
            let key = (server.pid, server.start_ticks);
            if let Err(err) = self.attach(server.clone()) {
                warn!(pid = server.pid, error = %err, "cannot trace this server");
                self.refused.insert(key, err.to_string());
            }
        }
    }

    /// Drains every attached server; at a window end (`window_end`) also
    /// closes the kernel aggregates' epoch and reads the counters.
    pub fn drain(&mut self, window_end: bool, out: &mut Vec<ProbeBatch>) {
        for attached in self.attached.values_mut() {
            let (mut kernel, mut forgotten) = (Vec::new(), Vec::new());
            if window_end && let Err(e) = attached.flip(&mut kernel, &mut forgotten) {
                warn!(pid = attached.server.pid, error = %e, "reading kernel aggregates failed");
            }
            let (mut statements, mut long_waits) = (Vec::new(), Vec::new());
            let bad = attached.drain(&mut statements, &mut long_waits);
            if bad > 0 {
                warn!(pid = attached.server.pid, bad, "undecodable ring buffer records");
            }
            let counters = if window_end { read_counters(attached) } else { None };
            if statements.is_empty() && long_waits.is_empty() && counters.is_none() && kernel.is_empty() {
                continue;
            }
            out.push(ProbeBatch {
                server: attached.server.clone(),
                statements,
                long_waits,
                counters,
                kernel,
                forgotten,
                detached: false,
            });
        }
    }

    /// Drains and detaches everything (shutdown).
    pub fn detach_all(&mut self, out: &mut Vec<ProbeBatch>) {
        for (_, mut attached) in self.attached.drain() {
            out.push(final_batch(&mut attached));
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

/// Everything left, read after the programs are gone so that counters,
/// records and kernel aggregates agree exactly.
fn final_batch(attached: &mut AttachedServer) -> ProbeBatch {
    attached.detach_programs();
    let (mut statements, mut long_waits) = (Vec::new(), Vec::new());
    attached.drain(&mut statements, &mut long_waits);
    let counters = read_counters(attached);
    let mut kernel = Vec::new();
    if let Err(e) = attached.collect_all(&mut kernel) {
        warn!(pid = attached.server.pid, error = %e, "reading kernel aggregates failed");
    }
    ProbeBatch {
        server: attached.server.clone(),
        statements,
        long_waits,
        counters,
        kernel,
        forgotten: Vec::new(),
        detached: true,
    }
}
