//! Writing: a batch's rows, then its record, each attempt under its own
//! ingest_id (see the module comment of `clickhouse` for why that is
//! exact); and pruning by dropping day partitions.
use std::{
    collections::BTreeMap,
    hash::{BuildHasher as _, Hasher as _},
    sync::atomic::{AtomicU64, Ordering},
};

use prost::Message as _;
use sqlbee_proto::v1::Batch;

use super::{
    error,
    http::{Client, RowWriter, quote},
    malformed, rollups,
    schema::{AGING, ROLLUP_AGING},
};
use crate::collector::store::{IngestOutcome, PruneCutoffs, PruneOutcome, StoreError, blob};

const DAY_MS: i64 = 86_400_000;

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

/// (ingest_id, content_hash) of every record of one batch identity.
fn records(db: &Client, agent_id: &str, epoch: u64, sequence: u64) -> Result<Vec<(u64, u64)>, StoreError> {
    let mut rows = db
        .select(&format!(
            "SELECT ingest_id, content_hash FROM batches
             WHERE agent_id = {} AND epoch = {epoch} AND sequence = {sequence} ORDER BY ingest_id",
            quote(agent_id)
        ))
        .map_err(|e| error("ingest", e))?;
    let mut out = Vec::new();
    while !rows.done() {
        out.push((rows.u64().map_err(malformed("ingest"))?, rows.u64().map_err(malformed("ingest"))?));
    }
    Ok(out)
}

/// The same rule as the SQLite store: 0 is "unknown" and never conflicts.
fn same_content(stored: u64, incoming: u64) -> bool {
    stored == 0 || incoming == 0 || stored == incoming
}

pub(super) fn ingest(db: &Client, batch: &Batch, received: i64, content_hash: u64) -> Result<IngestOutcome, StoreError> {
    let agent = batch.agent.clone().unwrap_or_default();
    let (epoch, sequence) = (batch.epoch, batch.sequence);
    let conflict =
        || StoreError::Conflict { agent_id: agent.agent_id.clone(), epoch, sequence };
    let before = records(db, &agent.agent_id, epoch, sequence)?;
    if let Some(&(_, stored)) = before.first() {
        if !same_content(stored, content_hash) {
            return Err(conflict());
        }
        seen(db, batch, received)?;
        return Ok(IngestOutcome { duplicate: true, conflict: false });
    }
    let ingest_id = new_ingest_id(sqlbee_common::clock::now_unix_ms());
    data_rows(db, batch, ingest_id, received)?;
    record(db, batch, ingest_id, received, content_hash)?;
    let after = records(db, &agent.agent_id, epoch, sequence)?;
    match after.first() {
        Some(&(winner, _)) if winner == ingest_id => {}
        Some(&(winner, stored)) => {
            if !same_content(stored, content_hash) {
                tracing::warn!(agent_id = %agent.agent_id, epoch, sequence, winner, ingest_id,
                    "another collector stored other content for this batch at the same time");
                return Err(conflict());
            }
            // Another collector stored the same batch at the same time:
            // its rows count, these never will.
            tracing::debug!(agent_id = %agent.agent_id, epoch, sequence, winner, ingest_id, "lost a race to store the same batch");
            seen(db, batch, received)?;
            return Ok(IngestOutcome { duplicate: true, conflict: false });
        }
        None => {
            return Err(StoreError::Backend {
                action: "ingest",
                source: "the batch record just written is not in the batches table".into(),
            });
        }
    }
    seen(db, batch, received)?;
    Ok(IngestOutcome { duplicate: false, conflict: false })
}

/// The agent's last word, stored or duplicate (never for a conflict).
fn seen(db: &Client, batch: &Batch, received: i64) -> Result<(), StoreError> {
    let agent = batch.agent.clone().unwrap_or_default();
    let mut w = RowWriter::default();
    w.str(&agent.agent_id).str(&agent.host).str(&agent.version).u64(batch.sequence).i64(received);
    w.end_row();
    db.insert("agent_seen", "agent_id, host, version, sequence, received_unix_ms", &w).map_err(|e| error("ingest", e))
}

