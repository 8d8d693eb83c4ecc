//! Writing: a batch's rows, then its record, each attempt under its own
//! ingest_id (see the module comment of `clickhouse` for why that is
//! exact); and pruning by dropping day partitions.
use std::{
    collections::{BTreeMap, HashMap},
    hash::{BuildHasher as _, Hasher as _},
    sync::atomic::{AtomicU64, Ordering},
};

use sqlbee_proto::v1::Batch;

use super::{
    error,
    http::{Client, RowWriter, quote},
    malformed,
    schema::{AGING, LEVELS, PLAN_AGING, ROLLUP_AGING},
};
use crate::store::{IngestOutcome, PruneCutoffs, PruneOutcome, StoreError, blob, rollup::DAY_MS};

/// A fresh ingest_id: milliseconds in the high 42 bits (earlier attempts
/// tend to win, so a record that was answered stays the winner), random
/// low bits so two attempts in one millisecond differ.
pub(super) fn new_ingest_id(now_unix_ms: i64) -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    hasher.write_u32(std::process::id());
    let random = hasher.finish() & ((1 << 22) - 1);
    ((now_unix_ms.max(0) as u64) << 22) | random
}

/// A batch's (agent_id, epoch, sequence).
pub(super) type Identity = (String, u64, u64);

pub(super) fn identity_of(batch: &Batch) -> Identity {
    (batch.agent.as_ref().map(|a| a.agent_id.clone()).unwrap_or_default(), batch.epoch, batch.sequence)
}

/// (ingest_id, content_hash) of every record of each identity, smallest
/// ingest_id first.
fn records(db: &Client, ids: &[&Identity]) -> Result<HashMap<Identity, Vec<(u64, u64)>>, StoreError> {
    let mut out: HashMap<Identity, Vec<(u64, u64)>> = HashMap::new();
    if ids.is_empty() {
        return Ok(out);
    }
    let list: Vec<String> =
        ids.iter().map(|(agent, epoch, sequence)| format!("({}, {epoch}, {sequence})", quote(agent))).collect();
    let mut rows = db
        .select(&format!(
            "SELECT agent_id, epoch, sequence, ingest_id, content_hash FROM batches
             WHERE (agent_id, epoch, sequence) IN ({}) ORDER BY ingest_id",
            list.join(", ")
        ))
        .map_err(|e| error("ingest", e))?;
    let bad = malformed("ingest");
    while !rows.done() {
        let id = (rows.string().map_err(&bad)?, rows.u64().map_err(&bad)?, rows.u64().map_err(&bad)?);
        let record = (rows.u64().map_err(&bad)?, rows.u64().map_err(&bad)?);
        out.entry(id).or_default().push(record);
    }
    Ok(out)
}

/// The same rule as the SQLite store: 0 is "unknown" and never conflicts.
fn same_content(stored: u64, incoming: u64) -> bool {
    stored == 0 || incoming == 0 || stored == incoming
}

/// A batch to store and what the collector knows of it.
pub(super) struct Pending<'a> {
    pub batch: &'a Batch,
    pub received: i64,
    pub content_hash: u64,
}

