//! Per-window statistics per server instance per digest.
//!
//! Owns the windows and their bounds: at most `max_digests` digests per
//! instance per window, the rest go to an explicit overflow row that is
//! still counted. Exact command totals come from the kernel counters, not
//! from the events, so they stay exact when events were dropped.
mod changes;
mod commands;
#[cfg(any(test, feature = "test-support"))]
pub mod fixtures;
mod locks;
mod long;
pub mod replication;
mod tags;
#[cfg(test)]
mod tests;

use sqlbee_kernel_abi::{FigureSums, wait_class};
use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
    time::SystemTime,
};

pub use changes::{ChangeRecord, SettingValue};
pub use commands::command_name;
use commands::{COM_QUERY, COM_STMT_EXECUTE};
use locks::LockTracker;
pub use locks::{Blocker, LockWaitRecord};
pub use long::{DeadlockPartner, LongStatement, LongStatements, Outcome};
use sqlbee_vocabulary::histogram::Histogram;
pub use tags::{Exemplar, MAX_TAG_VALUES, RowTags, TagValues};

use sqlbee_kernel_abi::kernel_digests::FIRST_AGENT_BUCKET;
use tracing::warn;

use crate::{
    budget::ProbeCost,
    normalize::{Digest, Normalizer, QueryTags, Samples, TagReader},
    probe::{Account, Client, Counters, KernelDigest, ProbeBatch, Program, Readable, Statement},
};

/// Longest sample text kept per digest.
pub const MAX_SAMPLE: usize = 1024;
/// Digest id of the overflow row.
pub const OVERFLOW_DIGEST: u64 = sqlbee_vocabulary::digest_id::OVERFLOW_ID;
/// Accounts told apart per digest per window; statements of further ones
/// are counted in `other_accounts`.
pub const MAX_ACCOUNTS: usize = 32;
/// Clients told apart per digest per window; statements of further ones
/// are counted in `other_clients`.
pub const MAX_CLIENTS: usize = 32;

/// Where a row's statements came from: a client (top level), a stored
/// program (nested: which one, and the digest of the client statement that
/// ran it), the replica applier or the event scheduler.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Lineage {
    /// `sqlbee_kernel_abi::source`.
    pub source: u32,
    pub nested: bool,
    pub program: Option<Arc<Program>>,
    /// None for a top-level row, an event's statements, or a nested
    /// statement whose parent's record never came.
    pub parent_digest: Option<u64>,
}

impl Lineage {
    /// `client`, `replica` or `event`.
    pub fn source_name(&self) -> &'static str {
        match self.source {
            sqlbee_kernel_abi::source::REPLICA => "replica",
            sqlbee_kernel_abi::source::EVENT => "event",
            _ => "client",
        }
    }
}

/// A digest row's key: the schema it ran in (none: no current database),
/// its digest, as in performance_schema, and its lineage.
pub type DigestKey = (Option<Arc<str>>, u64, Lineage);

/// One digest's row in one instance's window, as the agent keeps it (its
/// wire form is `sqlbee.v1.DigestStats`).
#[derive(Clone, Debug)]
pub struct DigestRow {
    pub digest: u64,
    pub digest_text: Arc<str>,
    /// The current database the statements ran in.
    pub schema: Option<Arc<str>>,
    /// Top level, or which program ran them for which client statement.
    pub lineage: Lineage,
    /// The server's figures summed over the statements (with CPU time).
    pub stats: FigureSums,
    /// Statements per account, at most `MAX_ACCOUNTS`; the rest of `count`
    /// had an account beyond those, or none the agent could name.
    pub accounts: HashMap<Arc<Account>, u64>,
    /// Statements per client, at most `MAX_CLIENTS`; the rest of `count`
    /// came from a client beyond those, or one the agent could not name.
    pub clients: HashMap<Arc<Client>, u64>,
    /// Statements per value of each query tag, and the slowest traced one.
    pub tags: RowTags,
    pub count: u64,
    pub errors: u64,
    pub error_codes: BTreeMap<u32, u64>,
    pub sum_ns: u64,
    pub min_ns: u64,
    pub max_ns: u64,
    pub histogram: Histogram,
    pub sample: String,
    /// One statement's text as the server had it, for EXPLAIN (kept only
    /// when plans are on; see `RawSample`).
    pub raw_sample: Option<RawSample>,
    /// The tables the digest reads and writes, when they go out with this
    /// window (set by the pipeline's `normalize::Describer`).
    pub tables: Option<Arc<crate::normalize::Tables>>,
    pub truncated: u64,
    /// Per wait class (`sqlbee_kernel_abi::wait_class`).
    pub waits: [WaitStats; wait_class::COUNT],
    /// One message per error code.
    pub error_messages: BTreeMap<u32, String>,
}

