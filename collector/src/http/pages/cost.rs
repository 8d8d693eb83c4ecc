//! What watching costs over time: the agents' CPU and memory, and the CPU
//! the probes take inside the servers they watch, with the per-agent
//! summary `sqlbee top` prints.
use std::fmt::Write as _;

use sqlbee_proto::v1::{AgentQuota, TopRequest};

use super::{PageHead, Rendered, instance_names, plot_range, rate_line, seconds, series_request, top_request};
use crate::http::{
    Ui,
    html::{self, Nav, esc},
    params::View,
    svg::{self, Unit},
};

/// Agents near or over their storage quota, since the collector started.
fn quotas(body: &mut String, quotas: &[AgentQuota]) {
    body.push_str("<h2>Storage quotas</h2>");
    if quotas.is_empty() {
        body.push_str("<p>Every agent is under half of its hourly quota, and none was refused.</p>");
        return;
    }
    body.push_str(
        "<p>Agents near or over what one agent may store per hour (<code>--agent-quota-rows</code>, \
         <code>--agent-quota-mib</code>), counted since this collector started. A refused batch stays in its \
         agent's spool and is sent again as the quota refills.</p><table class=\"data\" id=\"quotas\"><thead><tr>\
         <th>Agent</th><th>Hour's quota used</th><th>Rows stored</th><th>Batches refused</th><th>Rows refused</th>\
         <th>Bytes refused</th></tr></thead><tbody>",
    );
    for q in quotas {
        let _ = write!(
            body,
            "<tr data-agent=\"{}\" data-refused-batches=\"{}\" data-refused-rows=\"{}\"><td>{}</td>\
             <td class=\"num\">{:.0}%</td><td class=\"num\">{}</td><td class=\"num\">{}</td>\
             <td class=\"num\">{}</td><td class=\"num\">{}</td></tr>",
            esc(&q.agent_id),
            q.refused_batches,
            q.refused_rows,
            esc(&q.agent_id),
            q.used_fraction * 100.0,
            html::count(q.stored_rows),
            html::count(q.refused_batches),
            html::count(q.refused_rows),
            html::bytes(q.refused_bytes as f64),
        );
    }
    body.push_str("</tbody></table>");
}

/// What the OTLP export did since the collector started, per signal.
fn exports(body: &mut String, exports: &[crate::http::ExportStatus]) {
    if exports.is_empty() {
        return;
    }
    body.push_str(
        "<h2>OTLP export</h2><p>What this collector sent to its OpenTelemetry receiver (<code>--otlp-endpoint</code>) \
         since it started. Behind: how long ago the oldest step not yet sent began.</p><table class=\"data\" \
         id=\"otlp-export\"><thead><tr><th>Signal</th><th>Requests</th><th>Items taken</th><th>Retries</th>\
         <th>Items dropped</th><th>Steps skipped</th><th>Behind</th></tr></thead><tbody>",
    );
    let now = sqlbee_vocabulary::clock::now_unix_ms();
    for e in exports {
        let mark = e.mark_unix_ms;
        let behind = if mark > 0 { format!("{:.0} s", (now - mark).max(0) as f64 / 1000.0) } else { "-".into() };
        let _ = write!(
            body,
            "<tr data-signal=\"{signal}\" data-items=\"{items}\" data-dropped=\"{dropped}\"><td>{signal}</td>\
             <td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td>\
             <td class=\"num\">{}</td><td class=\"num\">{behind}</td></tr>",
            html::count(e.requests),
            html::count(e.items),
            html::count(e.retries),
            html::count(e.dropped_items),
            html::count(e.skipped_steps),
            signal = e.signal,
            items = e.items,
            dropped = e.dropped_items,
        );
    }
    body.push_str("</tbody></table>");
}

pub async fn render(ui: &Ui, view: &View) -> Rendered {
    let series = ui.series(series_request(view, "cost", 0, "")).await?;
    let marks = super::marks(ui, view).await?;
    let (x0, x1) = plot_range(view, &series);
    // Cost points carry no statement count: a step with no agent window
    // is a gap.
    let cost_line = |label: &str, value: &dyn Fn(&sqlbee_proto::v1::SeriesPoint) -> f64| svg::Line {
        label: label.to_string(),
        points: series
            .points
            .iter()
            .map(|p| (p.start_unix_ms + (p.end_unix_ms - p.start_unix_ms) / 2, (p.windows > 0).then(|| value(p))))
            .collect(),
    };
    let mut body = String::from("<section class=\"plots\">");
    body.push_str(&svg::line_chart(
        "CPU",
        Unit::Cores,
        &[
            cost_line("agents", &|p| p.agent_cpu_cores),
            cost_line("probes in mysqld", &|p| p.probe_cpu_seconds / seconds(p)),
        ],
        &marks,
        x0,
        x1,
    ));
    body.push_str(&svg::line_chart(
        "Largest agent memory",
        Unit::Bytes,
        &[cost_line("agent RSS", &|p| p.agent_max_rss_bytes as f64)],
        &marks,
        x0,
        x1,
    ));
    body.push_str(&svg::line_chart(
        "Agent windows",
        Unit::Count,
        &[rate_line("windows", &series, |p| p.windows as f64)],
        &marks,
        x0,
        x1,
    ));
    body.push_str("</section>");
    let top = ui.top(TopRequest { limit: 1, ..top_request(view) }).await?;
    super::top::costs(&mut body, &top.costs);
    if top.costs.is_empty() {
        body.push_str("<p>No agent reported its cost in this range.</p>");
    }
    quotas(&mut body, &top.quotas);
    exports(&mut body, &ui.exports());
    Ok((
        PageHead { title: "Agent cost".into(), nav: Nav::Cost, instances: instance_names(ui).await?, keep: Vec::new() },
        body,
    ))
}
