//! Query answers as JSON: the one shape `sqlbee top|series|instances|locks|hosts|plans|tables
//! --format json` prints and the web UI's `/api/` serves, so a script
//! written against one reads the other. Pure: takes the answer, returns a
//! value.
use crate::v1::{
    ActivityResponse, AgentQuota, AgentWindowRow, Annotation, Change, ClientCount, CostSummary, DiffSide, DigestChange,
    Event, Finding, InstanceCost, InstanceInfo, LiveConnection, LockWaitRow, LongStatementRow, PlansResponse,
    ProcessMetrics, QueryStats, ReplicationResponse, SeriesResponse, TablesResponse, TagCount, TopDigest, TopResponse,
    TotalsResponse,
};
use serde_json::{Map, Value, json};
use sqlbee_vocabulary::clock;

/// An RFC 3339 time for ms since the epoch; `-` for none.
fn time(ms: i64) -> String {
    if ms <= 0 {
        return "-".into();
    }
    clock::rfc3339(clock::from_unix_ms(ms))
}

/// What an answer that was full says about the rows (`what`) it left out.
pub fn left_out_note(left_out: u64, what: &str) -> String {
    format!(
        "{left_out} more {what} were left out: the answer was full (16 MiB); ask for fewer, a shorter range or one \
         instance"
    )
}

pub fn top_json(digests: &[TopDigest]) -> Value {
    Value::Array(
        digests
            .iter()
            .map(|d| {
                let mut row = json!({
                    "digest": format!("{:016x}", d.digest),
                    "digest_text": d.digest_text,
                    "schema": d.schema,
                    "nested": d.nested,
                    "program": (!d.program.is_empty()).then_some(&d.program),
                    "program_kind": (!d.program_kind.is_empty()).then_some(&d.program_kind),
                    "parent_digest": (d.parent_digest != 0).then(|| format!("{:016x}", d.parent_digest)),
                    "source": if d.source.is_empty() { "client" } else { &d.source },
                    "count": d.count,
                    "errors": d.errors,
                    "sum_ns": d.sum_ns,
                    "min_ns": d.min_ns,
                    "max_ns": d.max_ns,
                    "p50_ns": d.p50_ns,
                    "p95_ns": d.p95_ns,
                    "p99_ns": d.p99_ns,
                    "sample": d.sample,
                    "instances": d.instances,
                    "waits": d.waits.iter().map(|w| {
                        (w.class.clone(), json!({"sum_ns": w.sum_ns, "max_ns": w.max_ns, "statements": w.statements}))
                    }).collect::<Map<_, _>>(),
                    "error_codes": d.error_codes.iter().map(|e| {
                        (e.code.to_string(), json!({"count": e.count, "sample_message": e.sample_message}))
                    }).collect::<Map<_, _>>(),
                    // Budget mode: the count scaled to whole windows.
                    "estimated_count": (d.estimated_count > 0).then_some(d.estimated_count),
                    "accounts": d.accounts.iter().map(|a| json!({"user": a.user, "host": a.host, "count": a.count})).collect::<Vec<_>>(),
                    "clients": clients_json(&d.clients),
                    "tags": tags_json(&d.tags),
                    "exemplars": d.exemplars.iter().map(|e| {
                        json!({"trace_id": e.trace_id, "span_id": e.span_id, "duration_ns": e.duration_ns})
                    }).collect::<Vec<_>>(),
                });
                stats_json(&mut row, d.stats.as_ref());
                row
            })
            .collect(),
    )
}

/// The web UI's `/api/top` answer: the digests, what was left out, and the cost and
/// quota tables.
pub fn top_answer_json(answer: &TopResponse) -> Value {
    json!({
        "digests": top_json(&answer.digests),
        "left_out": answer.left_out,
        "costs": costs_json(&answer.costs),
        "quotas": quotas_json(&answer.quotas),
    })
}

/// `/api/totals`' answer, commands by name.
pub fn totals_json(t: &TotalsResponse) -> Value {
    json!({
        "statements": t.statements,
        "digest_count": t.digest_count,
        "commands": t.commands.iter().map(|c| (c.command.clone(), json!(c.count))).collect::<Map<_, _>>(),
        "dropped_events": t.dropped_events,
        "lost_statements": t.lost_statements,
        "unmatched": t.unmatched,
    })
}

/// `sqlbee diff`'s answer: `{"digests": [...]}`, each with both sides
/// (null where the digest did not run), its status and the evidence.
fn side_json(s: Option<&DiffSide>) -> Option<Value> {
    s.map(|s| {
        json!({
            "count": s.count,
            "sum_ns": s.sum_ns,
            "p50_ns": s.p50_ns,
            "p95_ns": s.p95_ns,
            "p99_ns": s.p99_ns,
            "rows_examined": s.rows_examined,
            "cpu_ns": s.cpu_ns,
            "range_ms": s.range_ms,
        })
    })
}

