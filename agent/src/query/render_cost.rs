//! What watching costs, as JSON or tables: the per-agent summary printed
//! under `sqlbee top`, the newest window's cost under `sqlbee instances`,
//! and the agents' own windows for `sqlbee hosts`. Pure, like `render`.
use std::io::Write;

use serde_json::{Value, json};
use sqlbee_proto::v1::{AgentWindowRow, CostSummary, InstanceCost, InstanceInfo, ProcessMetrics};

use super::cells::{cut, time};

const MIB: f64 = 1024.0 * 1024.0;

fn mib(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / MIB)
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

/// The footer of `sqlbee top`: one line per agent.
pub fn write_costs(out: &mut impl Write, costs: &[CostSummary]) -> std::io::Result<()> {
    if costs.is_empty() {
        return Ok(());
    }
    writeln!(out)?;
    writeln!(
        out,
        "{:<20} {:<16} {:>12} {:>14} {:>15} {:>12} {:>10} {:<18}",
        "cost: host", "agent", "statements", "agent c/10kQPS", "mysqld +c/10kQPS", "agent_rss_MiB", "dropped", "shedding"
    )?;
    for c in costs {
        let shedding = if c.shedding_windows > 0 {
            format!("{} ({} windows shed)", c.latest_shedding, c.shedding_windows)
        } else {
            c.latest_shedding.clone()
        };
        writeln!(
            out,
            "{:<20} {:<16} {:>12} {:>14.4} {:>15.4} {:>12} {:>10} {:<18}",
            cut(&c.host, 20),
            cut(&c.agent_id, 16),
            c.statements,
            c.agent_cores_per_10k_qps,
            c.server_extra_cores_per_10k_qps,
            mib(c.agent_max_rss_bytes),
            c.dropped_events,
            shedding
        )?;
    }
    Ok(())
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

/// Under `sqlbee instances`: the newest window's cost of each instance.
pub fn write_instance_costs(out: &mut impl Write, instances: &[InstanceInfo]) -> std::io::Result<()> {
    let with_cost: Vec<(&InstanceInfo, &InstanceCost)> =
        instances.iter().filter_map(|i| i.latest.as_ref().map(|c| (i, c))).collect();
    if with_cost.is_empty() {
        return Ok(());
    }
    writeln!(out)?;
    writeln!(
        out,
        "{:<28} {:>9} {:>14} {:>16} {:>13} {:>9} {:>8} {:<16} {:>8} {:>11} {:>14}",
        "newest window: instance",
        "qps",
        "agent c/10kQPS",
        "mysqld +c/10kQPS",
        "agent_rss_MiB",
        "events/s",
        "dropped",
        "shedding",
        "attached",
        "mysqld_cores",
        "mysqld_rss_MiB"
    )?;
    for (i, c) in with_cost {
        let server = c.server.as_ref();
        writeln!(
            out,
            "{:<28} {:>9.0} {:>14.4} {:>16.4} {:>13} {:>9.0} {:>8} {:<16} {:>8.2} {:>11} {:>14}",
            cut(&i.instance, 28),
            c.statements_per_s,
            c.agent_cores_per_10k_qps,
            c.server_extra_cores_per_10k_qps,
            mib(c.agent_rss_bytes),
            c.events_per_s,
            c.dropped_events,
            cut(&c.shedding, 16),
            c.attached_fraction,
            server.and_then(|s| s.cpu_cores).map_or("-".into(), |v| format!("{v:.2}")),
            server.and_then(|s| s.rss_bytes).map_or("-".into(), mib),
        )?;
    }
    Ok(())
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

pub fn write_hosts_table(out: &mut impl Write, rows: &[AgentWindowRow]) -> std::io::Result<()> {
    writeln!(
        out,
        "{:<24} {:<20} {:>6} {:>6} {:>6} {:>6} {:>10} {:>6} {:>12} {:>12} {:>10} {:>10} {:>11} {:>9}",
        "window_end",
        "host",
        "user",
        "system",
        "iowait",
        "idle",
        "avail_MiB",
        "load1",
        "disk_rd_MiB",
        "disk_wr_MiB",
        "net_rx_MiB",
        "net_tx_MiB",
        "agent_cores",
        "agent_MiB"
    )?;
    for r in rows {
        let w = r.window.clone().unwrap_or_default();
        let cost = w.cost.unwrap_or_default();
        let host = w.host.unwrap_or_default();
        let cpu = |f: fn(&sqlbee_proto::v1::CpuModes) -> f64| host.cpu.as_ref().map_or("-".into(), |c| format!("{:.2}", f(c)));
        let total = |f: fn(&sqlbee_proto::v1::DiskIo) -> u64| mib(host.disks.iter().map(f).sum());
        let net = |f: fn(&sqlbee_proto::v1::NetIo) -> u64| mib(host.interfaces.iter().map(f).sum());
        writeln!(
            out,
            "{:<24} {:<20} {:>6} {:>6} {:>6} {:>6} {:>10} {:>6.2} {:>12} {:>12} {:>10} {:>10} {:>11.3} {:>9}",
            time(w.window_end_unix_ms),
            cut(&r.host, 20),
            cpu(|c| c.user),
            cpu(|c| c.system),
            cpu(|c| c.iowait),
            cpu(|c| c.idle),
            mib(host.memory_available_bytes),
            host.load1,
            total(|d| d.read_bytes),
            total(|d| d.write_bytes),
            net(|n| n.rx_bytes),
            net(|n| n.tx_bytes),
            cost.cpu_cores,
            mib(cost.rss_bytes),
        )?;
    }
    if rows.is_empty() {
        writeln!(out, "(no agent windows in this range)")?;
    }
    let costs: Vec<_> = rows.iter().filter_map(|r| r.window.as_ref()?.cost.clone()).collect();
    let restarts: u64 = costs.iter().map(|c| c.sender_restarts).sum();
    let io_errors: u64 = costs.iter().map(|c| c.spool_io_errors).sum();
    let skew = costs.iter().map(|c| c.clock_skew_ms).max_by_key(|s| s.abs()).unwrap_or(0);
    let corrected = costs.iter().map(|c| c.clock_correction_ms).max().unwrap_or(0);
    if restarts > 0 || io_errors > 0 || skew.abs() > 2_000 || corrected > 0 {
        writeln!(
            out,
            "ship: {restarts} sender restarts, {io_errors} spool disk errors; agent clock off by up to {skew} ms, windows moved back by up to {corrected} ms"
        )?;
    }
    out.flush()
}

#[cfg(test)]
mod tests {
    use sqlbee_proto::v1::{AgentCost, AgentWindow, CpuModes, DiskIo, HostMetrics};

    use super::*;

    #[test]
    fn costs_footer_names_the_shedding_windows() {
        let c = CostSummary {
            agent_id: "a1".into(),
            host: "db1".into(),
            statements: 1_000_000,
            agent_cores_per_10k_qps: 0.0031,
            server_extra_cores_per_10k_qps: 0.052,
            agent_max_rss_bytes: 31 * 1024 * 1024,
            shedding_windows: 2,
            latest_shedding: "exact".into(),
            ..Default::default()
        };
        let mut table = Vec::new();
        write_costs(&mut table, std::slice::from_ref(&c)).unwrap();
        let table = String::from_utf8(table).unwrap();
        assert!(table.contains("0.0031") && table.contains("0.0520") && table.contains("31.0"), "{table}");
        assert!(table.contains("exact (2 windows shed)"), "{table}");
        assert_eq!(costs_json(&[c])[0]["agent_cores_per_10k_qps"], 0.0031);
    }

    #[test]
    fn host_rows_add_up_devices() {
        let row = AgentWindowRow {
            agent_id: "a1".into(),
            host: "db1".into(),
            window: Some(AgentWindow {
                window_start_unix_ms: 1_000,
                window_end_unix_ms: 11_000,
                cost: Some(AgentCost { cpu_cores: 0.012, rss_bytes: 2 * 1024 * 1024, ..Default::default() }),
                host: Some(HostMetrics {
                    cpu: Some(CpuModes { user: 1.25, ..Default::default() }),
                    disks: vec![
                        DiskIo { device: "vda".into(), read_bytes: 1024 * 1024, ..Default::default() },
                        DiskIo { device: "vdb".into(), read_bytes: 3 * 1024 * 1024, ..Default::default() },
                    ],
                    ..Default::default()
                }),
                untraced: Vec::new(),
            }),
        };
        let mut table = Vec::new();
        write_hosts_table(&mut table, std::slice::from_ref(&row)).unwrap();
        let table = String::from_utf8(table).unwrap();
        let line = table.lines().nth(1).unwrap();
        assert!(line.contains("1.25") && line.contains("4.0") && line.contains("0.012"), "{table}");
        let json = hosts_json(&[row]);
        assert_eq!(json[0]["disks"][1]["read_bytes"], 3 * 1024 * 1024);
        assert_eq!(json[0]["cpu"]["user"], 1.25);
    }
}
