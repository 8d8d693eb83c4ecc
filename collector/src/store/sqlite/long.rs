//! Long, killed and disconnected statements: one row each, the statement
//! kept whole (an encoded sqlbee.v1.LongStatement), pruned by start time
//! with the raw windows. A batch is written once (its identity is checked
//! in the same transaction), so each statement is stored once.
use prost::Message;
use rusqlite::{Transaction, params};
use sqlbee_proto::v1::{LongStatement, LongStatementRow};

use super::{error, i, instance_filter};
use crate::store::{LocksQuery, Page, StoreError};

pub(super) const TABLES: &str = "
CREATE TABLE IF NOT EXISTS long_statements (
    id            INTEGER PRIMARY KEY,
    agent_id      TEXT NOT NULL,
    instance      TEXT NOT NULL,
    start_unix_ms INTEGER NOT NULL,
    outcome       TEXT NOT NULL,
    digest        INTEGER NOT NULL,
    statement     BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS long_statements_start ON long_statements (start_unix_ms);
CREATE INDEX IF NOT EXISTS long_statements_instance ON long_statements (instance, start_unix_ms);
";

pub(super) fn write(
    tx: &Transaction<'_>,
    agent_id: &str,
    instance: &str,
    statements: &[LongStatement],
) -> rusqlite::Result<()> {
    if statements.is_empty() {
        return Ok(());
    }
    let mut insert = tx.prepare_cached(
        "INSERT INTO long_statements (agent_id, instance, start_unix_ms, outcome, digest, statement)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )?;
    for s in statements {
        insert.execute(params![agent_id, instance, s.start_unix_ms, s.outcome, i(s.digest), s.encode_to_vec()])?;
    }
    Ok(())
}

pub(super) fn read(tx: &Transaction<'_>, query: &LocksQuery) -> Result<Page<LongStatementRow>, StoreError> {
    let err = |e| error("long_statements", e);
    let mut stmt = tx
        .prepare(&format!(
            "SELECT agent_id, instance, statement FROM long_statements WHERE start_unix_ms >= ?1{}
             ORDER BY start_unix_ms DESC, id DESC LIMIT {}",
            instance_filter(&query.instance, "instance"),
            query.limit
        ))
        .map_err(err)?;
    stmt.raw_bind_parameter(1, query.since_unix_ms).map_err(err)?;
    if let Some(instance) = &query.instance {
        stmt.raw_bind_parameter(2, instance).map_err(err)?;
    }
    let mut rows = stmt.raw_query();
    let mut out = Page::default();
    while let Some(row) = rows.next().map_err(err)? {
        if out.is_full() {
            out.skip();
            continue;
        }
        let bytes: Vec<u8> = row.get(2).map_err(err)?;
        let statement = LongStatement::decode(bytes.as_slice())
            .map_err(|_| StoreError::Corrupt { what: "long_statements.statement" })?;
        out.push(LongStatementRow {
            agent_id: row.get(0).map_err(err)?,
            instance: row.get(1).map_err(err)?,
            statement: Some(statement),
        });
    }
    Ok(out)
}
