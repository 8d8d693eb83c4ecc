//! Plans: a digest's plans as the digest page shows them (the newest as a
//! tree with its findings, and the history of distinct plans), and the
//! page of every plan change in the range.
use std::fmt::Write;

use serde_json::Value;
use sqlbee_proto::v1::{PlanRow, PlansRequest, PlansResponse};

use super::{PageHead, Rendered, instance_names};
use crate::http::{
    Ui,
    html::{self, Nav, esc},
    params::View,
    svg::{Marker, MarkerKind},
};

/// Plan changes a page lists.
const MAX_CHANGES: u32 = 500;

/// Where a user who sees no plan learns how to get them.
const HOW_TO: &str = "Agents collect plans only with a login to the server (--server-login); \
    see the manual, \"Plans\".";

pub fn request(view: &View, digest: u64, schema: &str) -> PlansRequest {
    PlansRequest {
        digest,
        schema: schema.to_string(),
        instance: view.instance.clone().unwrap_or_default(),
        since_unix_ms: view.range.since_unix_ms,
        until_unix_ms: view.range.until_unix_ms,
        limit: MAX_CHANGES,
    }
}

/// The plan changes as markers for the latency plot.
pub fn markers(answer: &PlansResponse) -> Vec<Marker> {
    answer
        .changes
        .iter()
        .map(|c| Marker {
            at: c.at_unix_ms,
            label: format!(
                "plan change on {}: {} -> {}",
                c.instance,
                html::digest_hex(c.from_hash),
                html::digest_hex(c.to_hash)
            ),
            kind: MarkerKind::Plan,
        })
        .collect()
}

/// The digest page's section.
pub fn section(body: &mut String, answer: &PlansResponse) {
    body.push_str("<h2 id=\"plans\">Plan</h2>");
    let Some(newest) = answer.plans.first() else {
        let _ = write!(
            body,
            "<p class=\"notice\" id=\"no-plan\">No plan for this digest in this range. {}</p>",
            esc(HOW_TO)
        );
        return;
    };
    findings(body, newest);
    let plan = newest.plan.clone().unwrap_or_default();
    let _ = write!(
        body,
        "<p class=\"label\">Newest plan {} on {}, seen {} .. {} (constants redacted unless the agent runs with \
         --samples raw)</p>",
        html::digest_hex(plan.plan_hash),
        esc(&newest.instance),
        html::time(newest.first_seen_unix_ms),
        html::time(newest.last_seen_unix_ms)
    );
    if !plan.not_explained.is_empty() {
        let _ =
            write!(body, "<p class=\"notice\" id=\"not-explained\">Not explained: {}</p>", esc(&plan.not_explained));
    } else {
        match serde_json::from_str::<Value>(&plan.plan_json) {
            Ok(tree) => {
                body.push_str("<div class=\"plan-tree\" id=\"plan-tree\">");
                node(body, None, &tree);
                body.push_str("</div>");
            }
            Err(_) => {
                let _ = write!(body, "<pre class=\"sample\">{}</pre>", esc(&plan.plan_json));
            }
        }
    }
    history(body, answer);
}

fn findings(body: &mut String, newest: &PlanRow) {
    if newest.findings.is_empty() {
        body.push_str("<p id=\"findings-none\">No findings for the newest plan.</p>");
        return;
    }
    super::finding_list(body, "<ul class=\"findings\" id=\"findings\">", &newest.findings);
}

