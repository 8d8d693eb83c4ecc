//! One digest: its latency percentiles and rate over time, a latency
//! heatmap, its errors by code with a sample message each, its waits by
//! class, the server's figures, the accounts and clients that ran it, a redacted
//! sample, its plan (with findings and history; plan changes marked on
//! the latency plot), and the instances it runs on. A digest that ran in several
//! schemas (or inside stored programs) shows one row per schema and
//! lineage; the plots cover every one of them unless a schema is chosen.
use std::{collections::BTreeMap, fmt::Write};

use sqlbee_figures::Unit;
use sqlbee_proto::v1::{QueryStats, TablesRequest, TopDigest, TopRequest};

use super::{
    PageHead, Rendered, change_item, instance_names, plans, series_request, statement_plots, tables::MAX_TABLES,
    top_request,
};
use crate::{
    http::{
        Ui,
        html::{self, Nav, esc},
        page_error::PageError,
        params::{Params, View, digest_id},
        svg::MarkerKind,
    },
    query_api::blame,
};

/// Rows (schemas and lineages) a digest page lists.
const MAX_ROWS: u32 = 100;

pub async fn render(ui: &Ui, view: &View, params: &Params) -> Rendered {
    let id = digest_id(params)?;
    let hex = html::digest_hex(id);
    let schema = params.get("schema").unwrap_or("").to_string();
    let answer = ui
        .top(TopRequest { limit: MAX_ROWS, schema: schema.clone(), digest: id, nested: true, ..top_request(view) })
        .await?;
    let mut keep = vec![("id", hex.clone())];
    if !schema.is_empty() {
        keep.push(("schema", schema.clone()));
    }
    let head = |title: String, instances| PageHead { title, nav: Nav::Digest, instances, keep: keep.clone() };
    let instances = instance_names(ui).await?;
    let Some(first) = answer.digests.first() else {
        let body = html::notice(&format!(
            "No statement of digest {hex}{} ran in this range{}. Try a longer range.",
            if schema.is_empty() { String::new() } else { format!(" in schema {schema}") },
            view.instance.as_deref().map_or(String::new(), |i| format!(" on {i}")),
        ));
        return Ok((head(format!("Digest {hex}"), instances), body));
    };

    let mut body = String::new();
    let _ = write!(body, "<pre class=\"digest-text\" id=\"digest-text\">{}</pre>", esc(&first.digest_text));
    let sample = answer.digests.iter().map(|d| d.sample.as_str()).find(|s| !s.is_empty());
    if let Some(sample) = sample {
        let _ = write!(
            body,
            "<p class=\"label\">Sample (redacted unless the agent runs with --samples raw)</p><pre class=\"sample\">{}</pre>",
            esc(sample)
        );
    }

    let series = ui.series(series_request(view, "digest", id, &schema)).await?;
    let plans = ui.plans(plans::request(view, id, &schema)).await?;
    let mut markers = plans::markers(&plans);
    // Its plan changes are drawn from its plans already.
    markers.extend(super::marks(ui, view).await?.into_iter().filter(|m| m.kind != MarkerKind::Plan));
    body.push_str(&statement_plots(view, &series, &markers));
    plans::section(&mut body, &plans);
    changes(&mut body, ui, view, id).await?;

    rows(&mut body, view, &answer.digests);
    errors(&mut body, &answer.digests);
    waits(&mut body, &answer.digests);
    figures(&mut body, &answer.digests);
    accounts(&mut body, &answer.digests);
    clients(&mut body, &answer.digests);
    tags(&mut body, &answer.digests);
    traces(&mut body, &answer.digests);
    instances_on(&mut body, view, &answer.digests);
    Ok((head(format!("Digest {hex}"), instances), body))
}

