//! The fleet overview: every instance with its rate, p99 and errors over
//! the range, what watching it costs, when it was last heard from, and
//! its gaps; above them the fleet's rate and latency over time. A large
//! fleet's table is paged (`page`, `PAGE_ROWS` instances a page). With
//! one instance chosen, its changes are listed under the table: what the
//! plots' markers point at, written out.
use std::{collections::HashMap, fmt::Write};

use sqlbee_proto::v1::{InstanceInfo, SeriesRequest, SeriesResponse};

use super::{
    PageHead, Rendered, change_item, changes_in_view, merged, plot_range, seconds, series_request, sparkline_request,
    statement_plots,
};
use crate::http::{
    Ui,
    html::{self, Nav, esc},
    page_error::PageError,
    params::{Params, View},
    svg,
};

/// An instance not heard from for this long is marked stale.
const STALE_MS: i64 = 5 * 60_000;

/// Instances in one page of the fleet table.
pub const PAGE_ROWS: usize = 100;

pub async fn render(ui: &Ui, view: &View, params: &Params, now: i64) -> Rendered {
    let instances = ui.instances().await?;
    let mut names: Vec<String> = instances.iter().map(|i| i.instance.clone()).filter(|n| !n.is_empty()).collect();
    names.sort();
    names.dedup();

    let fleet = ui.series(series_request(view, "statements", 0, "")).await?;
    let mut body = statement_plots(view, &fleet, &super::marks(ui, view).await?);

    let matching: Vec<&InstanceInfo> =
        instances.iter().filter(|i| view.instance.as_deref().is_none_or(|want| i.instance == want)).collect();
    // A large fleet is paged, so the page stays small whatever it holds.
    let pages = matching.len().div_ceil(PAGE_ROWS).max(1);
    let page = params.get("page").and_then(|p| p.parse::<usize>().ok()).unwrap_or(1).clamp(1, pages);
    let shown: Vec<&InstanceInfo> = matching.iter().skip((page - 1) * PAGE_ROWS).take(PAGE_ROWS).copied().collect();
    if pages > 1 {
        let link = |to: usize| view.link("/", &[("page", &to.to_string())]);
        let _ = write!(
            body,
            "<p class=\"pager\" id=\"pager\" data-page=\"{page}\" data-pages=\"{pages}\">Instances {} to {} of {}",
            (page - 1) * PAGE_ROWS + 1,
            (page - 1) * PAGE_ROWS + shown.len(),
            matching.len()
        );
        if page > 1 {
            let _ = write!(body, " · <a href=\"{}\">previous</a>", esc(&link(page - 1)));
        }
        if page < pages {
            let _ = write!(body, " · <a href=\"{}\">next</a>", esc(&link(page + 1)));
        }
        body.push_str("</p>");
    }
    body.push_str(
        "<table class=\"data\" id=\"instances\"><thead><tr><th>Instance</th><th>Host</th><th>Server</th>\
         <th>Statements/s</th><th>p99</th><th>Errors</th><th>Trend</th><th>Agent cores</th><th>Agent memory</th>\
         <th>Agent cores / 10k QPS</th><th>mysqld extra cores / 10k QPS</th><th>Last seen</th><th>Gaps</th>\
         <th>Lost statements</th><th>Status</th></tr></thead><tbody>",
    );
    if shown.is_empty() {
        body.push_str("<tr><td colspan=\"15\">No agent has sent a batch to this collector yet.</td></tr>");
    }
    // Every instance's row figures in one read: a series per instance
    // would be one store query per row.
    let split = ui.series(SeriesRequest { by_instance: true, ..sparkline_request(view, "statements", 0, "") }).await?;
    let mut series: HashMap<String, SeriesResponse> = split
        .instances
        .into_iter()
        .map(|s| (s.instance, SeriesResponse { points: s.points, step_ms: split.step_ms, ..SeriesResponse::default() }))
        .collect();
    for info in shown {
        let own =
            series.remove(&info.instance).unwrap_or(SeriesResponse { step_ms: split.step_ms, ..Default::default() });
        row(view, info, &own, now, &mut body);
    }
    body.push_str("</tbody></table>");
    if let Some(instance) = &view.instance {
        changes(&mut body, ui, view, instance).await?;
    }
    Ok((PageHead { title: "Fleet".into(), nav: Nav::Fleet, instances: names, keep: Vec::new() }, body))
}

