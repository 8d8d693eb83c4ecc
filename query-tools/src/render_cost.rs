//! What watching costs, as JSON or tables: the per-agent summary printed
//! under `sqlbee top`, the newest window's cost under `sqlbee instances`,
//! and the agents' own windows for `sqlbee hosts`. Pure, like `render`.
use std::io::Write;

use sqlbee_proto::v1::{AgentQuota, AgentWindowRow, CostSummary, InstanceCost, InstanceInfo};

use super::cells::{cut, time};

const MIB: f64 = 1024.0 * 1024.0;

fn mib(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / MIB)
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
        "cost: host",
        "agent",
        "statements",
        "agent c/10kQPS",
        "mysqld +c/10kQPS",
        "agent_rss_MiB",
        "dropped",
        "shedding"
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

/// Under the costs of `sqlbee top`: agents near or over their storage
/// quota.
pub fn write_quotas(out: &mut impl Write, quotas: &[AgentQuota]) -> std::io::Result<()> {
    if quotas.is_empty() {
        return Ok(());
    }
    writeln!(out)?;
    writeln!(
        out,
        "{:<32} {:>9} {:>14} {:>12} {:>14} {:>14}",
        "quota: agent", "hour_used", "stored_rows", "refused", "refused_rows", "refused_MiB"
    )?;
    for q in quotas {
        writeln!(
            out,
            "{:<32} {:>8.0}% {:>14} {:>12} {:>14} {:>14}",
            cut(&q.agent_id, 32),
            q.used_fraction * 100.0,
            q.stored_rows,
            q.refused_batches,
            q.refused_rows,
            mib(q.refused_bytes)
        )?;
    }
    Ok(())
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
        let cpu = |f: fn(&sqlbee_proto::v1::CpuModes) -> f64| {
            host.cpu.as_ref().map_or("-".into(), |c| format!("{:.2}", f(c)))
        };
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
    use sqlbee_proto::json::{costs_json, hosts_json};

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
