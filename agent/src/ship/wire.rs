//! Closed windows -> `sqlbee.v1` messages. The only place that knows both
//! the aggregate types and the wire types.
use std::time::SystemTime;

use sqlbee_kernel_abi::wait_class;
use sqlbee_proto::v1::{
    AccountCount, ActivityReport, AgentCost, AgentWindow, AppliedClass, AppliedTable, Blocker as WireBlocker, Bucket,
    Change as WireChange, ClientCount, CommandCount, CpuModes as WireCpuModes, DigestStats as WireDigest,
    DiskIo as WireDiskIo, ErrorCount, Histogram as WireHistogram, HostMetrics as WireHostMetrics, IndexColumn,
    IndexDefinition, InstanceActivity, InstanceWindow, LiveConnection, LockWait, LongStatement as WireLongStatement,
    NetIo as WireNetIo, Plan as WirePlan, ProbeCost as WireProbeCost, ProcessMetrics as WireProcess,
    QueryStats as WireQueryStats, Replication as WireReplication, ServerInstance, SettingValue as WireSettingValue,
    TableAccess as WireTableAccess, TableIndexes as WireTableIndexes, TableUse as WireTableUse, TagCount, TagValue,
    TraceExemplar, UntracedServer as WireUntraced, WaitStats,
};
use sqlbee_vocabulary::{clock::unix_ms, histogram};

use super::health::HealthReport;
use crate::{
    activity::{Connection, Snapshot},
    aggregate::{ChangeRecord, DigestRow, LockWaitRecord, LongStatement, WindowReport},
    budget::{CostSample, ProbeCost},
    discover::Client,
    host::{HostMetrics, ProcessMetrics, ProcessStatus},
    normalize::Tables,
    plans::{Explained, IndexReading, PlanRecord},
    probe::{Readable, UntracedServer},
};

/// One round of activity snapshots (the sender fills in the agent).
pub fn activity_report(at: SystemTime, snapshots: &[Snapshot]) -> ActivityReport {
    let connection = |c: &Connection| LiveConnection {
        thread_id: c.thread_id,
        user: c.user.clone(),
        host: c.host.clone(),
        schema: c.schema.clone(),
        command: c.command.clone(),
        state: c.state.clone(),
        digest: c.digest,
        digest_text: c.digest_text.clone(),
        sample: c.sample.clone(),
        running_ms: c.running_ms,
        wait: c.wait.unwrap_or_default().to_string(),
        blocked_by: c.blocked_by.map_or(0, |b| b.0),
        blocked_by_source: c.blocked_by.map_or("", |b| b.1).to_string(),
        in_transaction: c.in_transaction,
        killed: c.killed,
        system: c.system,
    };
    ActivityReport {
        agent: None,
        taken_unix_ms: unix_ms(at),
        instances: snapshots
            .iter()
            .map(|s| InstanceActivity {
                instance: Some(ServerInstance {
                    name: s.server.instance.clone(),
                    pid: s.server.pid,
                    start_time_unix_ms: s.server.start_unix_ms,
                    container_id: s.server.container.as_ref().map(|c| c.id.clone()).unwrap_or_default(),
                    container: s.server.container.as_ref().map(|c| c.name.clone()).unwrap_or_default(),
                    build_id: s.build_id.clone().unwrap_or_default(),
                    server_version: s.version.clone().unwrap_or_default(),
                }),
                connections: s.connections.iter().map(connection).collect(),
                warning: s.warning.clone().unwrap_or_default(),
                blocker_sources: s.blocker_sources.iter().map(|s| s.to_string()).collect(),
            })
            .collect(),
    }
}

