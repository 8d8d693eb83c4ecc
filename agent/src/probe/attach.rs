//! One server process: its own copy of the kernel programs and maps,
//! attached with per-process scope. Dropping it detaches every probe.
use std::{
    io,
    num::NonZeroU32,
    os::fd::AsFd as _,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, MapData, PerCpuArray, PerCpuValues, RingBuf},
    programs::{
        UProbe,
        uprobe::{UProbeAttachLocation, UProbeLinkId, UProbeScope},
    },
};
use sqlbee_kernel_abi::{COMMAND_SLOTS, LongWait, MAX_TEXT, ServerLayout, StatBlock, kernel_digests::known_sets};

use tracing::{debug, info, warn};

use super::{
    Counters, ErrorMessage, ProbeError, Statement,
    clients::Clients,
    decode_error, decode_statement,
    kernel_digests::{KernelDigest, KernelDigests},
    link_mode::object_name,
    names::Names,
    programs::{
        LeftOut, Loaded, ProgramSet, REQUIRED, Refusal, SEND_TRACEPOINT_PROGRAM, kernel_release, lost_without,
        partners, refusal_reason, refused_on_purpose, without,
    },
    send_hook::{SendHook, with_send_hook},
    skipped_runs,
    values::Values,
};
use crate::discover::{BinaryInfo, ProbePoint, ServerProcess};

/// The kernel object built by `build.rs`.
pub(super) static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/agent-ebpf"));

#[derive(Clone, Debug)]
pub struct ProbeConfig {
    /// Text bytes copied per statement (at most `MAX_TEXT`).
    pub text_limit: u32,
    /// Ring buffer size in bytes (a power of two, at least one page).
    pub ring_bytes: u32,
    /// Attach the wait-class probes (`thd_wait_begin`/`thd_wait_end`).
    pub waits: bool,
    /// Attach the command-start probe (`dispatch_command`): exact counts
    /// of commands that are not statements, at a second trap per command.
    pub commands: bool,
    /// Report each wait at least this long (us) on its own; 0: never.
    pub long_wait_us: u32,
    /// Statements at least this long always come as records (0: off).
    pub long_statement_ms: u32,
    /// Slots of the kernel digests; 0 sends every statement.
    pub digest_slots: u32,
    /// Budget mode: the probes' CPU as a fraction of mysqld's (0.01 = 1%).
    pub overhead_budget: Option<f64>,
    /// Budget mode: one attach/detach cycle.
    pub duty_period: Duration,
    /// Offset of `se.sum_exec_runtime` in this kernel's `task_struct` (0:
    /// unknown, CPU time left out).
    pub task_runtime_offset: u32,
    /// The kernel has `bpf_get_current_task_btf` (see `ServerLayout::task_btf`).
    pub task_btf: bool,
    /// Name each connection's client (see `clients`).
    pub clients: bool,
    /// Time what a replica applies (see `replication` in the kernel
    /// programs).
    pub replica: bool,
    /// With it, a client's connection attributes are read too.
    pub client_login: Option<crate::server_login::ServerLogin>,
    /// Load the value probes, attached while `capture_values` asks: the
    /// values prepared statements ran with, for their plans.
    pub values: bool,
    /// Which of the server's figures the programs read (`--figures`).
    pub figures: super::FigureChoice,
    /// Where statements end (`--statement-hook`).
    pub statement_hook: super::StatementHook,
    /// Offset of `thread.fsbase` in this kernel's `task_struct` (0:
    /// unknown, so no send hook).
    pub task_fsbase_offset: u32,
}

