//! Writes closed windows to stdout until the ship stage takes over:
//! JSON lines (schema: docs/src/reference/jsonl.md) or a readable table.
use std::io::Write;

use serde_json::{Value, json};

use sqlbee_kernel_abi::wait_class;

use sqlbee_vocabulary::{clock::rfc3339, histogram::Histogram};

use std::collections::BTreeMap;

use crate::{
    aggregate::{DigestRow, WindowReport},
    discover::Client,
    normalize::Tables,
    plans::{Explained, LoginState},
    probe::{Readable, UntracedServer},
};

pub fn window_to_json(report: &WindowReport) -> Vec<Value> {
    let start = rfc3339(report.window_start);
    let end = rfc3339(report.window_end);
    // Budget mode: counts sample the attached share of the window.
    let cost = report.summary.probe_cost.as_ref();
    let sampled = cost.is_some_and(|c| c.sampled());
    let estimate = |n: u64| cost.map_or(n, |c| c.estimate(n));
    let mut lines: Vec<Value> = report
        .digests
        .iter()
        .map(|d| {
            let line = json!({
                "type": "digest",
                "instance": report.instance,
                "window_start": start,
                "window_end": end,
                "digest": format!("{:016x}", d.digest),
                "digest_text": &*d.digest_text,
                "schema": d.schema.as_deref(),
                "nested": d.lineage.nested,
                "program": d.lineage.program.as_ref().map(|p| p.name.clone()),
                "program_kind": d.lineage.program.as_ref().map(|p| p.kind),
                "parent_digest": d.lineage.parent_digest.map(|p| format!("{p:016x}")),
                "source": d.lineage.source_name(),
                "count": d.count,
                "errors": d.errors,
                "error_codes": d.error_codes.iter().map(|(c, n)| (c.to_string(), json!(n))).collect::<serde_json::Map<_, _>>(),
                "sum_ns": d.sum_ns,
                "min_ns": d.min_ns,
                "max_ns": d.max_ns,
                "p50_ns": d.histogram.percentile(0.50, d.min_ns, d.max_ns),
                "p95_ns": d.histogram.percentile(0.95, d.min_ns, d.max_ns),
                "p99_ns": d.histogram.percentile(0.99, d.min_ns, d.max_ns),
                "histogram": buckets(&d.histogram),
                "waits": waits(d),
                "error_messages": d.error_messages.iter().map(|(c, m)| (c.to_string(), json!(m))).collect::<serde_json::Map<_, _>>(),
                "truncated": d.truncated,
                "sample": d.sample,
                "sampled": sampled,
                "estimated_count": sampled.then(|| estimate(d.count)),
            });
            let mut line = line;
            add_figures(&mut line, d, report.summary.readable);
            add_tags(&mut line, d);
            add_clients(&mut line, d);
            match d.tables.as_deref() {
                None => {}
                Some(Tables::Unknown) => line["tables"] = "unknown".into(),
                Some(Tables::Known { kind, tables }) => {
                    line["statement_kind"] = kind.as_str().into();
                    line["tables"] = tables
                        .iter()
                        .map(|t| json!({"schema": t.schema, "table": t.table, "write": t.write}))
                        .collect();
                }
            }
            line
        })
        .collect();
    for w in &report.lock_waits {
        lines.push(json!({
            "type": "lock_wait",
            "instance": report.instance,
            "start": rfc3339(w.start),
            "duration_ns": w.duration_ns,
            "class": w.class,
            "connection_id": w.connection_id,
            "digest": w.digest.as_ref().map(|d| format!("{:016x}", d.id)),
            "digest_text": w.digest.as_ref().map(|d| d.text.to_string()),
            "sample": w.sample,
            // The agent sees no lock ownership: these are candidates.
            "blocker_kind": "candidates",
            "blockers": w.blockers.iter().map(|b| json!({
                "connection_id": b.connection_id,
                "transaction": b.transaction,
                "started": rfc3339(b.started),
                "statements": b.statements.iter().map(|t| t.to_string()).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
        }));
    }
    for e in &report.long_statements {
        lines.push(json!({
            "type": "long_statement",
            "instance": report.instance,
            "connection_id": e.connection_id,
            "digest": format!("{:016x}", e.digest),
            "digest_text": e.digest_text.to_string(),
            "schema": e.schema.as_deref(),
            "user": e.user,
            "host": e.host,
            "sample": e.sample,
            "start": rfc3339(e.start),
            "duration_ns": e.duration_ns,
            "outcome": e.outcome.name(),
            "error_code": (e.error_code != 0).then_some(e.error_code),
            "waits": sqlbee_kernel_abi::wait_class::NAMES
                .iter()
                .zip(e.waits)
                .filter(|(_, ns)| *ns > 0)
                .map(|(class, ns)| (class.to_string(), json!(ns)))
                .collect::<serde_json::Map<_, _>>(),
            "blocked_by": e.blocked_by,
            "deadlock_with": e.deadlock_with.as_ref().map(|p| json!({
                "connection_id": p.connection_id,
                "digest": format!("{:016x}", p.digest),
                "digest_text": p.digest_text,
                "sample": p.sample,
            })),
        }));
    }
    for c in &report.changes {
        lines.push(json!({
            "type": "change",
            "instance": report.instance,
            "kind": c.kind.name(),
            "action": c.action,
            "objects": c.objects,
            "connection_id": c.connection_id,
            "digest": format!("{:016x}", c.digest),
            "digest_text": c.digest_text.to_string(),
            "schema": c.schema.as_deref(),
            "user": c.user,
            "host": c.host,
            "client": c.client.as_deref().map(client_json),
            "program": c.program,
            "sample": c.sample,
            "start": rfc3339(c.start),
            "duration_ns": c.duration_ns,
            "error_code": (c.error_code != 0).then_some(c.error_code),
            "values": c.values.iter().map(|v| json!({"name": v.name, "old": v.old, "new": v.new})).collect::<Vec<_>>(),
        }));
    }
    if report.changes_dropped > 0 {
        lines.push(json!({
            "type": "changes_dropped",
            "instance": report.instance,
            "count": report.changes_dropped,
        }));
    }
    if report.long_statements_dropped > 0 {
        lines.push(json!({
            "type": "long_statements_dropped",
            "instance": report.instance,
            "count": report.long_statements_dropped,
        }));
    }
    for (channel, replication) in &report.replication {
        lines.push(replication_json(&report.instance, channel, replication));
    }
    let s = &report.summary;
    lines.push(json!({
        "type": "summary",
        "instance": report.instance,
        "pid": s.pid,
        "container_id": s.container_id,
        "container": s.container,
        "build_id": s.build_id,
        "version": s.server_version,
        "window_start": start,
        "window_end": end,
        "commands": s.commands,
        "statements": s.statements,
        "events": s.events,
        "dropped_events": s.dropped_events,
        "unmatched": s.unmatched,
        "read_failures": s.read_failures,
        "overflow_statements": s.overflow_statements,
        "aggregated_in_kernel": s.aggregated_in_kernel,
        "nested_statements": s.nested_statements,
        "nested_unmatched": s.nested_unmatched,
        "replica_statements": s.replica_statements,
        "duplicate_hits": s.duplicate_hits,
        "skipped_runs": s.skipped_runs,
        "probes": s.probe_cost.as_ref().map(|c| json!({
            "attached_fraction": c.attached_fraction,
            "program_ns": c.program_ns,
            "program_runs": c.program_runs,
            "trap_ns": c.trap_ns,
            "probe_cpu_s": c.probe_cpu_s(),
            "mysqld_cpu_s": c.mysqld_cpu_s,
            // What the probes add to mysqld, in cores per 10k statements/s.
            "mysqld_extra_cores_per_10k_qps": c.extra_cores_per_10k_qps(s.statements),
            "server_statements": c.server_statements,
            "learned_statement_ns": c.learned_ns,
        })),
        "sampled": sampled,
        "estimated_statements": sampled.then(|| cost.map_or(s.statements, |c| c.estimate_total(s.statements))),
        "digests": report.digests.len(),
        "programs": programs_to_json(&s.programs),
    }));
    lines
}

/// The kernel programs an instance has (with what verifying each took)
/// and those its kernel refused, with why and what the instance lacks.
pub fn programs_to_json(programs: &crate::probe::ProgramSet) -> Value {
    json!({
        "loaded": programs.loaded.iter().map(|l| (l.program.to_string(), json!({
            "verified_insns": l.verified_insns,
            "load_ms": l.load_time.as_millis() as u64,
        }))).collect::<serde_json::Map<_, _>>(),
        "left_out": programs.left_out.iter().map(|l| json!({
            "program": l.program,
            "reason": l.reason,
            "lost": l.lost,
        })).collect::<Vec<_>>(),
    })
}

/// Most accounts, users and hosts listed per digest; the rest are `other`.
pub const TOP_ACCOUNTS: usize = 5;

/// The server's figures of a digest row; null where this build or kernel
/// does not let the agent read one (never 0 for "unknown").
fn add_figures(line: &mut Value, d: &DigestRow, readable: Readable) {
    let object = line.as_object_mut().expect("a digest line is an object");
    for (figure, value) in sqlbee_figures::FIGURES.iter().zip(d.stats.values()) {
        let known = if readable.knows(figure.needs) { json!(value) } else { Value::Null };
        object.insert(figure.name.into(), known);
    }
    if readable.has(Readable::ACCOUNT) {
        let (users, hosts, accounts) = breakdowns(d);
        object.insert("users".into(), users);
        object.insert("hosts".into(), hosts);
        object.insert("accounts".into(), accounts);
    }
}

/// Query tags (`{"controller": [{"value": "orders", "count": 12}, ...]}`,
/// most frequent first, then `{"value": null, "count": n}` for values not
/// told apart) and the slowest traced statement (`exemplar`).
fn add_tags(line: &mut Value, d: &DigestRow) {
    let object = line.as_object_mut().expect("a digest line is an object");
    let tags: serde_json::Map<String, Value> = d
        .tags
        .keys
        .iter()
        .map(|(key, counts)| {
            let mut listed: Vec<Value> =
                counts.most_frequent().iter().map(|(v, n)| json!({"value": v, "count": n})).collect();
            if counts.other > 0 {
                listed.push(json!({"value": null, "count": counts.other}));
            }
            (key.to_string(), Value::Array(listed))
        })
        .collect();
    object.insert("tags".into(), Value::Object(tags));
    let exemplar =
        d.tags.exemplar.as_ref().map(
            |e| json!({"trace_id": e.trace.trace_hex(), "span_id": e.trace.span_hex(), "duration_ns": e.duration_ns}),
        );
    object.insert("exemplar".into(), exemplar.unwrap_or(Value::Null));
}

/// `clients`: each client the row names, the most statements first, with
/// null for what is unknown, then `{"other": n}` for the rest.
fn add_clients(line: &mut Value, d: &DigestRow) {
    let mut clients: Vec<_> = d.clients.iter().collect();
    clients.sort_by(|a, b| b.1.cmp(a.1).then_with(|| a.0.cmp(b.0)));
    let mut listed: Vec<Value> = clients
        .into_iter()
        .map(|(c, n)| {
            let mut client = client_json(c);
            client.as_object_mut().expect("a client is an object").insert("count".into(), json!(n));
            client
        })
        .collect();
    let other = d.other_clients();
    if other > 0 {
        listed.push(json!({"other": other}));
    }
    line.as_object_mut().expect("a digest line is an object").insert("clients".into(), Value::Array(listed));
}

/// A client as jsonl names it, null for what is unknown.
fn client_json(c: &Client) -> Value {
    json!({
        "program": c.program, "driver": c.driver, "client_pid": c.client_pid,
        "address": c.address, "process": c.process, "pid": c.pid, "container": c.container,
        "container_id": c.container_id, "pod": c.pod, "namespace": c.namespace,
    })
}

/// Statements by user, by client host and by both: the top
/// `TOP_ACCOUNTS` of each, and `other` for the rest (still counted).
pub fn breakdowns(d: &DigestRow) -> (Value, Value, Value) {
    let mut users: BTreeMap<&str, u64> = BTreeMap::new();
    let mut hosts: BTreeMap<&str, u64> = BTreeMap::new();
    let mut accounts: BTreeMap<String, u64> = BTreeMap::new();
    for (account, n) in &d.accounts {
        *users.entry(&account.user).or_default() += n;
        *hosts.entry(&account.host).or_default() += n;
        *accounts.entry(format!("{}@{}", account.user, account.host)).or_default() += n;
    }
    let other = d.other_accounts();
    let top = |counts: Vec<(String, u64)>| -> Value {
        let mut counts = counts;
        counts.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let mut out = serde_json::Map::new();
        let rest: u64 = counts.iter().skip(TOP_ACCOUNTS).map(|(_, n)| n).sum::<u64>() + other;
        for (name, n) in counts.into_iter().take(TOP_ACCOUNTS) {
            out.insert(name, json!(n));
        }
        if rest > 0 {
            out.insert("other".into(), json!(rest));
        }
        Value::Object(out)
    };
    (
        top(users.into_iter().map(|(k, v)| (k.to_string(), v)).collect()),
        top(hosts.into_iter().map(|(k, v)| (k.to_string(), v)).collect()),
        top(accounts.into_iter().collect()),
    )
}

/// Wait classes with any time in them: `{"row_lock": {"sum_ns", "max_ns", "statements"}}`.
fn waits(d: &DigestRow) -> serde_json::Map<String, Value> {
    d.waits
        .iter()
        .zip(wait_class::NAMES)
        .filter(|(w, _)| w.statements > 0)
        .map(|(w, name)| {
            (name.to_string(), json!({"sum_ns": w.sum_ns, "max_ns": w.max_ns, "statements": w.statements}))
        })
        .collect()
}

fn buckets(h: &Histogram) -> Vec<[u64; 2]> {
    h.buckets().map(|(i, c)| [i as u64, c]).collect()
}

pub fn write_jsonl(out: &mut impl Write, report: &WindowReport) -> std::io::Result<()> {
    for line in window_to_json(report) {
        serde_json::to_writer(&mut *out, &line)?;
        out.write_all(b"\n")?;
    }
    out.flush()
}

fn ms(ns: u64) -> String {
    format!("{:.3}", ns as f64 / 1e6)
}

pub fn write_table(out: &mut impl Write, report: &WindowReport, rows: usize) -> std::io::Result<()> {
    let s = &report.summary;
    writeln!(
        out,
        "== {} {} .. {}: {} statements, {} digests, {} records dropped (ring buffer full)",
        report.instance,
        rfc3339(report.window_start),
        rfc3339(report.window_end),
        s.statements,
        report.digests.len(),
        s.dropped_events,
    )?;
    writeln!(
        out,
        "{:>8} {:>6} {:>10} {:>9} {:>9} {:>9}  digest",
        "count", "errors", "total_ms", "avg_ms", "p95_ms", "max_ms"
    )?;
    for d in report.digests.iter().take(rows) {
        let avg = d.sum_ns.checked_div(d.count).unwrap_or(0);
        let mut text: String = d.digest_text.chars().take(100).collect();
        if text.len() < d.digest_text.len() {
            text.push_str("...");
        }
        // Statements of stored programs: marked, with their program.
        if let Some(program) = &d.lineage.program {
            text = format!("  -> [{} {}] {text}", program.kind, program.name);
        } else if d.lineage.source != sqlbee_kernel_abi::source::CLIENT {
            text = format!("[{}] {text}", d.lineage.source_name());
        }
        writeln!(
            out,
            "{:>8} {:>6} {:>10} {:>9} {:>9} {:>9}  {}",
            d.count,
            d.errors,
            ms(d.sum_ns),
            ms(avg),
            ms(d.histogram.percentile(0.95, d.min_ns, d.max_ns)),
            ms(d.max_ns),
            text
        )?;
    }
    let commands: Vec<String> = s.commands.iter().map(|(c, n)| format!("{c}={n}")).collect();
    writeln!(out, "   commands: {}", commands.join(" "))?;
    out.flush()
}

/// One line for the agent's own cost and one for the host, per window.
pub fn write_agent_jsonl(
    out: &mut impl Write,
    cost: &crate::budget::CostSample,
    host: Option<&crate::host::HostMetrics>,
) -> std::io::Result<()> {
    let mut agent = serde_json::to_value(cost).map_err(std::io::Error::other)?;
    agent["type"] = "agent".into();
    writeln!(out, "{agent}")?;
    if let Some(host) = host {
        let mut line = serde_json::to_value(host).map_err(std::io::Error::other)?;
        line["type"] = "host".into();
        writeln!(out, "{line}")?;
    }
    Ok(())
}

/// One `untraced_server` line per server the agent found but does not
/// trace, in every window until it does.
pub fn untraced_to_json(untraced: &[UntracedServer], window_end: std::time::SystemTime) -> Vec<Value> {
    untraced
        .iter()
        .map(|u| {
            json!({
                "type": "untraced_server",
                "instance": u.server.instance,
                "pid": u.server.pid,
                "container_id": u.server.container.as_ref().map(|c| c.id.clone()),
                "container": u.server.container.as_ref().map(|c| c.name.clone()),
                "window_end": rfc3339(window_end),
                "kind": u.kind,
                "reason": u.reason,
                "build_id": u.binary.build_id,
                "version": u.binary.version,
                "since": rfc3339(u.since),
                "attempts": u.attempts,
            })
        })
        .collect()
}

pub fn write_untraced_jsonl(
    out: &mut impl Write,
    untraced: &[UntracedServer],
    window_end: std::time::SystemTime,
) -> std::io::Result<()> {
    for line in untraced_to_json(untraced, window_end) {
        writeln!(out, "{line}")?;
    }
    Ok(())
}

/// One line per plan (`"type": "plan"`), and one per instance with a
/// login (`"type": "server_login"`: `ok` or the warning).
pub fn plans_to_json(explained: &Explained, window_end: std::time::SystemTime) -> Vec<Value> {
    let at = rfc3339(window_end);
    let mut lines: Vec<Value> = explained
        .logins
        .iter()
        .map(|(instance, state)| {
            json!({
                "type": "server_login",
                "window_end": at,
                "instance": instance,
                "status": if *state == LoginState::Ok { "ok" } else { "warning" },
                "warning": match state { LoginState::Warning(w) => Some(w), LoginState::Ok => None },
            })
        })
        .collect();
    for record in &explained.plans {
        let mut line = json!({
            "type": "plan",
            "instance": record.instance,
            "schema": record.schema.as_deref(),
            "digest": format!("{:016x}", record.digest),
            "explained_at": rfc3339(record.explained_at),
            "explain_ns": record.explain_ns,
            "previous_plan_hash": (record.previous_hash != 0).then(|| format!("{:016x}", record.previous_hash)),
        });
        match &record.plan {
            Ok(plan) => {
                line["plan_hash"] = format!("{:016x}", plan.hash).into();
                line["access"] = plan
                    .access
                    .iter()
                    .map(|a| json!({"table": a.table, "type": a.access_type, "key": a.key, "rows": a.rows}))
                    .collect();
                line["filesort"] = plan.filesort.into();
                line["temporary"] = plan.temporary.into();
                line["plan"] = plan.json.clone().into();
            }
            Err(reason) => line["not_explained"] = reason.clone().into(),
        }
        lines.push(line);
    }
    lines
}

pub fn write_plans_jsonl(
    out: &mut impl Write,
    explained: &Explained,
    window_end: std::time::SystemTime,
) -> std::io::Result<()> {
    for line in plans_to_json(explained, window_end) {
        writeln!(out, "{line}")?;
    }
    Ok(())
}

pub fn write_untraced_table(out: &mut impl Write, untraced: &[UntracedServer]) -> std::io::Result<()> {
    for u in untraced {
        writeln!(
            out,
            "!! {} (pid {}, {}) NOT TRACED since {}: {}",
            u.server.instance,
            u.server.pid,
            u.binary.version.as_deref().unwrap_or("version unknown"),
            rfc3339(u.since),
            u.reason
        )?;
    }
    Ok(())
}

/// A replica's window of one channel (`"type": "replication"`):
/// transactions, lag at commit, and apply time by event class and by table.
fn replication_json(instance: &str, channel: &str, r: &crate::aggregate::replication::ReplicationWindow) -> Value {
    json!({
        "type": "replication",
        "instance": instance,
        "channel": channel,
        "transactions": r.transactions,
        "lag": {
            "samples": r.lag.total(),
            "p50_ms": r.lag_quantile(0.5).map(|ns| ns / 1_000_000),
            "p99_ms": r.lag_quantile(0.99).map(|ns| ns / 1_000_000),
            "max_ms": (r.lag.total() > 0).then_some(r.lag_max_ns / 1_000_000),
        },
        "events": r.classes.iter().map(|(class, t)| json!({
            "class": class, "events": t.events, "apply_ns": t.apply_ns, "rows": t.rows,
            "p50_ms": t.quantile_ms(0.5), "p99_ms": t.quantile_ms(0.99),
        })).collect::<Vec<_>>(),
        "tables": r.tables.iter().map(|((schema, table, kind), t)| json!({
            "schema": schema, "table": table, "kind": kind.name(), "events": t.events, "apply_ns": t.apply_ns,
            "rows": t.rows, "p50_ms": t.quantile_ms(0.5), "p99_ms": t.quantile_ms(0.99),
        })).collect::<Vec<_>>(),
        "lost_events": r.lost_events,
    })
}

#[cfg(test)]
mod tests {
    use sqlbee_figures::needs;

    use super::*;
    use crate::aggregate::fixtures::{all_figures, figure_value, report, statement, with_figures};

    fn digest_lines(report: &WindowReport) -> Vec<Value> {
        window_to_json(report).into_iter().filter(|l| l["type"] == "digest").collect()
    }

    #[test]
    fn a_digest_line_has_every_figure_null_when_the_build_cannot_read_it() {
        let readable = Readable(needs::SERVER_STATUS | needs::CPU);
        let r = report("db:3306", readable, vec![with_figures(statement(1, 0, 1000, "SELECT 1"), 3)]);
        let line = &digest_lines(&r)[0];
        for (i, figure) in sqlbee_figures::FIGURES.iter().enumerate() {
            let expected = if readable.knows(figure.needs) { json!(figure_value(i, 3)) } else { Value::Null };
            assert_eq!(line[figure.name], expected, "{}", figure.name);
        }
        assert!(line.get("users").is_none(), "no accounts without the account figure");
    }

    #[test]
    fn digest_lines_count_what_the_window_holds() {
        let mut failed = statement(2, 0, 7_000, "DELETE FROM t WHERE id = 5");
        failed.error_code = 1451;
        let statements = vec![
            statement(1, 0, 1_000, "SELECT * FROM t WHERE id = 1"),
            statement(1, 0, 3_000, "SELECT * FROM t WHERE id = 2"),
            failed,
        ];
        let r = report("db:3306", all_figures(), statements);
        let lines = window_to_json(&r);
        let digests: Vec<&Value> = lines.iter().filter(|l| l["type"] == "digest").collect();
        assert_eq!(digests.len(), 2);
        let select = digests.iter().find(|l| l["count"] == 2).expect("the select row");
        assert_eq!(
            (select["sum_ns"].as_u64(), select["min_ns"].as_u64(), select["max_ns"].as_u64()),
            (Some(4_000), Some(1_000), Some(3_000))
        );
        let text = crate::normalize::Normalizer::new(1).normalize(b"SELECT * FROM t WHERE id = 9").text;
        assert_eq!(select["digest_text"], &*text);
        let delete = digests.iter().find(|l| l["count"] == 1).expect("the delete row");
        assert_eq!((delete["errors"].as_u64(), delete["error_codes"]["1451"].as_u64()), (Some(1), Some(1)));
        let summary = lines.iter().find(|l| l["type"] == "summary").expect("a summary line");
        assert_eq!(summary["instance"], "db:3306");
        assert_eq!(summary["digests"], 2);
    }
}
