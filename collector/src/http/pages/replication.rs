//! What replicas applied over the range: per replica, its lag at commit
//! window by window, its transactions, and the tables and event classes
//! that took the apply time ("91% of apply time was update_rows on
//! shop.orders").
use std::fmt::Write;

use sqlbee_proto::v1::{ReplicaAnswer, ReplicationRequest};

use super::{PageHead, Rendered, instance_names};
use crate::http::{
    Ui,
    html::{self, Nav, esc},
    params::View,
    svg::{self, Unit},
};

/// Tables a replica's list shows, most apply time first.
const TABLES: usize = 20;

pub async fn render(ui: &Ui, view: &View) -> Rendered {
    let answer = ui
        .replication(ReplicationRequest {
            instance: view.instance.clone().unwrap_or_default(),
            since_unix_ms: view.range.since_unix_ms,
            until_unix_ms: view.range.until_unix_ms,
        })
        .await?;
    let marks = super::marks(ui, view).await?;
    let shaped = sqlbee_proto::json::replication_json(&answer);
    let mut body = String::from(
        "<p class=\"summary\">What each replica applied, timed where its applier applied it. Lag is each \
         transaction's at its commit: the replica's clock less the second the primary wrote it.</p>",
    );
    if answer.replicas.is_empty() {
        body.push_str("<p id=\"no-replicas\">No instance applied events as a replica in this range.</p>");
    }
    for (replica, shaped) in answer.replicas.iter().zip(shaped["replicas"].as_array().into_iter().flatten()) {
        section(&mut body, replica, shaped, &marks, view);
    }
    Ok((
        PageHead {
            title: "Replication".into(),
            nav: Nav::Replication,
            instances: instance_names(ui).await?,
            keep: Vec::new(),
        },
        body,
    ))
}

/// An event's apply time at p50 and p99 (`-` from an agent before 0.9).
fn per_event(row: &serde_json::Value) -> String {
    match (row["p50_ms"].as_f64(), row["p99_ms"].as_f64()) {
        (Some(p50), Some(p99)) => format!("{} / {}", html::duration_ns(p50 * 1e6), html::duration_ns(p99 * 1e6)),
        _ => "-".into(),
    }
}

/// The instance, and its channel when it is not the default one.
fn replica_name(replica: &ReplicaAnswer) -> String {
    match replica.channel.as_str() {
        "" => replica.instance.clone(),
        channel => format!("{} · channel {channel}", replica.instance),
    }
}