fn plan(record: &PlanRecord) -> WirePlan {
    let mut out = WirePlan {
        digest: record.digest,
        schema: record.schema.as_deref().unwrap_or_default().to_string(),
        explained_unix_ms: unix_ms(record.explained_at),
        previous_plan_hash: record.previous_hash,
        explain_ns: record.explain_ns,
        ..Default::default()
    };
    match &record.plan {
        Ok(plan) => {
            out.plan_hash = plan.hash;
            out.filesort = plan.filesort;
            out.temporary = plan.temporary;
            out.plan_json.clone_from(&plan.json);
            out.access = plan
                .access
                .iter()
                .map(|a| WireTableAccess {
                    table: a.table.clone(),
                    r#type: a.access_type.clone(),
                    key: a.key.clone(),
                    key_parts: a.key_parts.clone(),
                    possible_keys: a.possible_keys.clone(),
                    rows: a.rows,
                })
                .collect();
        }
        Err(reason) => out.not_explained.clone_from(reason),
    }
    out
}

/// Puts each plan, and each login's state, in its instance's window (the
/// pipeline hands over only plans whose instance has one, at most
/// `MAX_PLANS_PER_WINDOW` each: `Explained::keep_for`).
pub fn attach_plans(windows: &mut [InstanceWindow], explained: &Explained) {
    for window in windows.iter_mut() {
        let name = window.instance.as_ref().map(|i| i.name.clone()).unwrap_or_default();
        if let Some(state) = explained.logins.get(&name) {
            window.server_login = state.describe().to_string();
        }
        window.plans = explained.plans.iter().filter(|p| p.instance == name).map(plan).collect();
        window.table_indexes = explained.indexes.iter().filter(|(i, _)| *i == name).map(|(_, r)| indexes(r)).collect();
    }
}

fn indexes(reading: &IndexReading) -> WireTableIndexes {
    let t = &reading.table;
    WireTableIndexes {
        schema: t.schema.clone(),
        table: t.table.clone(),
        read_unix_ms: unix_ms(reading.read_at),
        missing: t.missing,
        indexes: t
            .indexes
            .iter()
            .map(|i| IndexDefinition {
                name: i.name.clone(),
                columns: i
                    .columns
                    .iter()
                    .map(|(name, prefix)| IndexColumn { name: name.clone(), prefix: *prefix })
                    .collect(),
                unique: i.unique,
                r#type: i.kind.clone(),
                ignored: i.ignored,
                rows_read: i.rows_read,
            })
            .collect(),
    }
}

/// The figures a server's build let the agent read; the rest absent.
/// Each figure the server's build lets the agent read; the others are
/// absent (unknown), never 0.
fn query_stats(d: &DigestRow, readable: Readable) -> WireQueryStats {
    let mut out = WireQueryStats::default();
    let values = d.stats.values();
    for ((slot, value), figure) in out.values_mut().into_iter().zip(values).zip(sqlbee_figures::FIGURES) {
        *slot = readable.knows(figure.needs).then_some(value);
    }
    out
}

fn accounts(d: &DigestRow) -> Vec<AccountCount> {
    let mut out: Vec<AccountCount> = d
        .accounts
        .iter()
        .map(|(a, n)| AccountCount { user: a.user.clone(), host: a.host.clone(), count: *n })
        .collect();
    out.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| (&a.user, &a.host).cmp(&(&b.user, &b.host))));
    out
}

fn client_count(c: &Client, count: u64) -> ClientCount {
    let text = |v: &Option<String>| v.clone().unwrap_or_default();
    ClientCount {
        address: text(&c.address),
        process: text(&c.process),
        pid: c.pid.unwrap_or(0),
        container: text(&c.container),
        container_id: text(&c.container_id),
        pod: text(&c.pod),
        namespace: text(&c.namespace),
        program: text(&c.program),
        driver: text(&c.driver),
        client_pid: c.client_pid.unwrap_or(0),
        count,
    }
}

fn clients(d: &DigestRow) -> Vec<ClientCount> {
    let mut out: Vec<ClientCount> = d.clients.iter().map(|(c, n)| client_count(c, *n)).collect();
    out.sort_by(|a, b| {
        b.count.cmp(&a.count).then_with(|| (&a.process, a.pid, &a.address).cmp(&(&b.process, b.pid, &b.address)))
    });
    out
}