/// A statement's text exactly as the server had it, literals and all. It
/// exists for one reason, EXPLAIN, and lives in the agent's memory only:
/// no output, spool or batch reads it, and its `Debug` shows its length,
/// never its text. A prepared statement's sample has the values it ran
/// with in place of its placeholders when the probe stage caught them.
#[derive(Clone, PartialEq, Eq)]
pub struct RawSample {
    pub text: Arc<[u8]>,
    /// A prepared statement's text with its values bound in.
    pub bound: bool,
}

impl std::fmt::Debug for RawSample {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RawSample({} bytes, bound: {})", self.text.len(), self.bound)
    }
}

impl RawSample {
    /// The statement's whole text, with its values when it has them, or
    /// None when the capture cut it (a part of a statement cannot be
    /// explained).
    fn of(statement: &Statement) -> Option<RawSample> {
        if statement.truncated || statement.text.is_empty() {
            return None;
        }
        if let Some(values) = &statement.values
            && let Some(bound) = crate::normalize::bind(&statement.text, &values.0)
        {
            return Some(RawSample { text: bound.into(), bound: true });
        }
        Some(RawSample { text: statement.text.as_slice().into(), bound: false })
    }

    /// The newer sample, unless only the older one has its values bound.
    fn newer(new: Option<RawSample>, old: Option<RawSample>) -> Option<RawSample> {
        match (new, old) {
            (Some(new), Some(old)) if old.bound && !new.bound => Some(old),
            (new, old) => new.or(old),
        }
    }
}

/// Time statements of one digest spent in one wait class.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WaitStats {
    pub sum_ns: u64,
    /// Longest total wait of a single statement.
    pub max_ns: u64,
    /// Statements that waited at all.
    pub statements: u64,
}

impl DigestRow {
    fn new(digest: &Digest, schema: Option<Arc<str>>, lineage: Lineage) -> Self {
        Self {
            digest: digest.id,
            digest_text: digest.text.clone(),
            schema,
            lineage,
            stats: FigureSums::default(),
            accounts: HashMap::new(),
            clients: HashMap::new(),
            tags: RowTags::default(),
            count: 0,
            errors: 0,
            error_codes: BTreeMap::new(),
            sum_ns: 0,
            min_ns: u64::MAX,
            max_ns: 0,
            histogram: Histogram::default(),
            sample: String::new(),
            raw_sample: None,
            tables: None,
            truncated: 0,
            waits: Default::default(),
            error_messages: BTreeMap::new(),
        }
    }

    /// Statements that ran under an account the row does not name.
    pub fn other_accounts(&self) -> u64 {
        self.count.saturating_sub(self.accounts.values().sum())
    }

    /// Statements from a client the row does not name.
    pub fn other_clients(&self) -> u64 {
        self.count.saturating_sub(self.clients.values().sum())
    }

    fn count_client(&mut self, client: &Arc<Client>, n: u64) {
        if let Some(total) = self.clients.get_mut(client) {
            *total += n;
        } else if self.clients.len() < MAX_CLIENTS {
            self.clients.insert(client.clone(), n);
        }
    }

    fn count_account(&mut self, account: &Arc<Account>, n: u64) {
        if let Some(total) = self.accounts.get_mut(account) {
            *total += n;
        } else if self.accounts.len() < MAX_ACCOUNTS {
            self.accounts.insert(account.clone(), n);
        }
    }