/// `{"events": [...]}`: each event with both sides of the comparison that
/// opened it; `closed` is null while it is open.
pub fn events_json(events: &[Event]) -> Value {
    json!({
        "events": events.iter().map(|e| json!({
            "id": format!("{:016x}", e.id),
            "instance": e.instance,
            "kind": e.kind,
            "digest": format!("{:016x}", e.digest),
            "schema": e.schema,
            "digest_text": e.digest_text,
            "opened": time(e.opened_unix_ms),
            "opened_unix_ms": e.opened_unix_ms,
            "closed": (e.closed_unix_ms != 0).then(|| time(e.closed_unix_ms)),
            "closed_unix_ms": (e.closed_unix_ms != 0).then_some(e.closed_unix_ms),
            "closed_because": (e.closed_unix_ms != 0).then_some(&e.closed_because),
            "evidence": e.evidence,
            "p_value": e.p_value,
            "before_range_unix_ms": [e.before_since_unix_ms, e.before_until_unix_ms],
            "after_range_unix_ms": [e.after_since_unix_ms, e.after_until_unix_ms],
            "before": side_json(e.before.as_ref()),
            "after": side_json(e.after.as_ref()),
            "change": e.change.as_ref().map(change_json),
        })).collect::<Vec<_>>(),
    })
}

/// A change as an agent saw it run; null for what is unknown.
fn change_json(c: &Change) -> Value {
    let text = |s: &str| (!s.is_empty()).then(|| s.to_string());
    json!({
        "kind": c.kind,
        "action": c.action,
        "objects": c.objects,
        "connection_id": (c.connection_id != 0).then_some(c.connection_id),
        "schema": text(&c.schema),
        "user": text(&c.user),
        "host": text(&c.host),
        "client": c.client.as_ref().and_then(|client| clients_json(std::slice::from_ref(client)).as_array()?.first().cloned()),
        "program": text(&c.program),
        "sample": text(&c.sample),
        "start": time(c.start_unix_ms),
        "duration_ns": c.duration_ns,
        "error_code": (c.error_code != 0).then_some(c.error_code),
        "values": c.values.iter().map(|v| json!({"name": v.name, "old": v.old, "new": v.new})).collect::<Vec<_>>(),
    })
}

/// `{"annotations": [...]}`; `instances` empty: the whole fleet.
pub fn annotations_json(annotations: &[Annotation]) -> Value {
    json!({
        "annotations": annotations.iter().map(|a| json!({
            "id": format!("{:016x}", a.id),
            "at": time(a.at_unix_ms),
            "at_unix_ms": a.at_unix_ms,
            "text": a.text,
            "instances": a.instances,
        })).collect::<Vec<_>>(),
    })
}

pub fn diff_json(digests: &[DigestChange]) -> Value {
    json!({
        "digests": digests.iter().map(|d| json!({
            "digest": format!("{:016x}", d.digest),
            "schema": d.schema,
            "digest_text": d.digest_text,
            "before": side_json(d.before.as_ref()),
            "after": side_json(d.after.as_ref()),
            "status": d.status,
            "evidence": d.evidence,
            "p_value": d.p_value,
            "changes": events_json(&d.changes)["events"],
        })).collect::<Vec<_>>(),
    })
}

/// Clients, the most statements first; each field null where unknown.
/// `program`, `driver` and `client_pid` are what the client said it is at
/// connect (its connection attributes, read with the agent's login).
pub fn clients_json(clients: &[ClientCount]) -> Value {
    let text = |s: &str| (!s.is_empty()).then(|| s.to_string());
    clients
        .iter()
        .map(|c| {
            json!({
                "program": text(&c.program),
                "driver": text(&c.driver),
                "client_pid": (c.client_pid != 0).then_some(c.client_pid),
                "address": text(&c.address),
                "process": text(&c.process),
                "pid": (c.pid != 0).then_some(c.pid),
                "container": text(&c.container),
                "container_id": text(&c.container_id),
                "pod": text(&c.pod),
                "namespace": text(&c.namespace),
                "count": c.count,
            })
        })
        .collect::<Vec<_>>()
        .into()
}

