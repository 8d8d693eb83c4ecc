//! Time series: one point per step, read from the coarsest rollup level
//! that divides the step.
use sqlbee_proto::v1::SeriesPoint;

use crate::collector::store::{SeriesQuery, StoreError};

pub(super) fn series(_tx: &rusqlite::Transaction<'_>, _query: &SeriesQuery) -> Result<Vec<SeriesPoint>, StoreError> {
    Err(StoreError::Corrupt { what: "series (not yet)" })
}
