//! Plans: sightings merged per distinct plan (first seen, last seen, the
//! newest sighting's plan) and plan changes, distinct (a replayed batch
//! wrote the same rows again).
use prost::Message;
use sqlbee_proto::v1::{Plan, PlanChange, PlanRow, PlansResponse};

use super::{
    equals, error,
    http::{Client, RowWriter, quote},
    malformed,
};
use crate::collector::store::{PlansQuery, StoreError};

/// A plan sighting a group of batches brings (plans without a hash, which
/// only say why there is none, left out).
pub(super) struct Sighting {
    pub instance: String,
    pub schema: String,
    pub digest: u64,
    pub at_unix_ms: i64,
    pub plan_hash: u64,
    /// As the agent knew it; 0 for its first plan of the digest.
    pub previous_plan_hash: u64,
}

/// The plan changes of a group's sightings, into `changes`. An agent that
/// has not explained a digest since it started knows no previous plan:
/// the newest sighting before its own, stored or in the same group,
/// stands for it (on a cluster, those of the shard the agent writes to).
pub(super) fn changes(db: &Client, sightings: &[Sighting], changes: &mut RowWriter) -> Result<(), StoreError> {
    let bad = malformed("plans");
    for s in sightings {
        let previous = if s.previous_plan_hash != 0 {
            s.previous_plan_hash
        } else {
            let mut rows = db
                .select(&format!(
                    "SELECT argMax(plan_hash, seen_unix_ms), max(seen_unix_ms) FROM plans
                     WHERE instance = {} AND schema = {} AND digest = {} AND plan_hash != 0 AND seen_unix_ms < {}",
                    quote(&s.instance),
                    quote(&s.schema),
                    s.digest,
                    s.at_unix_ms
                ))
                .map_err(|e| error("ingest", e))?;
            let (mut hash, mut seen) = (rows.u64().map_err(&bad)?, rows.i64().map_err(&bad)?);
            let same_digest = |o: &&Sighting| o.instance == s.instance && o.schema == s.schema && o.digest == s.digest;
            for o in sightings.iter().filter(same_digest) {
                if o.at_unix_ms < s.at_unix_ms && (hash == 0 || o.at_unix_ms > seen) {
                    (hash, seen) = (o.plan_hash, o.at_unix_ms);
                }
            }
            hash
        };
        if previous != 0 && previous != s.plan_hash {
            changes.col("instance").str(&s.instance).col("schema").str(&s.schema);
            changes.col("digest").u64(s.digest).col("at_unix_ms").i64(s.at_unix_ms);
            changes.col("from_hash").u64(previous).col("to_hash").u64(s.plan_hash);
            changes.end_row();
        }
    }
    Ok(())
}

pub(super) fn read(db: &Client, query: &PlansQuery) -> Result<PlansResponse, StoreError> {
    let bad = malformed("plans");
    let err = |e| error("plans", e);
    let filters = equals(&[("schema", &query.schema), ("instance", &query.instance)]);
    let mut texts: std::collections::HashMap<u64, String> = std::collections::HashMap::new();
    let mut text = |digest: u64| -> Result<String, StoreError> {
        if let Some(known) = texts.get(&digest) {
            return Ok(known.clone());
        }
        let mut rows =
            db.select(&format!("SELECT any(text) FROM digest_texts WHERE digest = {digest}")).map_err(err)?;
        let found = if rows.done() { String::new() } else { rows.string().map_err(&bad)? };
        texts.insert(digest, found.clone());
        Ok(found)
    };
    let mut out = PlansResponse::default();
    if let Some(digest) = query.digest {
        let digest_text = text(digest)?;
        let mut rows = db
            .select(&format!(
                "SELECT instance, min(seen_unix_ms) AS first, max(seen_unix_ms) AS last, argMax(plan, seen_unix_ms)
                 FROM plans WHERE digest = {digest}{filters}
                 GROUP BY instance, schema, plan_hash ORDER BY last DESC, instance LIMIT {}",
                query.limit
            ))
            .map_err(err)?;
        while !rows.done() {
            let instance = rows.string().map_err(&bad)?;
            let first_seen_unix_ms = rows.i64().map_err(&bad)?;
            let last_seen_unix_ms = rows.i64().map_err(&bad)?;
            let plan = Plan::decode(rows.bytes().map_err(&bad)?.as_slice())
                .map_err(|_| StoreError::Corrupt { what: "plans.plan" })?;
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
    let digest_filter = query.digest.map(|d| format!(" AND digest = {d}")).unwrap_or_default();
    let mut rows = db
        .select(&format!(
            "SELECT DISTINCT instance, schema, digest, at_unix_ms, from_hash, to_hash FROM plan_changes
             WHERE at_unix_ms >= {} AND at_unix_ms < {}{digest_filter}{filters}
             ORDER BY at_unix_ms DESC, digest LIMIT {}",
            query.since_unix_ms, query.until_unix_ms, query.limit
        ))
        .map_err(err)?;
    while !rows.done() {
        out.changes.push(PlanChange {
            instance: rows.string().map_err(&bad)?,
            schema: rows.string().map_err(&bad)?,
            digest: rows.u64().map_err(&bad)?,
            at_unix_ms: rows.i64().map_err(&bad)?,
            from_hash: rows.u64().map_err(&bad)?,
            to_hash: rows.u64().map_err(&bad)?,
            digest_text: String::new(),
        });
    }
    for change in &mut out.changes {
        change.digest_text = text(change.digest)?;
    }
    Ok(out)
}
