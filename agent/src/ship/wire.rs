//! Closed windows -> `sqlbee.v1` messages. The only place that knows both
//! the aggregate types and the wire types.
use std::time::{SystemTime, UNIX_EPOCH};

use agent_common::wait_class;
use sqlbee_proto::v1::{
    Bucket, CommandCount, DigestStats as WireDigest, ErrorCount, Histogram as WireHistogram, InstanceWindow,
    LockWait, ServerInstance, WaitStats, Blocker as WireBlocker,
};

use crate::aggregate::{DigestStats, LockWaitRecord, WindowReport};

/// Histogram scheme 1: log-linear, 8 buckets per power of two (see
/// `aggregate::histogram`).
pub const HISTOGRAM_SCHEME: u32 = 1;

pub fn unix_ms(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

fn digest(d: &DigestStats) -> WireDigest {
    WireDigest {
        digest: d.digest,
        digest_text: d.digest_text.to_string(),
        count: d.count,
        errors: d.errors,
        sum_ns: d.sum_ns,
        min_ns: if d.count == 0 { 0 } else { d.min_ns },
        max_ns: d.max_ns,
        histogram: Some(WireHistogram {
            scheme: HISTOGRAM_SCHEME,
            buckets: d.histogram.buckets().map(|(index, count)| Bucket { index: index as u32, count }).collect(),
        }),
        sample: d.sample.clone(),
        truncated: d.truncated,
        error_codes: d
            .error_codes
            .iter()
            .map(|(code, count)| ErrorCount {
                code: *code,
                count: *count,
                sample_message: d.error_messages.get(code).cloned().unwrap_or_default(),
            })
            .collect(),
        waits: d
            .waits
            .iter()
            .zip(wait_class::NAMES)
            .filter(|(w, _)| w.statements > 0)
            .map(|(w, class)| WaitStats { class: class.to_string(), sum_ns: w.sum_ns, max_ns: w.max_ns, statements: w.statements })
            .collect(),
    }
}

fn lock_wait(w: &LockWaitRecord) -> LockWait {
    LockWait {
        start_unix_ms: unix_ms(w.start),
        duration_ns: w.duration_ns,
        class: w.class.to_string(),
        connection_id: w.connection_id,
        digest: w.digest.as_ref().map_or(0, |d| d.id),
        digest_text: w.digest.as_ref().map(|d| d.text.to_string()).unwrap_or_default(),
        sample: w.sample.clone(),
        blocker_kind: "candidates".into(),
        blockers: w
            .blockers
            .iter()
            .map(|b| WireBlocker {
                connection_id: b.connection_id,
                transaction: b.transaction,
                started_unix_ms: unix_ms(b.started),
                statements: b.statements.iter().map(|t| t.to_string()).collect(),
            })
            .collect(),
    }
}

pub fn instance_window(report: &WindowReport) -> InstanceWindow {
    let s = &report.summary;
    InstanceWindow {
        instance: Some(ServerInstance {
            name: report.instance.clone(),
            pid: s.pid,
            start_time_unix_ms: s.server_start_unix_ms,
        }),
        window_start_unix_ms: unix_ms(report.window_start),
        window_end_unix_ms: unix_ms(report.window_end),
        digests: report.digests.iter().map(digest).collect(),
        commands: s.commands.iter().map(|(command, count)| CommandCount { command: command.clone(), count: *count }).collect(),
        statements: s.statements,
        events: s.events,
        dropped_events: s.dropped_events,
        // Nothing is dropped between the probe reader and aggregation any
        // more (the reader waits); the field stays for older collectors.
        dropped_in_agent: 0,
        unmatched: s.unmatched,
        overflow_statements: s.overflow_statements,
        lock_waits: report.lock_waits.iter().map(lock_wait).collect(),
    }
}