    fn record(&mut self, statement: &Statement, samples: Samples) {
        self.count += 1;
        self.stats.add(&statement.stats);
        if let Some(account) = &statement.account {
            self.count_account(account, 1);
        }
        if let Some(client) = &statement.client {
            self.count_client(client, 1);
        }
        let ns = statement.duration_ns;
        self.sum_ns = self.sum_ns.saturating_add(ns);
        self.min_ns = self.min_ns.min(ns);
        self.max_ns = self.max_ns.max(ns);
        self.histogram.record(ns);
        if statement.error_code != 0 {
            self.errors += 1;
            *self.error_codes.entry(statement.error_code).or_default() += 1;
            if let Some(message) = &statement.error_message {
                self.error_messages.entry(statement.error_code).or_insert_with(|| samples.message(message));
            }
        }
        for (stats, waited) in self.waits.iter_mut().zip(statement.waits) {
            if waited > 0 {
                stats.sum_ns = stats.sum_ns.saturating_add(waited);
                stats.max_ns = stats.max_ns.max(waited);
                stats.statements += 1;
            }
        }
        if statement.truncated {
            self.truncated += 1;
        }
        if self.sample.is_empty() && !statement.text.is_empty() {
            self.sample = samples.statement(&statement.text, MAX_SAMPLE);
        }
    }

    /// Adds what the kernel counted for one of this digest's text hashes.
    fn record_kernel(&mut self, kernel: &KernelDigest, text: &KernelText) {
        let sample = text.sample.as_str();
        if self.raw_sample.as_ref().is_none_or(|r| !r.bound) {
            self.raw_sample = RawSample::newer(text.raw.clone(), self.raw_sample.take());
        }
        self.count += kernel.count;
        self.stats.add(&kernel.stats);
        for (account, n) in &kernel.named_accounts {
            self.count_account(account, *n);
        }
        for (client, n) in &kernel.clients {
            self.count_client(client, *n);
        }
        if let Some(tags) = &text.tags {
            self.tags.count(tags, kernel.count, kernel.max_ns);
        }
        self.sum_ns = self.sum_ns.saturating_add(kernel.sum_ns);
        self.min_ns = self.min_ns.min(kernel.min_ns);
        self.max_ns = self.max_ns.max(kernel.max_ns);
        for &(bucket, n) in &kernel.buckets {
            self.histogram.add_bucket(FIRST_AGENT_BUCKET + bucket as usize, n);
        }
        if self.sample.is_empty() {
            self.sample = sample.to_string();
        }
    }
}

/// Health and exact totals of one instance over one window.
#[derive(Clone, Debug, Default)]
pub struct Summary {
    pub pid: u32,
    /// Start of the server process, ms since the Unix epoch.
    pub server_start_unix_ms: i64,
    /// The container the server runs in: id and name (empty on the host).
    pub container_id: String,
    pub container: String,
    /// The server's build id and compiled-in version, when known.
    pub build_id: Option<String>,
    pub server_version: Option<String>,
    /// Which per-statement figures its records carry.
    pub readable: Readable,
    /// The kernel programs loaded for it, and those its kernel refused.
    pub programs: Arc<crate::probe::ProgramSet>,
    pub commands: BTreeMap<String, u64>,
    /// Statements that finished (exact, from kernel counters).
    pub statements: u64,
    /// Statement records delivered to the agent.
    pub events: u64,
    /// Statement records lost in the kernel (ring buffer full).
    pub dropped_events: u64,
    pub unmatched: u64,
    pub read_failures: u64,
    /// Statements folded into the overflow row.
    pub overflow_statements: u64,
    /// Statements counted by the kernel digests instead of sent.
    pub aggregated_in_kernel: u64,
    /// Statements stored programs ran (not in `statements`, which counts
    /// what clients sent), and those of them whose start was not seen
    /// (counted here, in no row).
    pub nested_statements: u64,
    pub nested_unmatched: u64,
    /// Statements the replica's applier ran (not in `statements`).
    pub replica_statements: u64,
    /// Second ends of one statement, not counted again.
    pub duplicate_hits: u64,
    /// Runs of the programs the kernel skipped because another BPF program
    /// or a `bpf` call was in progress on that CPU: `statements` may be
    /// short by up to this many. None when the kernel does not count them.
    pub skipped_runs: Option<u64>,
    /// Statement records the kernel sent without their text because the
    /// agent was shedding (counted under a placeholder digest).
    pub shed_statements: u64,
    /// What the probes cost the server in this window (summed over the
    /// window's reads; the attached fraction is the last one).
    pub probe_cost: Option<ProbeCost>,
}