pub struct AttachedServer {
    pub server: ServerProcess,
    pub binary: BinaryInfo,
    /// Which figures the loaded programs read (see `Readable`).
    pub readable: super::Readable,
    /// The programs loaded, and those this kernel refused.
    pub programs: Arc<ProgramSet>,
    // Field order matters on drop: maps taken out of `ebpf` go first.
    events: RingBuf<MapData>,
    errors: RingBuf<MapData>,
    long_waits: RingBuf<MapData>,
    names_ring: RingBuf<MapData>,
    values_ring: RingBuf<MapData>,
    applied: RingBuf<MapData>,
    /// The event classes' virtual tables in this process, to name what
    /// the replica-apply probes report.
    event_classes: Vec<(u64, crate::discover::EventClass)>,
    /// Where the values a prepared statement ran with are decoded, when the
    /// value probes are loaded; else why not.
    value_decoders: Result<Vec<crate::discover::ValueDecoder>, &'static str>,
    values: Values,
    value_link: Option<UProbeLinkId>,
    /// What the schema and account hashes in records stand for.
    names: Names,
    /// Each connection's client, when they are named.
    clients: Option<Clients>,
    /// Budget mode's switch: closed, the programs count nothing.
    gate: Array<MapData, u32>,
    kernel_digests: Option<KernelDigests>,
    /// Where each loaded program goes, and its link while attached.
    points: Vec<(&'static str, ProbePoint)>,
    links: Vec<(&'static str, UProbeLinkId)>,
    /// `--statement-hook send`: statements end at a syscall tracepoint's
    /// program instead of at the uprobe.
    send_hook: Option<SendHook>,
    /// Links handed to the detach thread and not closed yet.
    detaching: Arc<AtomicUsize>,
    /// Error messages waiting for their statement, by (thread, time
    /// raised); bounded.
    messages: std::collections::HashMap<(u32, u64), ErrorMessage>,
    /// Statements of connections whose client waits for its connection
    /// attributes, released once it is named; bounded.
    held: Vec<Statement>,
    ebpf: Ebpf,
}

/// Error messages kept while their statement has not been drained yet.
const MAX_PENDING_MESSAGES: usize = 4096;
/// Statements held for their connection's attributes at most; past this,
/// every waiting connection is named without them.
const MAX_HELD: usize = 50_000;

impl AttachedServer {
    pub fn attach(server: ServerProcess, binary: BinaryInfo, config: ProbeConfig) -> Result<Self, ProbeError> {
        let pid = server.pid;
        let base = binary.programs.and_then(|p| with_programs(pid, binary.layout, &p)).unwrap_or(binary.layout);
        let event_classes = match &binary.apply {
            Ok(apply) => {
                if apply.rows_changed.is_none() {
                    info!(pid, "the rows a replica's events change cannot be read in this build; they are left out");
                }
                if apply.channel.is_none() {
                    info!(pid, "a replica's channels cannot be told apart in this build; they count as one");
                }
                apply_classes(pid, apply)
            }
            Err(why) => {
                info!(pid, why = %why, "what this server applies as a replica cannot be read in its build");
                Vec::new()
            }
        };
        let base = match &binary.apply {
            Ok(apply) if config.replica && binary.points.apply.is_some() && !event_classes.is_empty() => {
                with_apply(base, apply, &event_classes)
            }
            _ => base,
        };
        let layout = ServerLayout { nested_probes: u32::from(binary.points.nested.is_some()), ..base };
        let layout = ServerLayout {
            text_limit: config.text_limit.min(MAX_TEXT as u32),
            long_wait_us: config.long_wait_us,
            long_statement_ms: config.long_statement_ms,
            command_probe: config.commands as u32,
            digest_slots: config.digest_slots,
            wait_probes: u32::from(config.waits && binary.points.waits.is_some()),
            known_sets: known_sets(config.digest_slots.max(1)),
            task_runtime_offset: config.task_runtime_offset,
            task_btf: u32::from(config.task_btf),
            // The name is cached on the probe of THD::set_db: without it,
            // no schema.
            db_offset: if binary.points.schema_change.is_some() {
                layout.db_offset
            } else {
                sqlbee_kernel_abi::UNKNOWN
            },
            // Known only when each connection's client is named.
            vio_offset: if config.clients && layout.sctx_offset != sqlbee_kernel_abi::UNKNOWN {
                layout.vio_offset
            } else {
                sqlbee_kernel_abi::UNKNOWN
            },
            ..layout
        };
        let layout = config.figures.narrow(layout);
        let layout =
            if config.statement_hook.at_send() { with_send_hook(pid, layout, &binary, &config)? } else { layout };
        if config.figures != super::FigureChoice::ALL {
            info!(pid, left_out = ?config.figures.left_out(), "figures not read (--figures)");
        }
        let (mut ebpf, layout, points, programs, send_hook) = load_programs(pid, layout, &binary, &config)?;
        // Before any program runs (none is attached yet): they set the maps up.
        let kernel_digests = (config.digest_slots > 0)
            .then(|| KernelDigests::new(&mut ebpf, config.digest_slots, layout.known_sets))
            .transpose()?;
        let clients = (layout.vio_offset != sqlbee_kernel_abi::UNKNOWN)
            .then(|| Clients::new(&mut ebpf, pid, config.client_login.clone()))
            .transpose()?;
        let mut programs = programs;
        let value_decoders = value_decoders(&mut ebpf, &config, &binary, pid, &mut programs)?;
        let values = Values::new(match &value_decoders {
            Ok(decoders) => decoders
                .iter()
                .filter_map(|d| Some((crate::discover::runtime_address(pid, d.probe)?, d.value_type)))
                .collect(),
            Err(_) => Default::default(),
        });
        let events =
            ebpf.take_map("EVENTS").ok_or_else(|| ProbeError::Map { map: "EVENTS", detail: "not in object".into() })?;
        let events = RingBuf::try_from(events).map_err(|e| ProbeError::Map { map: "EVENTS", detail: e.to_string() })?;
        let errors =
            ebpf.take_map("ERRORS").ok_or_else(|| ProbeError::Map { map: "ERRORS", detail: "not in object".into() })?;
        let errors = RingBuf::try_from(errors).map_err(|e| ProbeError::Map { map: "ERRORS", detail: e.to_string() })?;
        let long_waits = ebpf
            .take_map("LONG_WAITS")
            .ok_or_else(|| ProbeError::Map { map: "LONG_WAITS", detail: "not in object".into() })?;
        let long_waits =
            RingBuf::try_from(long_waits).map_err(|e| ProbeError::Map { map: "LONG_WAITS", detail: e.to_string() })?;
        let names_ring =
            ebpf.take_map("NAMES").ok_or_else(|| ProbeError::Map { map: "NAMES", detail: "not in object".into() })?;
        let names_ring =
            RingBuf::try_from(names_ring).map_err(|e| ProbeError::Map { map: "NAMES", detail: e.to_string() })?;
        let values_ring =
            ebpf.take_map("VALUES").ok_or_else(|| ProbeError::Map { map: "VALUES", detail: "not in object".into() })?;
        let values_ring =
            RingBuf::try_from(values_ring).map_err(|e| ProbeError::Map { map: "VALUES", detail: e.to_string() })?;
        let applied = ebpf
            .take_map("APPLIED")
            .ok_or_else(|| ProbeError::Map { map: "APPLIED", detail: "not in object".into() })?;
        let applied =
            RingBuf::try_from(applied).map_err(|e| ProbeError::Map { map: "APPLIED", detail: e.to_string() })?;
        let gate =
            ebpf.take_map("GATE").ok_or_else(|| ProbeError::Map { map: "GATE", detail: "not in object".into() })?;
        let gate = Array::try_from(gate).map_err(|e| ProbeError::Map { map: "GATE", detail: e.to_string() })?;
        let mut attached = Self {
            server,
            readable: super::Readable::of(&layout),
            programs: Arc::new(programs),
            binary,
            events,
            errors,
            long_waits,
            names_ring,
            values_ring,
            applied,
            event_classes,
            value_decoders,
            values,
            value_link: None,
            names: Names::default(),
            clients,
            gate,
            kernel_digests,
            points,
            links: Vec::new(),
            send_hook,
            detaching: Arc::new(AtomicUsize::new(0)),
            messages: Default::default(),
            held: Vec::new(),
            ebpf,
        };
        attached.set_attached(true)?;
        Ok(attached)
    }

    /// Moves every record waiting in the ring buffer into `out`; returns
    /// how many records could not be decoded.
    pub fn drain(&mut self, out: &mut Vec<Statement>, waits: &mut Vec<LongWait>) -> u64 {
        let mut bad = 0;
        // Long waits before statements, so a waiting statement finds its
        // wait already known downstream.
        while let Some(record) = self.long_waits.next() {
            if record.len() >= std::mem::size_of::<LongWait>() {
                // SAFETY: length checked; plain integers.
                waits.push(unsafe { std::ptr::read_unaligned(record.as_ptr().cast()) });
            } else {
                bad += 1;
            }
        }
        // Names first: a record's schema and account are named before it.
        bad += learn_names(&mut self.names_ring, &mut self.names);
        if let Some(clients) = &mut self.clients {
            clients.name_new_connections(&mut self.names);
        }
        self.release_held(out, false);
        let first = out.len();
        // Errors first: a statement's error is written before the
        // statement itself, so its message is here when the statement is.
        while let Some(record) = self.errors.next() {
            match decode_error(&record) {
                Some(message) => {
                    if self.messages.len() >= MAX_PENDING_MESSAGES {
                        // Only samples whose statement never came: drop them.
                        self.messages.clear();
                    }
                    self.messages.insert((message.tid, message.raised_ns), message);
                }
                None => bad += 1,
            }
        }
        while let Some(record) = self.events.next() {
            match decode_statement(&record) {
                Some(mut statement) => {
                    if statement.text_hash != 0 && !statement.sample {
                        // Downstream learns the hash's digest from this
                        // record only when its later statements will come
                        // as kernel digests. A change (DDL, SET GLOBAL,
                        // GRANT, ...) is an event of its own each time it
                        // runs: its text never goes to the kernel's count.
                        let registered = match &mut self.kernel_digests {
                            Some(_) if crate::normalize::change_of(&statement.text, None).is_some() => false,
                            Some(kernel_digests) => kernel_digests.register(statement.text_hash).unwrap_or_else(|e| {
                                warn!(pid = self.server.pid, error = %e, "registering a text hash failed");
                                false
                            }),
                            None => false,
                        };
                        if !registered {
                            statement.text_hash = 0;
                        }
                    }
                    // A name is written before the first record that
                    // carries its hash, but may have come after the loop
                    // above: read the ring again rather than name the
                    // schema unknown (a kernel digest would keep that name
                    // for every later statement of its text).
                    if !self.names.knows_schema(statement.schema_hash)
                        || (statement.nested && !self.names.knows_program(statement.program_hash))
                    {
                        bad += learn_names(&mut self.names_ring, &mut self.names);
                    }
                    statement.schema = self.names.schema(statement.schema_hash);
                    statement.account = self.names.account(statement.account_hash);
                    if let Some(clients) = &self.clients {
                        statement.client = clients.client(statement.account_hash, statement.connection_id);
                    }
                    if statement.nested {
                        statement.program =
                            Some(Arc::new(self.names.program(statement.program_hash, statement.program_kind)));
                    }
                    if statement.error_code != 0
                        && let Some(message) = self.messages.remove(&(statement.tid, statement.error_ns))
                        && message.code == statement.error_code
                    {
                        statement.error_message = Some(message.message);
                    }
                    out.push(statement)
                }
                None => bad += 1,
            }
        }
        // After the statements: every value of a statement drained above
        // was written before it, so it is in the ring by now.
        while let Some(record) = self.values_ring.next() {
            self.values.learn(&record);
        }
        self.values.pair(&mut out[first..]);
        self.name_late_clients(out, first);
        bad
    }

    /// Moves every event the replica applied into `out`; returns how many
    /// records could not be decoded.
    pub fn drain_applied(&mut self, out: &mut Vec<super::Applied>) -> u64 {
        let mut bad = 0;
        while let Some(record) = self.applied.next() {
            match super::decode_applied(&record, &self.event_classes) {
                Some(applied) => out.push(applied),
                None => bad += 1,
            }
        }
        bad
    }

    /// Why this server's prepared statements cannot get their values, if
    /// they cannot.
    pub fn values_unavailable(&self) -> Option<&'static str> {
        self.value_decoders.as_ref().err().copied()
    }

    /// Whether the value probes are attached.
    pub fn capturing_values(&self) -> bool {
        self.value_link.is_some()
    }

    /// Prepared statements' values drained so far.
    pub fn values_learned(&self) -> u64 {
        self.values.learned
    }

    /// Attaches or detaches the value probes (loaded once), which then copy
    /// at most `at_most` values (spread over the CPUs). They attach only
    /// while the other probes are attached.
    pub fn capture_values(&mut self, on: bool, at_most: u64) -> Result<(), ProbeError> {
        let pid = self.server.pid;
        const PROGRAM: &str = "value_set";
        if !on {
            if let Some(link) = self.value_link.take() {
                uprobe(&mut self.ebpf, PROGRAM, pid)?.detach(link).map_err(|source| ProbeError::Program {
                    pid,
                    program: PROGRAM,
                    source,
                })?;
            }
            return Ok(());
        }
        let Ok(decoders) = &self.value_decoders else { return Ok(()) };
        if self.value_link.is_some() || self.links.is_empty() {
            return Ok(());
        }
        let name = "VALUES_LEFT";
        let cpus = aya::util::nr_cpus().map_err(|(_, e)| ProbeError::Map { map: name, detail: e.to_string() })?;
        let cpus = cpus.get() as usize;
        let per_cpu = at_most.div_ceil(cpus as u64);
        let map =
            self.ebpf.map_mut(name).ok_or_else(|| ProbeError::Map { map: name, detail: "not in object".into() })?;
        let mut left =
            PerCpuArray::<_, u64>::try_from(map).map_err(|e| ProbeError::Map { map: name, detail: e.to_string() })?;
        let values = PerCpuValues::try_from(vec![per_cpu; cpus])
            .map_err(|e| ProbeError::Map { map: name, detail: e.to_string() })?;
        left.set(0, values, 0).map_err(|e| ProbeError::Map { map: name, detail: e.to_string() })?;
        let scope = UProbeScope::OneProcess(NonZeroU32::new(pid).expect("pids are positive"));
        let locations: Vec<UProbeAttachLocation> =
            decoders.iter().map(|d| UProbeAttachLocation::SymbolOffset(d.symbol, d.offset)).collect();
        let target = &self.server.binary;
        let link = uprobe(&mut self.ebpf, PROGRAM, pid)?.attach(locations, target, scope).map_err(|source| {
            ProbeError::Attach {
                pid,
                program: PROGRAM,
                symbol: "Item_param::set_param_*",
                binary: target.display().to_string(),
                source,
            }
        })?;
        self.value_link = Some(link);
        Ok(())
    }

    /// The names ring's fd, to wait on for new connections when clients are
    /// named (the kernel wakes it for each).
    pub fn names_fd(&self) -> Option<std::os::fd::RawFd> {
        use std::os::fd::AsRawFd;
        self.clients.as_ref().map(|_| self.names_ring.as_raw_fd())
    }

    /// Learns what waits in the names ring and names the new connections'
    /// clients, between drains.
    pub fn name_clients_now(&mut self) {
        let Some(clients) = &mut self.clients else { return };
        while let Some(record) = self.names_ring.next() {
            self.names.learn(&record);
        }
        clients.name_new_connections(&mut self.names);
    }

    /// Names the clients of statements whose connection was named after
    /// the names were drained above (its name record and the statement's
    /// were written in between).
    fn name_late_clients(&mut self, out: &mut Vec<Statement>, first: usize) {
        let Some(clients) = &mut self.clients else { return };
        let mut unnamed = out[first..].iter_mut().filter(|s| s.client.is_none() && s.connection_id != 0).peekable();
        if unnamed.peek().is_none() {
            return;
        }
        learn_names(&mut self.names_ring, &mut self.names);
        clients.name_new_connections(&mut self.names);
        let mut waiting = false;
        for statement in unnamed {
            statement.client = clients.client(statement.account_hash, statement.connection_id);
            if statement.account.is_none() {
                statement.account = self.names.account(statement.account_hash);
            }
            waiting |= statement.client.is_none() && clients.is_awaiting(statement.connection_id);
        }
        if waiting {
            let (kept, held): (Vec<Statement>, Vec<Statement>) = out
                .drain(first..)
                .partition(|s| s.client.is_some() || s.connection_id == 0 || !clients.is_awaiting(s.connection_id));
            out.extend(kept);
            self.held.extend(held);
            if self.held.len() > MAX_HELD {
                self.release_held(out, true);
            }
        }
    }

    /// Statements held for their connection's attributes whose client is
    /// now named (all of them, when `all`: their connections are named with
    /// what is known) into `out`.
    fn release_held(&mut self, out: &mut Vec<Statement>, all: bool) {
        let Some(clients) = &mut self.clients else { return };
        if self.held.is_empty() {
            return;
        }
        if all {
            clients.settle_all(&mut self.names);
        }
        for mut statement in std::mem::take(&mut self.held) {
            if clients.is_awaiting(statement.connection_id) {
                self.held.push(statement);
                continue;
            }
            statement.client = clients.client(statement.account_hash, statement.connection_id);
            if statement.account.is_none() {
                statement.account = self.names.account(statement.account_hash);
            }
            out.push(statement);
        }
    }

    /// The statements still held, released with the clients known now (the
    /// last drain, once the programs are gone).
    pub fn release_all_held(&mut self, out: &mut Vec<Statement>) {
        self.release_held(out, true);
    }

    /// Closes the kernel digests' epoch (see [`KernelDigests::flip`]).
    pub fn flip(&mut self, out: &mut Vec<KernelDigest>, forgotten: &mut Vec<u64>) -> Result<(), ProbeError> {
        let first = out.len();
        match &mut self.kernel_digests {
            Some(kernel_digests) => kernel_digests.flip(out, forgotten)?,
            None => return Ok(()),
        }
        self.name_accounts(&mut out[first..]);
        Ok(())
    }

    /// Names the accounts of kernel digests, with the names drained so far.
    fn name_accounts(&mut self, digests: &mut [KernelDigest]) {
        while let Some(record) = self.names_ring.next() {
            self.names.learn(&record);
        }
        if let Some(clients) = &mut self.clients {
            clients.name_new_connections(&mut self.names);
        }
        for digest in digests {
            digest.name_accounts(&self.names, self.clients.as_ref());
        }
    }

    /// Attaches or detaches every program (loaded once, so re-attaching
    /// costs no verification). Detached, the server runs untouched.
    pub fn set_attached(&mut self, attach: bool) -> Result<(), ProbeError> {
        let pid = self.server.pid;
        if !attach {
            self.capture_values(false, 0)?;
            for (program, link) in self.links.drain(..) {
                uprobe(&mut self.ebpf, program, pid)?.detach(link).map_err(|source| ProbeError::Program {
                    pid,
                    program,
                    source,
                })?;
            }
            if let Some(send_hook) = &mut self.send_hook {
                send_hook.detach(&mut self.ebpf, pid)?;
            }
            return Ok(());
        }
        self.attach_links()
    }

    fn set_gate(&mut self, open: bool) -> Result<(), ProbeError> {
        self.gate.set(0, &u32::from(!open), 0).map_err(|e| ProbeError::Map { map: "GATE", detail: e.to_string() })
    }

    /// Detaches without waiting: the kernel removes the breakpoints at once
    /// but then waits for every handler still running to finish, which on
    /// a saturated host took seconds; a helper thread does that waiting.
    /// The gate closes first, so nothing is counted from now on.
    pub fn detach_in_background(&mut self) -> Result<(), ProbeError> {
        let pid = self.server.pid;
        self.set_gate(false)?;
        let value_link = self.value_link.take().map(|link| ("value_set", link));
        for (program, link) in self.links.drain(..).chain(value_link) {
            let link = uprobe(&mut self.ebpf, program, pid)?.take_link(link).map_err(|source| ProbeError::Program {
                pid,
                program,
                source,
            })?;
            release_later(Box::new(link), self.detaching.clone());
        }
        if let Some(send_hook) = &mut self.send_hook {
            let (taken, error) = send_hook.take_links(&mut self.ebpf, pid);
            for link in taken {
                release_later(link, self.detaching.clone());
            }
            if let Some(e) = error {
                return Err(e);
            }
        }
        Ok(())
    }

    /// Detached, and the kernel has let go of every probe.
    pub fn detach_settled(&self) -> bool {
        self.links.is_empty()
            && !self.send_hook.as_ref().is_some_and(SendHook::attached)
            && self.detaching.load(std::sync::atomic::Ordering::Acquire) == 0
    }

    /// Attaches again unless a background detach is still running: the
    /// kernel holds its trace-event lock while it waits, so attaching now
    /// would wait too. False when it did not attach (try again later).
    pub fn try_reattach(&mut self) -> Result<bool, ProbeError> {
        if self.detaching.load(std::sync::atomic::Ordering::Acquire) > 0 {
            return Ok(false);
        }
        self.attach_links()?;
        self.set_gate(true)?;
        Ok(true)
    }

    fn attach_links(&mut self) -> Result<(), ProbeError> {
        let pid = self.server.pid;
        // Each half on its own: a failed attach of one leaves the other
        // attached, and the next attempt completes the set.
        let scope = UProbeScope::OneProcess(NonZeroU32::new(pid).expect("pids are positive"));
        let uprobes_attached = !self.links.is_empty();
        for (program, point) in self.points.clone().into_iter().filter(|_| !uprobes_attached) {
            let symbol = point.symbol;
            let target = &self.server.binary;
            let location = UProbeAttachLocation::SymbolOffset(symbol, point.offset);
            let link = uprobe(&mut self.ebpf, program, pid)?.attach([location], target, scope).map_err(|source| {
                ProbeError::Attach { pid, program, symbol, binary: target.display().to_string(), source }
            })?;
            self.links.push((program, link));
        }
        if let Some(send_hook) = &mut self.send_hook
            && let Some(fallback) = send_hook.attach(&mut self.ebpf, pid)?
        {
            let mut programs = (*self.programs).clone();
            // The tracepoint program stays loaded, unused: it is not listed.
            programs.loaded.retain(|l| l.program != SEND_TRACEPOINT_PROGRAM);
            programs.loaded.push(fallback);
            self.programs = Arc::new(programs);
        }
        Ok(())
    }

    /// Tells the programs the agent's shedding step (no-op without
    /// the kernel digests, whose maps carry it).
    pub fn set_shedding(&mut self, step: u32) -> Result<(), ProbeError> {
        match &mut self.kernel_digests {
            Some(kernel_digests) => kernel_digests.set_shedding(step),
            None => Ok(()),
        }
    }

    /// Detaches every program, so that what is read afterwards is final.
    pub fn detach_programs(&mut self) {
        if let Err(e) = self.set_attached(false) {
            warn!(pid = self.server.pid, error = %e, "detaching failed");
        }
    }

    /// Run time and runs of each loaded program so far (BPF run-time
    /// statistics; zero unless they are enabled).
    pub fn program_stats(&self) -> Vec<(&'static str, Duration, u64)> {
        self.program_names()
            .filter_map(|name| {
                let info = self.ebpf.program(object_name(name))?.info().ok()?;
                Some((name, info.run_time(), info.run_count()))
            })
            .collect()
    }

    /// The names of the loaded programs.
    fn program_names(&self) -> impl Iterator<Item = &'static str> + '_ {
        let values = self.value_decoders.is_ok().then_some("value_set");
        let send = self.send_hook.as_ref().map(SendHook::program);
        self.points.iter().map(|(name, _)| *name).chain(values).chain(send)
    }

    /// Runs of this server's programs the kernel skipped so far (see
    /// `skipped_runs`); None when the kernel does not count them.
    fn skipped_runs(&self) -> Option<u64> {
        // Uprobes test `bpf_prog_active` only before 6.0, and tracepoints
        // always; kernels before 6.7 skip either's runs uncounted.
        let tracepoint = self.send_hook.as_ref().is_some_and(|h| h.program() == SEND_TRACEPOINT_PROGRAM);
        let counted_from = if tracepoint { (6, 7) } else { (6, 0) };
        if !crate::discover::running_kernel_at_least(counted_from) {
            return None;
        }
        let mut total = Some(0u64);
        for name in self.program_names() {
            let Some(program) = self.ebpf.program(object_name(name)) else { continue };
            match program.fd().map_err(io::Error::other).and_then(|fd| skipped_runs::of_program(fd.as_fd())) {
                Ok(skipped) => total = total.zip(skipped).map(|(a, b)| a + b),
                Err(e) => {
                    debug!(pid = self.server.pid, program = name, error = %e, "could not read a program's skipped runs");
                    return None;
                }
            }
        }
        total
    }

    /// Both epochs of the kernel digests, after `detach_programs`.
    pub fn collect_all(&mut self, out: &mut Vec<KernelDigest>) -> Result<(), ProbeError> {
        let first = out.len();
        match &mut self.kernel_digests {
            Some(kernel_digests) => kernel_digests.collect_all(out)?,
            None => return Ok(()),
        }
        self.name_accounts(&mut out[first..]);
        Ok(())
    }

    pub fn counters(&self) -> Result<Counters, ProbeError> {
        let commands = sum_per_cpu(&self.ebpf, "COMMANDS", COMMAND_SLOTS)?;
        let mut counters = Counters::from_stats(commands, &sum_stats(&self.ebpf)?);
        counters.skipped_runs = self.skipped_runs();
        Ok(counters)
    }
}

/// Loads the value program when values are wanted and this kernel and
/// build allow them; the decoders, or why there are none.
fn value_decoders(
    ebpf: &mut Ebpf,
    config: &ProbeConfig,
    binary: &BinaryInfo,
    pid: u32,
    programs: &mut ProgramSet,
) -> Result<Result<Vec<crate::discover::ValueDecoder>, &'static str>, ProbeError> {
    if !config.values {
        return Ok(Err("plans are off"));
    }
    if !super::multi_links() {
        return Ok(Err("this kernel has no multi-uprobe links (6.6 or later), which the value probe needs"));
    }
    if binary.points.values.is_empty() {
        return Ok(Err("this build exports no Item_param::set_param_* decoders"));
    }
    let program = "value_set";
    match try_load(ebpf, program, pid)? {
        Ok(done) => {
            programs.loaded.push(done);
            Ok(Ok(binary.points.values.clone()))
        }
        Err(refusal) => {
            warn!(pid, program, kernel = kernel_release(), reason = %refusal.reason, lost = lost_without(program),
                "the kernel refused an optional program; going on without it");
            programs.left_out.push(LeftOut { program, reason: refusal.reason, lost: lost_without(program) });
            Ok(Err("this kernel refused the value probe (see the agent's log)"))
        }
    }
}