/// A JSON value as a nested list; a table's object leads with what the
/// plan does with it.
fn node(body: &mut String, key: Option<&str>, value: &Value) {
    let label = key.map(|k| format!("<span class=\"k\">{}</span>", esc(k))).unwrap_or_default();
    match value {
        Value::Object(map) => {
            let summary = map.get("table_name").and_then(Value::as_str).map(|table| {
                let text = |k: &str| map.get(k).and_then(Value::as_str).unwrap_or("");
                let key = text("key");
                format!(
                    " <span class=\"table-access\" data-table=\"{}\" data-access=\"{}\">{} · {}{}</span>",
                    esc(table),
                    esc(text("access_type")),
                    esc(table),
                    esc(text("access_type")),
                    if key.is_empty() { " · no index".to_string() } else { format!(" · key {}", esc(key)) }
                )
            });
            let _ = write!(body, "{label}{}<ul>", summary.unwrap_or_default());
            for (k, v) in map {
                body.push_str("<li>");
                node(body, Some(k), v);
                body.push_str("</li>");
            }
            body.push_str("</ul>");
        }
        Value::Array(items) if items.iter().all(|i| !i.is_object() && !i.is_array()) => {
            let shown: Vec<String> = items.iter().map(scalar).collect();
            let _ = write!(body, "{label}: {}", esc(&shown.join(", ")));
        }
        Value::Array(items) => {
            let _ = write!(body, "{label}<ol>");
            for item in items {
                body.push_str("<li>");
                node(body, None, item);
                body.push_str("</li>");
            }
            body.push_str("</ol>");
        }
        other => {
            let _ = write!(body, "{label}: {}", esc(&scalar(other)));
        }
    }
}

fn scalar(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn history(body: &mut String, answer: &PlansResponse) {
    body.push_str(
        "<h3>Plan history</h3><table class=\"data\" id=\"plan-history\"><thead><tr><th>Plan</th><th>Instance</th>\
         <th>Schema</th><th>First seen</th><th>Last seen</th><th>Tables</th></tr></thead><tbody>",
    );
    for row in &answer.plans {
        let plan = row.plan.clone().unwrap_or_default();
        let tables: Vec<String> = plan
            .access
            .iter()
            .map(|a| {
                format!(
                    "{} {}{}",
                    a.table,
                    a.r#type,
                    if a.key.is_empty() { String::new() } else { format!(" ({})", a.key) }
                )
            })
            .collect();
        let _ = write!(
            body,
            "<tr data-plan-hash=\"{}\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            html::digest_hex(plan.plan_hash),
            if plan.plan_hash == 0 { "none".to_string() } else { html::digest_hex(plan.plan_hash) },
            esc(&row.instance),
            esc(&plan.schema),
            html::time(row.first_seen_unix_ms),
            html::time(row.last_seen_unix_ms),
            esc(&if tables.is_empty() { plan.not_explained.clone() } else { tables.join(", ") })
        );
    }
    body.push_str("</tbody></table>");
}

/// `/plans`: every plan change in the range, newest first.
pub async fn render(ui: &Ui, view: &View) -> Rendered {
    let answer = ui.plans(request(view, 0, "")).await?;
    let instances = instance_names(ui).await?;
    let head = PageHead { title: "Plan changes".into(), nav: Nav::Plans, instances, keep: Vec::new() };
    let mut body = String::new();
    if answer.changes.is_empty() {
        let _ = write!(body, "<p class=\"notice\">No plan changed in this range. {}</p>", esc(HOW_TO));
        return Ok((head, body));
    }
    body.push_str(
        "<table class=\"data\" id=\"plan-changes\"><thead><tr><th>When</th><th>Instance</th><th>Schema</th>\
         <th>Digest</th><th>From</th><th>To</th></tr></thead><tbody>",
    );
    for c in &answer.changes {
        let hex = html::digest_hex(c.digest);
        let mut keep = vec![("id", hex.as_str())];
        if !c.schema.is_empty() {
            keep.push(("schema", c.schema.as_str()));
        }
        let link = view.link("/digest", &keep);
        let _ = write!(
            body,
            "<tr data-digest=\"{hex}\"><td>{}</td><td>{}</td><td>{}</td><td><a href=\"{}\">{}</a></td><td>{}</td><td>{}</td></tr>",
            html::time(c.at_unix_ms),
            esc(&c.instance),
            esc(&c.schema),
            esc(&format!("{link}#plans")),
            esc(&html::cut(&c.digest_text, 80)),
            html::digest_hex(c.from_hash),
            html::digest_hex(c.to_hash)
        );
    }
    body.push_str("</tbody></table>");
    Ok((head, body))
}