/// Stores a group of batches with distinct identities in one pass: one
/// look-up of their records, one INSERT per table for all their rows, one
/// for their records, one look-up again. Each batch gets its own outcome,
/// as if stored alone (see the module comment of `clickhouse`); a failure
/// of a shared step fails every batch it carried, none of which counts
/// before its record exists.
pub(super) fn ingest_group(
    db: &Client,
    group: &[Pending<'_>],
    rows: &mut DataRows,
) -> Vec<Result<IngestOutcome, StoreError>> {
    rows.clear();
    match store_group(db, group, rows) {
        Ok(out) => out,
        Err(e) => group.iter().map(|_| Err(shared(&e))).collect(),
    }
}

/// The same failure for each batch of a group.
fn shared(e: &StoreError) -> StoreError {
    match e {
        StoreError::Full { source } => StoreError::Full { source: source.to_string().into() },
        StoreError::Backend { action, source } => StoreError::Backend { action, source: source.to_string().into() },
        StoreError::Corrupt { what } => StoreError::Corrupt { what },
        other => StoreError::Backend { action: "ingest", source: other.to_string().into() },
    }
}

fn store_group(
    db: &Client,
    group: &[Pending<'_>],
    rows: &mut DataRows,
) -> Result<Vec<Result<IngestOutcome, StoreError>>, StoreError> {
    let ids: Vec<Identity> = group.iter().map(|p| identity_of(p.batch)).collect();
    let conflict = |(agent_id, epoch, sequence): &Identity| StoreError::Conflict {
        agent_id: agent_id.clone(),
        epoch: *epoch,
        sequence: *sequence,
    };
    let duplicate = IngestOutcome { duplicate: true, conflict: false };
    let before = records(db, &ids.iter().collect::<Vec<_>>())?;
    let mut out: Vec<Option<Result<IngestOutcome, StoreError>>> = group.iter().map(|_| None).collect();
    let (mut recorded, mut seen) = (RowWriter::default(), RowWriter::default());
    let mut attempts: Vec<(usize, u64)> = Vec::new();
    for (i, p) in group.iter().enumerate() {
        match before.get(&ids[i]).and_then(|r| r.first()) {
            Some(&(_, stored)) if !same_content(stored, p.content_hash) => out[i] = Some(Err(conflict(&ids[i]))),
            Some(_) => {
                add_seen(&mut seen, p);
                out[i] = Some(Ok(duplicate));
            }
            None => {
                let ingest_id = new_ingest_id(sqlbee_vocabulary::clock::now_unix_ms());
                rows.add(p.batch, ingest_id, p.received);
                add_record(&mut recorded, p, ingest_id);
                attempts.push((i, ingest_id));
            }
        }
    }
    if !attempts.is_empty() {
        rows.insert(db)?;
        insert_records(db, &recorded)?;
        let after = records(db, &attempts.iter().map(|(i, _)| &ids[*i]).collect::<Vec<_>>())?;
        for (i, ingest_id) in attempts {
            let (agent_id, epoch, sequence) = &ids[i];
            out[i] = Some(match after.get(&ids[i]).and_then(|r| r.first()) {
                Some(&(winner, _)) if winner == ingest_id => {
                    add_seen(&mut seen, &group[i]);
                    Ok(IngestOutcome { duplicate: false, conflict: false })
                }
                Some(&(winner, stored)) if !same_content(stored, group[i].content_hash) => {
                    tracing::warn!(%agent_id, epoch, sequence, winner, ingest_id,
                        "another collector stored other content for this batch at the same time");
                    Err(conflict(&ids[i]))
                }
                Some(&(winner, _)) => {
                    // Another collector stored the same batch at the same
                    // time: its rows count, these never will.
                    tracing::debug!(%agent_id, epoch, sequence, winner, ingest_id, "lost a race to store the same batch");
                    add_seen(&mut seen, &group[i]);
                    Ok(duplicate)
                }
                None => Err(StoreError::Backend {
                    action: "ingest",
                    source: "the batch record just written is not in the batches table".into(),
                }),
            });
        }
    }
    db.insert("agent_seen", &seen).map_err(|e| error("ingest", e))?;
    Ok(out
        .into_iter()
        .map(|o| o.unwrap_or(Err(StoreError::Backend { action: "ingest", source: "no outcome".into() })))
        .collect())
}

/// The agent's last word, stored or duplicate (never for a conflict).
fn add_seen(w: &mut RowWriter, p: &Pending<'_>) {
    let agent = p.batch.agent.clone().unwrap_or_default();
    w.col("agent_id").str(&agent.agent_id).col("host").str(&agent.host).col("version").str(&agent.version);
    w.col("sequence").u64(p.batch.sequence).col("received_unix_ms").i64(p.received);
    w.end_row();
}

/// The times the batch's rows are placed at: (first, last).
fn time_range(batch: &Batch, received: i64) -> (i64, i64) {
    let times = batch
        .windows
        .iter()
        .flat_map(|w| {
            std::iter::once(w.window_end_unix_ms)
                .chain(w.lock_waits.iter().map(|l| l.start_unix_ms))
                .chain(w.long_statements.iter().map(|l| l.start_unix_ms))
        })
        .chain(batch.agent_windows.iter().map(|w| w.window_end_unix_ms))
        .chain(batch.gaps.iter().map(|g| gap_keep_until(g, received)))
        .chain(batch.gaps.iter().map(|g| gap_time(g, received)));
    times.fold((received, received), |(lo, hi), t| (lo.min(t), hi.max(t)))
}

/// Where a gap counts: its last window's end, else when it was reported.
fn gap_time(g: &sqlbee_proto::v1::Gap, received: i64) -> i64 {
    if g.last_window_end_unix_ms > 0 { g.last_window_end_unix_ms } else { received }
}

fn gap_keep_until(g: &sqlbee_proto::v1::Gap, received: i64) -> i64 {
    received.max(g.last_window_end_unix_ms)
}

/// One batch's record (see `add_record`), written alone.
#[cfg(test)]
pub(super) fn record(
    db: &Client,
    batch: &Batch,
    ingest_id: u64,
    received: i64,
    content_hash: u64,
) -> Result<(), StoreError> {
    let mut w = RowWriter::default();
    add_record(&mut w, &Pending { batch, received, content_hash }, ingest_id);
    insert_records(db, &w)
}

/// The exactly-once record of an attempt: identity, attempt, content hash,
/// received time, time range and the hours its windows end in (which a
/// rollup covers; see `rollups`).
fn add_record(w: &mut RowWriter, p: &Pending<'_>, ingest_id: u64) {
    let batch = p.batch;
    let agent = batch.agent.clone().unwrap_or_default();
    let (first, last) = time_range(batch, p.received);
    let hours: std::collections::BTreeSet<i64> = batch
        .windows
        .iter()
        .map(|w| w.window_end_unix_ms)
        .chain(batch.agent_windows.iter().map(|w| w.window_end_unix_ms))
        .map(|end| end.div_euclid(crate::store::rollup::HOUR_MS))
        .collect();
    let hours: Vec<i64> = hours.into_iter().collect();
    w.col("agent_id").str(&agent.agent_id).col("epoch").u64(batch.epoch);
    w.col("sequence").u64(batch.sequence).col("ingest_id").u64(ingest_id);
    w.col("content_hash").u64(p.content_hash).col("received_unix_ms").i64(p.received);
    w.col("first_unix_ms").i64(first).col("last_unix_ms").i64(last);
    w.col("keep_until_unix_ms").i64(last.max(p.received));
    w.col("window_hours").array(&hours, |w, h| {
        w.i64(*h);
    });
    w.end_row();
}

fn insert_records(db: &Client, w: &RowWriter) -> Result<(), StoreError> {
    // `inserted` is left to the server's clock.
    db.insert("batches", w).map_err(|e| error("ingest", e))
}

/// The data rows of a group of batches, each under its attempt's
/// `ingest_id`, none of which counts before its record exists: one INSERT
/// per table for the whole group. Group commit keeps one and reuses its
/// buffers: a group's rows run to megabytes, and growing fresh buffers to
/// that size for every group cost more in copies and page faults than
/// writing the rows.
#[derive(Default)]
pub(super) struct DataRows {
    windows: RowWriter,
    digests: RowWriter,
    texts: RowWriter,
    samples: RowWriter,
    locks: RowWriter,
    long_statements: RowWriter,
    agent_windows: RowWriter,
    untraced: RowWriter,
    gaps: RowWriter,
    plans: RowWriter,
    plan_changes: RowWriter,
    /// Plan changes are written from these at insert (see `plans::changes`).
    plan_sightings: Vec<super::plans::Sighting>,
    digest_tables: RowWriter,
    table_indexes: RowWriter,
    replication: RowWriter,
    /// A digest's text is written once per group: any copy will do.
    text_seen: std::collections::HashSet<u64>,
}

/// Bytes a table's buffer keeps between groups: a full group of a typical
/// fleet fits, and one outsized group does not pin its memory for good.
const KEEP_BYTES: usize = 16 << 20;

impl DataRows {
    fn clear(&mut self) {
        let DataRows {
            windows,
            digests,
            texts,
            samples,
            locks,
            long_statements,
            agent_windows,
            untraced,
            gaps,
            plans,
            plan_changes,
            plan_sightings,
            digest_tables,
            table_indexes,
            replication,
            text_seen,
        } = self;
        plan_sightings.clear();
        for w in [
            windows,
            digests,
            texts,
            samples,
            locks,
            long_statements,
            agent_windows,
            untraced,
            gaps,
            plans,
            plan_changes,
            digest_tables,
            table_indexes,
            replication,
        ] {
            w.clear(KEEP_BYTES);
        }
        text_seen.clear();
    }

    pub(super) fn add(&mut self, batch: &Batch, ingest_id: u64, received: i64) {
        let DataRows {
            windows,
            digests,
            texts,
            samples,
            locks,
            long_statements,
            agent_windows,
            untraced,
            gaps,
            plans,
            plan_changes: _,
            plan_sightings,
            digest_tables,
            table_indexes,
            replication,
            text_seen,
        } = self;
        let agent = batch.agent.clone().unwrap_or_default();
        let identity = |w: &mut RowWriter| {
            w.col("agent_id").str(&agent.agent_id).col("epoch").u64(batch.epoch);
            w.col("sequence").u64(batch.sequence).col("ingest_id").u64(ingest_id);
        };
        for (position, w) in batch.windows.iter().enumerate() {
            let server = w.instance.clone().unwrap_or_default();
            for l in &w.lock_waits {
                identity(locks);
                let at = locks.len() as u32;
                locks.col("position").u32(at).col("received_unix_ms").i64(received).col("instance").str(&server.name);
                locks.col("start_unix_ms").i64(l.start_unix_ms).col("duration_ns").u64(l.duration_ns);
                locks.col("class").str(&l.class).col("connection_id").u64(l.connection_id).col("digest").u64(l.digest);
                locks.col("digest_text").str(&l.digest_text).col("sample").str(&l.sample);
                locks.col("blocker_kind").str(&l.blocker_kind);
                locks.col("blockers").str(&blob::encode_blockers(&l.blockers));
                locks.end_row();
            }
            for l in &w.long_statements {
                identity(long_statements);
                let at = long_statements.len() as u32;
                let row = long_statements.col("position").u32(at).col("received_unix_ms").i64(received);
                row.col("instance").str(&server.name).col("start_unix_ms").i64(l.start_unix_ms);
                row.col("outcome").str(&l.outcome).col("digest").u64(l.digest).col("statement").message(Some(l));
                row.end_row();
            }
            // Same command twice in one window (should not happen) adds up.
            let mut commands: BTreeMap<&str, u64> = BTreeMap::new();
            for c in &w.commands {
                let slot = commands.entry(c.command.as_str()).or_default();
                *slot = slot.saturating_add(c.count);
            }
            let names: Vec<&str> = commands.keys().copied().collect();
            let counts: Vec<u64> = commands.values().copied().collect();
            identity(windows);
            windows.col("position").u32(position as u32).col("instance").str(&server.name);
            windows.col("pid").u32(server.pid).col("start_time_unix_ms").i64(server.start_time_unix_ms);
            windows.col("container_id").str(&server.container_id).col("container").str(&server.container);
            windows.col("build_id").str(&server.build_id).col("server_version").str(&server.server_version);
            windows.col("window_start").i64(w.window_start_unix_ms).col("window_end").i64(w.window_end_unix_ms);
            for (column, v) in [
                ("statements", w.statements),
                ("events", w.events),
                ("dropped_events", w.dropped_events),
                ("dropped_in_agent", w.dropped_in_agent),
                ("unmatched", w.unmatched),
                ("overflow_statements", w.overflow_statements),
                ("nested_statements", w.nested_statements),
                ("replica_statements", w.replica_statements),
            ] {
                windows.col(column).u64(v);
            }
            windows.col("command").array(&names, |w, n| {
                w.str(n);
            });
            windows.col("command_count").array(&counts, |w, n| {
                w.u64(*n);
            });
            let has_cost = w.probes.is_some() || w.process.is_some() || w.aggregated_in_kernel > 0;
            windows.col("has_cost").u8(u8::from(has_cost)).col("aggregated_in_kernel").u64(w.aggregated_in_kernel);
            windows.col("probes").message(w.probes.as_ref()).col("process").message(w.process.as_ref());
            windows.col("server_login").str(&w.server_login);
            windows.end_row();
            // Plans need no winner: a replayed batch's copy is the same
            // sighting, and reads merge sightings (min, max, newest).
            for plan in &w.plans {
                plans.col("instance").str(&server.name).col("schema").str(&plan.schema);
                plans.col("digest").u64(plan.digest).col("plan_hash").u64(plan.plan_hash);
                plans.col("seen_unix_ms").i64(plan.explained_unix_ms).col("plan").message(Some(plan));
                plans.end_row();
                if plan.plan_hash != 0 {
                    plan_sightings.push(super::plans::Sighting {
                        instance: server.name.clone(),
                        schema: plan.schema.clone(),
                        digest: plan.digest,
                        at_unix_ms: plan.explained_unix_ms,
                        plan_hash: plan.plan_hash,
                        previous_plan_hash: plan.previous_plan_hash,
                    });
                }
            }
            for t in &w.table_indexes {
                table_indexes.col("instance").str(&server.name).col("schema").str(&t.schema);
                table_indexes.col("table_name").str(&t.table).col("read_unix_ms").i64(t.read_unix_ms);
                table_indexes.col("indexes").message(Some(t));
                table_indexes.end_row();
            }
            for r in &w.replication {
                replication.col("instance").str(&server.name).col("channel").str(&r.channel);
                replication.col("window_start_unix_ms").i64(w.window_start_unix_ms);
                replication.col("window_end_unix_ms").i64(w.window_end_unix_ms).col("replication").message(Some(r));
                replication.end_row();
            }
            for d in &w.digests {
                if !d.statement_kind.is_empty() || d.tables_unknown {
                    let tables = sqlbee_proto::v1::DigestStats { tables: d.tables.clone(), ..Default::default() };
                    digest_tables.col("digest").u64(d.digest).col("schema").str(&d.schema);
                    digest_tables.col("kind").str(&d.statement_kind).col("tables").message(Some(&tables));
                    digest_tables.col("unknown").u8(u8::from(d.tables_unknown));
                    digest_tables.col("seen_unix_ms").i64(w.window_end_unix_ms);
                    digest_tables.end_row();
                }
                if text_seen.insert(d.digest) {
                    texts.col("digest").u64(d.digest).col("text").str(&d.digest_text);
                    texts.col("window_end").i64(w.window_end_unix_ms);
                    texts.end_row();
                }
                // Increasing codes; a code sent twice adds up, its last
                // non-empty message stands for it.
                let mut codes: BTreeMap<u32, u64> = BTreeMap::new();
                for e in &d.error_codes {
                    let slot = codes.entry(e.code).or_default();
                    *slot = slot.saturating_add(e.count);
                    if !e.sample_message.is_empty() {
                        identity(samples);
                        samples.col("digest").u64(d.digest).col("code").u32(e.code);
                        samples.col("message").str(&e.sample_message).col("window_end").i64(w.window_end_unix_ms);
                        let at = samples.len() as u32;
                        samples.col("position").u32(at).col("instance").str(&server.name);
                        samples.end_row();
                    }
                }
                let buckets = d.histogram.as_ref().map(|h| h.buckets.as_slice()).unwrap_or_default();
                identity(digests);
                digests.col("instance").str(&server.name).col("window_end").i64(w.window_end_unix_ms);
                digests.col("digest").u64(d.digest).col("schema").str(&d.schema).col("nested").u8(u8::from(d.nested));
                digests.col("program").str(&d.program).col("program_kind").str(&d.program_kind);
                digests.col("parent_digest").u64(d.parent_digest).col("source").str(&d.source);
                digests.col("count").u64(d.count).col("errors").u64(d.errors).col("sum_ns").u64(d.sum_ns);
                digests.col("min_ns").u64(d.min_ns).col("max_ns").u64(d.max_ns);
                digests.col("estimated_count").u64(d.estimated_count).col("truncated").u64(d.truncated);
                let codes: Vec<(u32, u64)> = codes.into_iter().collect();
                digest_arrays(digests, buckets, &codes, &d.waits);
                let stats = d.stats.as_ref();
                rank_figures(digests, stats);
                digests.col("figures").message(stats);
                digests.col("accounts").encoded(blob::senders_len(d), |out| blob::encode_senders_into(d, out));
                digests.col("sample").str(&d.sample);
                digests.end_row();
            }
        }
        for (position, w) in batch.agent_windows.iter().enumerate() {
            identity(agent_windows);
            agent_windows.col("position").u32(position as u32).col("received_unix_ms").i64(received);
            agent_windows.col("window_start").i64(w.window_start_unix_ms).col("window_end").i64(w.window_end_unix_ms);
            agent_windows.col("cost").message(w.cost.as_ref()).col("host").message(w.host.as_ref());
            agent_windows.end_row();
            for u in &w.untraced {
                let server = u.instance.clone().unwrap_or_default();
                identity(untraced);
                untraced.col("instance").str(&server.name).col("pid").u32(server.pid);
                untraced.col("start_time_unix_ms").i64(server.start_time_unix_ms);
                untraced.col("container_id").str(&server.container_id).col("container").str(&server.container);
                untraced.col("build_id").str(&server.build_id).col("server_version").str(&server.server_version);
                untraced.col("reason").str(&u.reason).col("kind").str(&u.kind);
                untraced.col("since_unix_ms").i64(u.since_unix_ms).col("seen_unix_ms").i64(w.window_end_unix_ms);
                untraced.end_row();
            }
        }
        for g in &batch.gaps {
            identity(gaps);
            gaps.col("first_sequence").u64(g.first_sequence).col("last_sequence").u64(g.last_sequence);
            gaps.col("batches").u64(g.batches).col("lost_statements").u64(g.lost_statements);
            gaps.col("lost_windows").u32(g.lost_windows);
            gaps.col("first_window_start_unix_ms").i64(g.first_window_start_unix_ms);
            gaps.col("last_window_end_unix_ms").i64(g.last_window_end_unix_ms);
            gaps.col("reason").str(&g.reason).col("received_unix_ms").i64(received);
            gaps.col("keep_until_unix_ms").i64(gap_keep_until(g, received));
            gaps.end_row();
        }
    }

    pub(super) fn insert(&mut self, db: &Client) -> Result<(), StoreError> {
        super::plans::changes(db, &self.plan_sightings, &mut self.plan_changes)?;
        let inserts: [(&str, &RowWriter); 14] = [
            ("instance_windows", &self.windows),
            ("digest_windows", &self.digests),
            ("digest_texts", &self.texts),
            ("error_samples", &self.samples),
            ("lock_waits", &self.locks),
            ("long_statements", &self.long_statements),
            ("agent_windows", &self.agent_windows),
            ("untraced", &self.untraced),
            ("gaps", &self.gaps),
            ("plans", &self.plans),
            ("plan_changes", &self.plan_changes),
            ("digest_tables", &self.digest_tables),
            ("table_indexes", &self.table_indexes),
            ("replication_windows", &self.replication),
        ];
        for (table, rows) in inserts {
            db.insert(table, rows).map_err(|e| error("ingest", e))?;
        }
        Ok(())
    }
}

/// A digest row's histogram, error codes and waits, as the parallel arrays
/// `digest_windows` and `digest_rollups` both keep them.
pub(super) fn digest_arrays(
    w: &mut RowWriter,
    buckets: &[sqlbee_proto::v1::Bucket],
    codes: &[(u32, u64)],
    waits: &[sqlbee_proto::v1::WaitStats],
) {
    w.col("hist_index").array(buckets, |w, b| {
        w.u32(b.index);
    });
    w.col("hist_count").array(buckets, |w, b| {
        w.u64(b.count);
    });
    w.col("error_code").array(codes, |w, c| {
        w.u32(c.0);
    });
    w.col("error_count").array(codes, |w, c| {
        w.u64(c.1);
    });
    w.col("wait_class").array(waits, |w, x| {
        w.str(&x.class);
    });
    w.col("wait_sum_ns").array(waits, |w, x| {
        w.u64(x.sum_ns);
    });
    w.col("wait_max_ns").array(waits, |w, x| {
        w.u64(x.max_ns);
    });
    w.col("wait_statements").array(waits, |w, x| {
        w.u64(x.statements);
    });
}

/// The figures a digest row keeps in columns of their own, to rank by.
pub(super) fn rank_figures(w: &mut RowWriter, stats: Option<&sqlbee_proto::v1::QueryStats>) {
    for (column, value) in crate::store::rank_columns::values(stats) {
        w.col(column).opt_u64(value);
    }
}

/// Every row of one batch under `ingest_id` (see `DataRows`).
#[cfg(test)]
pub(super) fn data_rows(db: &Client, batch: &Batch, ingest_id: u64, received: i64) -> Result<(), StoreError> {
    let mut rows = DataRows::default();
    rows.add(batch, ingest_id, received);
    rows.insert(db)
}

fn count(db: &Client, sql: &str) -> Result<u64, StoreError> {
    let mut rows = db.select(sql).map_err(|e| error("prune", e))?;
    rows.u64().map_err(malformed("prune"))
}

/// Deletes what is older than the raw cutoff, and hour rollups older than
/// theirs. Whole days go as partitions, cheap at any size; the part of the
/// cutoff's own day that is older goes by a mutation, waited for so the
/// answer after a prune no longer shows it. Ten-minute rollups older than
/// the minute cutoff go too (see `prune_ten_minutes`). Counts are of rows
/// deleted, losers' rows included.
pub(super) fn prune(db: &Client, cutoffs: &PruneCutoffs) -> Result<PruneOutcome, StoreError> {
    let mut outcome = PruneOutcome::default();
    let err = |e| error("prune", e);
    let raw = AGING.iter().map(|&(table, column)| (table, column, cutoffs.raw));
    let rolled = ROLLUP_AGING.iter().map(|&(table, column)| (table, column, cutoffs.hour));
    let plans = PLAN_AGING.iter().map(|&(table, column)| (table, column, cutoffs.hour));
    for (table, column, cut) in raw.chain(rolled).chain(plans) {
        let cut_day = cut.div_euclid(DAY_MS);
        let deleted = if table == "error_samples" {
            // One sample per (digest, code), as old as its newest window.
            count(
                db,
                &format!(
                    "SELECT count() FROM (SELECT max(window_end) AS newest FROM error_samples
                     WHERE {} GROUP BY digest, code) WHERE newest < {cut}",
                    super::winners(i64::MIN, i64::MAX)
                ),
            )?
        } else {
            count(db, &format!("SELECT count() FROM {table} WHERE {column} < {cut}"))?
        };
        let mut rows = db
            .select(&format!(
                "SELECT DISTINCT partition FROM system.parts
                 WHERE database = currentDatabase() AND table = {} AND active",
                quote(table)
            ))
            .map_err(err)?;
        let mut old_days = Vec::new();
        while !rows.done() {
            let partition = rows.string().map_err(malformed("prune"))?;
            if partition.parse::<i64>().is_ok_and(|day| day < cut_day) {
                old_days.push(partition);
            }
        }
        for day in old_days {
            db.execute(&format!("ALTER TABLE {table} DROP PARTITION {day}")).map_err(err)?;
        }
        if count(db, &format!("SELECT count() FROM {table} WHERE {column} < {cut}"))? > 0 {
            db.execute(&format!("ALTER TABLE {table} DELETE WHERE {column} < {cut}")).map_err(err)?;
            wait_for_mutations(db, table)?;
        }
        if deleted > 0 {
            wait_on_replicas(db, table, &format!("{column} < {cut}"))?;
        }
        match table {
            "digest_windows" => outcome.digest_windows = deleted,
            "instance_windows" => outcome.instance_windows = deleted,
            "agent_windows" => outcome.agent_windows = deleted,
            "lock_waits" => outcome.lock_waits = deleted,
            "long_statements" => outcome.long_statements = deleted,
            "error_samples" => outcome.error_samples = deleted,
            "batches" => outcome.batches = deleted,
            "digest_rollups" | "instance_rollups" | "agent_rollups" => outcome.rollup_rows += deleted,
            "plans" | "plan_changes" | "digest_tables" | "table_indexes" | "replication_windows" => {
                outcome.plan_rows += deleted
            }
            "annotations" | "events" => outcome.event_rows += deleted,
            _ => {}
        }
    }
    for &(table, column) in &ROLLUP_AGING {
        let ten_minutes = prune_ten_minutes(db, table, column, cutoffs)?;
        if table != "rollup_marks" {
            outcome.rollup_rows += ten_minutes;
        }
    }
    prune_agents(db, cutoffs.raw)?;
    Ok(outcome)
}

/// The ten-minute level of a rollup table, by the minute cutoff, when that
/// is later than the hour level's. Its partitions hold every level of a day,
/// so these rows go by a mutation, and ClickHouse 18.16 rewrites every part
/// of the table for one: they go whole days at a time (the days before the
/// cutoff's own), so that is once a day, not at every prune. Their marks go
/// with them: those buckets are then read at the next finer level, as before
/// they were rolled up. Never newer than the raw cutoff: a bucket whose
/// batch records are still kept and whose mark is gone would be rolled up
/// again by the next pass. Rows deleted.
fn prune_ten_minutes(db: &Client, table: &str, column: &str, cutoffs: &PruneCutoffs) -> Result<u64, StoreError> {
    let cut = cutoffs.minute.min(cutoffs.raw).div_euclid(DAY_MS) * DAY_MS;
    if cut <= cutoffs.hour {
        return Ok(0);
    }
    let old = format!("level = {} AND {column} < {cut}", LEVELS[0]);
    let deleted = count(db, &format!("SELECT count() FROM {table} WHERE {old}"))?;
    if deleted > 0 {
        db.execute(&format!("ALTER TABLE {table} DELETE WHERE {old}")).map_err(|e| error("prune", e))?;
        wait_for_mutations(db, table)?;
        wait_on_replicas(db, table, &old)?;
    }
    Ok(deleted)
}

/// Waits until no replica `db` writes through holds a row of `table`
/// matching `condition`. A dropped partition or a finished mutation is
/// gone from the replica that ran it when the ALTER returns, and from the
/// shard's other replicas a moment later (they replay it from ZooKeeper),
/// while a read through the cluster may ask any of them: a CI run read a
/// pruned event back that way. A replica that cannot be reached is not
/// waited for; it replays the change when it is back. One server is its
/// own only replica.
fn wait_on_replicas(db: &Client, table: &str, condition: &str) -> Result<(), StoreError> {
    let started = std::time::Instant::now();
    for base in db.bases() {
        let replica = db.with_bases(vec![base]);
        loop {
            let left = match replica.select(&format!("SELECT count() FROM {table} WHERE {condition}")) {
                Ok(mut rows) => rows.u64().map_err(malformed("prune"))?,
                Err(e) if e.is_unreachable() => break,
                Err(e) => return Err(error("prune", e)),
            };
            if left == 0 {
                break;
            }
            if started.elapsed() > std::time::Duration::from_secs(600) {
                return Err(StoreError::Backend {
                    action: "prune",
                    source: format!("a replica still holds pruned rows of {table} after 10 minutes").into(),
                });
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
    Ok(())
}

/// An agent stays listed while it has batch records (as in the SQLite
/// store): of its sightings older than the cutoff, the one that names it
/// (newest sequence) and the newest one stay; an agent without records
/// goes entirely.
fn prune_agents(db: &Client, cut: i64) -> Result<(), StoreError> {
    let bad = malformed("prune");
    let mut rows = db
        .select(
            "SELECT agent_id, argMax(sequence, (sequence, received_unix_ms)),
                    argMax(received_unix_ms, (sequence, received_unix_ms)), max(received_unix_ms)
             FROM agent_seen WHERE agent_id IN (SELECT agent_id FROM batches) GROUP BY agent_id",
        )
        .map_err(|e| error("prune", e))?;
    let mut keep = Vec::new();
    while !rows.done() {
        let agent = quote(&rows.string().map_err(&bad)?);
        let (sequence, at, newest) = (rows.u64().map_err(&bad)?, rows.i64().map_err(&bad)?, rows.i64().map_err(&bad)?);
        keep.push(format!("({agent}, {sequence}, {at})"));
        keep.push(format!("({agent}, toUInt64(0), {newest})"));
    }
    let condition = if keep.is_empty() {
        format!("received_unix_ms < {cut}")
    } else {
        // The newest sighting is kept whatever its sequence.
        format!(
            "received_unix_ms < {cut} AND (agent_id, sequence, received_unix_ms) NOT IN ({keep})
             AND (agent_id, toUInt64(0), received_unix_ms) NOT IN ({keep})",
            keep = keep.join(", ")
        )
    };
    if count(db, &format!("SELECT count() FROM agent_seen WHERE {condition}"))? > 0 {
        db.execute(&format!("ALTER TABLE agent_seen DELETE WHERE {condition}")).map_err(|e| error("prune", e))?;
        wait_for_mutations(db, "agent_seen")?;
    }
    Ok(())
}

fn wait_for_mutations(db: &Client, table: &str) -> Result<(), StoreError> {
    let started = std::time::Instant::now();
    loop {
        let pending = count(
            db,
            &format!(
                "SELECT count() FROM system.mutations WHERE database = currentDatabase() AND table = {} AND is_done = 0",
                quote(table)
            ),
        )?;
        if pending == 0 {
            return Ok(());
        }
        if started.elapsed() > std::time::Duration::from_secs(600) {
            return Err(StoreError::Backend {
                action: "prune",
                source: format!("the delete of old rows in {table} has not finished after 10 minutes").into(),
            });
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}
