//! How far each export has come (`ExportMark`). Nothing is updated in
//! place: each mark is a new row and a read takes the furthest, which is
//! also the newest, since an export only goes forward.
use super::{
    error,
    http::{Client, RowWriter, quote},
    malformed,
};
use crate::store::{ExportMark, StoreError};

pub(super) fn read(db: &Client, name: &str) -> Result<Option<ExportMark>, StoreError> {
    let mut rows = db
        .select(&format!(
            "SELECT step_ms, until_unix_ms, instance FROM export_marks WHERE name = {}
             ORDER BY until_unix_ms DESC, instance DESC LIMIT 1",
            quote(name)
        ))
        .map_err(|e| error("export_mark", e))?;
    if rows.done() {
        return Ok(None);
    }
    let bad = malformed("export_marks");
    Ok(Some(ExportMark {
        step_ms: rows.i64().map_err(&bad)?,
        until_unix_ms: rows.i64().map_err(&bad)?,
        instance: rows.string().map_err(&bad)?,
    }))
}

pub(super) fn write(db: &Client, name: &str, mark: &ExportMark) -> Result<(), StoreError> {
    let mut rows = RowWriter::default();
    rows.col("name").str(name);
    rows.col("step_ms").i64(mark.step_ms);
    rows.col("until_unix_ms").i64(mark.until_unix_ms);
    rows.col("instance").str(&mark.instance);
    rows.end_row();
    db.insert("export_marks", &rows).map_err(|e| error("export_marks", e))
}