/// Query tags by key: each listed value with its count, most frequent
/// first, then `{"value": null, "count": n}` for the statements whose value
/// is not listed.
pub fn tags_json(tags: &[TagCount]) -> Value {
    tags.iter()
        .map(|t| {
            let mut values: Vec<Value> = t.values.iter().map(|v| json!({"value": v.value, "count": v.count})).collect();
            if t.other > 0 {
                values.push(json!({"value": null, "count": t.other}));
            }
            (t.key.clone(), Value::Array(values))
        })
        .collect::<Map<_, _>>()
        .into()
}

/// The server's figures of a row, each null when no window carried it.
fn stats_json(row: &mut Value, stats: Option<&QueryStats>) {
    let s = stats.cloned().unwrap_or_default();
    let object = row.as_object_mut().expect("a digest row is an object");
    for (figure, value) in s.figures() {
        object.insert(figure.name.into(), json!(value));
    }
}

pub fn instances_json(instances: &[InstanceInfo], now_unix_ms: i64) -> Value {
    Value::Array(
        instances
            .iter()
            .map(|i| {
                json!({
                    "agent_id": i.agent_id,
                    "host": i.host,
                    "instance": i.instance,
                    "pid": i.pid,
                    "container_id": i.container_id,
                    "container": i.container,
                    "version": i.version,
                    "server_version": i.server_version,
                    "build_id": i.build_id,
                    "traced": i.untraced_reason.is_empty(),
                    // null: the agent has no login for plans.
                    "server_login": (!i.server_login.is_empty()).then_some(&i.server_login),
                    "untraced": (!i.untraced_reason.is_empty()).then(|| json!({
                        "reason": i.untraced_reason,
                        "kind": i.untraced_kind,
                        "since_unix_ms": i.untraced_since_unix_ms,
                        "reported_unix_ms": i.untraced_seen_unix_ms,
                    })),
                    "last_seen_unix_ms": i.last_seen_unix_ms,
                    "last_window_end_unix_ms": i.last_window_end_unix_ms,
                    "lag_ms": lag_ms(i, now_unix_ms),
                    "last_sequence": i.last_sequence,
                    "batches": i.batches,
                    "gaps": i.gaps,
                    "lost_statements": i.lost_statements,
                    "latest": i.latest.as_ref().map(instance_cost_json),
                })
            })
            .collect(),
    )
}

pub fn locks_json(rows: &[LockWaitRow]) -> Value {
    Value::Array(
        rows.iter()
            .map(|r| {
                let w = r.wait.clone().unwrap_or_default();
                json!({
                    "instance": r.instance,
                    "agent_id": r.agent_id,
                    "start_unix_ms": w.start_unix_ms,
                    "start": time(w.start_unix_ms),
                    "duration_ns": w.duration_ns,
                    "class": w.class,
                    "connection_id": w.connection_id,
                    "digest": format!("{:016x}", w.digest),
                    "digest_text": w.digest_text,
                    "sample": w.sample,
                    "blocker_kind": w.blocker_kind,
                    "blockers": w.blockers.iter().map(|b| json!({
                        "connection_id": b.connection_id,
                        "transaction": b.transaction,
                        "started_unix_ms": b.started_unix_ms,
                        "statements": b.statements,
                    })).collect::<Vec<_>>(),
                })
            })
            .collect(),
    )
}

/// `{"statements": [...]}`: statements that ran long, were killed or lost
/// their client, newest first.
pub fn long_statements_json(rows: &[LongStatementRow]) -> Value {
    let text = |s: &str| (!s.is_empty()).then(|| s.to_string());
    let statements: Vec<Value> = rows
        .iter()
        .map(|r| {
            let s = r.statement.clone().unwrap_or_default();
            json!({
                "instance": r.instance,
                "agent_id": r.agent_id,
                "thread_id": s.connection_id,
                "account": format!("{}@{}", s.user, s.host),
                "schema": text(&s.schema),
                "digest": (s.digest != 0).then(|| format!("{:016x}", s.digest)),
                "digest_text": s.digest_text,
                "sample": text(&s.sample),
                "start_unix_ms": s.start_unix_ms,
                "start": time(s.start_unix_ms),
                "duration_ms": s.duration_ns / 1_000_000,
                "duration_ns": s.duration_ns,
                "outcome": s.outcome,
                "error_code": (s.error_code != 0).then_some(s.error_code),
                "waits": s.waits.iter().map(|w| (w.class.clone(), Value::from(w.sum_ns))).collect::<Map<_, _>>(),
                "blocked_by": (s.blocked_by != 0).then_some(s.blocked_by),
                "deadlock_with": (s.deadlock_with != 0).then(|| json!({
                    "thread_id": s.deadlock_with,
                    "digest": (s.deadlock_with_digest != 0).then(|| format!("{:016x}", s.deadlock_with_digest)),
                    "digest_text": text(&s.deadlock_with_digest_text),
                    "sample": text(&s.deadlock_with_sample),
                })),
            })
        })
        .collect();
    json!({ "statements": statements })
}