/// The row's query tags, each key's values most frequent first.
fn tags(d: &DigestRow) -> Vec<TagCount> {
    d.tags
        .keys
        .iter()
        .map(|(key, counts)| {
            let values = counts
                .most_frequent()
                .into_iter()
                .map(|(value, count)| TagValue { value: value.to_string(), count })
                .collect();
            TagCount { key: key.to_string(), values, other: counts.other }
        })
        .collect()
}

fn exemplar(d: &DigestRow) -> Option<TraceExemplar> {
    d.tags.exemplar.as_ref().map(|e| TraceExemplar {
        trace_id: e.trace.trace_hex(),
        span_id: e.trace.span_hex(),
        duration_ns: e.duration_ns,
    })
}

/// (statement_kind, tables, tables_unknown) of a row described this window.
fn tables(d: &DigestRow) -> (String, Vec<WireTableUse>, bool) {
    match d.tables.as_deref() {
        None => (String::new(), Vec::new(), false),
        Some(Tables::Unknown) => (String::new(), Vec::new(), true),
        Some(Tables::Known { kind, tables }) => (
            kind.clone(),
            tables
                .iter()
                .map(|t| WireTableUse { schema: t.schema.clone(), table: t.table.clone(), write: t.write })
                .collect(),
            false,
        ),
    }
}