fn section(body: &mut String, replica: &ReplicaAnswer, shaped: &serde_json::Value, marks: &[svg::Marker], view: &View) {
    let lag = |key: &str| shaped["lag"][key].as_u64().map_or("-".into(), |ms| html::duration_ns(ms as f64 * 1e6));
    let _ = write!(
        body,
        "<section class=\"replica\" data-instance=\"{}\" data-channel=\"{}\"><h2>{}</h2><p class=\"summary\">\
         <span class=\"transactions\">{}</span> transactions; lag at commit p50 {}, p99 {}, max <span class=\"lag-max\">{}</span></p>",
        esc(&replica.instance),
        esc(&replica.channel),
        esc(&replica_name(replica)),
        shaped["transactions"],
        lag("p50_ms"),
        lag("p99_ms"),
        lag("max_ms"),
    );
    if let Some(lost) = shaped["lost_events"].as_u64().filter(|n| *n > 0) {
        let _ = write!(
            body,
            "<p class=\"label lost\">{} events applied could not be timed (the agent's ring was full or two appliers \
             shared a slot): the counts are short by that many.</p>",
            html::count(lost)
        );
    }
    // In a sentence: when the lag peaked, and where the apply time went.
    if let Some(peak) = replica.timeline.iter().filter(|w| w.lag_max_ns > 0).max_by_key(|w| w.lag_max_ns) {
        let _ = write!(
            body,
            "<p class=\"verdict\">Lag peaked at {} in the window ending {}",
            html::duration_ns(peak.lag_max_ns as f64),
            html::time(peak.window_end_unix_ms)
        );
        let all: u64 = shaped["events"].as_array().into_iter().flatten().filter_map(|e| e["apply_ns"].as_u64()).sum();
        let top = shaped["tables"].as_array().and_then(|t| t.first());
        if let Some(t) = top.filter(|_| all > 0) {
            let _ = write!(
                body,
                "; over the range, {:.0}% of apply time was {} on {}.{}",
                t["apply_ns"].as_u64().unwrap_or(0) as f64 * 100.0 / all as f64,
                esc(t["kind"].as_str().unwrap_or_default()),
                esc(t["schema"].as_str().unwrap_or_default()),
                esc(t["table"].as_str().unwrap_or_default()),
            );
        }
        body.push_str(".</p>");
    }
    let (x0, x1) = (super::plot_since(view), view.range.end_unix_ms);
    let points = |value: &dyn Fn(&sqlbee_proto::v1::ReplicaWindow) -> f64| {
        replica.timeline.iter().map(|w| ((w.window_start_unix_ms + w.window_end_unix_ms) / 2, Some(value(w)))).collect()
    };
    body.push_str("<section class=\"plots\">");
    body.push_str(&svg::line_chart(
        "Lag at commit (highest per window)",
        Unit::Nanos,
        &[svg::Line { label: "lag".into(), points: points(&|w| w.lag_max_ns as f64) }],
        marks,
        x0,
        x1,
    ));
    body.push_str("</section>");
    let events = shaped["events"].as_array().cloned().unwrap_or_default();
    let total: u64 = events.iter().filter_map(|e| e["apply_ns"].as_u64()).sum();
    let share = |ns: u64| if total == 0 { 0.0 } else { ns as f64 * 100.0 / total as f64 };
    body.push_str(
        "<table class=\"data replica-tables\"><thead><tr><th>Table</th><th>Kind</th><th>Events</th><th>Rows</th>\
         <th>Apply time</th><th>Share</th><th>p50 / p99 per event</th></tr></thead><tbody>",
    );
    let tables = shaped["tables"].as_array().cloned().unwrap_or_default();
    if tables.is_empty() {
        body.push_str("<tr><td colspan=\"7\">No rows events (statement-based changes are digests).</td></tr>");
    }
    for t in tables.iter().take(TABLES) {
        let ns = t["apply_ns"].as_u64().unwrap_or(0);
        let name = match (t["schema"].as_str().unwrap_or_default(), t["table"].as_str().unwrap_or_default()) {
            ("", "") => "(other tables)".to_string(),
            (schema, table) => format!("{schema}.{table}"),
        };
        let _ = write!(
            body,
            "<tr><td>{}</td><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td>\
             <td class=\"num\">{:.1}%</td><td class=\"num\">{}</td></tr>",
            esc(&name),
            esc(t["kind"].as_str().unwrap_or_default()),
            t["events"],
            t["rows"].as_u64().map_or("-".to_string(), |r| r.to_string()),
            html::duration_ns(ns as f64),
            share(ns),
            per_event(t)
        );
    }
    body.push_str("</tbody></table>");
    body.push_str(
        "<table class=\"data replica-events\"><thead><tr><th>Events</th><th>Applied</th><th>Apply time</th>\
         <th>Share</th></tr></thead><tbody>",
    );
    for e in &events {
        let ns = e["apply_ns"].as_u64().unwrap_or(0);
        let _ = write!(
            body,
            "<tr><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{:.1}%</td></tr>",
            esc(e["class"].as_str().unwrap_or_default()),
            e["events"],
            html::duration_ns(ns as f64),
            share(ns)
        );
    }
    body.push_str("</tbody></table>");
    body.push_str(
        "<table class=\"data replica-digests\"><thead><tr><th>Statement it applied</th><th>Applied</th>\
         <th>Mean apply</th><th>On its primary</th><th>Ran</th><th>Mean there</th></tr></thead><tbody>",
    );
    let digests = shaped["digests"].as_array().cloned().unwrap_or_default();
    if digests.is_empty() {
        body.push_str("<tr><td colspan=\"6\">No statements (row-based changes are the tables above).</td></tr>");
    }
    for d in &digests {
        let link = view.link("/digest", &[("id", d["digest"].as_str().unwrap_or_default())]);
        let mean =
            |side: &serde_json::Value| side["mean_ms"].as_f64().map_or("-".into(), |ms| html::duration_ns(ms * 1e6));
        let primary = &d["primary"];
        let _ = write!(
            body,
            "<tr data-digest=\"{}\"><td class=\"sql\"><a href=\"{}\">{}</a></td><td class=\"num applied\">{}</td>\
             <td class=\"num\">{}</td><td>{}</td><td class=\"num primary\">{}</td><td class=\"num\">{}</td></tr>",
            esc(d["digest"].as_str().unwrap_or_default()),
            esc(&link),
            esc(&html::cut(d["digest_text"].as_str().unwrap_or_default(), 120)),
            d["applied"]["count"],
            mean(&d["applied"]),
            esc(primary["instances"].as_array().and_then(|i| i.first()).and_then(|i| i.as_str()).unwrap_or("-")),
            primary["count"].as_u64().map_or("-".into(), |c| c.to_string()),
            if primary.is_null() { "-".into() } else { mean(primary) },
        );
    }
    body.push_str("</tbody></table></section>");
}
