//! Markers and the events the detection records, each kept whole (an
//! encoded sqlbee.v1.Annotation or Event) beside the columns reads filter
//! by. An event's newer version replaces its row; both go with the hour
//! rollups' retention, an event by its opening (every version of an event
//! shares it, so none outlives the others).
use prost::Message;
use rusqlite::{Transaction, params};
use sqlbee_proto::v1::{Annotation, Event};

use super::{error, i};
use crate::store::{AnnotationsQuery, EventsQuery, StoreError};

pub(super) const TABLES: &str = "
CREATE TABLE IF NOT EXISTS annotations (
    id         INTEGER PRIMARY KEY,
    at_unix_ms INTEGER NOT NULL,
    annotation BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS annotations_at ON annotations (at_unix_ms);

CREATE TABLE IF NOT EXISTS events (
    id              INTEGER PRIMARY KEY,
    instance        TEXT NOT NULL,
    kind            TEXT NOT NULL,
    opened_unix_ms  INTEGER NOT NULL,
    closed_unix_ms  INTEGER NOT NULL,
    updated_unix_ms INTEGER NOT NULL,
    event           BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS events_opened ON events (opened_unix_ms);
CREATE INDEX IF NOT EXISTS events_closed ON events (closed_unix_ms);
";

/// What retention deletes, oldest first, a chunk at a time.
pub(super) const AGING: [&str; 2] = [
    "DELETE FROM annotations WHERE id IN (SELECT id FROM annotations WHERE at_unix_ms < ?1 LIMIT ?2)",
    "DELETE FROM events WHERE id IN (SELECT id FROM events WHERE opened_unix_ms < ?1 LIMIT ?2)",
];

pub(super) fn annotate(tx: &Transaction<'_>, annotation: &Annotation) -> rusqlite::Result<()> {
    tx.execute(
        "INSERT OR REPLACE INTO annotations (id, at_unix_ms, annotation) VALUES (?1, ?2, ?3)",
        params![i(annotation.id), annotation.at_unix_ms, annotation.encode_to_vec()],
    )?;
    Ok(())
}

pub(super) fn annotations(tx: &Transaction<'_>, query: &AnnotationsQuery) -> Result<Vec<Annotation>, StoreError> {
    let err = |e| error("annotations", e);
    let mut stmt = match query.id {
        Some(_) => tx.prepare("SELECT annotation FROM annotations WHERE id = ?1"),
        None => tx.prepare(
            "SELECT annotation FROM annotations WHERE at_unix_ms >= ?1 AND at_unix_ms < ?2 ORDER BY at_unix_ms, id",
        ),
    }
    .map_err(err)?;
    let mut rows = match query.id {
        Some(id) => stmt.query(params![i(id)]),
        None => stmt.query(params![query.since_unix_ms, query.until_unix_ms]),
    }
    .map_err(err)?;
    let mut out = Vec::new();
    while let Some(row) = rows.next().map_err(err)? {
        let bytes: Vec<u8> = row.get(0).map_err(err)?;
        let annotation =
            Annotation::decode(bytes.as_slice()).map_err(|_| StoreError::Corrupt { what: "annotations.annotation" })?;
        // Instances are inside the blob: the range bounds what is read.
        if query.admits(&annotation) {
            out.push(annotation);
            if out.len() >= query.limit {
                break;
            }
        }
    }
    Ok(out)
}

pub(super) fn put(tx: &Transaction<'_>, events: &[Event]) -> rusqlite::Result<()> {
    let mut upsert = tx.prepare_cached(
        "INSERT INTO events (id, instance, kind, opened_unix_ms, closed_unix_ms, updated_unix_ms, event)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
         ON CONFLICT (id) DO UPDATE SET instance = excluded.instance, kind = excluded.kind,
             opened_unix_ms = excluded.opened_unix_ms, closed_unix_ms = excluded.closed_unix_ms,
             updated_unix_ms = excluded.updated_unix_ms, event = excluded.event
         WHERE excluded.updated_unix_ms >= events.updated_unix_ms",
    )?;
    for e in events {
        upsert.execute(params![
            i(e.id),
            e.instance,
            e.kind,
            e.opened_unix_ms,
            e.closed_unix_ms,
            e.updated_unix_ms,
            e.encode_to_vec()
        ])?;
    }
    Ok(())
}

pub(super) fn read(tx: &Transaction<'_>, query: &EventsQuery) -> Result<Vec<Event>, StoreError> {
    let err = |e| error("events", e);
    let mut stmt = tx
        .prepare(
            "SELECT event FROM events
             WHERE opened_unix_ms < ?1 AND (closed_unix_ms = 0 OR (?2 = 0 AND closed_unix_ms >= ?3))
               AND (?4 IS NULL OR instance = ?4) AND (?5 IS NULL OR kind = ?5)
             ORDER BY opened_unix_ms DESC, id LIMIT ?6",
        )
        .map_err(err)?;
    let limit = i64::try_from(query.limit).unwrap_or(i64::MAX);
    let mut rows = stmt
        .query(params![query.until_unix_ms, query.open_only, query.since_unix_ms, query.instance, query.kind, limit])
        .map_err(err)?;
    let mut out = Vec::new();
    while let Some(row) = rows.next().map_err(err)? {
        let bytes: Vec<u8> = row.get(0).map_err(err)?;
        out.push(Event::decode(bytes.as_slice()).map_err(|_| StoreError::Corrupt { what: "events.event" })?);
    }
    Ok(out)
}
