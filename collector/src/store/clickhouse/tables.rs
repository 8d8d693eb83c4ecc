//! What each digest reads and writes: one row per description an agent
//! sent; reads take the newest per (digest, schema). No winner is needed:
//! a replayed batch's copy is the same description.
use prost::Message;
use sqlbee_proto::v1::DigestStats;

use super::{error, http::Client, malformed};
use crate::store::{DigestTables, StoreError};

pub(super) fn read(db: &Client, digests: &[u64]) -> Result<Vec<DigestTables>, StoreError> {
    let bad = malformed("tables");
    let mut out = Vec::new();
    for chunk in digests.chunks(5000) {
        let list: Vec<String> = chunk.iter().map(u64::to_string).collect();
        let mut rows = db
            .select(&format!(
                "SELECT digest, schema, argMax(kind, seen_unix_ms), argMax(tables, seen_unix_ms),
                        argMax(unknown, seen_unix_ms)
                 FROM digest_tables WHERE digest IN ({}) GROUP BY digest, schema",
                list.join(", ")
            ))
            .map_err(|e| error("tables", e))?;
        while !rows.done() {
            let digest = rows.u64().map_err(&bad)?;
            let schema = rows.string().map_err(&bad)?;
            let kind = rows.string().map_err(&bad)?;
            let tables = DigestStats::decode(rows.bytes().map_err(&bad)?.as_slice())
                .map_err(|_| StoreError::Corrupt { what: "digest_tables.tables" })?
                .tables;
            let unknown = rows.u8().map_err(&bad)? != 0;
            out.push(DigestTables { digest, schema, kind, tables, unknown });
        }
    }
    Ok(out)
}
