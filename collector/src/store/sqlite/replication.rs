//! What replicas applied, one row per instance, channel and window, as
//! the agent sent it. A replayed batch writes the same row again. Rows age with the
//! plans (hour rollups' retention): a replica's lag history is small.
use prost::Message;
use rusqlite::{Transaction, params};
use sqlbee_proto::v1::Replication;

use super::error;
use crate::store::{StoreError, StoredReplication};

pub(super) const TABLES: &str = "
-- replication is an encoded sqlbee.v1.Replication of one channel.
CREATE TABLE IF NOT EXISTS replication_windows (
    instance             TEXT NOT NULL,
    channel              TEXT NOT NULL,
    window_start_unix_ms INTEGER NOT NULL,
    window_end_unix_ms   INTEGER NOT NULL,
    replication          BLOB NOT NULL,
    PRIMARY KEY (instance, channel, window_start_unix_ms)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS replication_windows_by_end ON replication_windows (window_end_unix_ms);
";

/// Aging, in the writer's chunked form (cutoff, limit).
pub(super) const AGING: &str = "DELETE FROM replication_windows WHERE (instance, channel, window_start_unix_ms) IN
    (SELECT instance, channel, window_start_unix_ms FROM replication_windows WHERE window_end_unix_ms < ?1 LIMIT ?2)";

pub(super) fn write(
    tx: &Transaction<'_>,
    instance: &str,
    window: (i64, i64),
    channels: &[Replication],
) -> rusqlite::Result<()> {
    for r in channels {
        tx.prepare_cached(
            "INSERT OR REPLACE INTO replication_windows
               (instance, channel, window_start_unix_ms, window_end_unix_ms, replication)
             VALUES (?1, ?2, ?3, ?4, ?5)",
        )?
        .execute(params![instance, r.channel, window.0, window.1, r.encode_to_vec()])?;
    }
    Ok(())
}

pub(super) fn read(
    tx: &Transaction<'_>,
    instance: Option<&str>,
    since_unix_ms: i64,
    until_unix_ms: i64,
    visit: &mut dyn FnMut(StoredReplication),
) -> Result<(), StoreError> {
    let failed = |e| error("replication_windows", e);
    let mut statement = tx
        .prepare(
            "SELECT instance, window_start_unix_ms, window_end_unix_ms, replication FROM replication_windows
             WHERE window_end_unix_ms > ?1 AND window_end_unix_ms <= ?2 AND (?3 IS NULL OR instance = ?3)
             ORDER BY window_start_unix_ms, instance, channel",
        )
        .map_err(failed)?;
    let rows = statement
        .query_map(params![since_unix_ms, until_unix_ms, instance], |r| {
            Ok((r.get::<_, String>(0)?, r.get(1)?, r.get(2)?, r.get::<_, Vec<u8>>(3)?))
        })
        .map_err(failed)?;
    for row in rows {
        let (instance, window_start_unix_ms, window_end_unix_ms, blob) = row.map_err(failed)?;
        let replication =
            Replication::decode(blob.as_slice()).map_err(|_| StoreError::Corrupt { what: "replication_windows" })?;
        visit(StoredReplication { instance, window_start_unix_ms, window_end_unix_ms, replication });
    }
    Ok(())
}