/// A hash as 16 hex digits; null for 0 (none).
fn hash(h: u64) -> Value {
    if h == 0 { Value::Null } else { format!("{h:016x}").into() }
}

/// `{"plans": [...], "changes": [...]}`: each distinct plan of a digest
/// (newest last seen first) and plan changes (newest first).
pub fn plans_json(answer: &PlansResponse) -> Value {
    let plans: Vec<Value> = answer
        .plans
        .iter()
        .map(|row| {
            let p = row.plan.clone().unwrap_or_default();
            json!({
                "plan_hash": hash(p.plan_hash),
                "first_seen_unix_ms": row.first_seen_unix_ms,
                "last_seen_unix_ms": row.last_seen_unix_ms,
                "instance": row.instance,
                "schema": p.schema,
                "digest": format!("{:016x}", p.digest),
                "digest_text": row.digest_text,
                "tables": p.access.iter().map(|a| a.table.as_str()).collect::<Vec<_>>(),
                "access": p.access.iter().map(|a| json!({
                    "table": a.table,
                    "type": a.r#type,
                    "key": (!a.key.is_empty()).then_some(&a.key),
                    "key_parts": a.key_parts,
                    "possible_keys": a.possible_keys,
                    "rows": a.rows,
                })).collect::<Vec<_>>(),
                "filesort": p.filesort,
                "temporary": p.temporary,
                "findings": row.findings.iter().map(finding_json).collect::<Vec<_>>(),
                "plan": (!p.plan_json.is_empty()).then_some(&p.plan_json),
                "not_explained": (!p.not_explained.is_empty()).then_some(&p.not_explained),
            })
        })
        .collect();
    let changes: Vec<Value> = answer
        .changes
        .iter()
        .map(|c| {
            json!({
                "at_unix_ms": c.at_unix_ms,
                "at": time(c.at_unix_ms),
                "instance": c.instance,
                "schema": c.schema,
                "digest": format!("{:016x}", c.digest),
                "digest_text": c.digest_text,
                "from_plan_hash": hash(c.from_hash),
                "to_plan_hash": hash(c.to_hash),
            })
        })
        .collect();
    json!({"plans": plans, "changes": changes})
}

/// `{"tables": [...], "unknown_statements", "undescribed_statements"}`.
/// A finding of a plan or of a table; `digests` names those a table's
/// finding rests on.
fn finding_json(f: &Finding) -> Value {
    json!({
        "kind": f.kind,
        "table": f.table,
        "plan_line": f.plan_line,
        "detail": f.detail,
        "suggestion": (!f.suggestion.is_empty()).then_some(&f.suggestion),
        "check_first": (!f.check_first.is_empty()).then_some(&f.check_first),
        "digests": f.digests.iter().map(|d| format!("{d:016x}")).collect::<Vec<_>>(),
    })
}