#[derive(Clone, Debug)]
pub struct WindowReport {
    pub instance: String,
    pub window_start: SystemTime,
    pub window_end: SystemTime,
    pub digests: Vec<DigestRow>,
    pub summary: Summary,
    /// Waits longer than the threshold that ended in this window.
    pub lock_waits: Vec<LockWaitRecord>,
    /// Statements that ran long, were killed or lost their client.
    pub long_statements: Vec<LongStatement>,
    pub long_statements_dropped: u64,
    /// Statements that changed the server (DDL, settings, privileges...).
    pub changes: Vec<ChangeRecord>,
    pub changes_dropped: u64,
    /// What the server applied as a replica, by replication channel
    /// (empty on a primary).
    pub replication: std::collections::BTreeMap<String, replication::ReplicationWindow>,
}

#[derive(Default)]
struct InstanceWindow {
    digests: HashMap<DigestKey, DigestRow>,
    overflow: Option<DigestRow>,
    summary: Summary,
    command_counts: BTreeMap<u32, u64>,
}

impl InstanceWindow {
    /// The stats row `digest`'s statements go to: its own, or the overflow
    /// row once the window holds `max_digests` (counting `statements`).
    fn stats_for(
        &mut self,
        digest: &Digest,
        schema: &Option<Arc<str>>,
        lineage: &Lineage,
        max_digests: usize,
        statements: u64,
    ) -> &mut DigestRow {
        let key = (schema.clone(), digest.id, lineage.clone());
        if self.digests.contains_key(&key) || self.digests.len() < max_digests {
            return self.digests.entry(key).or_insert_with(|| DigestRow::new(digest, schema.clone(), lineage.clone()));
        }
        self.summary.overflow_statements += statements;
        self.overflow.get_or_insert_with(|| {
            let overflow = Digest { id: OVERFLOW_DIGEST, text: Arc::from(sqlbee_vocabulary::digest_id::OVERFLOW_TEXT) };
            DigestRow::new(&overflow, None, Lineage::default())
        })
    }
}

/// A sample of a kernel-aggregated hash: refreshes the hash's sample text
/// and checks that its text still has the hash's digest.
fn check_sample(
    texts: &mut HashMap<u64, KernelText>,
    statement: &Statement,
    digest: &Digest,
    conflicts: &mut u64,
    samples: Samples,
) {
    let Some(known) = texts.get_mut(&statement.text_hash) else { return };
    if known.digest.id != digest.id {
        *conflicts += 1;
        warn!(hash = statement.text_hash, registered = %known.digest.text, sample = %digest.text,
            "two digests share a kernel text hash; their counts are merged under the first");
        return;
    }
    known.sample = samples.statement(&statement.text, MAX_SAMPLE);
    if known.raw.is_some() {
        known.raw = RawSample::newer(RawSample::of(statement), known.raw.take());
    }
}

pub struct Aggregator {
    normalizer: Normalizer,
    max_digests: usize,
    window_start: SystemTime,
    windows: BTreeMap<String, InstanceWindow>,
    /// Last cumulative kernel counters per attached server generation.
    last_counters: HashMap<(String, u32, u64), Counters>,
    /// Per instance; lives across windows (open transactions do).
    locks: HashMap<String, LockTracker>,
    /// Per attached server, what each registered text hash stands for.
    kernel_texts: HashMap<ServerKey, HashMap<u64, KernelText>>,
    /// Samples whose digest differed from their hash's (should never be).
    hash_conflicts: u64,
    /// What becomes of statement text before it is kept as a sample.
    samples: Samples,
    /// Whether rows keep a `RawSample` (plans are on).
    keep_raw: bool,
    /// Nested statements waiting for their client statement's record (it
    /// ends after them), by server, THD and the client statement's start,
    /// with the number of window closes they have waited.
    pending: HashMap<ParentKey, (Vec<Statement>, u32)>,
    /// Per instance, this window's long, killed and disconnected statements.
    long: HashMap<String, LongStatements>,
    /// Per instance, this window's changes.
    changes: HashMap<String, changes::Changes>,
    /// Per instance, what it applied as a replica.
    replication: HashMap<String, replication::Replication>,
    /// `--long-statement` (0: only killed and disconnected ones).
    long_ns: u64,
    /// `--query-tags` (None: off).
    tag_reader: Option<TagReader>,
}