/// The times the batch's rows are placed at: (first, last).
fn time_range(batch: &Batch, received: i64) -> (i64, i64) {
    let times = batch
        .windows
        .iter()
        .flat_map(|w| std::iter::once(w.window_end_unix_ms).chain(w.lock_waits.iter().map(|l| l.start_unix_ms)))
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

pub(super) fn record(
    db: &Client,
    batch: &Batch,
    ingest_id: u64,
    received: i64,
    content_hash: u64,
) -> Result<(), StoreError> {
    let agent = batch.agent.clone().unwrap_or_default();
    let (first, last) = time_range(batch, received);
    // The hours its windows end in, which a rollup covers (see `rollups`).
    let hours: std::collections::BTreeSet<i64> = batch
        .windows
        .iter()
        .map(|w| w.window_end_unix_ms)
        .chain(batch.agent_windows.iter().map(|w| w.window_end_unix_ms))
        .map(|end| end.div_euclid(rollups::LEVEL))
        .collect();
    let hours: Vec<i64> = hours.into_iter().collect();
    let mut w = RowWriter::default();
    w.str(&agent.agent_id).u64(batch.epoch).u64(batch.sequence).u64(ingest_id);
    w.u64(content_hash).i64(received).i64(first).i64(last).i64(last.max(received));
    w.array(&hours, |w, h| {
        w.i64(*h);
    });
    w.end_row();
    // `inserted` is left to the server's clock.
    db.insert(
        "batches",
        "agent_id, epoch, sequence, ingest_id, content_hash, received_unix_ms, first_unix_ms, last_unix_ms,
         keep_until_unix_ms, window_hours",
        &w,
    )
    .map_err(|e| error("ingest", e))
}

/// Every row of the batch under `ingest_id`, none of which counts before
/// its record exists.
pub(super) fn data_rows(db: &Client, batch: &Batch, ingest_id: u64, received: i64) -> Result<(), StoreError> {
    let agent = batch.agent.clone().unwrap_or_default();
    let identity = |w: &mut RowWriter| {
        w.str(&agent.agent_id).u64(batch.epoch).u64(batch.sequence).u64(ingest_id);
    };
    let mut windows = RowWriter::default();
    let mut digests = RowWriter::default();
    let mut texts = RowWriter::default();
    let mut samples = RowWriter::default();
    let mut locks = RowWriter::default();
    let mut text_seen = std::collections::HashSet::new();
    for (position, w) in batch.windows.iter().enumerate() {
        let server = w.instance.clone().unwrap_or_default();
        for l in &w.lock_waits {
            identity(&mut locks);
            locks.u32(locks.len() as u32).i64(received).str(&server.name).i64(l.start_unix_ms).u64(l.duration_ns);
            locks.str(&l.class).u64(l.connection_id).u64(l.digest).str(&l.digest_text).str(&l.sample);
            locks.str(&l.blocker_kind).str(&blob::encode_blockers(&l.blockers));
            locks.end_row();
        }
        // Same command twice in one window (should not happen) adds up.
        let mut commands: BTreeMap<&str, u64> = BTreeMap::new();
        for c in &w.commands {
            let slot = commands.entry(c.command.as_str()).or_default();
            *slot = slot.saturating_add(c.count);
        }
        let names: Vec<&str> = commands.keys().copied().collect();
        let counts: Vec<u64> = commands.values().copied().collect();
        identity(&mut windows);
        windows.u32(position as u32).str(&server.name).u32(server.pid).i64(server.start_time_unix_ms);
        windows.str(&server.container_id).str(&server.container).str(&server.build_id).str(&server.server_version);
        windows.i64(w.window_start_unix_ms).i64(w.window_end_unix_ms);
        for v in [
            w.statements,
            w.events,
            w.dropped_events,
            w.dropped_in_agent,
            w.unmatched,
            w.overflow_statements,
            w.nested_statements,
            w.replica_statements,
        ] {
            windows.u64(v);
        }
        windows.array(&names, |w, n| {
            w.str(n);
        });
        windows.array(&counts, |w, n| {
            w.u64(*n);
        });
        let has_cost = w.probes.is_some() || w.process.is_some() || w.aggregated_in_kernel > 0;
        windows.u8(u8::from(has_cost)).u64(w.aggregated_in_kernel);
        windows.bytes(&w.probes.as_ref().map(|m| m.encode_to_vec()).unwrap_or_default());
        windows.bytes(&w.process.as_ref().map(|m| m.encode_to_vec()).unwrap_or_default());
        windows.end_row();
        for d in &w.digests {
            if text_seen.insert(d.digest) {
                texts.u64(d.digest).str(&d.digest_text).i64(w.window_end_unix_ms);
                texts.end_row();
            }
            // Increasing codes; a code sent twice adds up, its last
            // non-empty message stands for it.
            let mut codes: BTreeMap<u32, u64> = BTreeMap::new();
            for e in &d.error_codes {
                let slot = codes.entry(e.code).or_default();
                *slot = slot.saturating_add(e.count);
                if !e.sample_message.is_empty() {
                    identity(&mut samples);
                    samples.u64(d.digest).u32(e.code).str(&e.sample_message).i64(w.window_end_unix_ms);
                    samples.u32(samples.len() as u32);
                    samples.end_row();
                }
            }
            let buckets = d.histogram.as_ref().map(|h| h.buckets.as_slice()).unwrap_or_default();
            identity(&mut digests);
            digests.str(&server.name).i64(w.window_end_unix_ms).u64(d.digest).str(&d.schema).u8(u8::from(d.nested));
            digests.str(&d.program).str(&d.program_kind).u64(d.parent_digest).str(&d.source);
            digests.u64(d.count).u64(d.errors).u64(d.sum_ns).u64(d.min_ns).u64(d.max_ns);
            digests.u64(d.estimated_count).u64(d.truncated);
            digests.array(buckets, |w, b| {
                w.u32(b.index);
            });
            digests.array(buckets, |w, b| {
                w.u64(b.count);
            });
            let codes: Vec<(u32, u64)> = codes.into_iter().collect();
            digests.array(&codes, |w, c| {
                w.u32(c.0);
            });
            digests.array(&codes, |w, c| {
                w.u64(c.1);
            });
            digests.array(&d.waits, |w, x| {
                w.str(&x.class);
            });
            digests.array(&d.waits, |w, x| {
                w.u64(x.sum_ns);
            });
            digests.array(&d.waits, |w, x| {
                w.u64(x.max_ns);
            });
            digests.array(&d.waits, |w, x| {
                w.u64(x.statements);
            });
            let stats = d.stats.as_ref();
            digests.opt_u64(stats.and_then(|s| s.rows_examined));
            digests.opt_u64(stats.and_then(|s| s.cpu_ns));
            digests.opt_u64(stats.and_then(|s| s.tmp_disk_tables));
            digests.bytes(&stats.map(|s| s.encode_to_vec()).unwrap_or_default());
            digests.bytes(&blob::encode_accounts(&d.accounts));
            digests.str(&d.sample);
            digests.end_row();
        }
    }
    let mut agent_windows = RowWriter::default();
    let mut untraced = RowWriter::default();
    for (position, w) in batch.agent_windows.iter().enumerate() {
        identity(&mut agent_windows);
        agent_windows.u32(position as u32).i64(received).i64(w.window_start_unix_ms).i64(w.window_end_unix_ms);
        agent_windows.bytes(&w.cost.as_ref().map(|m| m.encode_to_vec()).unwrap_or_default());
        agent_windows.bytes(&w.host.as_ref().map(|m| m.encode_to_vec()).unwrap_or_default());
        agent_windows.end_row();
        for u in &w.untraced {
            let server = u.instance.clone().unwrap_or_default();
            identity(&mut untraced);
            untraced.str(&server.name).u32(server.pid).i64(server.start_time_unix_ms).str(&server.container_id);
            untraced.str(&server.container).str(&server.build_id).str(&server.server_version);
            untraced.str(&u.reason).str(&u.kind).i64(u.since_unix_ms).i64(w.window_end_unix_ms);
            untraced.end_row();
        }
    }
    let mut gaps = RowWriter::default();
    for g in &batch.gaps {
        identity(&mut gaps);
        gaps.u64(g.first_sequence).u64(g.last_sequence).u64(g.batches).u64(g.lost_statements).u32(g.lost_windows);
        gaps.i64(g.first_window_start_unix_ms).i64(g.last_window_end_unix_ms).str(&g.reason).i64(received);
        gaps.i64(gap_keep_until(g, received));
        gaps.end_row();
    }
    const ID: &str = "agent_id, epoch, sequence, ingest_id";
    let inserts: [(&str, String, &RowWriter); 8] = [
        (
            "instance_windows",
            format!(
                "{ID}, position, instance, pid, start_time_unix_ms, container_id, container, build_id, server_version,
                 window_start, window_end, statements, events, dropped_events, dropped_in_agent, unmatched,
                 overflow_statements, nested_statements, replica_statements, command, command_count, has_cost,
                 aggregated_in_kernel, probes, process"
            ),
            &windows,
        ),
        (
            "digest_windows",
            format!(
                "{ID}, instance, window_end, digest, schema, nested, program, program_kind, parent_digest, source,
                 count, errors, sum_ns, min_ns, max_ns, estimated_count, truncated, hist_index, hist_count,
                 error_code, error_count, wait_class, wait_sum_ns, wait_max_ns, wait_statements, rows_examined,
                 cpu_ns, tmp_disk_tables, figures, accounts, sample"
            ),
            &digests,
        ),
        ("digest_texts", "digest, text, window_end".into(), &texts),
        ("error_samples", format!("{ID}, digest, code, message, window_end, position"), &samples),
        (
            "lock_waits",
            format!(
                "{ID}, position, received_unix_ms, instance, start_unix_ms, duration_ns, class, connection_id,
                 digest, digest_text, sample, blocker_kind, blockers"
            ),
            &locks,
        ),
        (
            "agent_windows",
            format!("{ID}, position, received_unix_ms, window_start, window_end, cost, host"),
            &agent_windows,
        ),
        (
            "untraced",
            format!(
                "{ID}, instance, pid, start_time_unix_ms, container_id, container, build_id, server_version,
                 reason, kind, since_unix_ms, seen_unix_ms"
            ),
            &untraced,
        ),
        (
            "gaps",
            format!(
                "{ID}, first_sequence, last_sequence, batches, lost_statements, lost_windows,
                 first_window_start_unix_ms, last_window_end_unix_ms, reason, received_unix_ms, keep_until_unix_ms"
            ),
            &gaps,
        ),
    ];
    for (table, columns, rows) in inserts {
        db.insert(table, &columns, rows).map_err(|e| error("ingest", e))?;
    }
    Ok(())
}

fn count(db: &Client, sql: &str) -> Result<u64, StoreError> {
    let mut rows = db.select(sql).map_err(|e| error("prune", e))?;
    rows.u64().map_err(malformed("prune"))
}

/// Deletes what is older than the raw cutoff, and hour rollups older than
/// theirs. Whole days go as partitions, cheap at any size; the part of the
/// cutoff's own day that is older goes by a mutation, waited for so the
/// answer after a prune no longer shows it. Counts are of rows deleted,
/// losers' rows included.
pub(super) fn prune(db: &Client, cutoffs: &PruneCutoffs) -> Result<PruneOutcome, StoreError> {
    let mut outcome = PruneOutcome::default();
    let err = |e| error("prune", e);
    let raw = AGING.iter().map(|&(table, column)| (table, column, cutoffs.raw));
    let rolled = ROLLUP_AGING.iter().map(|&(table, column)| (table, column, cutoffs.hour));
    for (table, column, cut) in raw.chain(rolled) {
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
        match table {
            "digest_windows" => outcome.digest_windows = deleted,
            "instance_windows" => outcome.instance_windows = deleted,
            "agent_windows" => outcome.agent_windows = deleted,
            "lock_waits" => outcome.lock_waits = deleted,
            "error_samples" => outcome.error_samples = deleted,
            "batches" => outcome.batches = deleted,
            "digest_rollups" | "instance_rollups" | "agent_rollups" => outcome.rollup_rows += deleted,
            _ => {}
        }
    }
    prune_agents(db, cutoffs.raw)?;
    Ok(outcome)
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
