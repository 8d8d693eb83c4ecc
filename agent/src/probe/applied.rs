//! The events a replica applied, as the replica-apply probes report them:
//! each decoded from its record and named by its class.
use sqlbee_kernel_abi::{APPLIED_NAME, AppliedEvent, ROWS_UNKNOWN};

use crate::discover::EventClass;

/// What a rows event does to its table's rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RowsKind {
    Write,
    Update,
    Delete,
}

impl RowsKind {
    /// The name the output and metrics use (`write_rows`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Self::Write => "write_rows",
            Self::Update => "update_rows",
            Self::Delete => "delete_rows",
        }
    }

    /// From the event's type code (MariaDB's `Log_event_type`: the v1 and
    /// v2 codes and the compressed ones).
    pub fn of_type_code(code: u32) -> Option<Self> {
        match code {
            23 | 30 | 166 | 169 => Some(Self::Write),
            24 | 31 | 167 | 170 => Some(Self::Update),
            25 | 32 | 168 | 171 => Some(Self::Delete),
            _ => None,
        }
    }
}

/// One event the replica applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Applied {
    /// The applier thread (or parallel worker) that applied it.
    pub tid: u32,
    pub class: EventClass,
    /// A rows event's kind and table; None for other events, or a rows
    /// event whose table could not be read.
    pub rows: Option<(RowsKind, String, String)>,
    /// When the primary wrote it (seconds since the epoch, its clock).
    pub primary_unix_s: u64,
    /// CLOCK_MONOTONIC ns.
    pub start_ns: u64,
    pub end_ns: u64,
    /// Rows the applier changed while applying it (None: not read).
    pub rows_changed: Option<u64>,
    /// A GTID event's replication channel (its connection name; empty:
    /// the default channel, or channels not told apart); None for other
    /// events, which belong to their thread's transaction's channel.
    pub channel: Option<String>,
}

/// The record, with its class looked up among this process's classes;
/// None when it is too short.
pub fn decode_applied(record: &[u8], classes: &[(u64, EventClass)]) -> Option<Applied> {
    if record.len() < std::mem::size_of::<AppliedEvent>() {
        return None;
    }
    // SAFETY: length checked; plain integers and byte arrays.
    let event: AppliedEvent = unsafe { std::ptr::read_unaligned(record.as_ptr().cast()) };
    let class = classes.iter().find(|(vtable, _)| *vtable == event.vtable).map_or(EventClass::Other, |(_, c)| *c);
    let rows = (class == EventClass::Rows)
        .then(|| {
            let kind = RowsKind::of_type_code(event.rows_type)?;
            let (schema, table) = (name(&event.schema), name(&event.table));
            (!schema.is_empty() && !table.is_empty()).then_some((kind, schema, table))
        })
        .flatten();
    Some(Applied {
        tid: event.tid,
        class,
        rows,
        primary_unix_s: event.when,
        start_ns: event.start_ns,
        end_ns: event.end_ns.max(event.start_ns),
        rows_changed: (event.rows != ROWS_UNKNOWN).then_some(event.rows),
        channel: (class == EventClass::Gtid).then(|| name(&event.table)),
    })
}

/// A NUL-terminated name, lossily: identifiers may be in any charset.
fn name(bytes: &[u8; APPLIED_NAME]) -> String {
    let end = bytes.iter().position(|b| *b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(vtable: u64, rows_type: u32, schema: &str, table: &str) -> Vec<u8> {
        let mut event = AppliedEvent {
            tid: 7,
            rows_type,
            vtable,
            when: 1_700_000_000,
            start_ns: 100,
            end_ns: 250,
            rows: 4,
            schema: [0; APPLIED_NAME],
            table: [0; APPLIED_NAME],
        };
        event.schema[..schema.len()].copy_from_slice(schema.as_bytes());
        event.table[..table.len()].copy_from_slice(table.as_bytes());
        // SAFETY: a plain `repr(C)` value viewed as its bytes.
        unsafe { std::slice::from_raw_parts((&raw const event).cast::<u8>(), std::mem::size_of::<AppliedEvent>()) }
            .to_vec()
    }

    #[test]
    fn a_rows_event_is_named_by_its_class_kind_and_table() {
        let classes = [(0x1000, EventClass::Rows), (0x2000, EventClass::Xid)];
        let rows = decode_applied(&record(0x1000, 24, "shop", "orders"), &classes).unwrap();
        assert_eq!(rows.rows, Some((RowsKind::Update, "shop".into(), "orders".into())));
        assert_eq!((rows.tid, rows.primary_unix_s, rows.end_ns - rows.start_ns), (7, 1_700_000_000, 150));
        assert_eq!(rows.rows_changed, Some(4));
        let xid = decode_applied(&record(0x2000, 0, "", ""), &classes).unwrap();
        assert_eq!((xid.class, xid.rows), (EventClass::Xid, None));
        assert_eq!(decode_applied(&record(0x3000, 0, "", ""), &classes).unwrap().class, EventClass::Other);
        assert_eq!(decode_applied(&record(0x1000, 99, "shop", "orders"), &classes).unwrap().rows, None);
        assert_eq!(decode_applied(&[0; 8], &classes), None);
        // A GTID event names its channel where a rows event names its table.
        let classes = [(0x4000, EventClass::Gtid)];
        assert_eq!(
            decode_applied(&record(0x4000, 0, "", "shop_eu"), &classes).unwrap().channel,
            Some("shop_eu".into())
        );
        assert_eq!(xid.channel, None);
    }
}
