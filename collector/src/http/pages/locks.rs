//! Lock waits over the range, newest first, each with the statements and
//! transactions that were open for the whole wait: the candidates for
//! what held the lock.
use std::fmt::Write;

use sqlbee_proto::v1::LocksRequest;

use super::{PageHead, Rendered, instance_names};
use crate::{
    http::{
        Ui,
        html::{self, Nav, esc},
        params::View,
    },
    query_api::json::left_out_note,
};

/// Waits a page lists.
const LIMIT: u32 = 200;

pub async fn render(ui: &Ui, view: &View) -> Rendered {
    let answer = ui
        .locks(LocksRequest {
            instance: view.instance.clone().unwrap_or_default(),
            since_unix_ms: view.range.since_unix_ms,
            limit: LIMIT,
        })
        .await?;
    let waits: Vec<_> = answer
        .waits
        .iter()
        .filter_map(|r| r.wait.as_ref().map(|w| (r, w)))
        .filter(|(_, w)| view.range.until_unix_ms == 0 || w.start_unix_ms < view.range.until_unix_ms)
        .collect();
    let mut body = format!(
        "<p class=\"summary\">The {} newest waits longer than the agents' threshold (default 50 ms).</p>",
        waits.len()
    );
    if answer.left_out > 0 {
        body.push_str(&html::notice(&left_out_note(answer.left_out, "lock waits")));
    }
    body.push_str(
        "<table class=\"data\" id=\"locks\"><thead><tr><th>Started</th><th>Instance</th><th>Waited</th><th>Class</th>\
         <th>Connection</th><th>Statement</th><th>Blockers</th></tr></thead><tbody>",
    );
    if waits.is_empty() {
        body.push_str("<tr><td colspan=\"7\">No lock waits in this range.</td></tr>");
    }
    for (row, w) in waits {
        let link = view.link("/digest", &[("id", &html::digest_hex(w.digest))]);
        let _ = write!(
            body,
            "<tr data-duration-ns=\"{}\"><td>{}</td><td>{}</td><td class=\"num\">{}</td><td>{}</td><td class=\"num\">{}</td>\
             <td class=\"sql\"><a href=\"{}\">{}</a>{}</td><td>",
            w.duration_ns,
            html::time(w.start_unix_ms),
            esc(&row.instance),
            html::duration_ns(w.duration_ns as f64),
            esc(&w.class),
            w.connection_id,
            esc(&link),
            esc(&html::cut(&w.digest_text, 120)),
            if w.sample.is_empty() {
                String::new()
            } else {
                format!("<div class=\"sample\">{}</div>", esc(&html::cut(&w.sample, 200)))
            },
        );
        if w.blockers.is_empty() {
            body.push_str("none seen");
        } else {
            let _ = write!(body, "<span class=\"label\">{}</span><ul class=\"blockers\">", esc(&w.blocker_kind));
            for b in &w.blockers {
                let _ = write!(
                    body,
                    "<li>connection {} ({} since {}){}</li>",
                    b.connection_id,
                    if b.transaction { "transaction open" } else { "statement running" },
                    html::time(b.started_unix_ms),
                    if b.statements.is_empty() {
                        String::new()
                    } else {
                        format!(
                            "<ol>{}</ol>",
                            b.statements
                                .iter()
                                .map(|s| format!("<li><code>{}</code></li>", esc(&html::cut(s, 160))))
                                .collect::<String>()
                        )
                    }
                );
            }
            body.push_str("</ul>");
        }
        body.push_str("</td></tr>");
    }
    body.push_str("</tbody></table>");
    Ok((
        PageHead {
            title: "Lock waits".into(),
            nav: Nav::Locks,
            instances: instance_names(ui).await?,
            keep: Vec::new(),
        },
        body,
    ))
}