/// One attached server generation: instance, pid, start time.
type ServerKey = (String, u32, u64);

/// A client statement as its nested statements name it.
type ParentKey = (ServerKey, u64, u64);

/// Bound on nested statements waiting for parents, so a parent that never
/// comes cannot grow memory: past it they are counted without one.
const MAX_PENDING: usize = 100_000;

/// The digest and schema of a registered text hash (the kernel mixes the
/// schema into it) and its latest sample.
struct KernelText {
    digest: Digest,
    schema: Option<Arc<str>>,
    sample: String,
    raw: Option<RawSample>,
    /// The text's query tags: every statement of the hash has its comment.
    tags: Option<Arc<QueryTags>>,
}

impl Aggregator {
    pub fn new(normalizer: Normalizer, max_digests: usize, now: SystemTime) -> Self {
        Self {
            normalizer,
            max_digests: max_digests.max(1),
            window_start: now,
            windows: BTreeMap::new(),
            last_counters: HashMap::new(),
            locks: HashMap::new(),
            kernel_texts: HashMap::new(),
            hash_conflicts: 0,
            samples: Samples::default(),
            keep_raw: false,
            pending: HashMap::new(),
            long: HashMap::new(),
            changes: HashMap::new(),
            replication: HashMap::new(),
            long_ns: 0,
            tag_reader: None,
        }
    }

    /// Statements at least this long become events too (zero: only
    /// killed and disconnected ones).
    pub fn with_long_statements(mut self, threshold: std::time::Duration) -> Self {
        self.long_ns = threshold.as_nanos().min(u64::MAX as u128) as u64;
        self
    }

    /// Rows keep one statement's raw text each, for EXPLAIN.
    pub fn with_raw_samples(mut self, keep: bool) -> Self {
        self.keep_raw = keep;
        self
    }

    /// Statements' query tags read as `reader` says (None: not at all).
    pub fn with_query_tags(mut self, reader: Option<TagReader>) -> Self {
        self.tag_reader = reader;
        self
    }

    /// Samples kept as `samples` says (redacted by default).
    pub fn with_samples(mut self, samples: Samples) -> Self {
        self.samples = samples;
        self
    }