/// The changes that may explain how it ran: those that named one of its
/// tables, and those that changed the whole server (as `sqlbee diff`
/// blames them).
async fn changes(body: &mut String, ui: &Ui, view: &View, id: u64) -> Result<(), PageError> {
    let instance = view.instance.clone().unwrap_or_default();
    let (since_unix_ms, until_unix_ms) = (view.range.since_unix_ms, view.range.until_unix_ms);
    let tables = ui.tables(TablesRequest { instance, since_unix_ms, until_unix_ms, limit: MAX_TABLES }).await?;
    let mine: Vec<(&str, &str)> = tables
        .tables
        .iter()
        .filter(|t| t.digests.iter().any(|d| d.digest == id))
        .map(|t| (t.schema.as_str(), t.table.as_str()))
        .collect();
    let events = super::changes_in_view(ui, view).await?;
    let touching: Vec<_> = events.iter().filter(|e| blame::touches_tables(e, mine.iter().copied())).collect();
    body.push_str("<h2>Changes</h2>");
    if touching.is_empty() {
        body.push_str("<p>No change to its tables or to the server in this range.</p>");
        return Ok(());
    }
    body.push_str("<p>Changes to its tables, and to the whole server, in this range.</p><ul id=\"changes\">");
    for e in touching {
        change_item(body, "digest-change", e);
    }
    body.push_str("</ul>");
    Ok(())
}

fn rows(body: &mut String, view: &View, digests: &[TopDigest]) {
    body.push_str(
        "<h2>Where it ran</h2><table class=\"data\" id=\"rows\"><thead><tr><th>Schema</th><th>Source</th><th>Count</th>\
         <th>Errors</th><th>Total</th><th>Avg</th><th>p50</th><th>p95</th><th>p99</th><th>Max</th></tr></thead><tbody>",
    );
    for d in digests {
        let source = if d.program.is_empty() {
            if d.source.is_empty() { "client".to_string() } else { d.source.clone() }
        } else {
            format!("{} {}", d.program_kind, d.program)
        };
        let parent = if d.parent_digest != 0 {
            let link = view.link("/digest", &[("id", &html::digest_hex(d.parent_digest))]);
            format!(" (run by <a href=\"{}\">{}</a>)", esc(&link), html::digest_hex(d.parent_digest))
        } else {
            String::new()
        };
        let avg = if d.count > 0 { d.sum_ns as f64 / d.count as f64 } else { 0.0 };
        let _ = write!(
            body,
            "<tr data-schema=\"{}\" data-count=\"{}\" data-errors=\"{}\" data-sum-ns=\"{}\" data-p99-ns=\"{}\">\
             <td>{}</td><td>{}{parent}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td>\
             <td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td></tr>",
            esc(&d.schema),
            d.count,
            d.errors,
            d.sum_ns,
            d.p99_ns,
            esc(&d.schema),
            esc(&source),
            html::count(d.count),
            html::count(d.errors),
            html::duration_ns(d.sum_ns as f64),
            html::duration_ns(avg),
            html::duration_ns(d.p50_ns as f64),
            html::duration_ns(d.p95_ns as f64),
            html::duration_ns(d.p99_ns as f64),
            html::duration_ns(d.max_ns as f64),
        );
    }
    body.push_str("</tbody></table>");
}

fn errors(body: &mut String, digests: &[TopDigest]) {
    let mut by_code: BTreeMap<u32, (u64, String)> = BTreeMap::new();
    for e in digests.iter().flat_map(|d| &d.error_codes) {
        let entry = by_code.entry(e.code).or_default();
        entry.0 += e.count;
        if entry.1.is_empty() {
            entry.1 = e.sample_message.clone();
        }
    }
    body.push_str("<h2>Errors</h2>");
    if by_code.is_empty() {
        body.push_str("<p>No errors in this range.</p>");
        return;
    }
    body.push_str("<table class=\"data\" id=\"errors\"><thead><tr><th>Code</th><th>Count</th><th>Sample message</th></tr></thead><tbody>");
    for (code, (count, message)) in by_code {
        let _ = write!(
            body,
            "<tr data-code=\"{code}\" data-count=\"{count}\"><td>{code}</td><td class=\"num\">{}</td><td>{}</td></tr>",
            html::count(count),
            esc(&message)
        );
    }
    body.push_str("</tbody></table>");
}

