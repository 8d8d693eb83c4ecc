//! Checks the measurements a batch carries besides statements: what the
//! probes and the agent cost, the server process and the host. Every one of
//! them is optional (older agents send none); what is present must be a
//! finite, non-negative number in its range and bounded in size.
use std::fmt::Display;

use sqlbee_proto::v1::{AgentWindow, HostMetrics, ProbeCost, ProcessMetrics};

use super::{Invalid, MAX_NAME, TimeRange, invalid, name_len, path::Path};

/// Disks or interfaces in one host sample (the agent keeps at most 64).
pub const MAX_DEVICES: usize = 1024;
/// Longest agent window (the agent's window is at most an hour).
pub const MAX_AGENT_WINDOW_MS: i64 = 24 * 3600 * 1000;
/// Largest value any measurement may take (cores, seconds, rates, load):
/// far above anything real, low enough that sums stay finite.
pub const MAX_AMOUNT: f64 = 1e12;

fn amount(field: impl Display, value: f64) -> Result<(), Invalid> {
    if !value.is_finite() || !(0.0..=MAX_AMOUNT).contains(&value) {
        return Err(invalid(field, format!("{value} is not a finite number in 0..={MAX_AMOUNT:e}")));
    }
    Ok(())
}

/// `statements`: the window's count, which an estimate may only scale up.
pub(super) fn probe_cost(at: &Path<'_>, c: &ProbeCost, statements: u64) -> Result<(), Invalid> {
    if c.estimated_statements != 0 && c.estimated_statements < statements {
        return Err(invalid(
            at.field("estimated_statements"),
            format!("{} is below the window's statements {statements}", c.estimated_statements),
        ));
    }
    amount(at.field("attached_fraction"), c.attached_fraction)?;
    if c.attached_fraction > 1.0 {
        return Err(invalid(at.field("attached_fraction"), format!("{} is above 1", c.attached_fraction)));
    }
    amount(at.field("probe_cpu_seconds"), c.probe_cpu_seconds)?;
    if let Some(n) = c.server_statements {
        amount(at.field("server_statements"), n as f64)?;
    }
    if let Some(ns) = c.learned_statement_ns {
        amount(at.field("learned_statement_ns"), ns as f64)?;
    }
    amount(at.field("server_cpu_seconds"), c.server_cpu_seconds)?;
    amount(at.field("extra_cores_per_10k_qps"), c.extra_cores_per_10k_qps)
}

pub(super) fn process(at: &Path<'_>, p: &ProcessMetrics) -> Result<(), Invalid> {
    name_len(at.field("status"), &p.status)?;
    if let Some(cores) = p.cpu_cores {
        amount(at.field("cpu_cores"), cores)?;
    }
    Ok(())
}

/// A batch's agent windows must not overlap: each window's cost would
/// otherwise count twice.
pub(super) fn agent_windows(windows: &[AgentWindow], range: TimeRange) -> Result<(), Invalid> {
    for (i, w) in windows.iter().enumerate() {
        agent_window(&Path::Root("agent_windows").index(i), w, range)?;
    }
    let mut spans: Vec<(i64, i64, usize)> =
        windows.iter().enumerate().map(|(i, w)| (w.window_start_unix_ms, w.window_end_unix_ms, i)).collect();
    spans.sort();
    for pair in spans.windows(2) {
        if pair[1].0 < pair[0].1 {
            return Err(invalid(
                format!("agent_windows[{}]", pair[1].2),
                format!("overlaps agent_windows[{}]", pair[0].2),
            ));
        }
    }
    Ok(())
}

fn agent_window(at: &Path<'_>, w: &AgentWindow, range: TimeRange) -> Result<(), Invalid> {
    range.check(at.field("window_start_unix_ms"), w.window_start_unix_ms)?;
    range.check(at.field("window_end_unix_ms"), w.window_end_unix_ms)?;
    if w.window_start_unix_ms > w.window_end_unix_ms {
        return Err(invalid(
            at.field("window_end_unix_ms"),
            format!("{} is before window_start_unix_ms {}", w.window_end_unix_ms, w.window_start_unix_ms),
        ));
    }
    if w.window_end_unix_ms - w.window_start_unix_ms > MAX_AGENT_WINDOW_MS {
        return Err(invalid(at.field("window_end_unix_ms"), "the window is longer than a day"));
    }
    if let Some(c) = &w.cost {
        let at = at.field("cost");
        for (name, value) in [
            ("cpu_cores", c.cpu_cores),
            ("statements_per_s", c.statements_per_s),
            ("cores_per_10k_qps", c.cores_per_10k_qps),
            ("cpu_limit_cores", c.cpu_limit_cores),
            ("events_per_s", c.events_per_s),
        ] {
            amount(at.field(name), value)?;
        }
        name_len(at.field("cpu_source"), &c.cpu_source)?;
        name_len(at.field("shedding"), &c.shedding)?;
    }
    if let Some(h) = &w.host {
        host(&at.field("host"), h)?;
    }
    Ok(())
}

fn host(at: &Path<'_>, h: &HostMetrics) -> Result<(), Invalid> {
    if let Some(cpu) = &h.cpu {
        for (name, value) in [
            ("user", cpu.user),
            ("nice", cpu.nice),
            ("system", cpu.system),
            ("idle", cpu.idle),
            ("iowait", cpu.iowait),
            ("irq", cpu.irq),
            ("softirq", cpu.softirq),
            ("steal", cpu.steal),
        ] {
            amount(at.field("cpu").field(name), value)?;
        }
    }
    for (name, value) in [("load1", h.load1), ("load5", h.load5), ("load15", h.load15)] {
        amount(at.field(name), value)?;
    }
    if h.disks.len() > MAX_DEVICES {
        return Err(invalid(at.field("disks"), format!("{} disks, at most {MAX_DEVICES}", h.disks.len())));
    }
    if h.interfaces.len() > MAX_DEVICES {
        return Err(invalid(
            at.field("interfaces"),
            format!("{} interfaces, at most {MAX_DEVICES}", h.interfaces.len()),
        ));
    }
    for (i, d) in h.disks.iter().enumerate() {
        device_name(at.field("disks").index(i).field("device"), &d.device)?;
    }
    for (i, n) in h.interfaces.iter().enumerate() {
        device_name(at.field("interfaces").index(i).field("interface"), &n.interface)?;
    }
    Ok(())
}

fn device_name(field: impl Display, name: &str) -> Result<(), Invalid> {
    if name.is_empty() {
        return Err(invalid(field, "empty"));
    }
    if name.len() > MAX_NAME {
        return Err(invalid(field, format!("{} bytes, at most {MAX_NAME}", name.len())));
    }
    Ok(())
}
