//! Activity: what runs now on each instance, as its agent last read it
//! (about a second old), with the blocking chains drawn as trees. The
//! page's script fetches it again every two seconds and swaps the live part
//! in place (without the script, the browser's reload does the same).
use std::fmt::Write;

use serde_json::Value;
use sqlbee_proto::v1::{ActivityRequest, LongStatementsRequest};
use sqlbee_vocabulary::clock::now_unix_ms;

use super::{PageHead, Rendered, instance_names};
use crate::{
    http::{
        Ui,
        html::{self, Nav, esc},
        page_error::PageError,
        params::View,
    },
    query_api::json::{blocking_trees, left_out_note},
};

/// Long statements the page lists, newest first.
const MAX_LONG: u32 = 100;

pub async fn render(ui: &Ui, view: &View) -> Rendered {
    let answer =
        ui.activity(ActivityRequest { instance: view.instance.clone().unwrap_or_default(), min_running_ms: 0 }).await?;
    let instances = instance_names(ui).await?;
    let head = PageHead { title: "Activity".into(), nav: Nav::Activity, instances, keep: Vec::new() };
    let now = now_unix_ms();
    let mut body = String::from("<div id=\"live\" data-refresh-ms=\"2000\">");
    if answer.left_out > 0 {
        body.push_str(&html::notice(&left_out_note(answer.left_out, "instances")));
    }
    if answer.instances.is_empty() {
        body.push_str(&html::notice(
            "No live activity: no agent sent any in the last 30 s (agents send it once a second unless \
             --activity-interval 0).",
        ));
    }
    for live in &answer.instances {
        let snapshot = live.activity.clone().unwrap_or_default();
        let name = snapshot.instance.as_ref().map(|i| i.name.clone()).unwrap_or_default();
        let busy = snapshot.connections.iter().filter(|c| c.command != "Sleep").count();
        let _ = write!(
            body,
            "<section class=\"activity\" data-instance=\"{}\"><h2>{}</h2><p class=\"label\">{} connections, {} busy; \
             read {} ms ago{}</p>",
            esc(&name),
            esc(&name),
            snapshot.connections.len(),
            busy,
            (now - live.taken_unix_ms).max(0),
            if snapshot.blocker_sources.is_empty() {
                " (blockers need the agent's --server-login)".to_string()
            } else {
                format!("; blockers from {}", esc(&snapshot.blocker_sources.join(", ")))
            }
        );
        if !snapshot.warning.is_empty() {
            body.push_str(&html::notice(&snapshot.warning));
        }
        if live.more_connections > 0 {
            body.push_str(&html::notice(&format!(
                "{} more connections are not shown: the page lists the {} that have run longest",
                live.more_connections,
                snapshot.connections.len()
            )));
        }
        let trees = blocking_trees(&name, &snapshot.connections);
        if !trees.is_empty() {
            body.push_str("<h3>Blocking chains</h3><ul class=\"chains\">");
            for tree in &trees {
                chain(&mut body, tree);
            }
            body.push_str("</ul>");
        }
        body.push_str(
            "<table class=\"data activity\"><thead><tr><th>Thread</th><th>Account</th><th>Schema</th><th>Command</th>\
             <th>Running</th><th>State</th><th>Wait</th><th>Blocked by</th><th>Statement</th></tr></thead><tbody>",
        );
        let mut connections = snapshot.connections.clone();
        // Busy first, the longest running on top; idle ones after.
        connections.sort_by_key(|c| (c.command == "Sleep", std::cmp::Reverse(c.running_ms)));
        for c in &connections {
            let statement = if c.digest == 0 {
                String::new()
            } else {
                let hex = html::digest_hex(c.digest);
                let mut keep = vec![("id", hex.as_str())];
                if !c.schema.is_empty() {
                    keep.push(("schema", c.schema.as_str()));
                }
                format!(
                    "<a href=\"{}\" title=\"{}\">{}</a>",
                    esc(&view.link("/digest", &keep)),
                    esc(&c.sample),
                    esc(&html::cut(&c.digest_text, 90))
                )
            };
            let _ = write!(
                body,
                "<tr data-thread=\"{}\" data-blocked-by=\"{}\"><td class=\"num\">{}</td><td>{}</td><td>{}</td>\
                 <td>{}</td><td class=\"num\">{}</td><td>{}</td><td>{}</td><td class=\"num\">{}</td><td>{}</td></tr>",
                c.thread_id,
                c.blocked_by,
                c.thread_id,
                esc(&format!("{}@{}", c.user, c.host)),
                esc(&c.schema),
                esc(&c.command),
                html::duration_ns(c.running_ms as f64 * 1e6),
                esc(&c.state),
                esc(&c.wait),
                if c.blocked_by == 0 { String::new() } else { c.blocked_by.to_string() },
                statement
            );
        }
        body.push_str("</tbody></table></section>");
    }
    body.push_str("</div>");
    long_statements(ui, view, &mut body).await?;
    Ok((head, body))
}

