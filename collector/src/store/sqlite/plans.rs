//! Plans: one row per distinct plan of a digest on an instance (hash 0
//! holds the newest reason there is none), first and last seen kept
//! whatever order batches arrive in, and one row per plan change.
use prost::Message;
use rusqlite::{Transaction, params};
use sqlbee_proto::v1::{Plan, PlanChange, PlanRow, PlansResponse};

use super::{error, i, u};
use crate::store::{PlansQuery, StoreError};

pub(super) const TABLES: &str = "
-- Each distinct plan per (instance, schema, digest); plan is an encoded
-- sqlbee.v1.Plan, the newest sighting of that hash.
CREATE TABLE IF NOT EXISTS plans (
    instance           TEXT NOT NULL,
    schema             TEXT NOT NULL,
    digest             INTEGER NOT NULL,
    plan_hash          INTEGER NOT NULL,
    first_seen_unix_ms INTEGER NOT NULL,
    last_seen_unix_ms  INTEGER NOT NULL,
    plan               BLOB NOT NULL,
    PRIMARY KEY (digest, instance, schema, plan_hash)
) WITHOUT ROWID;

-- A digest's plan went from one hash to another: as its agent saw it, or,
-- for an agent's first plan of the digest, from the plan stored before.
CREATE TABLE IF NOT EXISTS plan_changes (
    instance   TEXT NOT NULL,
    schema     TEXT NOT NULL,
    digest     INTEGER NOT NULL,
    at_unix_ms INTEGER NOT NULL,
    from_hash  INTEGER NOT NULL,
    to_hash    INTEGER NOT NULL,
    PRIMARY KEY (at_unix_ms, digest, instance, schema, to_hash)
) WITHOUT ROWID;
";

/// Stores the plans one instance window brought.
pub(super) fn write(tx: &Transaction<'_>, instance: &str, plans: &[Plan]) -> rusqlite::Result<()> {
    if plans.is_empty() {
        return Ok(());
    }
    let mut upsert = tx.prepare_cached(
        "INSERT INTO plans (instance, schema, digest, plan_hash, first_seen_unix_ms, last_seen_unix_ms, plan)
         VALUES (?1, ?2, ?3, ?4, ?5, ?5, ?6)
         ON CONFLICT (digest, instance, schema, plan_hash) DO UPDATE SET
             plan = CASE WHEN excluded.last_seen_unix_ms >= last_seen_unix_ms THEN excluded.plan ELSE plan END,
             first_seen_unix_ms = min(first_seen_unix_ms, excluded.first_seen_unix_ms),
             last_seen_unix_ms = max(last_seen_unix_ms, excluded.last_seen_unix_ms)",
    )?;
    let mut stored_before = tx.prepare_cached(
        "SELECT plan_hash FROM plans
         WHERE digest = ?1 AND instance = ?2 AND schema = ?3 AND plan_hash != 0 AND last_seen_unix_ms < ?4
         ORDER BY last_seen_unix_ms DESC LIMIT 1",
    )?;
    for plan in plans {
        let at = plan.explained_unix_ms;
        // An agent that has not explained the digest since it started
        // knows no previous plan; what was stored before stands for it.
        let previous = if plan.previous_plan_hash == 0 && plan.plan_hash != 0 {
            stored_before
                .query_row(params![i(plan.digest), instance, plan.schema, at], |r| r.get::<_, i64>(0))
                .map(u)
                .or_else(|e| if e == rusqlite::Error::QueryReturnedNoRows { Ok(0) } else { Err(e) })?
        } else {
            plan.previous_plan_hash
        };
        upsert.execute(params![instance, plan.schema, i(plan.digest), i(plan.plan_hash), at, plan.encode_to_vec()])?;
        if plan.plan_hash != 0 && previous != 0 && previous != plan.plan_hash {
            super::row::insert_or_ignore(
                tx,
                "plan_changes",
                &[
                    ("instance", &instance),
                    ("schema", &plan.schema),
                    ("digest", &i(plan.digest)),
                    ("at_unix_ms", &at),
                    ("from_hash", &i(previous)),
                    ("to_hash", &i(plan.plan_hash)),
                ],
            )?;
        }
    }
    Ok(())
}

pub(super) fn read(tx: &Transaction<'_>, query: &PlansQuery) -> Result<PlansResponse, StoreError> {
    let failed = |e| error("plans", e);
    let text = |digest: u64| -> Result<String, StoreError> {
        tx.query_row("SELECT text FROM digest_texts WHERE digest = ?1", [i(digest)], |r| r.get(0))
            .or_else(|e| if e == rusqlite::Error::QueryReturnedNoRows { Ok(String::new()) } else { Err(e) })
            .map_err(failed)
    };
    let mut out = PlansResponse::default();
    if let Some(digest) = query.digest {
        let mut statement = tx
            .prepare(
                "SELECT instance, first_seen_unix_ms, last_seen_unix_ms, plan FROM plans
                 WHERE digest = ?1 AND (?2 IS NULL OR schema = ?2) AND (?3 IS NULL OR instance = ?3)
                 ORDER BY last_seen_unix_ms DESC, instance LIMIT ?4",
            )
            .map_err(failed)?;
        let rows = statement
            .query_map(params![i(digest), query.schema, query.instance, query.limit as i64], |r| {
                Ok((r.get::<_, String>(0)?, r.get(1)?, r.get(2)?, r.get::<_, Vec<u8>>(3)?))
            })
            .map_err(failed)?;
        let digest_text = text(digest)?;
        for row in rows {
            let (instance, first_seen_unix_ms, last_seen_unix_ms, plan) = row.map_err(failed)?;
            let plan = Plan::decode(plan.as_slice()).map_err(|_| StoreError::Corrupt { what: "plan" })?;
            out.plans.push(PlanRow {
                instance,
                first_seen_unix_ms,
                last_seen_unix_ms,
                plan: Some(plan),
                digest_text: digest_text.clone(),
                findings: Vec::new(),
            });
        }
    }
    let mut statement = tx
        .prepare(
            "SELECT instance, schema, digest, at_unix_ms, from_hash, to_hash FROM plan_changes
             WHERE at_unix_ms >= ?1 AND at_unix_ms < ?2 AND (?3 IS NULL OR digest = ?3)
               AND (?4 IS NULL OR schema = ?4) AND (?5 IS NULL OR instance = ?5)
             ORDER BY at_unix_ms DESC, digest LIMIT ?6",
        )
        .map_err(failed)?;
    let rows = statement
        .query_map(
            params![
                query.since_unix_ms,
                query.until_unix_ms,
                query.digest.map(i),
                query.schema,
                query.instance,
                query.limit as i64
            ],
            |r| {
                Ok(PlanChange {
                    instance: r.get(0)?,
                    schema: r.get(1)?,
                    digest: u(r.get(2)?),
                    at_unix_ms: r.get(3)?,
                    from_hash: u(r.get(4)?),
                    to_hash: u(r.get(5)?),
                    digest_text: String::new(),
                })
            },
        )
        .map_err(failed)?;
    for change in rows {
        let mut change = change.map_err(failed)?;
        change.digest_text = text(change.digest)?;
        out.changes.push(change);
    }
    Ok(out)
}
