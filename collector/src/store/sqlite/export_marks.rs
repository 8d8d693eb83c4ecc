//! How far each export has come (`ExportMark`): one row per export,
//! replaced as it goes.
use rusqlite::{OptionalExtension as _, Transaction, params};

use super::error;
use crate::store::{ExportMark, StoreError};

pub(super) const TABLES: &str = "
CREATE TABLE IF NOT EXISTS export_marks (
    name          TEXT PRIMARY KEY,
    step_ms       INTEGER NOT NULL,
    until_unix_ms INTEGER NOT NULL,
    instance      TEXT NOT NULL
);
";

pub(super) fn read(tx: &Transaction<'_>, name: &str) -> Result<Option<ExportMark>, StoreError> {
    tx.query_row("SELECT step_ms, until_unix_ms, instance FROM export_marks WHERE name = ?1", params![name], |row| {
        Ok(ExportMark { step_ms: row.get(0)?, until_unix_ms: row.get(1)?, instance: row.get(2)? })
    })
    .optional()
    .map_err(|e| error("export_mark", e))
}

pub(super) fn write(tx: &Transaction<'_>, name: &str, mark: &ExportMark) -> rusqlite::Result<()> {
    tx.execute(
        "INSERT OR REPLACE INTO export_marks (name, step_ms, until_unix_ms, instance) VALUES (?1, ?2, ?3, ?4)",
        params![name, mark.step_ms, mark.until_unix_ms, mark.instance],
    )?;
    Ok(())
}
