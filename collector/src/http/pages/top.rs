//! Top digests over the range, sortable by every key `sqlbee top` knows,
//! each row with a sparkline of its rate and a link to its own page.
//! Every row carries its exact figures in data attributes: what the cells
//! show rounded, scripts and tests read whole.
use std::{collections::HashMap, fmt::Write};

use sqlbee_figures::{FIGURES, RANK_FIGURES, Unit};
use sqlbee_proto::v1::{SeriesPoint, SeriesRequest, SeriesResponse, TopDigest, TopRequest, TotalsRequest};

use super::{PageHead, Rendered, instance_names, seconds, sparkline_request, top_request};
use crate::{
    http::{
        Ui,
        html::{self, Nav, esc, sort_header},
        params::{BadParam, Params, View},
        svg,
    },
    query_api::OrderBy,
};

pub const DEFAULT_LIMIT: u32 = 50;
pub const MAX_LIMIT: u32 = 500;

fn wait_ns(d: &TopDigest) -> u64 {
    d.waits.iter().map(|w| w.sum_ns).sum()
}

pub async fn render(ui: &Ui, view: &View, params: &Params) -> Rendered {
    let order = params.get("order").unwrap_or("total");
    if !OrderBy::NAMES.contains(&order) {
        return Err(
            BadParam { name: "order", value: order.to_string(), expected: "one of the column names' keys" }.into()
        );
    }
    let limit = match params.get("limit") {
        None => DEFAULT_LIMIT,
        Some(text) => text.parse::<u32>().ok().filter(|n| (1..=MAX_LIMIT).contains(n)).ok_or_else(|| BadParam {
            name: "limit",
            value: text.to_string(),
            expected: "a number of digests from 1 to 500",
        })?,
    };
    let schema = params.get("schema").unwrap_or("").to_string();
    let answer =
        ui.top(TopRequest { order_by: order.to_string(), limit, schema: schema.clone(), ..top_request(view) }).await?;
    let totals = ui
        .totals(TotalsRequest {
            instance: view.instance.clone().unwrap_or_default(),
            since_unix_ms: view.range.since_unix_ms,
            until_unix_ms: view.range.until_unix_ms,
        })
        .await?;

    let keep: Vec<(&str, &str)> = [("schema", schema.as_str()), ("limit", params.get("limit").unwrap_or(""))]
        .into_iter()
        .filter(|(_, v)| !v.is_empty())
        .collect();
    let mut body = String::new();
    let _ = write!(
        body,
        "<p class=\"summary\">{} statements in {} digests over this range{}{}.</p>",
        html::count(totals.statements),
        html::count(totals.digest_count),
        if totals.lost_statements > 0 {
            format!("; {} statements lost before they reached the collector", html::count(totals.lost_statements))
        } else {
            String::new()
        },
        if schema.is_empty() { String::new() } else { format!(" (schema {} only)", esc(&schema)) },
    );
    if answer.left_out > 0 {
        body.push_str(&html::notice(&sqlbee_proto::json::left_out_note(answer.left_out, "digests")));
    }
    body.push_str("<table class=\"data\" id=\"top\"><thead><tr><th>Digest</th><th>Schema</th>");
    for sort in OrderBy::ALL {
        body.push_str(&sort_header(view, "/top", sort.label(), sort.key(), order, &keep));
    }
    body.push_str("<th>Statements/s</th><th>Trend</th><th>Instances</th></tr></thead><tbody>");
    if answer.digests.is_empty() {
        let columns = 2 + OrderBy::ALL.len() + 3;
        let _ = write!(body, "<tr><td colspan=\"{columns}\">No statements in this range.</td></tr>");
    }
    // Every row's sparkline in one read: a series per row would be one
    // store query each.
    let mut split = SeriesRequest {
        by_digests: answer.digests.iter().map(|d| d.digest).collect(),
        ..sparkline_request(view, "statements", 0, &schema)
    };
    let sparklines = if split.by_digests.is_empty() {
        SeriesResponse::default()
    } else {
        split.by_digests.sort_unstable();
        split.by_digests.dedup();
        ui.series(split).await?
    };
    let mut series_of: HashMap<(u64, String), Vec<SeriesPoint>> =
        sparklines.digests.into_iter().map(|s| ((s.digest, s.schema), s.points)).collect();
    for d in &answer.digests {
        let series = SeriesResponse {
            points: series_of.remove(&(d.digest, d.schema.clone())).unwrap_or_default(),
            ..SeriesResponse::default()
        };
        let trend: Vec<f64> = series.points.iter().map(|p| p.count as f64 / seconds(p)).collect();
        let trend_count: u64 = series.points.iter().map(|p| p.count).sum();
        let covered: f64 = series.points.iter().map(seconds).sum::<f64>().max(1.0);
        let stats = d.stats.unwrap_or_default();
        let avg = if d.count > 0 { d.sum_ns as f64 / d.count as f64 } else { 0.0 };
        let link = view.link("/digest", &[("id", &html::digest_hex(d.digest)), ("schema", &d.schema)]);
        let _ = write!(
            body,
            "<tr data-digest=\"{}\" data-schema=\"{}\" data-count=\"{}\" data-errors=\"{}\" data-sum-ns=\"{}\" \
             data-p99-ns=\"{}\" data-wait-ns=\"{}\" data-trend-count=\"{trend_count}\"><td class=\"sql\"><a href=\"{}\">{}</a></td><td>{}</td>\
             <td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td>\
             <td class=\"num\">{}</td><td class=\"num\">{}</td>",
            html::digest_hex(d.digest),
            esc(&d.schema),
            d.count,
            d.errors,
            d.sum_ns,
            d.p99_ns,
            wait_ns(d),
            esc(&link),
            esc(&html::cut(&d.digest_text, 160)),
            esc(&d.schema),
            html::count(d.count),
            html::count(d.errors),
            html::duration_ns(d.sum_ns as f64),
            html::duration_ns(avg),
            html::duration_ns(d.p99_ns as f64),
            html::duration_ns(wait_ns(d) as f64),
        );
        // The figures' columns, in `OrderBy::ALL`'s order as their headers.
        let values = stats.values();
        for place in RANK_FIGURES {
            let shown = match (values[place], FIGURES[place].unit) {
                (None, _) => "-".into(),
                (Some(ns), Unit::Ns) => html::duration_ns(ns as f64),
                (Some(n), _) => html::count(n),
            };
            let _ = write!(body, "<td class=\"num\">{shown}</td>");
        }
        let _ = write!(
            body,
            "<td class=\"num\">{}</td><td>{}</td><td class=\"num\">{}</td></tr>",
            html::number(d.count as f64 / covered),
            svg::sparkline(&trend),
            d.instances.len(),
        );
    }
    body.push_str("</tbody></table>");
    costs(&mut body, &answer.costs);
    let mut page_keep: Vec<(&'static str, String)> = vec![("order", order.to_string())];
    if !schema.is_empty() {
        page_keep.push(("schema", schema));
    }
    Ok((
        PageHead { title: "Top digests".into(), nav: Nav::Top, instances: instance_names(ui).await?, keep: page_keep },
        body,
    ))
}

/// What watching cost over the range, per agent.
pub fn costs(body: &mut String, costs: &[sqlbee_proto::v1::CostSummary]) {
    if costs.is_empty() {
        return;
    }
    body.push_str(
        "<h2>What watching cost</h2><table class=\"data\" id=\"costs\"><thead><tr><th>Host</th><th>Agent</th>\
         <th>Statements</th><th>Agent CPU seconds</th><th>Agent cores / 10k QPS</th><th>Agent max memory</th>\
         <th>Probes' CPU seconds in mysqld</th><th>mysqld extra cores / 10k QPS</th><th>Dropped events</th>\
         <th>Shedding</th></tr></thead><tbody>",
    );
    for c in costs {
        let _ = write!(
            body,
            "<tr><td>{}</td><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{:.3}</td><td class=\"num\">{:.4}</td>\
             <td class=\"num\">{}</td><td class=\"num\">{:.3}</td><td class=\"num\">{:.4}</td><td class=\"num\">{}</td><td>{}</td></tr>",
            esc(&c.host),
            esc(&c.agent_id),
            html::count(c.statements),
            c.agent_cpu_seconds,
            c.agent_cores_per_10k_qps,
            html::bytes(c.agent_max_rss_bytes as f64),
            c.probe_cpu_seconds,
            c.server_extra_cores_per_10k_qps,
            html::count(c.dropped_events),
            if c.shedding_windows > 0 {
                format!("{} ({} windows)", esc(&c.latest_shedding), c.shedding_windows)
            } else {
                esc(&c.latest_shedding)
            },
        );
    }
    body.push_str("</tbody></table>");
}