/// Loads the server's programs: the optional ones first, then the
/// statement program with a layout that relies only on what loaded. A
/// refused optional program is left out (with its partner) and the set
/// loaded again without it; a refused statement program is the error.
/// Returns the loaded object, the layout it was loaded with, the points to
/// attach, what was loaded and left out, and the send hook's program.
fn load_programs(
    pid: u32,
    full: ServerLayout,
    binary: &BinaryInfo,
    config: &ProbeConfig,
) -> Result<(Ebpf, ServerLayout, Vec<(&'static str, ProbePoint)>, ProgramSet, Option<SendHook>), ProbeError> {
    let mut left_out: Vec<LeftOut> = Vec::new();
    loop {
        let layout = without(full, &left_out);
        let points: Vec<(&'static str, ProbePoint)> = probe_points(binary, config, &layout)
            .into_iter()
            .filter(|(program, _)| !left_out.iter().any(|l| l.program == *program))
            .collect();
        let mut ebpf = EbpfLoader::new()
            .override_global("LAYOUT", &layout, true)
            .map_max_entries("EVENTS", config.ring_bytes)
            .map_max_entries("KNOWN", layout.known_sets)
            .map_max_entries("DIGEST_SLOTS", config.digest_slots.max(1) * 2)
            .load(EBPF_OBJECT)
            .map_err(|source| ProbeError::Load { pid, source })?;
        let mut loaded = Vec::new();
        let mut refused = None;
        // The statement program last: its layout depends on the others.
        let order = points.iter().filter(|(p, _)| *p != REQUIRED).chain(points.iter().filter(|(p, _)| *p == REQUIRED));
        for (program, _) in order {
            match try_load(&mut ebpf, program, pid)? {
                Ok(done) => loaded.push(done),
                Err(refusal) if *program == REQUIRED => {
                    return Err(ProbeError::Refused {
                        pid,
                        program,
                        kernel: kernel_release(),
                        reason: refusal.reason,
                        source: refusal.source,
                    });
                }
                Err(refusal) => {
                    refused = Some((*program, refusal));
                    break;
                }
            }
        }
        let Some((program, refusal)) = refused else {
            let send_hook = if layout.send_tgid != 0 {
                let (send_hook, done) = SendHook::load(&mut ebpf, pid, config.statement_hook, &layout)?;
                loaded.push(done);
                Some(send_hook)
            } else {
                None
            };
            return Ok((ebpf, layout, points, ProgramSet { loaded, left_out }, send_hook));
        };
        warn!(pid, program, kernel = kernel_release(), reason = %refusal.reason, lost = lost_without(program),
            "the kernel refused an optional program; going on without it");
        if let Some(source) = &refusal.source {
            debug!(pid, program, log = %source, "the verifier's whole answer");
        }
        let mut gone: Vec<&'static str> = partners(program).to_vec();
        if gone.is_empty() {
            gone.push(program);
        }
        for g in gone {
            let reason = if g == program { refusal.reason.clone() } else { format!("left out with {program}") };
            left_out.push(LeftOut { program: g, reason, lost: lost_without(g) });
        }
    }
}

/// The programs a server gets and where each attaches, as this build,
/// the options and `layout` allow.
fn probe_points(binary: &BinaryInfo, config: &ProbeConfig, layout: &ServerLayout) -> Vec<(&'static str, ProbePoint)> {
    let mut points = vec![("error_raised", binary.points.error_raised)];
    // With the send hook, statements end at the answer's syscall instead.
    if layout.send_tgid == 0 {
        points.insert(0, (REQUIRED, binary.points.statement_end));
    }
    if config.commands {
        points.push(("command_start", binary.points.command_start));
    }
    if let Some((begin, end)) = binary.points.waits.filter(|_| layout.wait_probes != 0) {
        points.extend([("wait_begin", begin), ("wait_end", end)]);
    }
    // `USE` is rare next to statements: one trap each spares every
    // statement a read of the schema's name. Without the probe the name
    // could change in place unseen, so the schema is left out.
    match binary.points.schema_change {
        Some(point) if layout.db_offset != sqlbee_kernel_abi::UNKNOWN => points.push(("schema_change", point)),
        _ => {}
    }
    // Statements of stored programs: two traps each, none for a
    // statement that runs no program.
    if let Some((start, end)) = binary.points.nested.filter(|_| layout.nested_probes != 0) {
        points.extend([("nested_start", start), ("nested_end", end)]);
    }
    // Logins and changes of user are rare: one trap each keeps the
    // account of a connection right after a COM_CHANGE_USER.
    if let Some(point) = binary.points.account_change.filter(|_| layout.sctx_offset != sqlbee_kernel_abi::UNKNOWN) {
        points.push(("account_change", point));
    }
    // Events a replica applies: a client's statement never passes there,
    // so a primary pays nothing for them.
    if let Some(point) = binary.points.apply.filter(|_| layout.apply_probes != 0) {
        points.extend([("apply_start", point), ("apply_end", point)]);
    }
    points
}

/// Loads one program, timing the verifier. `Err(Refusal)` when the kernel
/// (or a test build, on purpose) refused it; other failures are errors.
fn try_load(ebpf: &mut Ebpf, program: &'static str, pid: u32) -> Result<Result<Loaded, Refusal>, ProbeError> {
    if refused_on_purpose(program) {
        return Ok(Err(Refusal { reason: "refused on purpose (SQLBEE_TEST_REFUSE_PROGRAMS)".into(), source: None }));
    }
    let started = std::time::Instant::now();
    let probe = uprobe(ebpf, program, pid)?;
    match probe.load() {
        Ok(()) => {
            let load_time = started.elapsed();
            let verified_insns = probe.info().ok().and_then(|info| info.verified_instruction_count());
            Ok(Ok(Loaded { program, verified_insns, load_time }))
        }
        Err(source) => Ok(Err(Refusal { reason: refusal_reason(&source), source: Some(source) })),
    }
}

/// The event classes' virtual tables located in this process; empty when
/// they cannot be.
fn apply_classes(pid: u32, apply: &crate::discover::ApplyLayout) -> Vec<(u64, crate::discover::EventClass)> {
    apply
        .classes
        .iter()
        .map(|(table, class)| Some((crate::discover::runtime_address(pid, *table)?, *class)))
        .collect::<Option<Vec<_>>>()
        .unwrap_or_default()
}

/// The layout with how the replica-apply probes read an event.
fn with_apply(
    layout: ServerLayout,
    apply: &crate::discover::ApplyLayout,
    classes: &[(u64, crate::discover::EventClass)],
) -> ServerLayout {
    let mut rows_vtables = [0; sqlbee_kernel_abi::ROWS_VTABLES];
    let rows = classes.iter().filter(|(_, class)| *class == crate::discover::EventClass::Rows);
    for (slot, (table, _)) in rows_vtables.iter_mut().zip(rows) {
        *slot = *table;
    }
    let (event_thd_offset, row_counter_offsets) = apply.rows_changed.unwrap_or((sqlbee_kernel_abi::UNKNOWN, [0; 3]));
    let unknown = sqlbee_kernel_abi::UNKNOWN;
    let (rgi_rli_offset, rli_mi_offset, mi_channel_offset) =
        apply.channel.map_or((unknown, unknown, unknown), |c| (c.rgi_rli, c.rli_mi, c.mi_name));
    let gtid_vtable = classes.iter().find(|(_, class)| *class == crate::discover::EventClass::Gtid).map_or(0, |c| c.0);
    ServerLayout {
        gtid_vtable,
        rgi_rli_offset,
        rli_mi_offset,
        mi_channel_offset,
        apply_probes: 1,
        event_thd_offset,
        row_counter_offsets,
        event_when_offset: apply.when,
        rows_type_offset: apply.rows_type,
        rows_table_offset: apply.rows_table,
        table_share_offset: apply.table_share,
        share_db_offset: apply.share_db,
        rows_vtables,
        ..layout
    }
}

/// The server's layout with where its running program is named, the
/// handlers' addresses located in this process; None when they cannot be.
fn with_programs(pid: u32, layout: ServerLayout, programs: &crate::discover::ProgramLayout) -> Option<ServerLayout> {
    let locate = |v| crate::discover::runtime_address(pid, v);
    Some(ServerLayout {
        spcont_offset: programs.spcont,
        rcontext_sp_offset: programs.rcontext_sp,
        sp_db_offset: programs.sp_db,
        sp_name_offset: programs.sp_name,
        sp_handler_offset: programs.sp_handler,
        sp_flags_offset: programs.sp_flags,
        handler_procedure: locate(programs.procedure)?,
        handler_function: locate(programs.function)?,
        handler_trigger: locate(programs.trigger)?,
        ..layout
    })
}

type Release = (Box<dyn Send>, Arc<AtomicUsize>);

/// Drops what it is given on a thread of its own (see
/// `AttachedServer::detach_in_background`); `pending` counts the drops
/// not done yet.
fn release_later(item: Box<dyn Send>, pending: Arc<AtomicUsize>) {
    static REAPER: std::sync::OnceLock<std::sync::Mutex<std::sync::mpsc::Sender<Release>>> = std::sync::OnceLock::new();
    let sender = REAPER.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel::<Release>();
        let spawned = std::thread::Builder::new().name("detach".into()).spawn(move || {
            for (item, pending) in rx {
                let started = std::time::Instant::now();
                drop(item);
                pending.fetch_sub(1, Ordering::AcqRel);
                tracing::debug!(took_ms = started.elapsed().as_millis() as u64, "detached a probe");
            }
        });
        if let Err(e) = spawned {
            warn!(error = %e, "no detach thread; detaching waits in place");
        }
        std::sync::Mutex::new(tx)
    });
    pending.fetch_add(1, Ordering::AcqRel);
    if let Err(std::sync::mpsc::SendError((item, pending))) =
        sender.lock().unwrap_or_else(|e| e.into_inner()).send((item, pending))
    {
        drop(item);
        pending.fetch_sub(1, Ordering::AcqRel);
    }
}

