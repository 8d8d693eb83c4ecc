//! Markers and the events the detection records, each kept whole (an
//! encoded sqlbee.v1.Annotation or Event) beside the columns reads filter
//! by. Nothing is updated in place: a new version of an event is a new row,
//! and reads take each id's newest (`argMax` by `updated_unix_ms`), so two
//! collectors that write one event leave it once. A marker retried is the
//! same id written twice, read once (`DISTINCT`).
use prost::Message;
use sqlbee_proto::v1::{Annotation, Event};

use super::{
    error,
    http::{Client, RowWriter, quote},
    malformed,
};
use crate::store::{AnnotationsQuery, EventsQuery, StoreError};

pub(super) fn annotate(db: &Client, annotation: &Annotation) -> Result<(), StoreError> {
    let mut rows = RowWriter::default();
    rows.col("id").u64(annotation.id);
    rows.col("at_unix_ms").i64(annotation.at_unix_ms);
    rows.col("annotation").bytes(&annotation.encode_to_vec());
    rows.end_row();
    db.insert("annotations", &rows).map_err(|e| error("annotate", e))
}

pub(super) fn annotations(db: &Client, query: &AnnotationsQuery) -> Result<Vec<Annotation>, StoreError> {
    let filter = match query.id {
        Some(id) => format!("id = {id}"),
        None => format!("at_unix_ms >= {} AND at_unix_ms < {}", query.since_unix_ms, query.until_unix_ms),
    };
    let mut rows = db
        .select(&format!(
            "SELECT DISTINCT id, at_unix_ms, annotation FROM annotations WHERE {filter} ORDER BY at_unix_ms, id"
        ))
        .map_err(|e| error("annotations", e))?;
    let bad = malformed("annotations");
    let mut out = Vec::new();
    while !rows.done() {
        let (_, _) = (rows.u64().map_err(&bad)?, rows.i64().map_err(&bad)?);
        let annotation = Annotation::decode(rows.bytes().map_err(&bad)?.as_slice())
            .map_err(|_| StoreError::Corrupt { what: "annotations.annotation" })?;
        if query.admits(&annotation) && out.len() < query.limit {
            out.push(annotation);
        }
    }
    Ok(out)
}

pub(super) fn put(db: &Client, events: &[Event]) -> Result<(), StoreError> {
    if events.is_empty() {
        return Ok(());
    }
    let mut rows = RowWriter::default();
    for e in events {
        rows.col("id").u64(e.id);
        rows.col("instance").str(&e.instance);
        rows.col("kind").str(&e.kind);
        rows.col("opened_unix_ms").i64(e.opened_unix_ms);
        rows.col("closed_unix_ms").i64(e.closed_unix_ms);
        rows.col("updated_unix_ms").i64(e.updated_unix_ms);
        rows.col("event").bytes(&e.encode_to_vec());
        rows.end_row();
    }
    db.insert("events", &rows).map_err(|e| error("events", e))
}

pub(super) fn read(db: &Client, query: &EventsQuery) -> Result<Vec<Event>, StoreError> {
    let mut filters = vec![format!("opened < {}", query.until_unix_ms)];
    if query.open_only {
        filters.push("closed = 0".into());
    } else {
        filters.push(format!("(closed = 0 OR closed >= {})", query.since_unix_ms));
    }
    if let Some(instance) = &query.instance {
        filters.push(format!("instance = {}", quote(instance)));
    }
    if let Some(kind) = &query.kind {
        filters.push(format!("kind = {}", quote(kind)));
    }
    let mut rows = db
        .select(&format!(
            "SELECT id, opened, event FROM (
                 SELECT id, argMax(instance, updated_unix_ms) AS instance, argMax(kind, updated_unix_ms) AS kind,
                     argMax(opened_unix_ms, updated_unix_ms) AS opened,
                     argMax(closed_unix_ms, updated_unix_ms) AS closed, argMax(event, updated_unix_ms) AS event
                 FROM events GROUP BY id)
             WHERE {} ORDER BY opened DESC, id LIMIT {}",
            filters.join(" AND "),
            query.limit
        ))
        .map_err(|e| error("events", e))?;
    let bad = malformed("events");
    let mut out = Vec::new();
    while !rows.done() {
        let (_, _) = (rows.u64().map_err(&bad)?, rows.i64().map_err(&bad)?);
        out.push(
            Event::decode(rows.bytes().map_err(&bad)?.as_slice())
                .map_err(|_| StoreError::Corrupt { what: "events.event" })?,
        );
    }
    Ok(out)
}
