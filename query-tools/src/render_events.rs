//! `sqlbee events` as a table: one line per event, newest first, with what
//! was tested; the sides of the comparison are in `--format json`. And the
//! line `sqlbee annotate` prints for the marker it stored.
use std::io::Write;

use sqlbee_proto::v1::{Annotation, Event};
use sqlbee_vocabulary::clock;

use super::cells::cut;

fn time(ms: i64) -> String {
    if ms <= 0 { "-".into() } else { clock::rfc3339(clock::from_unix_ms(ms)) }
}

pub fn write_table(out: &mut impl Write, events: &[Event]) -> std::io::Result<()> {
    if events.is_empty() {
        writeln!(out, "no event in this range")?;
        return out.flush();
    }
    writeln!(out, "{:<12} {:<24} {:<24} {:<20} {:<16} DIGEST", "KIND", "OPENED", "CLOSED", "INSTANCE", "ID")?;
    for e in events {
        let closed = if e.closed_unix_ms == 0 { "open".to_string() } else { time(e.closed_unix_ms) };
        writeln!(
            out,
            "{:<12} {:<24} {:<24} {:<20} {:016x} {}{}",
            e.kind,
            time(e.opened_unix_ms),
            closed,
            cut(&e.instance, 20),
            e.digest,
            if e.schema.is_empty() { String::new() } else { format!("[{}] ", e.schema) },
            cut(&e.digest_text, 70)
        )?;
        writeln!(out, "    {}", e.evidence)?;
        if e.closed_unix_ms != 0 && !e.closed_because.is_empty() {
            writeln!(out, "    closed: {}", e.closed_because)?;
        }
    }
    out.flush()
}

pub fn write_marker(out: &mut impl Write, marker: &Annotation) -> std::io::Result<()> {
    let scope = if marker.instances.is_empty() { "the whole fleet".to_string() } else { marker.instances.join(", ") };
    writeln!(out, "marker {:016x} at {} for {scope}: {}", marker.id, time(marker.at_unix_ms), marker.text)?;
    out.flush()
}
