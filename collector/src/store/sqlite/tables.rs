//! What each digest reads and writes, as its agent parsed it: the newest
//! description per (digest, schema). Descriptions do not age with the
//! windows: they are small, and a digest's text never changes.
use prost::Message;
use rusqlite::{Transaction, params};
use sqlbee_proto::v1::DigestStats;

use super::{error, i, u};
use crate::store::{DigestTables, StoreError};

pub(super) const TABLES: &str = "
-- tables is an encoded sqlbee.v1.DigestStats holding only its tables.
CREATE TABLE IF NOT EXISTS digest_tables (
    digest       INTEGER NOT NULL,
    schema       TEXT NOT NULL,
    kind         TEXT NOT NULL,
    tables       BLOB NOT NULL,
    unknown      INTEGER NOT NULL,
    seen_unix_ms INTEGER NOT NULL,
    PRIMARY KEY (digest, schema)
) WITHOUT ROWID;
";

/// Stores the descriptions a window's digest rows carry.
pub(super) fn write(tx: &Transaction<'_>, window_end: i64, digests: &[DigestStats]) -> rusqlite::Result<()> {
    let described = digests.iter().filter(|d| !d.statement_kind.is_empty() || d.tables_unknown);
    let mut upsert = None;
    for d in described {
        let upsert = match &mut upsert {
            Some(statement) => statement,
            None => upsert.insert(tx.prepare_cached(
                "INSERT INTO digest_tables (digest, schema, kind, tables, unknown, seen_unix_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)
                 ON CONFLICT (digest, schema) DO UPDATE SET
                     kind = CASE WHEN excluded.seen_unix_ms >= seen_unix_ms THEN excluded.kind ELSE kind END,
                     tables = CASE WHEN excluded.seen_unix_ms >= seen_unix_ms THEN excluded.tables ELSE tables END,
                     unknown = CASE WHEN excluded.seen_unix_ms >= seen_unix_ms THEN excluded.unknown ELSE unknown END,
                     seen_unix_ms = max(seen_unix_ms, excluded.seen_unix_ms)",
            )?),
        };
        let tables = DigestStats { tables: d.tables.clone(), ..Default::default() }.encode_to_vec();
        upsert.execute(params![i(d.digest), d.schema, d.statement_kind, tables, d.tables_unknown, window_end])?;
    }
    Ok(())
}

pub(super) fn read(tx: &Transaction<'_>, digests: &[u64]) -> Result<Vec<DigestTables>, StoreError> {
    let failed = |e| error("tables", e);
    let mut out = Vec::new();
    for chunk in digests.chunks(1000) {
        // Numbers only: the list is written into the statement.
        let list: Vec<String> = chunk.iter().map(|d| i(*d).to_string()).collect();
        let mut statement = tx
            .prepare(&format!(
                "SELECT digest, schema, kind, tables, unknown FROM digest_tables WHERE digest IN ({})",
                list.join(", ")
            ))
            .map_err(failed)?;
        let rows = statement
            .query_map([], |r| {
                Ok((u(r.get(0)?), r.get::<_, String>(1)?, r.get(2)?, r.get::<_, Vec<u8>>(3)?, r.get(4)?))
            })
            .map_err(failed)?;
        for row in rows {
            let (digest, schema, kind, tables, unknown) = row.map_err(failed)?;
            let tables = DigestStats::decode(tables.as_slice())
                .map_err(|_| StoreError::Corrupt { what: "digest_tables.tables" })?
                .tables;
            out.push(DigestTables { digest, schema, kind, tables, unknown });
        }
    }
    Ok(out)
}