fn waits(body: &mut String, digests: &[TopDigest]) {
    let mut by_class: BTreeMap<&str, (u64, u64, u64)> = BTreeMap::new();
    for w in digests.iter().flat_map(|d| &d.waits) {
        let entry = by_class.entry(&w.class).or_default();
        entry.0 += w.statements;
        entry.1 += w.sum_ns;
        entry.2 = entry.2.max(w.max_ns);
    }
    body.push_str("<h2>Waits</h2>");
    if by_class.is_empty() {
        body.push_str("<p>No waits in this range.</p>");
        return;
    }
    body.push_str("<table class=\"data\" id=\"waits\"><thead><tr><th>Class</th><th>Statements that waited</th><th>Total</th><th>Longest</th></tr></thead><tbody>");
    for (class, (statements, sum, max)) in by_class {
        let _ = write!(
            body,
            "<tr><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td></tr>",
            esc(class),
            html::count(statements),
            html::duration_ns(sum as f64),
            html::duration_ns(max as f64)
        );
    }
    body.push_str("</tbody></table>");
}

/// Every figure any of the rows carried, summed as the collector merges
/// them; one no row carried (an older agent, a build the agent could not
/// read it from) is left out rather than shown as 0.
fn figures(body: &mut String, digests: &[TopDigest]) {
    let mut sum = QueryStats::default();
    for s in digests.iter().filter_map(|d| d.stats.as_ref()) {
        sum.merge(s);
    }
    let known: Vec<_> = sum.figures().filter_map(|(f, v)| v.map(|v| (f, v))).collect();
    if known.is_empty() {
        return;
    }
    body.push_str("<h2>What the server did</h2><table class=\"data kv\" id=\"figures\"><tbody>");
    for (figure, value) in known {
        let shown = match figure.unit {
            Unit::Ns => html::duration_ns(value as f64),
            Unit::Rows | Unit::Statements | Unit::Count => html::count(value),
        };
        let _ = write!(
            body,
            "<tr data-figure=\"{}\" data-value=\"{value}\"><th>{}</th><td class=\"num\">{shown}</td></tr>",
            figure.name, figure.label
        );
    }
    body.push_str("</tbody></table>");
}

fn accounts(body: &mut String, digests: &[TopDigest]) {
    let mut by_account: BTreeMap<(String, String), u64> = BTreeMap::new();
    for a in digests.iter().flat_map(|d| &d.accounts) {
        *by_account.entry((a.user.clone(), a.host.clone())).or_default() += a.count;
    }
    if by_account.is_empty() {
        return;
    }
    let mut sorted: Vec<_> = by_account.into_iter().collect();
    sorted.sort_by_key(|entry| std::cmp::Reverse(entry.1));
    body.push_str("<h2>Accounts</h2><table class=\"data\" id=\"accounts\"><thead><tr><th>User</th><th>Client host</th><th>Statements</th></tr></thead><tbody>");
    for ((user, host), count) in sorted {
        let _ = write!(
            body,
            "<tr><td>{}</td><td>{}</td><td class=\"num\">{}</td></tr>",
            esc(&user),
            esc(&host),
            html::count(count)
        );
    }
    body.push_str("</tbody></table>");
}

/// Who sends it, as the server's node sees it: statements per client over
/// the digest's rows, then those from clients not listed or not named.
fn clients(body: &mut String, digests: &[TopDigest]) {
    let mut by_client: BTreeMap<(String, String, u32, String, String, String), u64> = BTreeMap::new();
    for c in digests.iter().flat_map(|d| &d.clients) {
        let pod = if c.namespace.is_empty() { c.pod.clone() } else { format!("{}/{}", c.namespace, c.pod) };
        let key = (c.program.clone(), c.process.clone(), c.pid, c.address.clone(), c.container.clone(), pod);
        *by_client.entry(key).or_default() += c.count;
    }
    if by_client.is_empty() {
        return;
    }
    let unnamed = digests.iter().map(|d| d.count).sum::<u64>().saturating_sub(by_client.values().sum::<u64>());
    let mut sorted: Vec<_> = by_client.into_iter().collect();
    sorted.sort_by_key(|entry| std::cmp::Reverse(entry.1));
    body.push_str(
        "<h2>Clients</h2><table class=\"data\" id=\"clients\"><thead><tr><th>Program</th><th>Process</th><th>Pid</th>\
         <th>Address</th><th>Container</th><th>Pod</th><th>Statements</th></tr></thead><tbody>",
    );
    let dash = |s: &str| if s.is_empty() { "-".to_string() } else { esc(s) };
    for ((program, process, pid, address, container, pod), count) in sorted {
        let _ = write!(
            body,
            "<tr class=\"client\" data-program=\"{}\" data-process=\"{}\" data-count=\"{count}\"><td>{}</td>\
             <td>{}</td><td class=\"num\">{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"num\">{}</td></tr>",
            esc(&program),
            esc(&process),
            dash(&program),
            dash(&process),
            if pid == 0 { "-".to_string() } else { pid.to_string() },
            dash(&address),
            dash(&container),
            dash(&pod),
            html::count(count)
        );
    }
    if unnamed > 0 {
        let _ = write!(
            body,
            "<tr class=\"client\" data-process=\"\" data-count=\"{unnamed}\"><td colspan=\"6\"><em>other or not \
             named</em></td><td class=\"num\">{}</td></tr>",
            html::count(unnamed)
        );
    }
    body.push_str("</tbody></table>");
}