/// Events the store kept over the page's range: statements that ran
/// long, were killed or lost their client.
async fn long_statements(ui: &Ui, view: &View, body: &mut String) -> Result<(), PageError> {
    let answer = ui
        .long_statements(LongStatementsRequest {
            instance: view.instance.clone().unwrap_or_default(),
            since_unix_ms: view.range.since_unix_ms,
            limit: MAX_LONG,
        })
        .await?;
    body.push_str("<h2>Long, killed and disconnected statements</h2>");
    if answer.left_out > 0 {
        body.push_str(&html::notice(&left_out_note(answer.left_out, "statements")));
    }
    if answer.statements.is_empty() {
        body.push_str(&html::notice(
            "None in this range: no statement ran past the agents' --long-statement, was killed or lost its client.",
        ));
        return Ok(());
    }
    body.push_str(
        "<table class=\"data\" id=\"long\"><thead><tr><th>Start</th><th>Instance</th><th>Thread</th><th>Outcome</th>\
         <th>Duration</th><th>Waits</th><th>Blocked by</th><th>Statement</th></tr></thead><tbody>",
    );
    for row in &answer.statements {
        let s = row.statement.clone().unwrap_or_default();
        let waits: Vec<String> =
            s.waits.iter().map(|w| format!("{} {}", w.class, html::duration_ns(w.sum_ns as f64))).collect();
        let hex = html::digest_hex(s.digest);
        let mut keep = vec![("id", hex.as_str())];
        if !s.schema.is_empty() {
            keep.push(("schema", s.schema.as_str()));
        }
        let _ = write!(
            body,
            "<tr data-outcome=\"{}\" data-thread=\"{}\"><td>{}</td><td>{}</td><td class=\"num\">{}</td><td>{}</td>\
             <td class=\"num\">{}</td><td>{}</td><td class=\"num\">{}</td><td><a href=\"{}\" title=\"{}\">{}</a></td></tr>",
            esc(&s.outcome),
            s.connection_id,
            esc(&sqlbee_vocabulary::clock::rfc3339(sqlbee_vocabulary::clock::from_unix_ms(s.start_unix_ms))),
            esc(&row.instance),
            s.connection_id,
            esc(&s.outcome),
            html::duration_ns(s.duration_ns as f64),
            esc(&waits.join(", ")),
            other_side(&s),
            esc(&view.link("/digest", &keep)),
            esc(&s.sample),
            esc(&html::cut(&s.digest_text, 90))
        );
    }
    body.push_str("</tbody></table>");
    Ok(())
}

/// Who blocked a long statement, or a deadlock's other side.
fn other_side(s: &sqlbee_proto::v1::LongStatement) -> String {
    if s.deadlock_with != 0 {
        return format!(
            "<span class=\"deadlock-with\" data-thread=\"{}\">deadlock with {}: {}</span>",
            s.deadlock_with,
            s.deadlock_with,
            esc(&html::cut(&s.deadlock_with_digest_text, 60))
        );
    }
    if s.blocked_by == 0 { String::new() } else { s.blocked_by.to_string() }
}

/// One node of a blocking tree, and the connections waiting on it.
fn chain(body: &mut String, node: &Value) {
    let text = |key: &str| node.get(key).and_then(Value::as_str).unwrap_or_default().to_string();
    let running = node.get("running_ms").and_then(Value::as_u64).unwrap_or(0);
    let _ = write!(
        body,
        "<li class=\"chain\" data-thread=\"{}\"><strong>{}</strong> {} · {} · {}",
        node.get("thread_id").and_then(Value::as_u64).unwrap_or(0),
        node.get("thread_id").and_then(Value::as_u64).unwrap_or(0),
        esc(&text("state")),
        html::duration_ns(running as f64 * 1e6),
        esc(&html::cut(&text("digest_text"), 80))
    );
    if let Some(blocked) = node.get("blocked").and_then(Value::as_array).filter(|b| !b.is_empty()) {
        body.push_str("<ul>");
        for waiter in blocked {
            chain(body, waiter);
        }
        body.push_str("</ul>");
    }
    // The tree is cut at MAX_CHAIN_DEPTH: say how many wait below.
    if let Some(more) = node.get("more_blocked").and_then(Value::as_u64) {
        let _ = write!(body, "<ul><li class=\"chain more\">{more} more connections wait below</li></ul>");
    }
    body.push_str("</li>");
}
