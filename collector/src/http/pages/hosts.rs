//! The hosts the agents run on: each one's newest window (CPU by mode,
//! memory, load, disks and network), and its CPU and load over the
//! newest windows the collector holds in the range.
use std::{collections::BTreeMap, fmt::Write};

use sqlbee_proto::v1::{AgentWindowRow, CpuModes, HostsRequest};

use super::{PageHead, Rendered, instance_names};
use crate::http::{
    Ui,
    html::{self, Nav, esc},
    params::View,
    svg::{self, Line, Unit},
};

/// Agent windows read for a page (newest first): the plots cover these.
const WINDOWS: u32 = 2_000;
/// Hosts drawn on one plot; the table lists them all.
const MAX_PLOTTED: usize = 8;

fn busy(cpu: &CpuModes) -> f64 {
    cpu.user + cpu.nice + cpu.system + cpu.irq + cpu.softirq + cpu.steal
}

pub async fn render(ui: &Ui, view: &View, now: i64) -> Rendered {
    let answer =
        ui.hosts(HostsRequest { host: String::new(), since_unix_ms: view.range.since_unix_ms, limit: WINDOWS }).await?;
    let mut by_host: BTreeMap<(String, String), Vec<&AgentWindowRow>> = BTreeMap::new();
    for row in answer.windows.iter().filter(|r| {
        r.window
            .as_ref()
            .is_some_and(|w| view.range.until_unix_ms == 0 || w.window_end_unix_ms < view.range.until_unix_ms)
    }) {
        by_host.entry((row.host.clone(), row.agent_id.clone())).or_default().push(row);
    }
    let mut body = String::new();
    if by_host.is_empty() {
        body.push_str(&html::notice("No agent reported host metrics in this range."));
        return Ok((
            PageHead { title: "Hosts".into(), nav: Nav::Hosts, instances: instance_names(ui).await?, keep: Vec::new() },
            body,
        ));
    }
    let oldest =
        answer.windows.iter().filter_map(|r| r.window.as_ref()).map(|w| w.window_start_unix_ms).min().unwrap_or(0);
    let newest =
        answer.windows.iter().filter_map(|r| r.window.as_ref()).map(|w| w.window_end_unix_ms).max().unwrap_or(now);
    let plotted = |value: &dyn Fn(&AgentWindowRow) -> Option<f64>| -> Vec<Line> {
        by_host
            .iter()
            .take(MAX_PLOTTED)
            .map(|((host, _), rows)| Line {
                label: host.clone(),
                points: rows
                    .iter()
                    .rev()
                    .filter_map(|r| r.window.as_ref().map(|w| (w.window_end_unix_ms, value(r))))
                    .collect(),
            })
            .collect()
    };
    let marks = super::marks(ui, view).await?;
    body.push_str("<section class=\"plots\">");
    body.push_str(&svg::line_chart(
        "CPU busy (cores)",
        Unit::Cores,
        &plotted(&|r| r.window.as_ref().and_then(|w| w.host.as_ref()).and_then(|h| h.cpu.as_ref()).map(busy)),
        &marks,
        oldest,
        newest,
    ));
    body.push_str(&svg::line_chart(
        "Load (1 min)",
        Unit::Count,
        &plotted(&|r| r.window.as_ref().and_then(|w| w.host.as_ref()).map(|h| h.load1)),
        &marks,
        oldest,
        newest,
    ));
    body.push_str("</section>");
    let _ = write!(
        body,
        "<p class=\"summary\">Plots cover the newest {} agent windows in this range, from {}.</p>",
        answer.windows.len(),
        html::time(oldest)
    );
    body.push_str(
        "<table class=\"data\" id=\"hosts\"><thead><tr><th>Host</th><th>Agent</th><th>Newest window</th><th>Cores</th>\
         <th>Busy</th><th>iowait</th><th>Steal</th><th>Memory available</th><th>Swap used</th><th>Load 1/5/15</th>\
         <th>Disks</th><th>Network</th></tr></thead><tbody>",
    );
    for ((host, agent), rows) in &by_host {
        let Some(w) = rows.first().and_then(|r| r.window.as_ref()) else { continue };
        let h = w.host.clone().unwrap_or_default();
        let cpu = h.cpu.unwrap_or_default();
        let seconds = ((w.window_end_unix_ms - w.window_start_unix_ms).max(1)) as f64 / 1000.0;
        let disks: Vec<String> = h
            .disks
            .iter()
            .map(|d| {
                format!(
                    "{}: {} read, {} written",
                    esc(&d.device),
                    html::bytes(d.read_bytes as f64 / seconds),
                    html::bytes(d.write_bytes as f64 / seconds)
                )
            })
            .collect();
        let nets: Vec<String> = h
            .interfaces
            .iter()
            .map(|n| {
                format!(
                    "{}: {} in, {} out",
                    esc(&n.interface),
                    html::bytes(n.rx_bytes as f64 / seconds),
                    html::bytes(n.tx_bytes as f64 / seconds)
                )
            })
            .collect();
        let _ = write!(
            body,
            "<tr><td>{}</td><td>{}</td><td title=\"{}\">{}</td><td class=\"num\">{}</td><td class=\"num\">{:.2}</td>\
             <td class=\"num\">{:.2}</td><td class=\"num\">{:.2}</td><td class=\"num\">{} of {}</td><td class=\"num\">{}</td>\
             <td class=\"num\">{:.2} / {:.2} / {:.2}</td><td>{}</td><td>{}</td></tr>",
            esc(host),
            esc(agent),
            html::time(w.window_end_unix_ms),
            html::ago(w.window_end_unix_ms, now),
            h.online_cores,
            busy(&cpu),
            cpu.iowait,
            cpu.steal,
            html::bytes(h.memory_available_bytes as f64),
            html::bytes(h.memory_total_bytes as f64),
            html::bytes(h.swap_total_bytes.saturating_sub(h.swap_free_bytes) as f64),
            h.load1,
            h.load5,
            h.load15,
            if disks.is_empty() { "-".into() } else { format!("{}/s", disks.join("/s<br>")) },
            if nets.is_empty() { "-".into() } else { format!("{}/s", nets.join("/s<br>")) },
        );
    }
    body.push_str("</tbody></table>");
    Ok((
        PageHead { title: "Hosts".into(), nav: Nav::Hosts, instances: instance_names(ui).await?, keep: Vec::new() },
        body,
    ))
}