/// Who sends it, as the applications say in their comments: statements per
/// query tag value over the digest's rows.
fn tags(body: &mut String, digests: &[TopDigest]) {
    let mut by_value: BTreeMap<(String, Option<String>), u64> = BTreeMap::new();
    for tag in digests.iter().flat_map(|d| &d.tags) {
        for v in &tag.values {
            *by_value.entry((tag.key.clone(), Some(v.value.clone()))).or_default() += v.count;
        }
        if tag.other > 0 {
            *by_value.entry((tag.key.clone(), None)).or_default() += tag.other;
        }
    }
    if by_value.is_empty() {
        return;
    }
    let mut sorted: Vec<_> = by_value.into_iter().collect();
    // By key, then the most frequent value first, values not told apart last.
    sorted.sort_by(|((ka, va), na), ((kb, vb), nb)| ka.cmp(kb).then(va.is_none().cmp(&vb.is_none())).then(nb.cmp(na)));
    body.push_str(
        "<h2>Query tags</h2><table class=\"data\" id=\"tags\"><thead><tr><th>Tag</th><th>Value</th>\
         <th>Statements</th></tr></thead><tbody>",
    );
    for ((key, value), count) in sorted {
        let value = value.map_or_else(|| "<em>other values</em>".to_string(), |v| esc(&v));
        let _ = write!(
            body,
            "<tr><td>{}</td><td>{value}</td><td class=\"num\">{}</td></tr>",
            esc(&key),
            html::count(count)
        );
    }
    body.push_str("</tbody></table>");
}

/// The slowest statements that carried a trace context: a trace id to look
/// up in the tracing system.
fn traces(body: &mut String, digests: &[TopDigest]) {
    let mut exemplars: Vec<_> = digests.iter().flat_map(|d| &d.exemplars).collect();
    if exemplars.is_empty() {
        return;
    }
    exemplars.sort_by_key(|e| std::cmp::Reverse(e.duration_ns));
    exemplars.dedup_by(|a, b| a.trace_id == b.trace_id && a.span_id == b.span_id);
    body.push_str(
        "<h2>Slowest traced statements</h2><table class=\"data\" id=\"exemplars\"><thead><tr><th>Trace id</th>\
         <th>Span id</th><th>Took</th></tr></thead><tbody>",
    );
    for e in exemplars.into_iter().take(5) {
        let _ = write!(
            body,
            "<tr><td><code>{}</code></td><td><code>{}</code></td><td class=\"num\">{}</td></tr>",
            esc(&e.trace_id),
            esc(&e.span_id),
            html::duration_ns(e.duration_ns as f64)
        );
    }
    body.push_str("</tbody></table>");
}

fn instances_on(body: &mut String, view: &View, digests: &[TopDigest]) {
    let mut names: Vec<&str> = digests.iter().flat_map(|d| d.instances.iter().map(String::as_str)).collect();
    names.sort_unstable();
    names.dedup();
    body.push_str("<h2>Instances</h2><ul class=\"instances\" id=\"instances\">");
    for name in names {
        let scoped = View { instance: Some(name.to_string()), ..view.clone() };
        let _ = write!(body, "<li><a href=\"{}\">{}</a></li>", esc(&scoped.link("/top", &[])), esc(name));
    }
    body.push_str("</ul>");
}