fn uprobe<'a>(ebpf: &'a mut Ebpf, program: &'static str, pid: u32) -> Result<&'a mut UProbe, ProbeError> {
    ebpf.program_mut(object_name(program))
        .ok_or_else(|| ProbeError::Map { map: program, detail: "program not in object".into() })?
        .try_into()
        .map_err(|source| ProbeError::Program { pid, program, source })
}

/// Every CPU's health counters added up.
fn sum_stats(ebpf: &Ebpf) -> Result<StatBlock, ProbeError> {
    let name = "STATS";
    let map = ebpf.map(name).ok_or_else(|| ProbeError::Map { map: name, detail: "not in object".into() })?;
    let array =
        PerCpuArray::<_, StatBlock>::try_from(map).map_err(|e| ProbeError::Map { map: name, detail: e.to_string() })?;
    let blocks = array.get(&0, 0).map_err(|e| ProbeError::Map { map: name, detail: e.to_string() })?;
    Ok(blocks.iter().fold(StatBlock::default(), |mut total, block| {
        total.iter_mut().zip(block).for_each(|(sum, n)| *sum += n);
        total
    }))
}

fn sum_per_cpu(ebpf: &Ebpf, name: &'static str, slots: u32) -> Result<Vec<u64>, ProbeError> {
    let map = ebpf.map(name).ok_or_else(|| ProbeError::Map { map: name, detail: "not in object".into() })?;
    let array =
        PerCpuArray::<_, u64>::try_from(map).map_err(|e| ProbeError::Map { map: name, detail: e.to_string() })?;
    (0..slots)
        .map(|i| {
            array
                .get(&i, 0)
                .map(|values| values.iter().sum())
                .map_err(|e| ProbeError::Map { map: name, detail: e.to_string() })
        })
        .collect()
}

/// Takes what the names ring holds; returns how many records were not
/// names.
fn learn_names(ring: &mut RingBuf<MapData>, names: &mut Names) -> u64 {
    let mut bad = 0;
    while let Some(record) = ring.next() {
        if !names.learn(&record) {
            bad += 1;
        }
    }
    bad
}
