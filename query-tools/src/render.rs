//! Turns Query answers into one JSON document or a readable table. Pure:
//! takes the answer, writes to the given writer.
use std::io::Write;

use serde_json::Value;
use sqlbee_figures::{FIGURES, RANK_FIGURES, Unit};
use sqlbee_proto::v1::{
    Blocker, InstanceInfo, LockWaitRow, PlansResponse, TableTotals, TablesResponse, TopDigest, WaitStats,
};

use super::cells::{cut, time};
use sqlbee_proto::json::lag_ms;

pub fn write_json(out: &mut impl Write, value: &Value) -> std::io::Result<()> {
    serde_json::to_writer_pretty(&mut *out, value)?;
    out.write_all(b"\n")?;
    out.flush()
}

fn ms(ns: u64) -> String {
    format!("{:.3}", ns as f64 / 1e6)
}

/// A short duration for the wait column: `512ms`, `3.2ms`, `0.04ms`.
fn short_ms(ns: u64) -> String {
    let ms = ns as f64 / 1e6;
    if ms >= 10.0 {
        format!("{ms:.0}ms")
    } else if ms >= 1.0 {
        format!("{ms:.1}ms")
    } else {
        format!("{ms:.2}ms")
    }
}

/// The class with the most wait time and that time (`row_lock 512ms`);
/// `-` when the digest never waited.
fn dominant_wait(waits: &[WaitStats]) -> String {
    // Most time first, ties by class name, whatever order the answer has.
    let top = waits.iter().filter(|w| w.sum_ns > 0).min_by(|a, b| b.sum_ns.cmp(&a.sum_ns).then(a.class.cmp(&b.class)));
    match top {
        Some(w) => format!("{} {}", cut(&w.class, 14), short_ms(w.sum_ns)),
        None => "-".into(),
    }
}

pub fn write_top_table(out: &mut impl Write, digests: &[TopDigest]) -> std::io::Result<()> {
    let figures = rank_columns();
    write!(
        out,
        "{:>9} {:>6} {:>11} {:>9} {:>9} {:>9} {:>9} {:>9} {:>11} {:<24}",
        "count", "errors", "total_ms", "avg_ms", "p50_ms", "p95_ms", "p99_ms", "max_ms", "wait_ms", "top_wait",
    )?;
    for (_, header, width) in &figures {
        write!(out, " {header:>width$}")?;
    }
    writeln!(out, " {:>4}  {:<16}  {:<12}  digest_text", "inst", "digest", "schema")?;
    // Nested rows right under the client statement that ran them; the
    // rest (their parent is not in this answer, or they have none) after.
    let mut shown = vec![false; digests.len()];
    let mut order = Vec::with_capacity(digests.len());
    for (i, d) in digests.iter().enumerate().filter(|(_, d)| !d.nested) {
        order.push(i);
        shown[i] = true;
        for (k, child) in digests.iter().enumerate() {
            if child.nested && !shown[k] && child.parent_digest == d.digest {
                order.push(k);
                shown[k] = true;
            }
        }
    }
    order.extend((0..digests.len()).filter(|k| !shown[*k]));
    for d in order.into_iter().map(|k| &digests[k]) {
        let avg = d.sum_ns.checked_div(d.count).unwrap_or(0);
        let waited = d.waits.iter().fold(0u64, |a, w| a.saturating_add(w.sum_ns));
        let stats = d.stats.unwrap_or_default();
        write!(
            out,
            "{:>9} {:>6} {:>11} {:>9} {:>9} {:>9} {:>9} {:>9} {:>11} {:<24}",
            d.count,
            d.errors,
            ms(d.sum_ns),
            ms(avg),
            ms(d.p50_ns),
            ms(d.p95_ns),
            ms(d.p99_ns),
            ms(d.max_ns),
            ms(waited),
            dominant_wait(&d.waits),
        )?;
        let values = stats.values();
        for (place, _, width) in &figures {
            let shown = match (values[*place], FIGURES[*place].unit) {
                (None, _) => "-".to_string(),
                (Some(ns), Unit::Ns) => ms(ns),
                (Some(n), _) => n.to_string(),
            };
            write!(out, " {shown:>width$}")?;
        }
        writeln!(
            out,
            " {:>4}  {:016x}  {:<12}  {}",
            d.instances.len(),
            d.digest,
            cut(if d.schema.is_empty() { "-" } else { &d.schema }, 12),
            lineage_text(d)
        )?;
    }
    if digests.is_empty() {
        writeln!(out, "(no digests in this range)")?;
    }
    out.flush()
}

