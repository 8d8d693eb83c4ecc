//! Tables' indexes as agents read them over their login: one row per
//! reading; reads take the newest per (instance, schema, table). A
//! replayed batch's copy is the same reading.
use prost::Message;
use sqlbee_proto::v1::{PlanRow, TableIndexes};

use super::{
    error,
    http::{Client, quote},
    malformed,
};
use crate::store::{StoreError, StoredIndexes};

pub(super) fn read(db: &Client, instance: Option<&str>) -> Result<Vec<StoredIndexes>, StoreError> {
    let bad = malformed("table_indexes");
    let filter = instance.map(|i| format!("WHERE instance = {}", quote(i))).unwrap_or_default();
    let mut rows = db
        .select(&format!(
            "SELECT instance, argMax(indexes, read_unix_ms) FROM table_indexes {filter}
             GROUP BY instance, schema, table_name"
        ))
        .map_err(|e| error("table_indexes", e))?;
    let mut out = Vec::new();
    while !rows.done() {
        let instance = rows.string().map_err(&bad)?;
        let table = TableIndexes::decode(rows.bytes().map_err(&bad)?.as_slice())
            .map_err(|_| StoreError::Corrupt { what: "table_indexes.indexes" })?;
        out.push(StoredIndexes { instance, table });
    }
    Ok(out)
}

/// Every plan with a hash of `digests` first seen before `until`.
pub(super) fn plans_of(
    db: &Client,
    digests: &[u64],
    instance: Option<&str>,
    until: i64,
) -> Result<Vec<PlanRow>, StoreError> {
    let filter = instance.map(|i| format!(" AND instance = {}", quote(i))).unwrap_or_default();
    let mut out = Vec::new();
    for chunk in digests.chunks(5000) {
        let list: Vec<String> = chunk.iter().map(u64::to_string).collect();
        let mut rows = db
            .select(&format!(
                "SELECT instance, min(seen_unix_ms) AS first, max(seen_unix_ms), argMax(plan, seen_unix_ms)
                 FROM plans WHERE digest IN ({}) AND plan_hash != 0{filter}
                 GROUP BY instance, schema, digest, plan_hash HAVING first < {until}",
                list.join(", ")
            ))
            .map_err(|e| error("plans", e))?;
        while !rows.done() {
            out.push(super::plans::plan_row(&mut rows)?);
        }
    }
    Ok(out)
}
