//! Compare: the page's range against the same range moved back by `shift`
//! (a day by default), digest by digest, as `sqlbee diff` answers it. Each
//! row links to its digest page and carries the evidence for its verdict.
use std::fmt::Write;

use sqlbee_proto::v1::{DiffRequest, DiffSide};
use sqlbee_vocabulary::duration;

use super::{PageHead, Rendered, instance_names};
use crate::http::{
    Ui,
    html::{self, Nav, esc},
    params::{BadParam, Params, View},
};

/// Digests a page lists.
const MAX_ROWS: u32 = 200;
pub const DEFAULT_SHIFT: &str = "1d";

/// The first range: `before=FROM..TO` (ms since the epoch), or the page's
/// range moved back by `shift` (a duration, a day by default); and the
/// words that name it.
pub fn before_range(params: &Params, view: &View) -> Result<((i64, i64), String), BadParam> {
    if let Some(text) = params.get("before") {
        let bad = || BadParam { name: "before", value: text.to_string(), expected: "FROM..TO in ms since the epoch" };
        let (from, to) = text.split_once("..").ok_or_else(bad)?;
        let (from, to): (i64, i64) = (from.parse().map_err(|_| bad())?, to.parse().map_err(|_| bad())?);
        if from < 0 || to <= from {
            return Err(bad());
        }
        return Ok(((from, to), format!("the range from {} to {}", html::time(from), html::time(to))));
    }
    let text = params.get("shift").unwrap_or(DEFAULT_SHIFT);
    let shift = duration::parse(text).ok().filter(|d| !d.is_zero()).ok_or_else(|| BadParam {
        name: "shift",
        value: text.to_string(),
        expected: "a duration (1h, 1d, 7d)",
    })?;
    let shift_ms = shift.as_millis().min(i64::MAX as u128) as i64;
    let r = &view.range;
    let range = ((r.since_unix_ms - shift_ms).max(0), (r.end_unix_ms - shift_ms).max(1));
    Ok((range, format!("the same range {text} earlier")))
}

/// The request for the page's range (`after`) against `before`.
pub fn request(view: &View, before: (i64, i64), limit: u32) -> DiffRequest {
    let r = &view.range;
    DiffRequest {
        instance: view.instance.clone().unwrap_or_default(),
        before_since_unix_ms: before.0,
        before_until_unix_ms: before.1,
        after_since_unix_ms: r.since_unix_ms,
        after_until_unix_ms: r.until_unix_ms,
        limit,
        ..Default::default()
    }
}

fn mean(side: Option<&DiffSide>) -> String {
    side.filter(|s| s.count > 0).map_or_else(|| "-".into(), |s| html::duration_ns(s.sum_ns as f64 / s.count as f64))
}

pub async fn render(ui: &Ui, view: &View, params: &Params) -> Rendered {
    let (before, named) = before_range(params, view)?;
    let answer = ui.diff(request(view, before, MAX_ROWS)).await?;
    let instances = instance_names(ui).await?;
    let keep: Vec<(&str, String)> =
        ["shift", "before"].into_iter().filter_map(|k| params.get(k).map(|v| (k, v.to_string()))).collect();
    let head = PageHead { title: "Compare".into(), nav: Nav::Compare, instances, keep };
    let mut body = String::new();
    let _ = write!(
        body,
        "<p>This range against {}. A digest is <em>regressed</em> or <em>improved</em> only \
         when a rank test on its two latency histograms finds a difference (p &lt; 0.001) and its mean moved by at \
         least 20% and 100 µs.</p><p>Compare with: ",
        esc(&named)
    );
    for other in ["1h", "1d", "7d"] {
        let _ = write!(body, "<a href=\"{}\">{other} earlier</a> ", esc(&view.link("/compare", &[("shift", other)])));
    }
    body.push_str("</p>");
    if answer.digests.is_empty() {
        body.push_str(&html::notice("No statement ran in either range."));
        return Ok((head, body));
    }
    body.push_str(
        "<table class=\"data\" id=\"changes\"><thead><tr><th>Status</th><th>Before</th><th>After</th>\
         <th>Mean before</th><th>Mean after</th><th>Digest</th></tr></thead><tbody>",
    );
    for d in &answer.digests {
        let hex = html::digest_hex(d.digest);
        let mut keep = vec![("id", hex.as_str())];
        if !d.schema.is_empty() {
            keep.push(("schema", d.schema.as_str()));
        }
        let count = |s: Option<&DiffSide>| s.map_or(0, |s| s.count);
        let _ = write!(
            body,
            "<tr data-digest=\"{hex}\" data-status=\"{}\" title=\"{}\"><td><strong>{}</strong></td>\
             <td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td>\
             <td><a href=\"{}\">{}</a><br><small>{}</small></td></tr>",
            esc(&d.status),
            esc(&d.evidence),
            esc(&d.status),
            html::count(count(d.before.as_ref())),
            html::count(count(d.after.as_ref())),
            mean(d.before.as_ref()),
            mean(d.after.as_ref()),
            esc(&view.link("/digest", &keep)),
            esc(&html::cut(&d.digest_text, 90)),
            esc(&d.evidence),
        );
    }
    body.push_str("</tbody></table>");
    Ok((head, body))
}