/// The columns of the figures the top list ranks by: (place in the
/// figure list, header, width). The header is the order key, in ms when
/// the figure is a time.
fn rank_columns() -> Vec<(usize, String, usize)> {
    RANK_FIGURES
        .iter()
        .filter_map(|&place| {
            let figure = &FIGURES[place];
            let rank = figure.rank?;
            let header = if figure.unit == Unit::Ns { format!("{}_ms", rank.key) } else { rank.key.to_string() };
            Some((place, header.clone(), header.len().max(9)))
        })
        .collect()
}

/// The digest text, marked when a stored program ran the statements
/// (`-> [procedure shop.p_restock] ...`) or they are not a client's.
fn lineage_text(d: &TopDigest) -> String {
    let text = cut(&d.digest_text, 100);
    if d.nested {
        let program = if d.program.is_empty() { "?" } else { &d.program };
        format!("  -> [{} {program}] {text}", if d.program_kind.is_empty() { "program" } else { &d.program_kind })
    } else if !d.source.is_empty() && d.source != "client" {
        format!("[{}] {text}", d.source)
    } else {
        text
    }
}

/// `HH:MM:SS` (UTC) of a time in ms since the epoch.
fn clock(ms: i64) -> String {
    if ms <= 0 {
        return "?".into();
    }
    let secs = (ms / 1000) % 86_400;
    format!("{:02}:{:02}:{:02}", secs / 3600, secs % 3600 / 60, secs % 60)
}

/// `conn 12 txn since 10:01:02: SELECT ... FOR UPDATE; UPDATE ...` per
/// blocker, ` | ` between them; `-` when there are none.
fn blockers_summary(blockers: &[Blocker]) -> String {
    if blockers.is_empty() {
        return "-".into();
    }
    blockers
        .iter()
        .map(|b| {
            let what = if b.transaction { "txn" } else { "stmt" };
            let statements = if b.statements.is_empty() { "?".to_string() } else { b.statements.join("; ") };
            format!("conn {} {what} since {}: {}", b.connection_id, clock(b.started_unix_ms), cut(&statements, 80))
        })
        .collect::<Vec<_>>()
        .join(" | ")
}

pub fn write_locks_table(out: &mut impl Write, rows: &[LockWaitRow]) -> std::io::Result<()> {
    if rows.iter().any(|r| r.wait.as_ref().is_some_and(|w| w.blocker_kind == "candidates")) {
        writeln!(
            out,
            "# blockers are candidates: connections with a transaction or statement open for the whole wait, not proven lock holders"
        )?;
    }
    writeln!(
        out,
        "{:<24} {:<22} {:>10} {:<14} {:>11}  {:<60}  blockers",
        "time", "instance", "connection", "class", "duration_ms", "waiting"
    )?;
    for r in rows {
        let w = r.wait.clone().unwrap_or_default();
        writeln!(
            out,
            "{:<24} {:<22} {:>10} {:<14} {:>11}  {:<60}  {}",
            time(w.start_unix_ms),
            cut(&r.instance, 22),
            w.connection_id,
            cut(&w.class, 14),
            ms(w.duration_ns),
            cut(&w.digest_text, 57),
            blockers_summary(&w.blockers)
        )?;
    }
    if rows.is_empty() {
        writeln!(out, "(no lock waits in this range)")?;
    }
    out.flush()
}

