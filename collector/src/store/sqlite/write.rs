//! Writing: one batch per transaction with its exactly-once record, and
//! pruning past the retention in small chunks so ingest never waits long.
use std::{collections::BTreeMap, sync::Mutex};

use prost::Message;
use rusqlite::{Connection, TransactionBehavior, params};
use sqlbee_proto::v1::{Batch, DigestStats};

use super::{costs::AgentCosts, error, i, lock, rollups, row};
use crate::store::{IngestOutcome, PruneCutoffs, PruneOutcome, StoreError, blob, rollup};

/// Rows deleted per prune transaction, so ingest never waits long.
const PRUNE_CHUNK: i64 = 5000;

pub(super) fn batch(
    tx: &rusqlite::Transaction<'_>,
    batch: &Batch,
    received: i64,
    content_hash: u64,
) -> rusqlite::Result<IngestOutcome> {
    let agent = batch.agent.clone().unwrap_or_default();
    let sequence = i(batch.sequence);
    let epoch = i(batch.epoch);
    let newest_window = batch
        .windows
        .iter()
        .map(|w| w.window_end_unix_ms)
        .chain(batch.agent_windows.iter().map(|w| w.window_end_unix_ms))
        .max()
        .unwrap_or(received);
    let inserted = tx
        .prepare_cached(
            "INSERT INTO batches (agent_id, epoch, sequence, received_unix_ms, keep_until_unix_ms, content_hash)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT DO NOTHING",
        )?
        .execute(params![agent.agent_id, epoch, sequence, received, newest_window.max(received), i(content_hash)])?;
    // A duplicate still proves the agent is alive. Host and version follow
    // the newest sequence so a replayed old batch does not roll them back.
    tx.prepare_cached(
        "INSERT INTO agents (agent_id, host, version, first_seen_unix_ms, last_seen_unix_ms, last_sequence)
         VALUES (?1, ?2, ?3, ?4, ?4, ?5)
         ON CONFLICT (agent_id) DO UPDATE SET
             host = CASE WHEN excluded.last_sequence >= last_sequence THEN excluded.host ELSE host END,
             version = CASE WHEN excluded.last_sequence >= last_sequence THEN excluded.version ELSE version END,
             last_seen_unix_ms = max(last_seen_unix_ms, excluded.last_seen_unix_ms),
             last_sequence = max(last_sequence, excluded.last_sequence)",
    )?
    .execute(params![agent.agent_id, agent.host, agent.version, received, sequence])?;
    if inserted == 0 {
        let stored: i64 = tx.query_row(
            "SELECT content_hash FROM batches WHERE agent_id = ?1 AND epoch = ?2 AND sequence = ?3",
            params![agent.agent_id, epoch, sequence],
            |r| r.get(0),
        )?;
        // 0: stored before hashes were kept, or sent without one.
        let conflict = stored != 0 && content_hash != 0 && stored != i(content_hash);
        return Ok(IngestOutcome { duplicate: !conflict, conflict });
    }
    // Same command twice in one window (should not happen) adds up.
    let mut insert_command = tx.prepare_cached(
        "INSERT INTO window_commands (window_id, command, count) VALUES (?1, ?2, ?3)
         ON CONFLICT DO UPDATE SET count = count + excluded.count",
    )?;
    let mut upsert_instance = tx.prepare_cached(
        "INSERT INTO agent_instances (agent_id, instance, pid, start_time_unix_ms, last_window_end_unix_ms,
                                      container_id, container, build_id, server_version, server_login)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)
         ON CONFLICT (agent_id, instance) DO UPDATE SET
             server_login = CASE WHEN excluded.last_window_end_unix_ms >= last_window_end_unix_ms THEN excluded.server_login ELSE server_login END,
             pid = CASE WHEN excluded.last_window_end_unix_ms >= last_window_end_unix_ms THEN excluded.pid ELSE pid END,
             container_id = CASE WHEN excluded.last_window_end_unix_ms >= last_window_end_unix_ms THEN excluded.container_id ELSE container_id END,
             container = CASE WHEN excluded.last_window_end_unix_ms >= last_window_end_unix_ms THEN excluded.container ELSE container END,
             start_time_unix_ms = CASE WHEN excluded.last_window_end_unix_ms >= last_window_end_unix_ms THEN excluded.start_time_unix_ms ELSE start_time_unix_ms END,
             build_id = CASE WHEN excluded.last_window_end_unix_ms >= last_window_end_unix_ms THEN excluded.build_id ELSE build_id END,
             server_version = CASE WHEN excluded.last_window_end_unix_ms >= last_window_end_unix_ms THEN excluded.server_version ELSE server_version END,
             last_window_end_unix_ms = max(last_window_end_unix_ms, excluded.last_window_end_unix_ms)",
    )?;
    let mut insert_text = tx.prepare_cached("INSERT OR IGNORE INTO digest_texts (digest, text) VALUES (?1, ?2)")?;
    // The newest window's message wins, whatever order batches arrive in.
    let mut upsert_sample = tx.prepare_cached(
        "INSERT INTO error_samples (instance, digest, code, message, last_seen) VALUES (?1, ?2, ?3, ?4, ?5)
         ON CONFLICT (digest, code, instance) DO UPDATE SET
             message = CASE WHEN excluded.last_seen >= last_seen THEN excluded.message ELSE message END,
             last_seen = max(last_seen, excluded.last_seen)",
    )?;
    for w in &batch.windows {
        let server = w.instance.clone().unwrap_or_default();
        for l in &w.lock_waits {
            row::insert(
                tx,
                "lock_waits",
                &[
                    ("agent_id", &agent.agent_id),
                    ("instance", &server.name),
                    ("start_unix_ms", &l.start_unix_ms),
                    ("duration_ns", &i(l.duration_ns)),
                    ("class", &l.class),
                    ("connection_id", &i(l.connection_id)),
                    ("digest", &i(l.digest)),
                    ("digest_text", &l.digest_text),
                    ("sample", &l.sample),
                    ("blocker_kind", &l.blocker_kind),
                    ("blockers", &blob::encode_blockers(&l.blockers)),
                ],
            )?;
        }
        row::insert(
            tx,
            "instance_windows",
            &[
                ("agent_id", &agent.agent_id),
                ("sequence", &sequence),
                ("instance", &server.name),
                ("pid", &server.pid),
                ("start_time_unix_ms", &server.start_time_unix_ms),
                ("window_start", &w.window_start_unix_ms),
                ("window_end", &w.window_end_unix_ms),
                ("statements", &i(w.statements)),
                ("events", &i(w.events)),
                ("dropped_events", &i(w.dropped_events)),
                ("dropped_in_agent", &i(w.dropped_in_agent)),
                ("unmatched", &i(w.unmatched)),
                ("overflow_statements", &i(w.overflow_statements)),
                ("nested_statements", &i(w.nested_statements)),
                ("replica_statements", &i(w.replica_statements)),
            ],
        )?;
        let window_id = tx.last_insert_rowid();
        for c in &w.commands {
            insert_command.execute(params![window_id, c.command, i(c.count)])?;
        }
        if w.probes.is_some() || w.process.is_some() || w.aggregated_in_kernel > 0 {
            let encoded = |m: Option<Vec<u8>>| m.unwrap_or_default();
            row::insert(
                tx,
                "instance_costs",
                &[
                    ("window_id", &window_id),
                    ("aggregated_in_kernel", &i(w.aggregated_in_kernel)),
                    ("probes", &encoded(w.probes.as_ref().map(Message::encode_to_vec))),
                    ("process", &encoded(w.process.as_ref().map(Message::encode_to_vec))),
                ],
            )?;
        }
        upsert_instance.execute(params![
            agent.agent_id,
            server.name,
            server.pid,
            server.start_time_unix_ms,
            w.window_end_unix_ms,
            server.container_id,
            server.container,
            server.build_id,
            server.server_version,
            w.server_login,
        ])?;
        super::plans::write(tx, &server.name, &w.plans)?;
        super::long::write(tx, &agent.agent_id, &server.name, &w.long_statements)?;
        super::tables::write(tx, w.window_end_unix_ms, &w.digests)?;
        super::indexes::write(tx, &server.name, &w.table_indexes)?;
        let window = (w.window_start_unix_ms, w.window_end_unix_ms);
        super::replication::write(tx, &server.name, window, &w.replication)?;
        for d in &w.digests {
            insert_text.execute(params![i(d.digest), d.digest_text])?;
            for e in &d.error_codes {
                if !e.sample_message.is_empty() {
                    upsert_sample.execute(params![
                        server.name,
                        i(d.digest),
                        e.code,
                        e.sample_message,
                        w.window_end_unix_ms
                    ])?;
                }
            }
            let Blobs { histogram, error_codes, waits } = blobs(d);
            let stats = d.stats.as_ref();
            let ranks = row::rank_values(stats);
            row::insert(
                tx,
                "digest_windows",
                &row::with_ranks(
                    &[
                        ("window_id", &window_id),
                        ("instance", &server.name),
                        ("window_end", &w.window_end_unix_ms),
                        ("digest", &i(d.digest)),
                        ("count", &i(d.count)),
                        ("errors", &i(d.errors)),
                        ("sum_ns", &i(d.sum_ns)),
                        ("min_ns", &i(d.min_ns)),
                        ("max_ns", &i(d.max_ns)),
                        ("histogram", &histogram),
                        ("error_codes", &error_codes),
                        ("sample", &d.sample),
                        ("truncated", &i(d.truncated)),
                        ("waits", &waits),
                        ("estimated_count", &i(d.estimated_count)),
                        ("schema", &d.schema),
                        ("figures", &stats.map(Message::encode_to_vec).unwrap_or_default()),
                        ("accounts", &blob::encode_senders(d)),
                        ("nested", &d.nested),
                        ("program", &d.program),
                        ("program_kind", &d.program_kind),
                        ("parent_digest", &i(d.parent_digest)),
                        ("source", &d.source),
                    ],
                    &ranks,
                ),
            )?;
        }
    }
    for w in &batch.agent_windows {
        row::insert(
            tx,
            "agent_windows",
            &[
                ("agent_id", &agent.agent_id),
                ("sequence", &sequence),
                ("window_start", &w.window_start_unix_ms),
                ("window_end", &w.window_end_unix_ms),
                ("cost", &w.cost.as_ref().map(Message::encode_to_vec).unwrap_or_default()),
                ("host", &w.host.as_ref().map(Message::encode_to_vec).unwrap_or_default()),
            ],
        )?;
    }
    // The newest agent window's word on a server wins, whatever order
    // batches arrive in.
    let mut upsert_untraced = tx.prepare_cached(
        "INSERT INTO agent_instances (agent_id, instance, pid, start_time_unix_ms, last_window_end_unix_ms,
             container_id, container, build_id, server_version, untraced_reason, untraced_kind,
             untraced_since_unix_ms, untraced_seen_unix_ms)
         VALUES (?1, ?2, ?3, ?4, 0, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)
         ON CONFLICT (agent_id, instance) DO UPDATE SET
             pid = CASE WHEN excluded.untraced_seen_unix_ms >= max(untraced_seen_unix_ms, last_window_end_unix_ms) THEN excluded.pid ELSE pid END,
             container_id = CASE WHEN excluded.untraced_seen_unix_ms >= max(untraced_seen_unix_ms, last_window_end_unix_ms) THEN excluded.container_id ELSE container_id END,
             container = CASE WHEN excluded.untraced_seen_unix_ms >= max(untraced_seen_unix_ms, last_window_end_unix_ms) THEN excluded.container ELSE container END,
             start_time_unix_ms = CASE WHEN excluded.untraced_seen_unix_ms >= max(untraced_seen_unix_ms, last_window_end_unix_ms) THEN excluded.start_time_unix_ms ELSE start_time_unix_ms END,
             build_id = CASE WHEN excluded.untraced_seen_unix_ms >= max(untraced_seen_unix_ms, last_window_end_unix_ms) THEN excluded.build_id ELSE build_id END,
             server_version = CASE WHEN excluded.untraced_seen_unix_ms >= max(untraced_seen_unix_ms, last_window_end_unix_ms) THEN excluded.server_version ELSE server_version END,
             untraced_reason = CASE WHEN excluded.untraced_seen_unix_ms >= max(untraced_seen_unix_ms, last_window_end_unix_ms) THEN excluded.untraced_reason ELSE untraced_reason END,
             untraced_kind = CASE WHEN excluded.untraced_seen_unix_ms >= max(untraced_seen_unix_ms, last_window_end_unix_ms) THEN excluded.untraced_kind ELSE untraced_kind END,
             untraced_since_unix_ms = CASE WHEN excluded.untraced_seen_unix_ms >= max(untraced_seen_unix_ms, last_window_end_unix_ms) THEN excluded.untraced_since_unix_ms ELSE untraced_since_unix_ms END,
             untraced_seen_unix_ms = max(untraced_seen_unix_ms, excluded.untraced_seen_unix_ms)",
    )?;
    for w in &batch.agent_windows {
        for u in &w.untraced {
            let server = u.instance.clone().unwrap_or_default();
            upsert_untraced.execute(params![
                agent.agent_id,
                server.name,
                server.pid,
                server.start_time_unix_ms,
                server.container_id,
                server.container,
                server.build_id,
                server.server_version,
                u.reason,
                u.kind,
                u.since_unix_ms,
                w.window_end_unix_ms,
            ])?;
        }
    }
    for g in &batch.gaps {
        // A gap reported twice (a replayed batch) is kept once.
        row::insert_or_ignore(
            tx,
            "gaps",
            &[
                ("agent_id", &agent.agent_id),
                ("first_sequence", &i(g.first_sequence)),
                ("last_sequence", &i(g.last_sequence)),
                ("batches", &i(g.batches)),
                ("lost_statements", &i(g.lost_statements)),
                ("lost_windows", &g.lost_windows),
                ("first_window_start_unix_ms", &g.first_window_start_unix_ms),
                ("last_window_end_unix_ms", &g.last_window_end_unix_ms),
                ("reason", &g.reason),
                ("received_unix_ms", &received),
            ],
        )?;
    }
    Ok(IngestOutcome { duplicate: false, conflict: false })
}

