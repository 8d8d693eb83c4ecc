//! What replicas applied, one row per instance, channel and window. ClickHouse
//! keeps both copies of a replayed batch; they are the same window, so a
//! read takes either.
use prost::Message;
use sqlbee_proto::v1::Replication;

use super::{
    error,
    http::{Client, quote},
    malformed,
};
use crate::store::{StoreError, StoredReplication};

pub(super) fn read(
    db: &Client,
    instance: Option<&str>,
    since_unix_ms: i64,
    until_unix_ms: i64,
    visit: &mut dyn FnMut(StoredReplication),
) -> Result<(), StoreError> {
    let bad = malformed("replication_windows");
    let filter = instance.map(|i| format!(" AND instance = {}", quote(i))).unwrap_or_default();
    let mut rows = db
        .select(&format!(
            "SELECT instance, window_start_unix_ms, any(window_end_unix_ms) AS end, any(replication)
             FROM replication_windows
             WHERE window_end_unix_ms > {since_unix_ms} AND window_end_unix_ms <= {until_unix_ms}{filter}
             GROUP BY instance, channel, window_start_unix_ms
             ORDER BY window_start_unix_ms, instance, channel"
        ))
        .map_err(|e| error("replication_windows", e))?;
    while !rows.done() {
        let instance = rows.string().map_err(&bad)?;
        let window_start_unix_ms = rows.i64().map_err(&bad)?;
        let window_end_unix_ms = rows.i64().map_err(&bad)?;
        let replication = Replication::decode(rows.bytes().map_err(&bad)?.as_slice())
            .map_err(|_| StoreError::Corrupt { what: "replication_windows.replication" })?;
        visit(StoredReplication { instance, window_start_unix_ms, window_end_unix_ms, replication });
    }
    Ok(())
}