pub fn write_instances_table(
    out: &mut impl Write,
    instances: &[InstanceInfo],
    now_unix_ms: i64,
) -> std::io::Result<()> {
    writeln!(
        out,
        "{:<28} {:<20} {:<16} {:>8} {:<10} {:<24} {:>7} {:<24} {:>10} {:>8} {:>5} {:>10}",
        "instance",
        "host",
        "agent",
        "pid",
        "version",
        "last_window_end",
        "lag_s",
        "last_seen",
        "sequence",
        "batches",
        "gaps",
        "lost_stmts"
    )?;
    for i in instances {
        let lag = lag_ms(i, now_unix_ms).map_or_else(|| "-".into(), |ms| format!("{:.1}", ms as f64 / 1000.0));
        writeln!(
            out,
            "{:<28} {:<20} {:<16} {:>8} {:<10} {:<24} {:>7} {:<24} {:>10} {:>8} {:>5} {:>10}",
            if i.instance.is_empty() { "(none yet)" } else { &i.instance },
            cut(&i.host, 20),
            cut(&i.agent_id, 16),
            i.pid,
            cut(&i.version, 10),
            time(i.last_window_end_unix_ms),
            lag,
            time(i.last_seen_unix_ms),
            i.last_sequence,
            i.batches,
            i.gaps,
            i.lost_statements
        )?;
    }
    if instances.is_empty() {
        writeln!(out, "(no agents have reported yet)")?;
    }
    let untraced: Vec<&InstanceInfo> = instances.iter().filter(|i| !i.untraced_reason.is_empty()).collect();
    if !untraced.is_empty() {
        writeln!(out, "\nNOT TRACED (the agent found these servers but cannot trace them; it retries on a back-off):")?;
        for i in untraced {
            writeln!(
                out,
                "  {} ({}, {}, build {}) since {}: [{}] {}",
                i.instance,
                i.host,
                if i.server_version.is_empty() { "version unknown" } else { &i.server_version },
                if i.build_id.is_empty() { "unknown" } else { &i.build_id },
                time(i.untraced_since_unix_ms),
                i.untraced_kind,
                i.untraced_reason
            )?;
        }
    }
    let logins: Vec<&InstanceInfo> =
        instances.iter().filter(|i| !i.server_login.is_empty() && i.server_login != "ok").collect();
    if !logins.is_empty() {
        writeln!(out, "\nNO PLANS (the agent's --server-login fails; counting goes on, the login is retried):")?;
        for i in logins {
            writeln!(out, "  {} ({}): {}", i.instance, i.host, i.server_login)?;
        }
    }
    super::render_cost::write_instance_costs(out, instances)?;
    out.flush()
}

fn table_name(t: &TableTotals) -> String {
    if t.schema.is_empty() { t.table.clone() } else { format!("{}.{}", t.schema, t.table) }
}

/// `sqlbee top --by table`: tables by all the time spent on them, the
/// statements that touch them and the rows events replicas applied to
/// them, each with its share of the whole.
pub fn write_top_tables(out: &mut impl Write, answer: &TablesResponse) -> std::io::Result<()> {
    let total = |t: &TableTotals| t.sum_ns.saturating_add(t.apply_ns);
    let all: u64 = answer.tables.iter().map(total).sum();
    writeln!(
        out,
        "{:<40} {:>12} {:>7} {:>12} {:>12} {:>10} {:>12} {:>12}  kinds",
        "table", "total_ms", "share", "statements", "stmt_ms", "applied", "rows", "apply_ms"
    )?;
    for t in &answer.tables {
        let events: u64 = t.applied.iter().map(|a| a.events).sum();
        let rows: Option<u64> = t.applied.iter().try_fold(0u64, |sum, a| a.rows.map(|r| sum + r));
        writeln!(
            out,
            "{:<40} {:>12} {:>6.1}% {:>12} {:>12} {:>10} {:>12} {:>12}  {}",
            cut(&table_name(t), 40),
            ms(total(t)),
            if all == 0 { 0.0 } else { 100.0 * total(t) as f64 / all as f64 },
            t.statements,
            ms(t.sum_ns),
            events,
            if t.applied.is_empty() {
                "-".to_string()
            } else {
                rows.map_or_else(|| "?".to_string(), |r| r.to_string())
            },
            ms(t.apply_ns),
            t.applied.iter().map(|a| a.kind.as_str()).collect::<Vec<_>>().join(",")
        )?;
    }
    if answer.tables.is_empty() {
        writeln!(out, "(no statement touched a table and no replica applied rows in this range)")?;
    }
    writeln!(
        out,
        "# a statement counts in full for every table its digest touches; applied: rows events a replica applied"
    )
}