/// A digest row's histogram, error codes and waits as stored.
struct Blobs {
    histogram: Vec<u8>,
    error_codes: Vec<u8>,
    waits: Vec<u8>,
}

fn blobs(d: &DigestStats) -> Blobs {
    let histogram = d
        .histogram
        .as_ref()
        .map(|h| blob::encode(h.buckets.iter().map(|b| (u64::from(b.index), b.count))))
        .unwrap_or_default();
    // Increasing codes, as the blob wants; a code sent twice adds up.
    let mut codes: BTreeMap<u32, u64> = BTreeMap::new();
    for e in &d.error_codes {
        let slot = codes.entry(e.code).or_default();
        *slot = slot.saturating_add(e.count);
    }
    let error_codes = blob::encode(codes.into_iter().map(|(code, count)| (u64::from(code), count)));
    let waits = blob::encode_waits(d.waits.iter().map(|w| (w.class.as_str(), w.sum_ns, w.max_ns, w.statements)));
    Blobs { histogram, error_codes, waits }
}

/// Adds a stored batch's digest rows to their minute and hour buckets, in
/// the batch's transaction.
pub(super) fn rollups(tx: &rusqlite::Transaction<'_>, batch: &Batch) -> Result<(), StoreError> {
    let agent_id = batch.agent.as_ref().map(|a| a.agent_id.as_str()).unwrap_or_default();
    let err = |e| error("ingest", e);
    for w in &batch.agent_windows {
        if let Some(cost) = &w.cost {
            let costs = AgentCosts::of_window(cost, w.window_start_unix_ms, w.window_end_unix_ms);
            rollups::add_agent_cost(tx, agent_id, w.window_end_unix_ms, &costs).map_err(err)?;
        }
    }
    for w in &batch.windows {
        let instance = w.instance.as_ref().map(|s| s.name.as_str()).unwrap_or_default();
        rollups::add_instance_cost(tx, agent_id, instance, w.window_end_unix_ms, w.statements, w.probes.as_ref())
            .map_err(err)?;
        for d in &w.digests {
            let Blobs { histogram, error_codes, waits } = blobs(d);
            let accounts = blob::encode_senders(d);
            let row = rollups::Row {
                window_end: w.window_end_unix_ms,
                instance,
                schema: &d.schema,
                digest: d.digest,
                nested: d.nested,
                program: &d.program,
                program_kind: &d.program_kind,
                parent_digest: d.parent_digest,
                source: &d.source,
                count: d.count,
                errors: d.errors,
                sum_ns: d.sum_ns,
                min_ns: d.min_ns,
                max_ns: d.max_ns,
                estimated_count: d.estimated_count,
                stats: d.stats.as_ref(),
                histogram: &histogram,
                error_codes: &error_codes,
                waits: &waits,
                accounts: &accounts,
                sample: &d.sample,
            };
            rollups::add(tx, &row).map_err(|e| match e {
                rollups::RollupError::Sqlite(e) => error("ingest", e),
                rollups::RollupError::Corrupt(what) => StoreError::Corrupt { what },
            })?;
        }
    }
    Ok(())
}

