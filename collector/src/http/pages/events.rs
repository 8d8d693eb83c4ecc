//! Events: what the collector's detection found in the page's range
//! (regressions, new digests, plan changes), newest first, each with its
//! evidence, whether it is still open, and a link to the compare view of
//! the ranges that opened it; and the markers people wrote in the range.
use std::fmt::Write;

use sqlbee_proto::v1::{AnnotationsRequest, EventsRequest};

use super::{PageHead, Rendered, instance_names};
use crate::http::{
    Ui,
    html::{self, Nav, esc},
    params::{View, encode},
};

/// Events and markers a page lists.
const MAX_ROWS: u32 = 500;

pub async fn render(ui: &Ui, view: &View) -> Rendered {
    let instance = view.instance.clone().unwrap_or_default();
    let (since_unix_ms, until_unix_ms) = (view.range.since_unix_ms, view.range.until_unix_ms);
    let events = ui
        .events(EventsRequest {
            instance: instance.clone(),
            since_unix_ms,
            until_unix_ms,
            open_only: false,
            limit: MAX_ROWS,
            kind: String::new(),
        })
        .await?;
    let markers =
        ui.annotations(AnnotationsRequest { instance, since_unix_ms, until_unix_ms, limit: MAX_ROWS, id: 0 }).await?;
    let head =
        PageHead { title: "Events".into(), nav: Nav::Events, instances: instance_names(ui).await?, keep: Vec::new() };
    let mut body = String::from(
        "<p>The collector compares each instance's recent statements with its baseline every few minutes \
         (<code>--detect-every</code>) and opens an event for a digest that regressed, a new digest, or a plan \
         change. A regression closes once its mean is back near the baseline it opened with.</p>",
    );
    if events.is_empty() {
        body.push_str(&html::notice("No event was open in this range."));
    } else {
        body.push_str(
            "<table class=\"data\" id=\"events\"><thead><tr><th>Kind</th><th>Instance</th><th>Opened</th>\
             <th>Closed</th><th>Digest</th><th>Compare</th></tr></thead><tbody>",
        );
        for e in &events {
            let hex = html::digest_hex(e.digest);
            let mut digest_link = vec![("id", hex.as_str())];
            if !e.schema.is_empty() {
                digest_link.push(("schema", e.schema.as_str()));
            }
            // A change compares the quarter hours on either side of it.
            let ranges = if e.kind == sqlbee_proto::query_client::CHANGE_EVENT_KIND {
                const SPAN: i64 = 15 * 60_000;
                [e.closed_unix_ms, e.closed_unix_ms + SPAN, e.opened_unix_ms - SPAN, e.opened_unix_ms]
            } else {
                [e.after_since_unix_ms, e.after_until_unix_ms, e.before_since_unix_ms, e.before_until_unix_ms]
            };
            let compare = format!(
                "/compare?since={}&until={}&instance={}&before={}..{}",
                ranges[0],
                ranges[1],
                encode(&e.instance),
                ranges[2],
                ranges[3]
            );
            let closed = match e.closed_unix_ms {
                0 => "<strong>open</strong>".to_string(),
                at => format!("{}<br><small>{}</small>", html::time(at), esc(&e.closed_because)),
            };
            let _ = write!(
                body,
                "<tr data-kind=\"{}\" data-digest=\"{hex}\" data-open=\"{}\"><td><strong>{}</strong></td><td>{}</td>\
                 <td>{}</td><td>{closed}</td><td><a href=\"{}\">{}</a><br><small>{}</small></td>\
                 <td><a href=\"{}\">compare</a></td></tr>",
                esc(&e.kind),
                e.closed_unix_ms == 0,
                esc(&e.kind.replace('_', " ")),
                esc(&e.instance),
                html::time(e.opened_unix_ms),
                esc(&view.link("/digest", &digest_link)),
                esc(&html::cut(&e.digest_text, 90)),
                esc(&e.evidence),
                esc(&compare),
            );
        }
        body.push_str("</tbody></table>");
    }
    body.push_str("<h2 id=\"markers\">Markers</h2>");
    if markers.is_empty() {
        body.push_str(
            "<p>No marker in this range. Mark a deploy with <code>sqlbee annotate \"deploy v2.3\"</code> or \
             <code>POST /api/annotations</code> (a token of the <code>annotate</code> role).</p>",
        );
    } else {
        body.push_str(
            "<table class=\"data\" id=\"marker-list\"><thead><tr><th>At</th><th>Marker</th><th>Instances</th>\
             <th>Compare</th></tr></thead><tbody>",
        );
        for m in &markers {
            let hour = 3_600_000;
            let compare = format!(
                "/compare?since={}&until={}&before={}..{}",
                m.at_unix_ms,
                m.at_unix_ms + hour,
                (m.at_unix_ms - hour).max(0),
                m.at_unix_ms
            );
            let _ = write!(
                body,
                "<tr data-marker=\"{:016x}\"><td>{}</td><td>{}</td><td>{}</td><td><a href=\"{}\">hour before \
                 and after</a></td></tr>",
                m.id,
                html::time(m.at_unix_ms),
                esc(&m.text),
                if m.instances.is_empty() { "the whole fleet".to_string() } else { esc(&m.instances.join(", ")) },
                esc(&compare),
            );
        }
        body.push_str("</tbody></table>");
    }
    Ok((head, body))
}