pub fn write_tables_table(out: &mut impl Write, answer: &TablesResponse) -> std::io::Result<()> {
    writeln!(out, "# each statement counts in full for every table its digest touches")?;
    writeln!(
        out,
        "{:<40} {:>12} {:>12} {:>14} {:>10} {:>10} {:>8} {:>12}",
        "table", "statements", "total_ms", "rows_examined", "writing", "reading", "digests", "applied_ms"
    )?;
    for t in &answer.tables {
        writeln!(
            out,
            "{:<40} {:>12} {:>12} {:>14} {:>10} {:>10} {:>8} {:>12}",
            cut(&table_name(t), 40),
            t.statements,
            ms(t.sum_ns),
            t.rows_examined.map_or_else(|| "-".to_string(), |r| r.to_string()),
            t.writing_statements,
            t.reading_statements,
            t.digest_count,
            if t.applied.is_empty() { "-".to_string() } else { ms(t.apply_ns) }
        )?;
    }
    if answer.tables.iter().any(|t| !t.applied.is_empty()) {
        writeln!(out, "# applied_ms: the rows events replicas applied to the table (`sqlbee replication` has more)")?;
    }
    if answer.tables.is_empty() {
        writeln!(out, "(no statement touched a table in this range)")?;
    }
    let findings: Vec<(String, &sqlbee_proto::v1::Finding)> = answer
        .tables
        .iter()
        .flat_map(|t| t.findings.iter().map(move |f| (format!("{}.{}", t.schema, t.table), f)))
        .collect();
    if !findings.is_empty() {
        writeln!(out, "# indexes to look at (`--format json` has the evidence and what to check first)")?;
        for (table, f) in findings {
            writeln!(out, "{:<40} {:<16} {:<32} {}", cut(&table, 40), f.kind, cut(&f.plan_line, 32), f.suggestion)?;
        }
    }
    if answer.unknown_statements + answer.undescribed_statements > 0 {
        writeln!(
            out,
            "# not in any table: {} statements whose text the agent could not parse, {} not described yet",
            answer.unknown_statements, answer.undescribed_statements
        )?;
    }
    out.flush()
}

/// A hash as 16 hex digits, `-` for none.
fn plan_hash(h: u64) -> String {
    if h == 0 { "-".into() } else { format!("{h:016x}") }
}