    pub fn ingest(&mut self, batch: ProbeBatch) {
        let instance = batch.server.instance.clone();
        let window = self.windows.entry(instance.clone()).or_default();
        window.summary.pid = batch.server.pid;
        window.summary.server_start_unix_ms = batch.server.start_unix_ms;
        if let Some(c) = &batch.server.container {
            window.summary.container_id.clone_from(&c.id);
            window.summary.container.clone_from(&c.name);
        }
        window.summary.build_id.clone_from(&batch.binary.build_id);
        window.summary.readable = batch.readable;
        window.summary.programs = batch.programs.clone();
        window.summary.server_version.clone_from(&batch.binary.version);
        let locks = self.locks.entry(instance.clone()).or_default();
        for wait in &batch.long_waits {
            locks.wait(*wait);
        }
        if !batch.applied.is_empty() {
            let replication = self.replication.entry(instance.clone()).or_default();
            for applied in &batch.applied {
                replication.apply(applied);
            }
        }
        let instance_name = instance.clone();
        let key = (instance, batch.server.pid, batch.server.start_ticks);
        let texts = self.kernel_texts.entry(key.clone()).or_default();
        let pending_total: usize = self.pending.values().map(|(v, _)| v.len()).sum();
        let long = self.long.entry(instance_name.clone()).or_default();
        let changes = self.changes.entry(instance_name.clone()).or_default();
        if let Some(stopped) = batch.stopped {
            changes.server_stopped(stopped);
        }
        for statement in batch.statements {
            let digest = digest_of(&mut self.normalizer, &statement);
            if statement.sample {
                check_sample(texts, &statement, &digest, &mut self.hash_conflicts, self.samples);
                continue;
            }
            long.offer(&statement, &digest, self.samples, self.long_ns);
            changes.offer(&statement, &digest, self.samples);
            if statement.shed {
                window.summary.shed_statements += 1;
            }
            if statement.nested {
                // Its client statement ends after it: wait for its record,
                // unless it has none (the event scheduler's).
                if statement.parent_start_ns != 0 && pending_total < MAX_PENDING {
                    let parent = (key.clone(), statement.thd, statement.parent_start_ns);
                    self.pending.entry(parent).or_default().0.push(statement);
                } else {
                    record_nested(window, &mut self.normalizer, statement, None, self.max_digests, self.samples);
                }
                continue;
            }
            let tags = self.tag_reader.as_mut().and_then(|r| r.read(&statement.text)).map(Arc::new);
            if statement.text_hash != 0 {
                let text = texts.entry(statement.text_hash).or_insert_with(|| KernelText {
                    digest: digest.clone(),
                    schema: statement.schema.clone(),
                    sample: self.samples.statement(&statement.text, MAX_SAMPLE),
                    raw: None,
                    tags: tags.clone(),
                });
                // The hash's later statements come as kernel digests: a
                // sample with its values is kept for them.
                if self.keep_raw && (text.raw.is_none() || statement.values.is_some()) {
                    text.raw = RawSample::newer(RawSample::of(&statement), text.raw.take());
                }
            }
            let lineage = Lineage { source: statement.source, ..Lineage::default() };
            if let Some((children, _)) = self.pending.remove(&(key.clone(), statement.thd, statement.start_ns)) {
                for child in children {
                    record_nested(window, &mut self.normalizer, child, Some(digest.id), self.max_digests, self.samples);
                }
            }
            locks.statement(&statement, &digest, self.samples);
            let row = window.stats_for(&digest, &statement.schema, &lineage, self.max_digests, 1);
            row.record(&statement, self.samples);
            if let Some(tags) = &tags {
                row.tags.count(tags, 1, statement.duration_ns);
            }
            // The first sample, or the first with its values bound.
            let unbound = row.raw_sample.as_ref().is_none_or(|r| !r.bound);
            if self.keep_raw
                && unbound
                && row.digest == digest.id
                && (row.raw_sample.is_none() || statement.values.is_some())
            {
                row.raw_sample = RawSample::newer(RawSample::of(&statement), row.raw_sample.take());
            }
        }
        for kernel in &batch.kernel {
            // Cannot happen (a hash is forgotten only after its last
            // aggregate), but never lose the count.
            let unknown;
            let text = match texts.get(&kernel.text_hash) {
                Some(text) => text,
                None => {
                    unknown = KernelText {
                        digest: Digest::from_text("(kernel aggregate, text unknown)"),
                        schema: None,
                        sample: String::new(),
                        raw: None,
                        tags: None,
                    };
                    &unknown
                }
            };
            window
                .stats_for(&text.digest, &text.schema, &Lineage::default(), self.max_digests, kernel.count)
                .record_kernel(kernel, text);
        }
        for hash in &batch.forgotten {
            texts.remove(hash);
        }
        if batch.detached {
            self.kernel_texts.remove(&key);
        }
        if let Some(cost) = batch.cost {
            window.summary.probe_cost.get_or_insert_with(ProbeCost::default).merge(&cost);
        }
        if let Some(now) = batch.counters {
            let last = self.last_counters.get(&key).cloned().unwrap_or_default();
            let delta = now.delta(&last);
            for (command, count) in delta.commands.iter().enumerate() {
                if *count > 0 {
                    *window.command_counts.entry(command as u32).or_default() += count;
                }
            }
            window.summary.statements += delta.statements;
            window.summary.events += delta.events;
            window.summary.dropped_events += delta.dropped;
            window.summary.unmatched += delta.unmatched;
            window.summary.read_failures += delta.read_failed;
            window.summary.aggregated_in_kernel += delta.counted_in_kernel;
            window.summary.nested_statements += delta.nested;
            window.summary.nested_unmatched += delta.nested_unmatched;
            window.summary.replica_statements += delta.replica;
            window.summary.duplicate_hits += delta.duplicate_hits;
            if let Some(skipped) = delta.skipped_runs {
                *window.summary.skipped_runs.get_or_insert(0) += skipped;
            }
            if delta.applied_lost > 0 {
                self.replication.entry(instance_name.clone()).or_default().lost(delta.applied_lost);
            }
            if batch.detached {
                self.last_counters.remove(&key);
            } else {
                self.last_counters.insert(key, now);
            }
        }
    }