pub(super) fn prune(writer: &Mutex<Connection>, cutoffs: &PruneCutoffs) -> Result<PruneOutcome, StoreError> {
    let older_than_unix_ms = cutoffs.raw;
    let err = |e| error("prune", e);
    let mut outcome = PruneOutcome::default();
    // Chunks in separate transactions: the writer lock is released in
    // between, so a large prune delays a batch by one chunk at most.
    let chunked_before = |sql: &str, cutoff: i64| -> Result<u64, StoreError> {
        let mut total = 0;
        loop {
            let mut conn = lock(writer);
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(err)?;
            let mut deleted = 0;
            for statement in sql.split(';').map(str::trim).filter(|s| !s.is_empty()) {
                deleted = tx.execute(statement, params![cutoff, PRUNE_CHUNK]).map_err(err)?;
            }
            tx.commit().map_err(err)?;
            total += deleted as u64;
            if (deleted as i64) < PRUNE_CHUNK {
                return Ok(total);
            }
        }
    };
    let chunked = |sql: &str| chunked_before(sql, older_than_unix_ms);
    // A bucket goes once all of it is past its level's retention.
    // Days follow the hour retention: a day bucket outliving its hours
    // would answer for ranges whose edges can no longer be read.
    for (level, cutoff) in
        [(rollup::MINUTE_MS, cutoffs.minute), (rollup::HOUR_MS, cutoffs.hour), (rollup::DAY_MS, cutoffs.hour)]
    {
        outcome.rollup_rows += chunked_before(
            &format!(
                "DELETE FROM instance_cost_rollups WHERE (level, bucket, agent_id, instance) IN
                    (SELECT level, bucket, agent_id, instance FROM instance_cost_rollups
                     WHERE level = {level} AND bucket <= ?1 - {level} LIMIT ?2);
                 DELETE FROM agent_cost_rollups WHERE (level, bucket, agent_id) IN
                    (SELECT level, bucket, agent_id FROM agent_cost_rollups
                     WHERE level = {level} AND bucket <= ?1 - {level} LIMIT ?2)"
            ),
            cutoff,
        )?;
        outcome.rollup_rows += chunked_before(
            &format!(
                "DELETE FROM digest_rollups WHERE (level, bucket, instance, schema, digest, nested, program,
                     program_kind, parent_digest, source) IN
                    (SELECT level, bucket, instance, schema, digest, nested, program, program_kind, parent_digest,
                         source FROM digest_rollups WHERE level = {level} AND bucket <= ?1 - {level} LIMIT ?2)"
            ),
            cutoff,
        )?;
    }
    // Plans, plan changes and digest descriptions outlive the raw windows:
    // they follow the hour rollups' retention, like a digest's history.
    for sql in [
        "DELETE FROM plans WHERE (digest, instance, schema, plan_hash) IN
            (SELECT digest, instance, schema, plan_hash FROM plans WHERE last_seen_unix_ms < ?1 LIMIT ?2)",
        "DELETE FROM plan_changes WHERE (at_unix_ms, digest, instance, schema, to_hash) IN
            (SELECT at_unix_ms, digest, instance, schema, to_hash FROM plan_changes WHERE at_unix_ms < ?1 LIMIT ?2)",
        "DELETE FROM digest_tables WHERE (digest, schema) IN
            (SELECT digest, schema FROM digest_tables WHERE seen_unix_ms < ?1 LIMIT ?2)",
        "DELETE FROM table_indexes WHERE (instance, schema, table_name) IN
            (SELECT instance, schema, table_name FROM table_indexes WHERE read_unix_ms < ?1 LIMIT ?2)",
        super::replication::AGING,
    ] {
        outcome.plan_rows += chunked_before(sql, cutoffs.hour)?;
    }
    for sql in super::events::AGING {
        outcome.event_rows += chunked_before(sql, cutoffs.hour)?;
    }
    outcome.digest_windows = chunked(
        "DELETE FROM digest_windows WHERE rowid IN
            (SELECT rowid FROM digest_windows WHERE window_end < ?1 LIMIT ?2)",
    )?;
    // The statements pick the same windows (same order, same
    // transaction): commands and costs first, then their windows.
    outcome.instance_windows = chunked(
        "DELETE FROM window_commands WHERE window_id IN
            (SELECT id FROM instance_windows WHERE window_end < ?1 ORDER BY id LIMIT ?2);
         DELETE FROM instance_costs WHERE window_id IN
            (SELECT id FROM instance_windows WHERE window_end < ?1 ORDER BY id LIMIT ?2);
         DELETE FROM instance_windows WHERE id IN
            (SELECT id FROM instance_windows WHERE window_end < ?1 ORDER BY id LIMIT ?2)",
    )?;
    outcome.agent_windows = chunked(
        "DELETE FROM agent_windows WHERE id IN
            (SELECT id FROM agent_windows WHERE window_end < ?1 ORDER BY id LIMIT ?2)",
    )?;
    outcome.lock_waits = chunked(
        "DELETE FROM lock_waits WHERE id IN
            (SELECT id FROM lock_waits WHERE start_unix_ms < ?1 ORDER BY id LIMIT ?2)",
    )?;
    outcome.long_statements = chunked(
        "DELETE FROM long_statements WHERE id IN
            (SELECT id FROM long_statements WHERE start_unix_ms < ?1 ORDER BY id LIMIT ?2)",
    )?;
    outcome.batches = chunked(
        "DELETE FROM batches WHERE (agent_id, epoch, sequence) IN
            (SELECT agent_id, epoch, sequence FROM batches WHERE keep_until_unix_ms < ?1 LIMIT ?2)",
    )?;
    let mut conn = lock(writer);
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(err)?;
    tx.execute_batch(&format!(
        "DELETE FROM gaps WHERE received_unix_ms < {cut} AND last_window_end_unix_ms < {cut};
         DELETE FROM agent_instances WHERE max(last_window_end_unix_ms, untraced_seen_unix_ms) < {cut};
         DELETE FROM agents WHERE last_seen_unix_ms < {cut}
             AND NOT EXISTS (SELECT 1 FROM batches b WHERE b.agent_id = agents.agent_id);
         DELETE FROM digest_texts WHERE NOT EXISTS
             (SELECT 1 FROM digest_windows d WHERE d.digest = digest_texts.digest)
             AND NOT EXISTS (SELECT 1 FROM digest_rollups r WHERE r.digest = digest_texts.digest);",
        cut = older_than_unix_ms
    ))
    .map_err(err)?;
    // A sample is as old as the newest window that brought its code.
    outcome.error_samples =
        tx.execute("DELETE FROM error_samples WHERE last_seen < ?1", [older_than_unix_ms]).map_err(err)? as u64;
    tx.commit().map_err(err)?;
    Ok(outcome)
}
