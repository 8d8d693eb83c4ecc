//! `sqlbee series` answers as JSON or a table: one line per step.
use std::io::Write;

use sqlbee_proto::v1::SeriesResponse;

use super::cells::time;
use sqlbee_proto::json::rate;

fn ms(ns: u64) -> String {
    format!("{:.3}", ns as f64 / 1e6)
}

pub fn write_series_table(out: &mut impl Write, answer: &SeriesResponse, cost: bool) -> std::io::Result<()> {
    if cost {
        writeln!(
            out,
            "{:<25} {:>7} {:>11} {:>12} {:>13}",
            "start", "windows", "agent_cores", "agent_rss_mb", "probe_cpu_s"
        )?;
        for p in &answer.points {
            writeln!(
                out,
                "{:<25} {:>7} {:>11.4} {:>12.1} {:>13.3}",
                time(p.start_unix_ms),
                p.windows,
                p.agent_cpu_cores,
                p.agent_max_rss_bytes as f64 / (1024.0 * 1024.0),
                p.probe_cpu_seconds
            )?;
        }
    } else {
        writeln!(
            out,
            "{:<25} {:>10} {:>9} {:>7} {:>9} {:>9} {:>9} {:>11}",
            "start", "count", "per_s", "errors", "p50_ms", "p95_ms", "p99_ms", "total_ms"
        )?;
        for p in &answer.points {
            writeln!(
                out,
                "{:<25} {:>10} {:>9.1} {:>7} {:>9} {:>9} {:>9} {:>11}",
                time(p.start_unix_ms),
                p.count,
                rate(p.count, p.start_unix_ms, p.end_unix_ms),
                p.errors,
                ms(p.p50_ns),
                ms(p.p95_ns),
                ms(p.p99_ns),
                ms(p.sum_ns)
            )?;
        }
    }
    out.flush()
}