    /// Closes the current window and starts the next one at `now`.
    pub fn flush(&mut self, now: SystemTime) -> Vec<WindowReport> {
        // Nested statements whose parent did not come within a whole window
        // (its record was lost) are counted without one.
        let overdue: Vec<ParentKey> =
            self.pending.iter().filter(|(_, (_, waited))| *waited >= 1).map(|(k, _)| k.clone()).collect();
        for parent in overdue {
            if let Some((children, _)) = self.pending.remove(&parent) {
                let window = self.windows.entry(parent.0.0.clone()).or_default();
                for child in children {
                    record_nested(window, &mut self.normalizer, child, None, self.max_digests, self.samples);
                }
            }
        }
        for (_, waited) in self.pending.values_mut() {
            *waited += 1;
        }
        let start = std::mem::replace(&mut self.window_start, now);
        let mut reports = Vec::new();
        for (instance, mut window) in std::mem::take(&mut self.windows) {
            let mut digests: Vec<DigestRow> = window.digests.into_values().collect();
            digests.extend(window.overflow.take());
            digests.sort_by(|a, b| {
                b.sum_ns
                    .cmp(&a.sum_ns)
                    .then(a.digest.cmp(&b.digest))
                    .then(a.schema.cmp(&b.schema))
                    .then(a.lineage.cmp(&b.lineage))
            });
            window.summary.commands =
                window.command_counts.iter().map(|(c, n)| (command_name(*c).into_owned(), *n)).collect();
            let lock_waits = self.locks.get_mut(&instance).map(LockTracker::take_records).unwrap_or_default();
            let long = self.long.remove(&instance).unwrap_or_default();
            let changes = self.changes.remove(&instance).unwrap_or_default();
            let replication =
                self.replication.get_mut(&instance).map(replication::Replication::take).unwrap_or_default();
            reports.push(WindowReport {
                instance,
                window_start: start,
                window_end: now,
                digests,
                summary: window.summary,
                lock_waits,
                long_statements: long.kept,
                long_statements_dropped: long.dropped,
                changes: changes.kept,
                changes_dropped: changes.dropped,
                replication,
            });
        }
        reports
    }

    pub fn normalizer(&self) -> &Normalizer {
        &self.normalizer
    }
}

/// A stored program's statement into its row: its program and its parent
/// client statement's digest (None when that is unknown).
fn record_nested(
    window: &mut InstanceWindow,
    normalizer: &mut Normalizer,
    statement: Statement,
    parent_digest: Option<u64>,
    max_digests: usize,
    samples: Samples,
) {
    let digest = digest_of(normalizer, &statement);
    let lineage = Lineage { source: statement.source, nested: true, program: statement.program.clone(), parent_digest };
    window.stats_for(&digest, &statement.schema, &lineage, max_digests, 1).record(&statement, samples);
}

fn digest_of(normalizer: &mut Normalizer, statement: &Statement) -> Digest {
    if !statement.text.is_empty() {
        return normalizer.normalize(&statement.text);
    }
    // Keep statements without text in the totals under a name that says
    // what they were.
    if statement.shed {
        return Digest::from_text(&format!("{} (text not sent: shedding)", command_name(statement.command)));
    }
    let text = match statement.command {
        COM_STMT_EXECUTE => format!("prepared statement #{} (text unknown)", statement.stmt_id),
        COM_QUERY => "query (text unknown)".to_string(),
        other => format!("{} (text unknown)", command_name(other)),
    };
    Digest::from_text(&text)
}