pub fn write_plans_table(out: &mut impl Write, answer: &PlansResponse) -> std::io::Result<()> {
    if let Some(first) = answer.plans.first() {
        writeln!(out, "{}", first.digest_text)?;
    }
    for row in &answer.plans {
        let p = row.plan.clone().unwrap_or_default();
        writeln!(
            out,
            "\nplan {} on {} (schema {}), seen {} .. {}",
            plan_hash(p.plan_hash),
            row.instance,
            if p.schema.is_empty() { "-" } else { &p.schema },
            time(row.first_seen_unix_ms),
            time(row.last_seen_unix_ms)
        )?;
        if !p.not_explained.is_empty() {
            writeln!(out, "  not explained: {}", p.not_explained)?;
        }
        for a in &p.access {
            let key = if a.key.is_empty() { "no index".to_string() } else { format!("key {}", a.key) };
            let rows = a.rows.map_or_else(String::new, |r| format!(", ~{r} rows"));
            writeln!(out, "  {:<32} {:<8} {key}{rows}", cut(&a.table, 32), a.r#type)?;
        }
        let extras: Vec<&str> = [(p.filesort, "filesort"), (p.temporary, "temporary table")]
            .into_iter()
            .filter_map(|(on, name)| on.then_some(name))
            .collect();
        if !extras.is_empty() {
            writeln!(out, "  uses {}", extras.join(" and "))?;
        }
        for f in &row.findings {
            writeln!(out, "  ! {} [{}]: {}", f.kind, f.plan_line, f.detail)?;
            if !f.suggestion.is_empty() {
                writeln!(out, "    {}", f.suggestion)?;
            }
        }
    }
    writeln!(out, "\n{:<24} {:<22} {:<16} {:<16} {:<16}  digest", "plan changed", "instance", "schema", "from", "to")?;
    for c in &answer.changes {
        writeln!(
            out,
            "{:<24} {:<22} {:<16} {:<16} {:<16}  {}",
            time(c.at_unix_ms),
            cut(&c.instance, 22),
            cut(&c.schema, 16),
            plan_hash(c.from_hash),
            plan_hash(c.to_hash),
            cut(&c.digest_text, 60)
        )?;
    }
    if answer.plans.is_empty() && answer.changes.is_empty() {
        writeln!(out, "(no plans: agents collect them only with --server-login; see the manual, \"Plans\")")?;
    }
    out.flush()
}

pub fn write_activity_table(
    out: &mut impl Write,
    answer: &sqlbee_proto::v1::ActivityResponse,
    now_unix_ms: i64,
) -> std::io::Result<()> {
    for live in &answer.instances {
        let snapshot = live.activity.clone().unwrap_or_default();
        let name = snapshot.instance.as_ref().map(|i| i.name.as_str()).unwrap_or("");
        writeln!(
            out,
            "# {name}: {} connections, read {} ms ago{}",
            snapshot.connections.len(),
            (now_unix_ms - live.taken_unix_ms).max(0),
            if snapshot.blocker_sources.is_empty() {
                String::new()
            } else {
                format!(", blockers from {}", snapshot.blocker_sources.join(", "))
            }
        )?;
        if !snapshot.warning.is_empty() {
            writeln!(out, "# warning: {}", snapshot.warning)?;
        }
        writeln!(
            out,
            "{:>8} {:<20} {:<12} {:<8} {:>10} {:<28} {:<14} {:>10}  statement",
            "thread", "account", "schema", "command", "running", "state", "wait", "blocked_by"
        )?;
        for c in &snapshot.connections {
            writeln!(
                out,
                "{:>8} {:<20} {:<12} {:<8} {:>10} {:<28} {:<14} {:>10}  {}",
                c.thread_id,
                cut(&format!("{}@{}", c.user, c.host), 20),
                cut(&c.schema, 12),
                cut(&c.command, 8),
                format!("{:.1}s", c.running_ms as f64 / 1000.0),
                cut(&c.state, 28),
                if c.wait.is_empty() { "-" } else { c.wait.as_str() },
                if c.blocked_by == 0 { "-".to_string() } else { c.blocked_by.to_string() },
                cut(&c.digest_text, 80),
            )?;
        }
    }
    if answer.instances.is_empty() {
        writeln!(out, "(no live activity: no agent sent any in the last 30 s)")?;
    }
    out.flush()
}

pub fn write_long_table(out: &mut impl Write, rows: &[sqlbee_proto::v1::LongStatementRow]) -> std::io::Result<()> {
    writeln!(
        out,
        "{:<24} {:<20} {:>8} {:<12} {:>12} {:>10}  statement",
        "start", "instance", "thread", "outcome", "duration", "blocked_by"
    )?;
    for r in rows {
        let s = r.statement.clone().unwrap_or_default();
        writeln!(
            out,
            "{:<24} {:<20} {:>8} {:<12} {:>12} {:>10}  {}",
            sqlbee_vocabulary::clock::rfc3339(sqlbee_vocabulary::clock::from_unix_ms(s.start_unix_ms)),
            cut(&r.instance, 20),
            s.connection_id,
            s.outcome,
            ms(s.duration_ns),
            match (s.deadlock_with, s.blocked_by) {
                (0, 0) => "-".to_string(),
                (0, blocker) => blocker.to_string(),
                (other, _) => format!("dl:{other}"),
            },
            cut(&s.digest_text, 80)
        )?;
    }
    if rows.is_empty() {
        writeln!(out, "(no statement ran long, was killed or lost its client in this range)")?;
    }
    out.flush()
}

/// Per replica: its transactions and lag, then the tables and event
/// classes that took its apply time, most first.
pub fn write_replication_table(
    out: &mut impl Write,
    answer: &sqlbee_proto::v1::ReplicationResponse,
) -> std::io::Result<()> {
    let shaped = sqlbee_proto::json::replication_json(answer);
    for r in shaped["replicas"].as_array().into_iter().flatten() {
        let lag = |key: &str| r["lag"][key].as_u64().map_or("-".to_string(), |v| format!("{v} ms"));
        let channel = match r["channel"].as_str().unwrap_or_default() {
            "" => String::new(),
            channel => format!(" (channel {channel})"),
        };
        writeln!(
            out,
            "{}{channel}: {} transactions, lag p50 {}, p99 {}, max {}",
            r["instance"].as_str().unwrap_or_default(),
            r["transactions"],
            lag("p50_ms"),
            lag("p99_ms"),
            lag("max_ms")
        )?;
        if let Some(lost) = r["lost_events"].as_u64().filter(|n| *n > 0) {
            writeln!(out, "  # {lost} events applied could not be timed: the counts below are short by that many")?;
        }
        let tables = r["tables"].as_array().cloned().unwrap_or_default();
        let events = r["events"].as_array().cloned().unwrap_or_default();
        let total: u64 = events.iter().filter_map(|e| e["apply_ns"].as_u64()).sum();
        let share = |ns: u64| if total == 0 { 0.0 } else { ns as f64 * 100.0 / total as f64 };
        writeln!(
            out,
            "  {:<40} {:<12} {:>10} {:>10} {:>12} {:>7} {:>10}",
            "table", "kind", "events", "rows", "apply", "share", "p99"
        )?;
        let p99 = |row: &Value| row["p99_ms"].as_f64().map_or("-".to_string(), |ms| format!("{ms:.3}"));
        for t in &tables {
            let ns = t["apply_ns"].as_u64().unwrap_or(0);
            let name = match (t["schema"].as_str().unwrap_or_default(), t["table"].as_str().unwrap_or_default()) {
                ("", "") => "(other tables)".to_string(),
                (schema, table) => format!("{schema}.{table}"),
            };
            writeln!(
                out,
                "  {:<40} {:<12} {:>10} {:>10} {:>12} {:>6.1}% {:>10}",
                cut(&name, 40),
                t["kind"].as_str().unwrap_or_default(),
                t["events"],
                t["rows"].as_u64().map_or("-".to_string(), |r| r.to_string()),
                ms(ns),
                share(ns),
                p99(t)
            )?;
        }
        for e in &events {
            let ns = e["apply_ns"].as_u64().unwrap_or(0);
            writeln!(
                out,
                "  {:<40} {:<12} {:>10} {:>10} {:>12} {:>6.1}% {:>10}",
                format!("({} events)", e["class"].as_str().unwrap_or_default()),
                "",
                e["events"],
                e["rows"].as_u64().map_or("-".to_string(), |r| r.to_string()),
                ms(ns),
                share(ns),
                p99(e)
            )?;
        }
    }
    for r in shaped["replicas"].as_array().into_iter().flatten() {
        let digests = r["digests"].as_array().cloned().unwrap_or_default();
        if digests.is_empty() {
            continue;
        }
        writeln!(out, "{}: statements it applied, beside its primary's", r["instance"].as_str().unwrap_or_default())?;
        writeln!(out, "  {:>10} {:>12}  {:<20} {:>10} {:>12}  statement", "applied", "mean", "primary", "ran", "mean")?;
        for d in &digests {
            let mean =
                |side: &serde_json::Value| side["mean_ms"].as_f64().map_or("-".to_string(), |m| format!("{m:.3} ms"));
            let primary = &d["primary"];
            writeln!(
                out,
                "  {:>10} {:>12}  {:<20} {:>10} {:>12}  {}",
                d["applied"]["count"],
                mean(&d["applied"]),
                cut(
                    primary["instances"].as_array().and_then(|i| i.first()).and_then(|i| i.as_str()).unwrap_or("-"),
                    20
                ),
                primary["count"].as_u64().map_or("-".to_string(), |c| c.to_string()),
                mean(primary),
                cut(d["digest_text"].as_str().unwrap_or_default(), 80)
            )?;
        }
    }
    if answer.replicas.is_empty() {
        writeln!(out, "(no instance applied events as a replica in this range)")?;
    }
    out.flush()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use sqlbee_proto::json::{instances_json, locks_json, top_json};

    #[test]
    fn digest_is_16_hex_digits() {
        let d = TopDigest { digest: 0xab, count: 2, sum_ns: 3_000_000, ..Default::default() };
        let json = top_json(std::slice::from_ref(&d));
        assert_eq!(json[0]["digest"], "00000000000000ab");
        let mut table = Vec::new();
        write_top_table(&mut table, &[d]).unwrap();
        let table = String::from_utf8(table).unwrap();
        assert!(table.contains("00000000000000ab") && table.contains("1.500"), "{table}");
        // No waits, no error codes: empty objects and a dash.
        assert_eq!(json[0]["waits"], json!({}));
        assert_eq!(json[0]["error_codes"], json!({}));
        assert!(table.lines().nth(1).unwrap().contains(" -  "), "{table}");
    }

    #[test]
    fn lock_waits() {
        let row = LockWaitRow {
            instance: "db1:3306".into(),
            agent_id: "a".into(),
            wait: Some(sqlbee_proto::v1::LockWait {
                start_unix_ms: 1_800_000_000_000,
                duration_ns: 120_500_000,
                class: "row_lock".into(),
                connection_id: 7,
                digest: 0xab,
                digest_text: "UPDATE t SET a = ? WHERE id = ?".into(),
                blocker_kind: "candidates".into(),
                blockers: vec![Blocker {
                    connection_id: 12,
                    transaction: true,
                    started_unix_ms: 1_800_000_000_000 - 3_000,
                    statements: vec!["SELECT * FROM t WHERE id = ? FOR UPDATE".into()],
                }],
                ..Default::default()
            }),
        };
        let json = locks_json(std::slice::from_ref(&row));
        assert_eq!(json[0]["digest"], "00000000000000ab");
        assert_eq!(json[0]["blockers"][0]["connection_id"], 12);
        assert_eq!(json[0]["blockers"][0]["statements"][0], "SELECT * FROM t WHERE id = ? FOR UPDATE");
        let mut table = Vec::new();
        write_locks_table(&mut table, &[row]).unwrap();
        let table = String::from_utf8(table).unwrap();
        assert!(table.lines().next().unwrap().contains("candidates"), "{table}");
        let line = table.lines().nth(2).unwrap();
        assert!(line.contains("120.500") && line.contains("row_lock") && line.contains("UPDATE t SET a"), "{table}");
        assert!(line.contains("conn 12 txn since 07:59:57: SELECT * FROM t WHERE id = ? FOR UPDATE"), "{table}");
        let mut empty = Vec::new();
        write_locks_table(&mut empty, &[]).unwrap();
        assert!(!String::from_utf8(empty).unwrap().contains("candidates"));
    }

    #[test]
    fn instances_carry_lag_and_last_seen_in_both_forms() {
        let now = 1_800_000_010_000;
        let seen = InstanceInfo {
            instance: "db1:3306".into(),
            last_window_end_unix_ms: now - 2_500,
            last_seen_unix_ms: now - 1_000,
            ..Default::default()
        };
        let fresh = InstanceInfo { agent_id: "new".into(), last_seen_unix_ms: now, ..Default::default() };
        let json = instances_json(&[seen.clone(), fresh.clone()], now);
        assert_eq!(json[0]["lag_ms"], 2_500);
        assert_eq!(json[1]["lag_ms"], Value::Null, "no window yet: no lag");
        let mut table = Vec::new();
        write_instances_table(&mut table, &[seen, fresh], now).unwrap();
        let table = String::from_utf8(table).unwrap();
        assert!(table.lines().next().unwrap().contains("last_seen"), "{table}");
        let line = table.lines().nth(1).unwrap();
        assert!(line.contains(" 2.5 ") && line.contains("2027-01-15T08:00:09.000Z"), "{table}");
    }

    #[test]
    fn waits_and_error_codes() {
        let wait =
            |class: &str, sum_ns, max_ns, statements| WaitStats { class: class.into(), sum_ns, max_ns, statements };
        let d = TopDigest {
            digest: 1,
            count: 10,
            errors: 3,
            sum_ns: 900_000_000,
            waits: vec![wait("disk_io", 1_200_000, 400_000, 2), wait("row_lock", 512_300_000, 300_000_000, 4)],
            error_codes: vec![sqlbee_proto::v1::ErrorCount {
                code: 1213,
                count: 3,
                sample_message: "Deadlock found when trying to get lock".into(),
            }],
            ..Default::default()
        };
        let json = top_json(std::slice::from_ref(&d));
        assert_eq!(
            json[0]["waits"]["row_lock"],
            json!({"sum_ns": 512_300_000u64, "max_ns": 300_000_000u64, "statements": 4})
        );
        assert_eq!(json[0]["waits"]["disk_io"]["statements"], 2);
        assert_eq!(
            json[0]["error_codes"]["1213"],
            json!({"count": 3, "sample_message": "Deadlock found when trying to get lock"})
        );
        let mut table = Vec::new();
        write_top_table(&mut table, &[d]).unwrap();
        let table = String::from_utf8(table).unwrap();
        let header = table.lines().next().unwrap();
        assert!(header.contains("wait_ms") && header.contains("top_wait"), "{table}");
        let line = table.lines().nth(1).unwrap();
        assert!(line.contains("513.500") && line.contains("row_lock 512ms"), "{table}");
        assert_eq!(short_ms(3_240_000), "3.2ms");
        assert_eq!(short_ms(40_000), "0.04ms");
    }
}