/// The instance's changes over the range (schema, settings, grants, its
/// server's starts and stops), newest first.
async fn changes(body: &mut String, ui: &Ui, view: &View, instance: &str) -> Result<(), PageError> {
    let events = changes_in_view(ui, view).await?;
    body.push_str("<h2>Changes</h2>");
    if events.is_empty() {
        body.push_str("<p>No change to this instance in this range.</p>");
        return Ok(());
    }
    let _ = write!(body, "<p>What changed on {} in this range, newest first.</p><ul id=\"changes\">", esc(instance));
    for e in &events {
        change_item(body, "instance-change", e);
    }
    body.push_str("</ul>");
    Ok(())
}

/// One instance's row; `series` is its statements over the range.
fn row(view: &View, info: &InstanceInfo, series: &SeriesResponse, now: i64, body: &mut String) {
    // The range's own figures for this instance: its series, summed.
    let (count, errors, p99, trend, seconds_covered) = if info.instance.is_empty() {
        (0, 0, 0, Vec::new(), 1.0)
    } else {
        let count: u64 = series.points.iter().map(|p| p.count).sum();
        let errors: u64 = series.points.iter().map(|p| p.errors).sum();
        let (x0, x1) = plot_range(view, series);
        let trend: Vec<f64> = series.points.iter().map(|p| p.count as f64 / seconds(p)).collect();
        (count, errors, merged(&series.points).quantile(0.99), trend, ((x1 - x0).max(1)) as f64 / 1000.0)
    };
    let latest = info.latest.clone().unwrap_or_default();
    let stale = info.last_seen_unix_ms > 0 && now - info.last_seen_unix_ms > STALE_MS;
    let status = if !info.untraced_reason.is_empty() {
        format!("<span class=\"bad\">not traced: {}</span>", esc(&info.untraced_reason))
    } else if stale {
        "<span class=\"warn\">stale</span>".to_string()
    } else {
        "<span class=\"ok\">traced</span>".to_string()
    };
    // Counting goes on without plans; the login's failure is said beside it.
    let status = if info.server_login.is_empty() || info.server_login == "ok" {
        status
    } else {
        format!("{status} <span class=\"warn login\">no plans: {}</span>", esc(&info.server_login))
    };
    let name = if info.instance.is_empty() { format!("(agent {})", info.agent_id) } else { info.instance.clone() };
    let link = view.link("/top", &[]);
    let link = if info.instance.is_empty() {
        link
    } else {
        let scoped = View { instance: Some(info.instance.clone()), ..view.clone() };
        scoped.link("/top", &[])
    };
    let _ = write!(
        body,
        "<tr data-instance=\"{}\" data-count=\"{count}\" data-errors=\"{errors}\" data-p99-ns=\"{p99}\">\
         <td><a href=\"{}\">{}</a></td><td>{}</td><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td>\
         <td class=\"num\">{}</td><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{:.4}</td>\
         <td class=\"num\">{:.4}</td><td title=\"{}\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td>{status}</td></tr>",
        esc(&info.instance),
        esc(&link),
        esc(&name),
        esc(&info.host),
        esc(&html::cut(&info.server_version, 40)),
        html::number(count as f64 / seconds_covered),
        html::duration_ns(p99 as f64),
        html::count(errors),
        svg::sparkline(&trend),
        html::number(latest.agent_cpu_cores),
        html::bytes(latest.agent_rss_bytes as f64),
        latest.agent_cores_per_10k_qps,
        latest.server_extra_cores_per_10k_qps,
        html::time(info.last_seen_unix_ms),
        html::ago(info.last_seen_unix_ms, now),
        html::count(info.gaps),
        html::count(info.lost_statements),
    );
}
