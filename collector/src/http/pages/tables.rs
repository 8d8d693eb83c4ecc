//! Tables: per-table totals over the range, each with the digests that
//! touch it (linked to their pages) and the changes made to it (the
//! `change` events that name it). A statement counts in full for every
//! table its digest touches, as the page says; the rows events a replica
//! applied to a table count beside its statements.
use std::fmt::Write;

use sqlbee_proto::v1::{TableTotals, TablesRequest};

use super::{PageHead, Rendered, digest_href, instance_names};
use crate::http::{
    Ui,
    html::{self, Nav, esc},
    params::View,
};

/// Tables a page lists.
pub(super) const MAX_TABLES: u32 = 200;
/// Changes read for the page, the newest.
pub(super) const MAX_CHANGES: u32 = 1_000;

pub async fn render(ui: &Ui, view: &View) -> Rendered {
    let answer = ui
        .tables(TablesRequest {
            instance: view.instance.clone().unwrap_or_default(),
            since_unix_ms: view.range.since_unix_ms,
            until_unix_ms: view.range.until_unix_ms,
            limit: MAX_TABLES,
        })
        .await?;
    let changes = super::changes_in_view(ui, view).await?;
    let instances = instance_names(ui).await?;
    let head = PageHead { title: "Tables".into(), nav: Nav::Tables, instances, keep: Vec::new() };
    let mut body = String::from(
        "<p>Each statement counts in full for every table its digest reads or writes, so the tables' totals add up \
         to more than the statements that ran.</p>",
    );
    if answer.tables.is_empty() {
        body.push_str(&html::notice("No statement touched a table in this range."));
    } else {
        body.push_str(
            "<table class=\"data\" id=\"tables\"><thead><tr><th>Table</th><th>Statements</th><th>Total</th>\
             <th>Rows examined</th><th>Writing</th><th>Reading</th><th>Digests</th><th>Applied</th></tr></thead>\
             <tbody>",
        );
        for t in &answer.tables {
            let name = if t.schema.is_empty() { t.table.clone() } else { format!("{}.{}", t.schema, t.table) };
            let _ = write!(
                body,
                "<tr data-table=\"{}\" data-statements=\"{}\" data-sum-ns=\"{}\" data-apply-ns=\"{}\">\
                 <td><strong>{}</strong></td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td>\
                 <td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td></tr>",
                esc(&name),
                t.statements,
                t.sum_ns,
                t.apply_ns,
                esc(&name),
                html::count(t.statements),
                html::duration_ns(t.sum_ns as f64),
                t.rows_examined.map_or_else(|| "-".to_string(), html::count),
                html::count(t.writing_statements),
                html::count(t.reading_statements),
                html::count(t.digest_count),
                if t.applied.is_empty() { "-".to_string() } else { html::duration_ns(t.apply_ns as f64) }
            );
            body.push_str("<tr class=\"table-digests\"><td colspan=\"8\"><ul>");
            for a in &t.applied {
                let _ = write!(
                    body,
                    "<li class=\"table-applied\" data-kind=\"{}\" data-events=\"{}\">{} applied by a replica: {} events \
                     · {} rows · {}</li>",
                    esc(&a.kind),
                    a.events,
                    esc(&a.kind),
                    html::count(a.events),
                    a.rows.map_or_else(|| "?".to_string(), html::count),
                    html::duration_ns(a.apply_ns as f64)
                );
            }
            for d in &t.digests {
                let _ = write!(
                    body,
                    "<li><a class=\"table-digest\" data-digest=\"{}\" href=\"{}\">{}</a> {} · {} statements · {}</li>",
                    html::digest_hex(d.digest),
                    esc(&digest_href(view, d.digest, &d.schema)),
                    esc(&html::cut(&d.digest_text, 90)),
                    if d.write { "writes" } else { "reads" },
                    html::count(d.count),
                    html::duration_ns(d.sum_ns as f64)
                );
            }
            for e in changes.iter().filter(|e| e.change.as_ref().is_some_and(|c| c.objects.contains(&name))) {
                super::change_item(&mut body, "table-change", e);
            }
            body.push_str("</ul>");
            indexes(&mut body, view, t);
            body.push_str("</td></tr>");
        }
        body.push_str("</tbody></table>");
    }
    if answer.unknown_statements + answer.undescribed_statements > 0 {
        let _ = write!(
            body,
            "<p class=\"label\">Not in any table: {} statements whose text the agent could not parse, {} whose digest \
             no agent has described yet.</p>",
            html::count(answer.unknown_statements),
            html::count(answer.undescribed_statements)
        );
    }
    Ok((head, body))
}

/// A table's indexes with the digests whose plans chose each, and what to
/// do about them; nothing when no agent read them (no --server-login).
fn indexes(body: &mut String, view: &View, t: &TableTotals) {
    if t.indexes.is_empty() {
        return;
    }
    let coverage = if t.plannable_statements == 0 {
        "no statement in this range may choose an index".to_string()
    } else {
        format!(
            "plans cover {} of the {} statements that may choose an index ({:.0}%)",
            html::count(t.planned_statements),
            html::count(t.plannable_statements),
            100.0 * t.planned_statements as f64 / t.plannable_statements as f64
        )
    };
    let _ = write!(
        body,
        "<p class=\"label\">Indexes, as {} read them {}; {}.</p><ul class=\"table-indexes\">",
        esc(&t.indexes_instance),
        esc(&html::time(t.indexes_read_unix_ms)),
        coverage
    );
    for i in &t.indexes {
        let _ = write!(
            body,
            "<li class=\"table-index\" data-index=\"{}\" data-digests=\"{}\"><code>{}</code> ({}){}{} · chosen by {} \
             digests, {} statements{}</li>",
            esc(&i.name),
            i.digests,
            esc(&i.name),
            esc(&i.columns.join(", ")),
            if i.unique { " unique" } else { "" },
            if i.ignored { " ignored" } else { "" },
            html::count(i.digests),
            html::count(i.statements),
            i.rows_read
                .map(|n| format!(" · {} rows read since the server started", html::count(n)))
                .unwrap_or_default()
        );
        // Its digests, linked: named by their text where the table lists
        // them.
        if !i.digest_ids.is_empty() {
            body.push_str("<ul>");
            for id in &i.digest_ids {
                let listed = t.digests.iter().find(|d| d.digest == *id);
                let schema = listed.map_or(t.schema.as_str(), |d| d.schema.as_str());
                let text = listed.map_or_else(|| html::digest_hex(*id), |d| html::cut(&d.digest_text, 90));
                let _ = write!(
                    body,
                    "<li><a class=\"index-digest\" data-digest=\"{}\" href=\"{}\">{}</a></li>",
                    html::digest_hex(*id),
                    esc(&digest_href(view, *id, schema)),
                    esc(&text)
                );
            }
            body.push_str("</ul>");
        }
    }
    body.push_str("</ul>");
    if !t.findings.is_empty() {
        super::finding_list(body, "<ul class=\"findings table-findings\">", &t.findings);
    }
}