pub fn tables_json(answer: &TablesResponse) -> Value {
    let tables: Vec<Value> = answer
        .tables
        .iter()
        .map(|t| {
            json!({
                "schema": t.schema,
                "table": t.table,
                "statements": t.statements,
                "sum_ns": t.sum_ns,
                "rows_examined": t.rows_examined,
                "writing_statements": t.writing_statements,
                "reading_statements": t.reading_statements,
                "digest_count": t.digest_count,
                "digests": t.digests.iter().map(|d| json!({
                    "digest": format!("{:016x}", d.digest),
                    "schema": d.schema,
                    "digest_text": d.digest_text,
                    "count": d.count,
                    "sum_ns": d.sum_ns,
                    "write": d.write,
                })).collect::<Vec<_>>(),
                "indexes": t.indexes.iter().map(|i| json!({
                    "name": i.name,
                    "columns": i.columns,
                    "unique": i.unique,
                    "type": i.r#type,
                    "ignored": i.ignored,
                    "digests": i.digests,
                    "statements": i.statements,
                    "rows_read": i.rows_read,
                    "digest_ids": i.digest_ids.iter().map(|d| format!("{d:016x}")).collect::<Vec<_>>(),
                })).collect::<Vec<_>>(),
                "indexes_instance": (!t.indexes_instance.is_empty()).then_some(&t.indexes_instance),
                "indexes_read_unix_ms": (t.indexes_read_unix_ms > 0).then_some(t.indexes_read_unix_ms),
                "plannable_statements": t.plannable_statements,
                "planned_statements": t.planned_statements,
                "findings": t.findings.iter().map(finding_json).collect::<Vec<_>>(),
                "apply_ns": t.apply_ns,
                "applied": t.applied.iter().map(applied_table_json).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({
        "tables": tables,
        "unknown_statements": answer.unknown_statements,
        "undescribed_statements": answer.undescribed_statements,
    })
}

/// How long ago the agent's newest window for the instance ended; `None`
/// before its first window. Left negative when the agent's clock is ahead
/// of ours, so skew shows instead of reading as "no lag".
pub fn lag_ms(i: &InstanceInfo, now_unix_ms: i64) -> Option<i64> {
    (i.last_window_end_unix_ms > 0).then(|| now_unix_ms - i.last_window_end_unix_ms)
}

pub fn costs_json(costs: &[CostSummary]) -> Value {
    Value::Array(
        costs
            .iter()
            .map(|c| {
                json!({
                    "agent_id": c.agent_id,
                    "host": c.host,
                    "windows": c.windows,
                    "seconds": c.seconds,
                    "statements": c.statements,
                    "agent_cpu_seconds": c.agent_cpu_seconds,
                    "agent_cores_per_10k_qps": c.agent_cores_per_10k_qps,
                    "agent_max_rss_bytes": c.agent_max_rss_bytes,
                    "probe_cpu_seconds": c.probe_cpu_seconds,
                    "server_extra_cores_per_10k_qps": c.server_extra_cores_per_10k_qps,
                    "shedding_windows": c.shedding_windows,
                    "latest_shedding": c.latest_shedding,
                    "dropped_events": c.dropped_events,
                })
            })
            .collect(),
    )
}

pub fn quotas_json(quotas: &[AgentQuota]) -> Value {
    Value::Array(
        quotas
            .iter()
            .map(|q| {
                json!({
                    "agent_id": q.agent_id,
                    "rows_per_hour": q.rows_per_hour,
                    "bytes_per_hour": q.bytes_per_hour,
                    "used_fraction": q.used_fraction,
                    "stored_rows": q.stored_rows,
                    "stored_bytes": q.stored_bytes,
                    "refused_batches": q.refused_batches,
                    "refused_rows": q.refused_rows,
                    "refused_bytes": q.refused_bytes,
                })
            })
            .collect(),
    )
}

fn process_json(p: &ProcessMetrics) -> Value {
    json!({
        "pid": p.pid,
        "status": p.status,
        "cpu_cores": p.cpu_cores,
        "rss_bytes": p.rss_bytes,
        "threads": p.threads,
        "open_files": p.open_files,
        "read_bytes": p.read_bytes,
        "write_bytes": p.write_bytes,
    })
}

pub fn instance_cost_json(c: &InstanceCost) -> Value {
    json!({
        "window_end_unix_ms": c.window_end_unix_ms,
        "statements_per_s": c.statements_per_s,
        "agent_cpu_cores": c.agent_cpu_cores,
        "agent_cores_per_10k_qps": c.agent_cores_per_10k_qps,
        "agent_rss_bytes": c.agent_rss_bytes,
        "shedding": c.shedding,
        "events_per_s": c.events_per_s,
        "dropped_events": c.dropped_events,
        "server_extra_cores_per_10k_qps": c.server_extra_cores_per_10k_qps,
        "attached_fraction": c.attached_fraction,
        "aggregated_in_kernel": c.aggregated_in_kernel,
        "server": c.server.as_ref().map(process_json),
    })
}

pub fn hosts_json(rows: &[AgentWindowRow]) -> Value {
    Value::Array(
        rows.iter()
            .map(|r| {
                let w = r.window.clone().unwrap_or_default();
                let cost = w.cost.unwrap_or_default();
                let host = w.host.unwrap_or_default();
                json!({
                    "agent_id": r.agent_id,
                    "host": r.host,
                    "window_start_unix_ms": w.window_start_unix_ms,
                    "window_end_unix_ms": w.window_end_unix_ms,
                    "agent": {
                        "cpu_cores": cost.cpu_cores,
                        "cpu_source": cost.cpu_source,
                        "rss_bytes": cost.rss_bytes,
                        "statements_per_s": cost.statements_per_s,
                        "cores_per_10k_qps": cost.cores_per_10k_qps,
                        "cpu_limit_cores": cost.cpu_limit_cores,
                        "memory_limit_bytes": cost.memory_limit_bytes,
                        "shedding": cost.shedding,
                        "events_per_s": cost.events_per_s,
                        "dropped_events": cost.dropped_events,
                    },
                    "ship": {
                        "sender_restarts": cost.sender_restarts,
                        "spool_io_errors": cost.spool_io_errors,
                        "clock_skew_ms": cost.clock_skew_ms,
                        "clock_correction_ms": cost.clock_correction_ms,
                    },
                    "online_cores": host.online_cores,
                    "cpu": host.cpu.map(|c| json!({
                        "user": c.user, "nice": c.nice, "system": c.system, "idle": c.idle,
                        "iowait": c.iowait, "irq": c.irq, "softirq": c.softirq, "steal": c.steal,
                    })),
                    "memory": {
                        "total_bytes": host.memory_total_bytes,
                        "available_bytes": host.memory_available_bytes,
                        "free_bytes": host.memory_free_bytes,
                        "cached_bytes": host.memory_cached_bytes,
                        "swap_total_bytes": host.swap_total_bytes,
                        "swap_free_bytes": host.swap_free_bytes,
                    },
                    "load": [host.load1, host.load5, host.load15],
                    "disks": host.disks.iter().map(|d| json!({
                        "device": d.device, "reads": d.reads, "writes": d.writes,
                        "read_bytes": d.read_bytes, "write_bytes": d.write_bytes, "io_time_ms": d.io_time_ms,
                    })).collect::<Vec<_>>(),
                    "interfaces": host.interfaces.iter().map(|n| json!({
                        "interface": n.interface, "rx_bytes": n.rx_bytes, "rx_packets": n.rx_packets,
                        "rx_errors": n.rx_errors, "rx_drops": n.rx_drops, "tx_bytes": n.tx_bytes,
                        "tx_packets": n.tx_packets, "tx_errors": n.tx_errors, "tx_drops": n.tx_drops,
                    })).collect::<Vec<_>>(),
                })
            })
            .collect(),
    )
}

/// Statements per second over one point.
pub fn rate(count: u64, start: i64, end: i64) -> f64 {
    let seconds = (end - start) as f64 / 1000.0;
    if seconds > 0.0 { count as f64 / seconds } else { 0.0 }
}

pub fn series_json(answer: &SeriesResponse, cost: bool) -> Value {
    let points: Vec<Value> = answer
        .points
        .iter()
        .map(|p| {
            if cost {
                json!({
                    "start_unix_ms": p.start_unix_ms,
                    "end_unix_ms": p.end_unix_ms,
                    "windows": p.windows,
                    "agent_cpu_cores": p.agent_cpu_cores,
                    "agent_max_rss_bytes": p.agent_max_rss_bytes,
                    "probe_cpu_seconds": p.probe_cpu_seconds,
                })
            } else {
                json!({
                    "start_unix_ms": p.start_unix_ms,
                    "end_unix_ms": p.end_unix_ms,
                    "count": p.count,
                    "per_s": rate(p.count, p.start_unix_ms, p.end_unix_ms),
                    "errors": p.errors,
                    "sum_ns": p.sum_ns,
                    "p50_ns": p.p50_ns,
                    "p95_ns": p.p95_ns,
                    "p99_ns": p.p99_ns,
                    "max_ns": p.max_ns,
                })
            }
        })
        .collect();
    json!({ "step_ms": answer.step_ms, "points": points })
}

/// `{"activity": [...], "instances": [...], "chains": [...]}`: one entry
/// per connection; each instance's snapshot (its age and why anything is
/// missing); and the blocking chains as trees, each root a connection that
/// blocks others and waits on nobody named.
pub fn activity_json(answer: &ActivityResponse, now_unix_ms: i64) -> Value {
    let mut activity = Vec::new();
    let mut instances = Vec::new();
    let mut chains = Vec::new();
    for live in &answer.instances {
        let snapshot = live.activity.clone().unwrap_or_default();
        let name = snapshot.instance.as_ref().map(|i| i.name.clone()).unwrap_or_default();
        instances.push(json!({
            "instance": name,
            "agent_id": live.agent_id,
            "taken_unix_ms": live.taken_unix_ms,
            "age_ms": (now_unix_ms - live.taken_unix_ms).max(0),
            "connections": snapshot.connections.len(),
            // The longest-running are answered; these were left out.
            "more_connections": live.more_connections,
            "warning": (!snapshot.warning.is_empty()).then_some(&snapshot.warning),
            "blocker_sources": snapshot.blocker_sources,
        }));
        for c in &snapshot.connections {
            activity.push(live_connection_json(&name, c));
        }
        chains.extend(blocking_trees(&name, &snapshot.connections));
    }
    json!({ "activity": activity, "instances": instances, "chains": chains, "left_out": answer.left_out })
}

fn live_connection_json(instance: &str, c: &LiveConnection) -> Value {
    let text = |s: &str| (!s.is_empty()).then(|| s.to_string());
    json!({
        "instance": instance,
        "thread_id": c.thread_id,
        "account": format!("{}@{}", c.user, c.host),
        "user": text(&c.user),
        "host": text(&c.host),
        "schema": text(&c.schema),
        "command": c.command,
        "state": text(&c.state),
        "digest": (c.digest != 0).then(|| format!("{:016x}", c.digest)),
        "digest_text": text(&c.digest_text),
        "sample": text(&c.sample),
        "running_ms": c.running_ms,
        "wait": text(&c.wait),
        "blocked_by": (c.blocked_by != 0).then_some(c.blocked_by),
        "blocked_by_source": text(&c.blocked_by_source),
        "in_transaction": c.in_transaction,
        "killed": c.killed,
        "system": c.system,
    })
}

/// Deepest a blocking tree is drawn. A chain an agent reports can be as
/// long as its connections; past this depth its waiters are counted
/// (`more_blocked`), not drawn, so no reader (this collector's pages, a
/// JSON parser with a nesting limit) walks thousands of levels.
pub const MAX_CHAIN_DEPTH: usize = 32;

/// Who blocks whom, as trees: a root blocks others and is blocked by
/// nobody the server named (or closes a cycle, which is cut there). Linear
/// in the connections, and never deeper than `MAX_CHAIN_DEPTH`.
pub fn blocking_trees(instance: &str, connections: &[LiveConnection]) -> Vec<Value> {
    use std::collections::{BTreeMap, HashMap, HashSet};
    let by_id: HashMap<u64, &LiveConnection> = connections.iter().map(|c| (c.thread_id, c)).collect();
    let mut waiters: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for c in connections.iter().filter(|c| c.blocked_by != 0 && c.blocked_by != c.thread_id) {
        waiters.entry(c.blocked_by).or_default().push(c.thread_id);
    }
    let is_root = |id: &u64| by_id.get(id).is_none_or(|c| c.blocked_by == 0 || !by_id.contains_key(&c.blocked_by));
    let mut seen: HashSet<u64> = HashSet::new();
    let mut trees = Vec::new();
    // Roots first; then what only cycles reach, each from its lowest id.
    let roots: Vec<u64> = waiters.keys().copied().filter(is_root).collect();
    for start in roots.into_iter().chain(waiters.keys().copied().collect::<Vec<_>>()) {
        if seen.insert(start) {
            trees.push(tree(start, instance, &by_id, &waiters, &mut seen, 0));
        }
    }
    trees
}

/// One node and its waiters, `depth` levels below its root; its id is in
/// `seen` already.
fn tree(
    id: u64,
    instance: &str,
    by_id: &std::collections::HashMap<u64, &LiveConnection>,
    waiters: &std::collections::BTreeMap<u64, Vec<u64>>,
    seen: &mut std::collections::HashSet<u64>,
    depth: usize,
) -> Value {
    let next: Vec<u64> = waiters.get(&id).into_iter().flatten().copied().filter(|w| seen.insert(*w)).collect();
    let (blocked, more) = if depth + 1 >= MAX_CHAIN_DEPTH {
        // Counted, iteratively: everything that waits below the cut.
        let mut more = next.len() as u64;
        let mut stack = next;
        while let Some(w) = stack.pop() {
            for below in waiters.get(&w).into_iter().flatten() {
                if seen.insert(*below) {
                    more += 1;
                    stack.push(*below);
                }
            }
        }
        (Vec::new(), more)
    } else {
        (next.into_iter().map(|w| tree(w, instance, by_id, waiters, seen, depth + 1)).collect(), 0)
    };
    let c = by_id.get(&id);
    json!({
        "instance": instance,
        "thread_id": id,
        "state": c.map(|c| c.state.as_str()),
        "command": c.map(|c| c.command.as_str()),
        "digest_text": c.map(|c| c.digest_text.as_str()).filter(|t| !t.is_empty()),
        "running_ms": c.map(|c| c.running_ms),
        "wait": c.map(|c| c.wait.as_str()).filter(|w| !w.is_empty()),
        "source": c.map(|c| c.blocked_by_source.as_str()).filter(|s| !s.is_empty()),
        "blocked": blocked,
        "more_blocked": (more > 0).then_some(more),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_digest_answer_has_every_figure_null_when_no_window_carried_it() {
        let mut stats = QueryStats::default();
        for (i, slot) in stats.values_mut().into_iter().enumerate().filter(|(i, _)| i % 2 == 0) {
            *slot = Some(i as u64 * 7);
        }
        let rows = top_json(&[TopDigest { stats: Some(stats), ..Default::default() }, TopDigest::default()]);
        for (i, figure) in sqlbee_figures::FIGURES.iter().enumerate() {
            let expected = if i % 2 == 0 { json!(i as u64 * 7) } else { Value::Null };
            assert_eq!(rows[0][figure.name], expected, "{}", figure.name);
            assert_eq!(rows[1][figure.name], Value::Null, "{} of a row without figures", figure.name);
        }
    }
}

/// One table's rows events of one kind, as a replica applied them.
fn applied_table_json(a: &crate::v1::AppliedTable) -> Value {
    json!({
        "schema": a.schema,
        "table": a.table,
        "kind": a.kind,
        "events": a.events,
        "rows": a.rows,
        "apply_ns": a.apply_ns,
        "p50_ms": apply_quantile_ms(a.latency.as_ref(), a.apply_ns, 0.5),
        "p99_ms": apply_quantile_ms(a.latency.as_ref(), a.apply_ns, 0.99),
    })
}

/// One event's apply time at quantile `q`, in ms, within its bucket and
/// never above the time of all of them (`apply_ns`); null without a
/// histogram (an agent before 0.9).
fn apply_quantile_ms(latency: Option<&crate::v1::Histogram>, apply_ns: u64, q: f64) -> Option<f64> {
    let h = counted(latency);
    (h.total() > 0).then(|| h.percentile(q, 0, apply_ns) as f64 / 1e6)
}

/// A wire histogram's buckets, counted again (empty when absent).
fn counted(wire: Option<&crate::v1::Histogram>) -> sqlbee_vocabulary::histogram::Histogram {
    let mut h = sqlbee_vocabulary::histogram::Histogram::default();
    for b in wire.iter().flat_map(|w| &w.buckets) {
        h.add_bucket(b.index as usize, b.count);
    }
    h
}

/// `sqlbee replication` and `/api/replication`: per replica, its
/// transactions, lag at commit, the tables and event classes that took the
/// apply time, and window by window the lag's highest point.
pub fn replication_json(answer: &ReplicationResponse) -> Value {
    let ms = |ns: u64| ns / 1_000_000;
    let replicas: Vec<Value> = answer
        .replicas
        .iter()
        .map(|r| {
            let t = r.totals.clone().unwrap_or_default();
            let lag = counted(t.lag.as_ref());
            let measured = lag.total();
            let quantile = |q: f64| (measured > 0).then(|| ms(lag.percentile(q, 0, t.lag_max_ns)));
            json!({
                "instance": r.instance,
                "channel": r.channel,
                "transactions": t.transactions,
                "lag": {
                    "samples": measured,
                    "p50_ms": quantile(0.5),
                    "p99_ms": quantile(0.99),
                    "max_ms": (measured > 0).then(|| ms(t.lag_max_ns)),
                },
                "lost_events": t.lost_events,
                "tables": t.tables.iter().map(applied_table_json).collect::<Vec<_>>(),
                "events": t.classes.iter().map(|c| json!({
                    "class": c.class, "events": c.events, "rows": c.rows, "apply_ns": c.apply_ns,
                    "p50_ms": apply_quantile_ms(c.latency.as_ref(), c.apply_ns, 0.5),
                    "p99_ms": apply_quantile_ms(c.latency.as_ref(), c.apply_ns, 0.99),
                })).collect::<Vec<_>>(),
                "digests": r.digests.iter().map(|d| {
                    let side = |t: &crate::v1::TopDigest| json!({
                        "instances": t.instances,
                        "count": t.count,
                        "sum_ns": t.sum_ns,
                        "mean_ms": if t.count == 0 { 0.0 } else { t.sum_ns as f64 / t.count as f64 / 1e6 },
                        "p99_ms": t.p99_ns as f64 / 1e6,
                    });
                    let applied = d.applied.clone().unwrap_or_default();
                    json!({
                        "digest": format!("{:016x}", applied.digest),
                        "digest_text": applied.digest_text,
                        "schema": (!applied.schema.is_empty()).then(|| applied.schema.clone()),
                        "applied": side(&applied),
                        "primary": d.primary.as_ref().map(side),
                    })
                }).collect::<Vec<_>>(),
                "timeline": r.timeline.iter().map(|w| json!({
                    "start": time(w.window_start_unix_ms),
                    "start_unix_ms": w.window_start_unix_ms,
                    "end_unix_ms": w.window_end_unix_ms,
                    "transactions": w.transactions,
                    "lag_max_ms": ms(w.lag_max_ns),
                    "apply_ns": w.apply_ns,
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({ "replicas": replicas })
}
