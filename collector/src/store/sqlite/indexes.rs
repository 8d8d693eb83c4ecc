//! Tables' indexes as agents read them over their login: the newest
//! reading per (instance, schema, table), whatever order batches arrive
//! in. Readings age with the plans.
use prost::Message;
use rusqlite::{Transaction, params};
use sqlbee_proto::v1::{PlanRow, TableIndexes};

use super::{error, i};
use crate::store::{StoreError, StoredIndexes};

pub(super) const TABLES: &str = "
-- indexes is an encoded sqlbee.v1.TableIndexes.
CREATE TABLE IF NOT EXISTS table_indexes (
    instance     TEXT NOT NULL,
    schema       TEXT NOT NULL,
    table_name   TEXT NOT NULL,
    read_unix_ms INTEGER NOT NULL,
    indexes      BLOB NOT NULL,
    PRIMARY KEY (instance, schema, table_name)
) WITHOUT ROWID;
";

pub(super) fn write(tx: &Transaction<'_>, instance: &str, readings: &[TableIndexes]) -> rusqlite::Result<()> {
    if readings.is_empty() {
        return Ok(());
    }
    let mut upsert = tx.prepare_cached(
        "INSERT INTO table_indexes (instance, schema, table_name, read_unix_ms, indexes)
         VALUES (?1, ?2, ?3, ?4, ?5)
         ON CONFLICT (instance, schema, table_name) DO UPDATE SET
             indexes = CASE WHEN excluded.read_unix_ms >= read_unix_ms THEN excluded.indexes ELSE indexes END,
             read_unix_ms = max(read_unix_ms, excluded.read_unix_ms)",
    )?;
    for t in readings {
        upsert.execute(params![instance, t.schema, t.table, t.read_unix_ms, t.encode_to_vec()])?;
    }
    Ok(())
}

pub(super) fn read(tx: &Transaction<'_>, instance: Option<&str>) -> Result<Vec<StoredIndexes>, StoreError> {
    let failed = |e| error("table_indexes", e);
    let mut statement =
        tx.prepare("SELECT instance, indexes FROM table_indexes WHERE ?1 IS NULL OR instance = ?1").map_err(failed)?;
    let rows = statement
        .query_map(params![instance], |r| Ok((r.get::<_, String>(0)?, r.get::<_, Vec<u8>>(1)?)))
        .map_err(failed)?;
    let mut out = Vec::new();
    for row in rows {
        let (instance, indexes) = row.map_err(failed)?;
        let table =
            TableIndexes::decode(indexes.as_slice()).map_err(|_| StoreError::Corrupt { what: "table_indexes" })?;
        out.push(StoredIndexes { instance, table });
    }
    Ok(out)
}

/// Every plan with a hash of `digests` first seen before `until`.
pub(super) fn plans_of(
    tx: &Transaction<'_>,
    digests: &[u64],
    instance: Option<&str>,
    until: i64,
) -> Result<Vec<PlanRow>, StoreError> {
    let failed = |e| error("plans", e);
    let mut out = Vec::new();
    for chunk in digests.chunks(1000) {
        // Numbers only: the list is written into the statement.
        let list: Vec<String> = chunk.iter().map(|d| i(*d).to_string()).collect();
        let mut statement = tx
            .prepare(&format!(
                "SELECT instance, first_seen_unix_ms, last_seen_unix_ms, plan FROM plans
                 WHERE digest IN ({}) AND plan_hash != 0 AND first_seen_unix_ms < ?1
                   AND (?2 IS NULL OR instance = ?2)",
                list.join(", ")
            ))
            .map_err(failed)?;
        let rows = statement
            .query_map(params![until, instance], |r| {
                Ok((r.get::<_, String>(0)?, r.get(1)?, r.get(2)?, r.get::<_, Vec<u8>>(3)?))
            })
            .map_err(failed)?;
        for row in rows {
            let (instance, first_seen_unix_ms, last_seen_unix_ms, plan) = row.map_err(failed)?;
            let plan =
                sqlbee_proto::v1::Plan::decode(plan.as_slice()).map_err(|_| StoreError::Corrupt { what: "plan" })?;
            out.push(PlanRow {
                instance,
                first_seen_unix_ms,
                last_seen_unix_ms,
                plan: Some(plan),
                ..Default::default()
            });
        }
    }
    Ok(out)
}
