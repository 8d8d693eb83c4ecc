//! One instance's step as OTLP log records: the events the collector
//! stores (regressions, new digests and plan changes as they open and
//! close; changes, server starts and stops) and the statements agents
//! reported as long, killed, deadlocked or abandoned by their client.
//!
//! A record belongs to the step its row was written in, as near as the
//! row tells: an event version by the later of its version time and its
//! closing (a change is written when its statement ends), a long
//! statement by its end. Bodies and attributes carry what the collector
//! computed, redacted digest texts only with `--otlp-query-text`, and
//! never a setting's value.
use sqlbee_proto::v1::{Event, LongStatementRow};

use super::{
    metrics::nanos,
    resource::{Instance, resource, scope},
    wire::{AnyValue, INFO, KeyValue, LogRecord, ResourceLogs, ScopeLogs, Value, WARN},
};

/// The time that puts an event's version in a step.
pub fn event_time(event: &Event) -> i64 {
    event.updated_unix_ms.max(event.closed_unix_ms)
}

/// The time that puts a long statement in a step: its end.
pub fn statement_time(row: &LongStatementRow) -> i64 {
    row.statement.as_ref().map_or(0, |s| s.start_unix_ms.saturating_add((s.duration_ns / 1_000_000) as i64))
}

pub fn instance_logs(
    instance: &Instance<'_>,
    events: &[Event],
    statements: &[LongStatementRow],
    query_text: bool,
    observed_unix_ms: i64,
) -> Option<ResourceLogs> {
    let observed = nanos(observed_unix_ms);
    let mut records: Vec<LogRecord> = events.iter().map(|e| event_record(e, query_text, observed)).collect();
    records.extend(statements.iter().filter_map(|s| statement_record(s, query_text, observed)));
    if records.is_empty() {
        return None;
    }
    records.sort_by_key(|r| r.time_unix_nano);
    Some(ResourceLogs {
        resource: Some(resource(instance)),
        scope_logs: vec![ScopeLogs { scope: Some(scope()), log_records: records, schema_url: String::new() }],
        schema_url: String::new(),
    })
}

fn text(body: String) -> Option<AnyValue> {
    Some(AnyValue { value: Some(Value::String(body)) })
}

fn digest_attributes(attributes: &mut Vec<KeyValue>, digest: u64, schema: &str, text: &str, query_text: bool) {
    if digest != 0 {
        attributes.push(KeyValue::string("sqlbee.digest", format!("{digest:016x}")));
    }
    if !schema.is_empty() {
        attributes.push(KeyValue::string("db.namespace", schema));
    }
    if query_text && !text.is_empty() {
        attributes.push(KeyValue::string("db.query.text", text));
    }
}

fn event_record(event: &Event, query_text: bool, observed: u64) -> LogRecord {
    let mut attributes = vec![
        KeyValue::string("sqlbee.event.id", format!("{:016x}", event.id)),
        KeyValue::string("sqlbee.event.kind", event.kind.clone()),
    ];
    digest_attributes(&mut attributes, event.digest, &event.schema, &event.digest_text, query_text);
    let (time, severity, body) = match &event.change {
        Some(change) => {
            attributes.push(KeyValue::string("sqlbee.change.kind", change.kind.clone()));
            attributes.push(KeyValue::string("sqlbee.change.action", change.action.clone()));
            if !change.objects.is_empty() {
                attributes.push(KeyValue::string("sqlbee.change.objects", change.objects.join(", ")));
            }
            if !change.user.is_empty() {
                attributes.push(KeyValue::string("sqlbee.account", format!("{}@{}", change.user, change.host)));
            }
            if !change.program.is_empty() {
                attributes.push(KeyValue::string("sqlbee.client.program", change.program.clone()));
            }
            if change.error_code != 0 {
                attributes.push(KeyValue::string("db.response.status_code", change.error_code.to_string()));
            }
            if !change.values.is_empty() {
                let names: Vec<&str> = change.values.iter().map(|v| v.name.as_str()).collect();
                attributes.push(KeyValue::string("sqlbee.change.settings", names.join(", ")));
            }
            attributes.push(KeyValue::double("sqlbee.change.duration_s", change.duration_ns as f64 / 1e9));
            let stop = change.action == "server stop";
            let what = std::iter::once(change.action.as_str()).chain(change.objects.iter().map(String::as_str));
            (event.opened_unix_ms, if stop { WARN } else { INFO }, what.collect::<Vec<_>>().join(" "))
        }
        None => {
            let closed = event.closed_unix_ms > 0;
            attributes.push(KeyValue::string("sqlbee.event.status", if closed { "closed" } else { "opened" }));
            let severity = if event.kind == "regressed" && !closed { WARN } else { INFO };
            let time = if closed { event.closed_unix_ms } else { event.opened_unix_ms };
            let body = if event.evidence.is_empty() {
                format!("{} {}", event.kind, if closed { "closed" } else { "opened" })
            } else {
                event.evidence.clone()
            };
            (time, severity, body)
        }
    };
    LogRecord {
        time_unix_nano: nanos(time),
        observed_time_unix_nano: observed,
        severity_number: severity,
        severity_text: severity_text(severity).into(),
        body: text(body),
        attributes,
        event_name: "sqlbee.event".into(),
    }
}

fn statement_record(row: &LongStatementRow, query_text: bool, observed: u64) -> Option<LogRecord> {
    let s = row.statement.as_ref()?;
    let mut attributes = vec![
        KeyValue::string("sqlbee.statement.outcome", s.outcome.clone()),
        KeyValue::double("sqlbee.statement.duration_s", s.duration_ns as f64 / 1e9),
        KeyValue::int("sqlbee.connection.id", i64::try_from(s.connection_id).unwrap_or(i64::MAX)),
    ];
    digest_attributes(&mut attributes, s.digest, &s.schema, &s.digest_text, query_text);
    if !s.user.is_empty() {
        attributes.push(KeyValue::string("sqlbee.account", format!("{}@{}", s.user, s.host)));
    }
    if s.error_code != 0 {
        attributes.push(KeyValue::string("db.response.status_code", s.error_code.to_string()));
    }
    if s.deadlock_with_digest != 0 {
        attributes.push(KeyValue::string("sqlbee.deadlock.with_digest", format!("{:016x}", s.deadlock_with_digest)));
    }
    let severity = if matches!(s.outcome.as_str(), "killed" | "deadlock") { WARN } else { INFO };
    Some(LogRecord {
        time_unix_nano: nanos(s.start_unix_ms),
        observed_time_unix_nano: observed,
        severity_number: severity,
        severity_text: severity_text(severity).into(),
        body: text(format!("{} statement, {:.3} s", s.outcome, s.duration_ns as f64 / 1e9)),
        attributes,
        event_name: "sqlbee.long_statement".into(),
    })
}

fn severity_text(severity: i32) -> &'static str {
    if severity >= WARN { "WARN" } else { "INFO" }
}