fn digest(d: &DigestRow, cost: Option<&ProbeCost>, readable: Readable) -> WireDigest {
    let lineage = &d.lineage;
    let (statement_kind, tables, tables_unknown) = tables(d);
    WireDigest {
        statement_kind,
        tables,
        tables_unknown,
        nested: lineage.nested,
        program: lineage.program.as_ref().map(|p| p.name.clone()).unwrap_or_default(),
        program_kind: lineage.program.as_ref().map(|p| p.kind.to_string()).unwrap_or_default(),
        parent_digest: lineage.parent_digest.unwrap_or(0),
        source: lineage.source_name().into(),
        schema: d.schema.as_deref().unwrap_or_default().to_string(),
        stats: Some(query_stats(d, readable)),
        accounts: accounts(d),
        clients: clients(d),
        tags: tags(d),
        exemplar: exemplar(d),
        estimated_count: cost.filter(|c| c.sampled()).map_or(0, |c| c.estimate(d.count)),
        digest: d.digest,
        digest_text: d.digest_text.to_string(),
        count: d.count,
        errors: d.errors,
        sum_ns: d.sum_ns,
        min_ns: if d.count == 0 { 0 } else { d.min_ns },
        max_ns: d.max_ns,
        histogram: Some(wire_histogram(&d.histogram)),
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
            .map(|(w, class)| WaitStats {
                class: class.to_string(),
                sum_ns: w.sum_ns,
                max_ns: w.max_ns,
                statements: w.statements,
            })
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

fn probe_cost(c: &ProbeCost, statements: u64) -> WireProbeCost {
    WireProbeCost {
        attached_fraction: c.attached_fraction,
        program_ns: c.program_ns,
        program_runs: c.program_runs,
        trap_ns: c.trap_ns,
        probe_cpu_seconds: c.probe_cpu_s(),
        server_cpu_seconds: c.mysqld_cpu_s,
        extra_cores_per_10k_qps: c.extra_cores_per_10k_qps(statements).unwrap_or(0.0),
        estimated_statements: c.estimate_total(statements),
        server_statements: c.server_statements,
        learned_statement_ns: c.learned_ns,
    }
}

fn process(p: &ProcessMetrics) -> WireProcess {
    WireProcess {
        pid: p.pid,
        status: match p.status {
            ProcessStatus::Running => "running",
            ProcessStatus::Gone => "gone",
            ProcessStatus::Unreadable => "unreadable",
        }
        .into(),
        cpu_cores: p.cpu_cores,
        rss_bytes: p.rss_bytes,
        threads: p.threads,
        open_files: p.open_fds,
        read_bytes: p.read_bytes,
        write_bytes: p.write_bytes,
    }
}

/// One server's window; `host` (the same window's sample) supplies the
/// server process's own metrics.
pub fn instance_window(report: &WindowReport, host: Option<&HostMetrics>) -> InstanceWindow {
    let s = &report.summary;
    let cost = s.probe_cost.as_ref();
    InstanceWindow {
        probes: cost.map(|c| probe_cost(c, s.statements)),
        process: host.and_then(|h| h.processes.iter().find(|p| p.pid == s.pid)).map(process),
        aggregated_in_kernel: s.aggregated_in_kernel,
        nested_statements: s.nested_statements,
        nested_unmatched: s.nested_unmatched,
        replica_statements: s.replica_statements,
        instance: Some(ServerInstance {
            name: report.instance.clone(),
            pid: s.pid,
            start_time_unix_ms: s.server_start_unix_ms,
            container_id: s.container_id.clone(),
            container: s.container.clone(),
            build_id: s.build_id.clone().unwrap_or_default(),
            server_version: s.server_version.clone().unwrap_or_default(),
        }),
        window_start_unix_ms: unix_ms(report.window_start),
        window_end_unix_ms: unix_ms(report.window_end),
        digests: report.digests.iter().map(|d| digest(d, cost, s.readable)).collect(),
        commands: s
            .commands
            .iter()
            .map(|(command, count)| CommandCount { command: command.clone(), count: *count })
            .collect(),
        statements: s.statements,
        events: s.events,
        dropped_events: s.dropped_events,
        // Nothing is dropped between the probe reader and aggregation any
        // more (the reader waits); the field stays for older collectors.
        dropped_in_agent: 0,
        unmatched: s.unmatched,
        overflow_statements: s.overflow_statements,
        lock_waits: report.lock_waits.iter().map(lock_wait).collect(),
        long_statements: report.long_statements.iter().map(long_statement).collect(),
        long_statements_dropped: report.long_statements_dropped,
        changes: report.changes.iter().map(change).collect(),
        changes_dropped: report.changes_dropped,
        // Filled by `attach_plans`.
        plans: Vec::new(),
        server_login: String::new(),
        table_indexes: Vec::new(),
        replication: report.replication.iter().map(|(channel, r)| replication(channel, r)).collect(),
    }
}

fn replication(channel: &str, r: &crate::aggregate::replication::ReplicationWindow) -> WireReplication {
    WireReplication {
        channel: channel.to_string(),
        transactions: r.transactions,
        lag: Some(wire_histogram(&r.lag)),
        lag_max_ns: r.lag_max_ns,
        lost_events: r.lost_events,
        classes: r
            .classes
            .iter()
            .map(|(class, t)| AppliedClass {
                class: class.to_string(),
                events: t.events,
                apply_ns: t.apply_ns,
                rows: t.rows,
                latency: Some(wire_histogram(&t.latency)),
            })
            .collect(),
        tables: r
            .tables
            .iter()
            .map(|((schema, table, kind), t)| AppliedTable {
                schema: schema.clone(),
                table: table.clone(),
                kind: kind.name().into(),
                events: t.events,
                apply_ns: t.apply_ns,
                rows: t.rows,
                latency: Some(wire_histogram(&t.latency)),
            })
            .collect(),
    }
}

fn wire_histogram(h: &histogram::Histogram) -> WireHistogram {
    WireHistogram {
        scheme: histogram::SCHEME,
        buckets: h.buckets().map(|(index, count)| Bucket { index: index as u32, count }).collect(),
    }
}

fn change(c: &ChangeRecord) -> WireChange {
    WireChange {
        kind: c.kind.name().into(),
        action: c.action.clone(),
        objects: c.objects.clone(),
        connection_id: c.connection_id,
        digest: c.digest,
        digest_text: c.digest_text.to_string(),
        schema: c.schema.as_deref().unwrap_or_default().to_string(),
        user: c.user.clone().unwrap_or_default(),
        host: c.host.clone().unwrap_or_default(),
        client: c.client.as_deref().filter(|c| !c.is_unknown()).map(|c| client_count(c, 1)),
        program: c.program.clone().unwrap_or_default(),
        sample: c.sample.clone(),
        start_unix_ms: unix_ms(c.start),
        duration_ns: c.duration_ns,
        error_code: c.error_code,
        values: c
            .values
            .iter()
            .map(|v| WireSettingValue { name: v.name.clone(), old: v.old.clone(), new: v.new.clone() })
            .collect(),
    }
}

fn long_statement(e: &LongStatement) -> WireLongStatement {
    WireLongStatement {
        connection_id: e.connection_id,
        digest: e.digest,
        digest_text: e.digest_text.to_string(),
        schema: e.schema.as_deref().unwrap_or_default().to_string(),
        user: e.user.clone().unwrap_or_default(),
        host: e.host.clone().unwrap_or_default(),
        sample: e.sample.clone(),
        start_unix_ms: unix_ms(e.start),
        duration_ns: e.duration_ns,
        outcome: e.outcome.name().to_string(),
        error_code: e.error_code,
        waits: e
            .waits
            .iter()
            .zip(wait_class::NAMES)
            .filter(|(ns, _)| **ns > 0)
            .map(|(ns, class)| WaitStats { class: class.to_string(), sum_ns: *ns, max_ns: *ns, statements: 1 })
            .collect(),
        blocked_by: e.blocked_by.unwrap_or(0),
        deadlock_with: e.deadlock_with.as_ref().map_or(0, |p| p.connection_id),
        deadlock_with_digest: e.deadlock_with.as_ref().map_or(0, |p| p.digest),
        deadlock_with_digest_text: e.deadlock_with.as_ref().map(|p| p.digest_text.clone()).unwrap_or_default(),
        deadlock_with_sample: e.deadlock_with.as_ref().map(|p| p.sample.clone()).unwrap_or_default(),
    }
}

fn host(h: &HostMetrics) -> WireHostMetrics {
    WireHostMetrics {
        online_cores: h.cpu.online_cores,
        cpu: h.cpu.busy.as_ref().map(|b| WireCpuModes {
            user: b.user,
            nice: b.nice,
            system: b.system,
            idle: b.idle,
            iowait: b.iowait,
            irq: b.irq,
            softirq: b.softirq,
            steal: b.steal,
        }),
        memory_total_bytes: h.memory.total_bytes,
        memory_available_bytes: h.memory.available_bytes.unwrap_or(h.memory.free_bytes),
        memory_free_bytes: h.memory.free_bytes,
        memory_cached_bytes: h.memory.cached_bytes,
        swap_total_bytes: h.memory.swap_total_bytes,
        swap_free_bytes: h.memory.swap_free_bytes,
        load1: h.load.one,
        load5: h.load.five,
        load15: h.load.fifteen,
        disks: h
            .disks
            .iter()
            .map(|d| WireDiskIo {
                device: d.device.clone(),
                reads: d.reads,
                writes: d.writes,
                read_bytes: d.read_bytes,
                write_bytes: d.write_bytes,
                io_time_ms: d.io_time_ms,
            })
            .collect(),
        interfaces: h
            .interfaces
            .iter()
            .map(|n| WireNetIo {
                interface: n.interface.clone(),
                rx_bytes: n.rx_bytes,
                rx_packets: n.rx_packets,
                rx_errors: n.rx_errors,
                rx_drops: n.rx_drops,
                tx_bytes: n.tx_bytes,
                tx_packets: n.tx_packets,
                tx_errors: n.tx_errors,
                tx_drops: n.tx_drops,
            })
            .collect(),
    }
}

/// The agent's own window: what it cost and what its host did.
pub fn agent_window(
    start: SystemTime,
    end: SystemTime,
    cost: &CostSample,
    host_metrics: Option<&HostMetrics>,
    ship: HealthReport,
    untraced: &[UntracedServer],
) -> AgentWindow {
    AgentWindow {
        window_start_unix_ms: unix_ms(start),
        window_end_unix_ms: unix_ms(end),
        cost: Some(AgentCost {
            cpu_cores: cost.cpu_cores,
            cpu_source: cost.cpu_source.into(),
            rss_bytes: cost.rss_bytes,
            statements_per_s: cost.statements_per_s,
            cores_per_10k_qps: cost.cores_per_10k_qps,
            cpu_limit_cores: cost.cpu_limit_cores.unwrap_or(0.0),
            memory_limit_bytes: cost.memory_limit_bytes.unwrap_or(0),
            shedding: cost.shedding.name().into(),
            events_per_s: cost.events_per_s,
            dropped_events: cost.dropped_events,
            sender_restarts: ship.sender_restarts,
            spool_io_errors: ship.spool_io_errors,
            clock_skew_ms: ship.clock_skew_ms.unwrap_or(0),
            clock_correction_ms: 0,
            explains: cost.explains,
            explain_ns: cost.explain_ns,
        }),
        host: host_metrics.map(host),
        untraced: untraced.iter().map(untraced_server).collect(),
    }
}

fn untraced_server(u: &UntracedServer) -> WireUntraced {
    let container = u.server.container.as_ref();
    WireUntraced {
        instance: Some(ServerInstance {
            name: u.server.instance.clone(),
            pid: u.server.pid,
            start_time_unix_ms: u.server.start_unix_ms,
            container_id: container.map(|c| c.id.clone()).unwrap_or_default(),
            container: container.map(|c| c.name.clone()).unwrap_or_default(),
            build_id: u.binary.build_id.clone().unwrap_or_default(),
            server_version: u.binary.version.clone().unwrap_or_default(),
        }),
        reason: u.reason.clone(),
        kind: u.kind.into(),
        since_unix_ms: unix_ms(u.since),
        attempts: u.attempts,
    }
}

#[cfg(test)]
mod tests {
    use sqlbee_figures::needs;

    use super::*;
    use crate::aggregate::fixtures::{
        all_figures, figure_value, report, statement, two_reads_and_a_deadlock, with_figures,
    };

    #[test]
    fn a_figure_goes_on_the_wire_when_the_build_lets_the_agent_read_it() {
        let readable = Readable(needs::PLAN | needs::ROWS_SENT);
        let r = report("db:3306", readable, vec![with_figures(statement(1, 0, 1000, "SELECT 1"), 1)]);
        let window = instance_window(&r, None);
        let stats = window.digests[0].stats.as_ref().expect("figures on the wire");
        for (i, (figure, value)) in stats.figures().enumerate() {
            assert_eq!(value, readable.knows(figure.needs).then_some(figure_value(i, 1)), "{}", figure.name);
        }
        assert!(stats.lock_ns.is_some() && stats.tmp_tables.is_some() && stats.cpu_ns.is_none());
    }

    #[test]
    fn a_window_goes_on_the_wire_whole() {
        let r = report("db:3306", all_figures(), two_reads_and_a_deadlock());
        let window = instance_window(&r, None);
        assert_eq!(window.instance.as_ref().unwrap().name, "db:3306");
        assert_eq!(window.digests.len(), r.digests.len());
        for (wire, row) in window.digests.iter().zip(&r.digests) {
            assert_eq!(wire.digest, sqlbee_vocabulary::digest_id::of(&wire.digest_text));
            assert_eq!(
                (wire.count, wire.errors, wire.sum_ns, wire.max_ns),
                (row.count, row.errors, row.sum_ns, row.max_ns)
            );
            let counted: u64 = wire.histogram.as_ref().unwrap().buckets.iter().map(|b| b.count).sum();
            assert_eq!(counted, wire.count, "the histogram holds every statement");
            let stats = wire.stats.as_ref().unwrap();
            assert_eq!(stats.values().map(Option::unwrap), row.stats.values());
        }
    }
}
