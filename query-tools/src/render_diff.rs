//! `sqlbee diff` as a table: one line per digest, both ranges' mean and
//! p99, the change, and the verdict, with the changes to the server that
//! came before a regression under it; the evidence is in `--format json`.
use std::io::Write;

use sqlbee_proto::v1::{DiffSide, DigestChange};

use super::cells::cut;

fn ms(ns: f64) -> String {
    format!("{:.3}", ns / 1e6)
}

fn mean_ms(side: Option<&DiffSide>) -> String {
    side.filter(|s| s.count > 0).map_or_else(|| "-".into(), |s| ms(s.sum_ns as f64 / s.count as f64))
}

fn p99_ms(side: Option<&DiffSide>) -> String {
    side.filter(|s| s.count > 0).map_or_else(|| "-".into(), |s| ms(s.p99_ns as f64))
}

fn count(side: Option<&DiffSide>) -> u64 {
    side.map_or(0, |s| s.count)
}

pub fn write_table(out: &mut impl Write, digests: &[DigestChange]) -> std::io::Result<()> {
    writeln!(
        out,
        "{:<10} {:>10} {:>10} {:>11} {:>11} {:>10} {:>10} {:>7}  {:<16} DIGEST",
        "STATUS", "BEFORE", "AFTER", "MEAN(ms)", "->", "P99(ms)", "->", "CHANGE", "ID"
    )?;
    for d in digests {
        let (b, a) = (d.before.as_ref(), d.after.as_ref());
        let change = match (b, a) {
            (Some(b), Some(a)) if b.count > 0 && a.count > 0 && b.sum_ns > 0 => {
                let ratio = (a.sum_ns as f64 / a.count as f64) / (b.sum_ns as f64 / b.count as f64);
                format!("{:+.0}%", (ratio - 1.0) * 100.0)
            }
            _ => "-".into(),
        };
        writeln!(
            out,
            "{:<10} {:>10} {:>10} {:>11} {:>11} {:>10} {:>10} {:>7}  {:016x} {}{}",
            d.status,
            count(b),
            count(a),
            mean_ms(b),
            mean_ms(a),
            p99_ms(b),
            p99_ms(a),
            change,
            d.digest,
            if d.schema.is_empty() { String::new() } else { format!("[{}] ", d.schema) },
            cut(&d.digest_text, 80)
        )?;
        for e in &d.changes {
            let at = sqlbee_vocabulary::clock::rfc3339(sqlbee_vocabulary::clock::from_unix_ms(e.opened_unix_ms));
            writeln!(out, "    after {} at {at} on {}", e.evidence, e.instance)?;
        }
    }
    out.flush()
}
