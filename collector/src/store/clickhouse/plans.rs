//! Plans: sightings merged per distinct plan (first seen, last seen, the
//! newest sighting's plan) and plan changes, distinct (a replayed batch
//! wrote the same rows again).
use std::collections::HashMap;

use prost::Message;
use sqlbee_proto::v1::{Plan, PlanChange, PlanRow, PlansResponse};

use super::{
    equals, error,
    http::{Client, RowWriter, Rows, quote},
    malformed,
};
use crate::store::{PlansQuery, StoreError};

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

/// Bytes of conditions per look-up query: ClickHouse parses at most 256
/// KiB of a query by default, and a digest's condition holds its instance
/// and schema names.
const CONDITIONS_PER_QUERY: usize = 128 * 1024;

/// A digest on an instance: (instance, schema, digest).
type Key<'a> = (&'a str, &'a str, u64);

fn key(s: &Sighting) -> Key<'_> {
    (s.instance.as_str(), s.schema.as_str(), s.digest)
}

/// The plan changes of a group's sightings, into `changes`. An agent that
/// has not explained a digest since it started knows no previous plan:
/// the newest sighting before its own, stored or in the same group,
/// stands for it (on a cluster, those of the shard the agent writes to).
/// Stored plans are looked up before the digest's earliest such sighting
/// in the group, many digests per query, so a batch of many first plans
/// costs a query per `CONDITIONS_PER_QUERY` bytes of names, not one each.
pub(super) fn changes(db: &Client, sightings: &[Sighting], changes: &mut RowWriter) -> Result<(), StoreError> {
    // The group's own sightings per digest, oldest first.
    let mut in_group: HashMap<Key<'_>, Vec<(i64, u64)>> = HashMap::new();
    for s in sightings {
        in_group.entry(key(s)).or_default().push((s.at_unix_ms, s.plan_hash));
    }
    for own in in_group.values_mut() {
        own.sort_unstable();
    }
    let mut earliest: HashMap<Key<'_>, i64> = HashMap::new();
    for s in sightings.iter().filter(|s| s.previous_plan_hash == 0) {
        let at = earliest.entry(key(s)).or_insert(s.at_unix_ms);
        *at = (*at).min(s.at_unix_ms);
    }
    let mut stored = HashMap::new();
    let mut conditions = String::new();
    let mut pending = earliest.iter().peekable();
    while let Some(((instance, schema, digest), at)) = pending.next() {
        if !conditions.is_empty() {
            conditions.push_str(" OR ");
        }
        conditions.push_str(&format!(
            "(instance = {} AND schema = {} AND digest = {digest} AND seen_unix_ms < {at})",
            quote(instance),
            quote(schema)
        ));
        if pending.peek().is_none() || conditions.len() >= CONDITIONS_PER_QUERY {
            newest_stored(db, &conditions, &mut stored)?;
            conditions.clear();
        }
    }
    for s in sightings {
        let previous = if s.previous_plan_hash != 0 {
            s.previous_plan_hash
        } else {
            let mut newest = stored.get(&(s.instance.clone(), s.schema.clone(), s.digest)).copied();
            let own = &in_group[&key(s)];
            let before = own.partition_point(|(at, _)| *at < s.at_unix_ms).checked_sub(1).map(|i| own[i]);
            if let Some((at, hash)) = before
                && newest.is_none_or(|(seen, _)| at > seen)
            {
                newest = Some((at, hash));
            }
            newest.map_or(0, |(_, hash)| hash)
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

/// The newest stored plan (seen, hash) of each digest `conditions` select.
fn newest_stored(
    db: &Client,
    conditions: &str,
    stored: &mut HashMap<(String, String, u64), (i64, u64)>,
) -> Result<(), StoreError> {
    let bad = malformed("plans");
    let mut rows = db
        .select(&format!(
            "SELECT instance, schema, digest, max(seen_unix_ms), argMax(plan_hash, seen_unix_ms) FROM plans
             WHERE plan_hash != 0 AND ({conditions}) GROUP BY instance, schema, digest"
        ))
        .map_err(|e| error("ingest", e))?;
    while !rows.done() {
        let key = (rows.string().map_err(&bad)?, rows.string().map_err(&bad)?, rows.u64().map_err(&bad)?);
        stored.insert(key, (rows.i64().map_err(&bad)?, rows.u64().map_err(&bad)?));
    }
    Ok(())
}

/// A plan read as (instance, first sighting, last sighting, the newest
/// sighting's plan).
pub(super) fn plan_row(rows: &mut Rows) -> Result<PlanRow, StoreError> {
    let bad = malformed("plans");
    let instance = rows.string().map_err(&bad)?;
    let first_seen_unix_ms = rows.i64().map_err(&bad)?;
    let last_seen_unix_ms = rows.i64().map_err(&bad)?;
    let plan =
        Plan::decode(rows.bytes().map_err(&bad)?.as_slice()).map_err(|_| StoreError::Corrupt { what: "plans.plan" })?;
    Ok(PlanRow { instance, first_seen_unix_ms, last_seen_unix_ms, plan: Some(plan), ..Default::default() })
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
            out.plans.push(PlanRow { digest_text: digest_text.clone(), ..plan_row(&mut rows)? });
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
