//! The agent's own Prometheus metrics, rendered once per window from what
//! the window produced: its cost, the host, and a bounded top of digests.
//! Digest labels are limited to `TOP_DIGESTS` per instance so a workload
//! with unbounded distinct statements cannot blow up series cardinality.
use crate::{aggregate::WindowReport, budget::CostSample, host::HostMetrics, probe::UntracedServer};

use super::{Encoder, MetricType};

/// Digests exported per instance (by statements in the window).
pub const TOP_DIGESTS: usize = 20;

pub fn render(
    cost: &CostSample,
    host: Option<&HostMetrics>,
    reports: &[WindowReport],
    untraced: &[UntracedServer],
) -> String {
    let mut enc = Encoder::new();
    enc.family("sqlbee_agent_cpu_cores", "CPU the agent used over the last window, cores.", MetricType::Gauge)
        .sample(&[("source", cost.cpu_source)], cost.cpu_cores);
    enc.family("sqlbee_agent_rss_bytes", "Resident memory of the agent.", MetricType::Gauge).sample(&[], cost.rss_bytes);
    enc.family(
        "sqlbee_agent_cores_per_10k_qps",
        "Agent CPU per 10,000 statements per second over the last window.",
        MetricType::Gauge,
    )
    .sample(&[], cost.cores_per_10k_qps);
    enc.family(
        "sqlbee_agent_shedding_step",
        "Shedding step in force: 0 exact, 1 no samples, 2 known texts only.",
        MetricType::Gauge,
    )
    .sample(&[], cost.shedding as u32 as f64);
    {
        let mut f = enc.family(
            "sqlbee_mysqld_probe_cores",
            "CPU the probes took from mysqld over the last window (program time plus one trap per run), cores.",
            MetricType::Gauge,
        );
        for r in reports {
            if let Some(c) = r.summary.probe_cost.as_ref().filter(|c| c.window_s > 0.0) {
                f.sample(&[("instance", &r.instance)], c.probe_cpu_s() / c.window_s);
            }
        }
    }
    if let Some(limit) = cost.cpu_limit_cores {
        enc.family("sqlbee_agent_cpu_limit_cores", "CPU limit the agent runs under.", MetricType::Gauge)
            .sample(&[], limit);
    }
    if let Some(limit) = cost.memory_limit_bytes {
        enc.family("sqlbee_agent_memory_limit_bytes", "Memory limit the agent runs under.", MetricType::Gauge)
            .sample(&[], limit);
    }
    {
        let mut f = enc.family("sqlbee_statements_per_second", "Statements per second per instance.", MetricType::Gauge);
        for r in reports {
            let seconds = r.window_end.duration_since(r.window_start).map(|d| d.as_secs_f64()).unwrap_or(0.0);
            let rate = if seconds > 0.0 { r.summary.statements as f64 / seconds } else { 0.0 };
            f.sample(&[("instance", &r.instance)], rate);
        }
    }
    enc.family(
        "sqlbee_servers_untraced",
        "Servers the agent found but does not trace (see sqlbee_server_untraced for why).",
        MetricType::Gauge,
    )
    .sample(&[], untraced.len() as u64);
    {
        let mut f = enc.family(
            "sqlbee_server_untraced",
            "1 for each server the agent found but cannot trace; kind says why, the agent's log and jsonl say it in full.",
            MetricType::Gauge,
        );
        for u in untraced {
            let pid = u.server.pid.to_string();
            f.sample(
                &[
                    ("instance", &u.server.instance),
                    ("pid", &pid),
                    ("kind", u.kind),
                    ("version", u.binary.version.as_deref().unwrap_or("")),
                    ("build_id", u.binary.build_id.as_deref().unwrap_or("")),
                ],
                1u64,
            );
        }
    }
    {
        let mut f = enc.family(
            "sqlbee_dropped_events",
            "Statement records lost in the kernel ring buffer in the last window (counts stay exact).",
            MetricType::Gauge,
        );
        for r in reports {
            f.sample(&[("instance", &r.instance)], r.summary.dropped_events);
        }
    }
    {
        struct Top<'a> {
            instance: &'a str,
            digest: String,
            text: String,
            schema: &'a str,
            d: &'a crate::aggregate::DigestStats,
            figures: crate::probe::Figures,
        }
        let mut top_rows = Vec::new();
        for r in reports {
            let mut top: Vec<_> = r.digests.iter().collect();
            top.sort_by(|a, b| b.count.cmp(&a.count));
            for d in top.into_iter().take(TOP_DIGESTS) {
                top_rows.push(Top {
                    instance: r.instance.as_str(),
                    digest: format!("{:016x}", d.digest),
                    text: short(&d.digest_text),
                    schema: d.schema.as_deref().unwrap_or(""),
                    d,
                    figures: r.summary.figures,
                });
            }
        }
        let labels = |t: &Top<'_>| -> [(&'static str, String); 4] {
            [
                ("instance", t.instance.to_string()),
                ("schema", t.schema.to_string()),
                ("digest", t.digest.clone()),
                ("text", t.text.clone()),
            ]
        };
        use agent_common::stats_field as f;
        let families: [(&str, &str, fn(&crate::aggregate::DigestStats) -> f64, u32); 6] = [
            ("sqlbee_digest_statements", "Statements of a top digest in the last window (top 20 per instance).", |d| d.count as f64, 0),
            ("sqlbee_digest_latency_seconds_sum", "Total latency of a top digest's statements in the last window.", |d| d.sum_ns as f64 / 1e9, 0),
            ("sqlbee_digest_rows_examined", "Rows a top digest's statements examined in the last window (the server's count).", |d| d.stats.rows_examined as f64, f::ROWS_EXAMINED),
            ("sqlbee_digest_rows_sent", "Rows a top digest's statements sent in the last window.", |d| d.stats.rows_sent as f64, f::ROWS_SENT),
            ("sqlbee_digest_cpu_seconds_sum", "On-CPU time of a top digest's statements in the last window.", |d| d.stats.cpu_ns as f64 / 1e9, crate::probe::Figures::CPU),
            ("sqlbee_digest_tmp_disk_tables", "Temporary tables a top digest's statements created on disk in the last window.", |d| d.stats.tmp_disk_tables as f64, f::PLAN),
        ];
        for (name, help, value, needs) in families {
            let mut family = enc.family(name, help, MetricType::Gauge);
            for t in top_rows.iter().filter(|t| needs == 0 || t.figures.has(needs)) {
                let labels = labels(t);
                let labels: Vec<(&str, &str)> = labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
                family.sample(&labels, value(t.d));
            }
        }
    }
    if let Some(host) = host {
        enc.family("sqlbee_host_cores", "Online CPU cores.", MetricType::Gauge).sample(&[], host.cpu.online_cores);
        if let Some(busy) = &host.cpu.busy {
            let mut f = enc.family("sqlbee_host_cpu_cores", "Host CPU by mode over the last window, cores.", MetricType::Gauge);
            for (mode, v) in [
                ("user", busy.user),
                ("nice", busy.nice),
                ("system", busy.system),
                ("idle", busy.idle),
                ("iowait", busy.iowait),
                ("irq", busy.irq),
                ("softirq", busy.softirq),
                ("steal", busy.steal),
            ] {
                f.sample(&[("mode", mode)], v);
            }
        }
        enc.family("sqlbee_host_memory_total_bytes", "Host memory.", MetricType::Gauge).sample(&[], host.memory.total_bytes);
        if let Some(available) = host.memory.available_bytes {
            enc.family("sqlbee_host_memory_available_bytes", "Host memory available.", MetricType::Gauge)
                .sample(&[], available);
        }
        enc.family("sqlbee_host_load1", "Host load average, 1 minute.", MetricType::Gauge).sample(&[], host.load.one);
        let mut f = enc.family("sqlbee_mysqld_cpu_cores", "CPU of each watched server process.", MetricType::Gauge);
        for p in &host.processes {
            if let Some(cores) = p.cpu_cores {
                f.sample(&[("pid", &p.pid.to_string())], cores);
            }
        }
        let mut f = enc.family("sqlbee_mysqld_rss_bytes", "RSS of each watched server process.", MetricType::Gauge);
        for p in &host.processes {
            if let Some(rss) = p.rss_bytes {
                f.sample(&[("pid", &p.pid.to_string())], rss);
            }
        }
    }
    enc.finish()
}

/// Digest texts can be long; a label keeps the head.
fn short(text: &str) -> String {
    text.chars().take(120).collect()
}
