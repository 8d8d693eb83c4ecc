//! One module per page. Each asks the Query service for what it shows and
//! returns the page's HTML; none holds state between requests.
mod activity;
mod clients;
pub(super) mod compare;
mod cost;
mod digest;
mod events;
mod fleet;
mod hosts;
mod locks;
pub mod login;
mod plans;
mod replication;
mod tables;
mod top;

use std::fmt::Write as _;

use sqlbee_proto::v1::{
    self as wire, AnnotationsRequest, EventsRequest, SeriesPoint, SeriesRequest, SeriesResponse, TopRequest,
};
use sqlbee_vocabulary::histogram::Histogram;

use super::{
    Ui,
    html::{self, Header, Nav},
    page_error::PageError,
    params::{Params, View},
    svg::{self, Column, Line, MarkerKind, Unit},
};

/// Markers and events a plot shows at most: a plot is not a log.
const MAX_MARKS: u32 = 200;

/// A plot over "all" starts this long before its end: the hour rollups'
/// default retention, so nothing kept is cut off.
const ALL_PLOT_MS: i64 = 90 * 86_400_000;

/// None: no page at `path`.
pub async fn render(
    ui: &Ui,
    path: &str,
    view: &View,
    params: &Params,
    now: i64,
    signed_in: bool,
) -> Option<Result<String, PageError>> {
    let page = match path {
        "/" => fleet::render(ui, view, params, now).await,
        "/top" => top::render(ui, view, params).await,
        "/digest" => digest::render(ui, view, params).await,
        "/locks" => locks::render(ui, view).await,
        "/replication" => replication::render(ui, view).await,
        "/plans" => plans::render(ui, view).await,
        "/tables" => tables::render(ui, view).await,
        "/compare" => compare::render(ui, view, params).await,
        "/events" => events::render(ui, view).await,
        "/clients" => clients::render(ui, view).await,
        "/activity" => activity::render(ui, view).await,
        "/hosts" => hosts::render(ui, view, now).await,
        "/cost" => cost::render(ui, view).await,
        _ => return None,
    };
    Some(page.map(|(header, body)| {
        let instances = header.instances;
        html::page(
            &Header {
                title: &header.title,
                nav: header.nav,
                path,
                view: Some(view),
                instances: &instances,
                keep: &header.keep.iter().map(|(n, v)| (*n, v.as_str())).collect::<Vec<_>>(),
                signed_in,
            },
            &body,
        )
    }))
}

/// What a page tells the shell about itself.
pub struct PageHead {
    pub title: String,
    pub nav: Nav,
    pub instances: Vec<String>,
    /// Its own parameters, kept when the range or instance changes.
    pub keep: Vec<(&'static str, String)>,
}

pub type Rendered = Result<(PageHead, String), PageError>;

/// Instance names for the filter, each once, in order.
async fn instance_names(ui: &Ui) -> Result<Vec<String>, PageError> {
    let mut names: Vec<String> =
        ui.instances().await?.into_iter().map(|i| i.instance).filter(|name| !name.is_empty()).collect();
    names.sort();
    names.dedup();
    Ok(names)
}

/// The start a plot of this view uses.
fn plot_since(view: &View) -> i64 {
    match view.range.since_unix_ms {
        0 => view.range.end_unix_ms - ALL_PLOT_MS,
        since => since,
    }
}

/// Steps of whole hours over a long range and whole minutes over a
/// shorter one: the hour and minute rollups then answer each step whole,
/// where a step of 24 minutes would make a day's plot read every minute
/// bucket. 0 (under an hour) lets the Query service choose.
fn step_ms(view: &View, points: i64) -> i64 {
    const MINUTE: i64 = 60_000;
    const HOUR: i64 = 3_600_000;
    let span = view.range.end_unix_ms - plot_since(view);
    let raw = (span / points).max(1);
    if span >= 12 * HOUR {
        (raw + HOUR - 1) / HOUR * HOUR
    } else if span >= HOUR {
        (raw + MINUTE - 1) / MINUTE * MINUTE
    } else {
        0
    }
}

/// A series of the view's range, about 60 steps.
fn series_request(view: &View, of: &str, digest: u64, schema: &str) -> SeriesRequest {
    SeriesRequest {
        of: of.to_string(),
        digest,
        instance: view.instance.clone().unwrap_or_default(),
        schema: schema.to_string(),
        since_unix_ms: plot_since(view),
        until_unix_ms: view.range.until_unix_ms,
        step_ms: step_ms(view, 60),
        by_instance: false,
        by_digests: Vec::new(),
    }
}

/// A series for a table row's sparkline: fewer, coarser steps.
fn sparkline_request(view: &View, of: &str, digest: u64, schema: &str) -> SeriesRequest {
    SeriesRequest { step_ms: step_ms(view, 24), ..series_request(view, of, digest, schema) }
}

fn histogram(wire: Option<&wire::Histogram>) -> Histogram {
    let mut h = Histogram::default();
    for b in wire.map_or(&[][..], |w| &w.buckets[..]) {
        h.add_bucket(b.index as usize, b.count);
    }
    h
}

/// Every point's histogram merged: exact quantiles over the whole range.
fn merged(points: &[SeriesPoint]) -> Histogram {
    let mut all = Histogram::default();
    for p in points {
        all.merge(&histogram(p.histogram.as_ref()));
    }
    all
}

fn midpoint(p: &SeriesPoint) -> i64 {
    p.start_unix_ms + (p.end_unix_ms - p.start_unix_ms) / 2
}

fn seconds(p: &SeriesPoint) -> f64 {
    ((p.end_unix_ms - p.start_unix_ms).max(1)) as f64 / 1000.0
}

/// A line of one figure per step; steps without statements are gaps.
fn line(label: &str, series: &SeriesResponse, value: impl Fn(&SeriesPoint) -> f64) -> Line {
    Line {
        label: label.to_string(),
        points: series.points.iter().map(|p| (midpoint(p), (p.count > 0).then(|| value(p)))).collect(),
    }
}

/// A line that is zero, not a gap, where a step had nothing.
fn rate_line(label: &str, series: &SeriesResponse, value: impl Fn(&SeriesPoint) -> f64) -> Line {
    Line { label: label.to_string(), points: series.points.iter().map(|p| (midpoint(p), Some(value(p)))).collect() }
}

fn heat_columns(series: &SeriesResponse) -> Vec<Column> {
    series
        .points
        .iter()
        .map(|p| Column {
            start: p.start_unix_ms,
            end: p.end_unix_ms,
            buckets: histogram(p.histogram.as_ref())
                .buckets()
                .map(|(i, n)| (sqlbee_figures::histogram::bucket_low(i), sqlbee_figures::histogram::bucket_high(i), n))
                .collect(),
        })
        .collect()
}

fn plot_range(view: &View, series: &SeriesResponse) -> (i64, i64) {
    let start = series.points.first().map_or(plot_since(view), |p| p.start_unix_ms);
    let end = series.points.last().map_or(view.range.end_unix_ms, |p| p.end_unix_ms);
    (start, end.max(start + 1))
}

/// A Top request over the view's range and instance.
/// The digest page of `digest` in `schema` (none: every schema), in the
/// view's range.
/// A change event as a list item of class `class`: what it did and who,
/// when, and where.
/// The changes (events of kind `change`) of the view's instance, or of
/// every instance, over the view's range, newest first: what the tables,
/// digest and instance pages list.
async fn changes_in_view(ui: &Ui, view: &View) -> Result<Vec<sqlbee_proto::v1::Event>, PageError> {
    Ok(ui
        .events(EventsRequest {
            instance: view.instance.clone().unwrap_or_default(),
            since_unix_ms: view.range.since_unix_ms,
            until_unix_ms: view.range.until_unix_ms,
            kind: sqlbee_proto::query_client::CHANGE_EVENT_KIND.into(),
            limit: tables::MAX_CHANGES,
            ..Default::default()
        })
        .await?)
}

fn change_item(body: &mut String, class: &str, e: &sqlbee_proto::v1::Event) {
    let _ = write!(
        body,
        "<li class=\"{class}\" data-event=\"{:016x}\">{} · {} on {}</li>",
        e.id,
        html::esc(&e.evidence),
        html::time(e.opened_unix_ms),
        html::esc(&e.instance)
    );
}

fn digest_href(view: &View, digest: u64, schema: &str) -> String {
    let hex = html::digest_hex(digest);
    let mut keep = vec![("id", hex.as_str())];
    if !schema.is_empty() {
        keep.push(("schema", schema));
    }
    view.link("/digest", &keep)
}

fn top_request(view: &View) -> TopRequest {
    TopRequest {
        instance: view.instance.clone().unwrap_or_default(),
        since_unix_ms: view.range.since_unix_ms,
        until_unix_ms: view.range.until_unix_ms,
        ..Default::default()
    }
}

/// What every time plot of the view marks: the markers people wrote and
/// the events the detection opened, of the view's instance (and the whole
/// fleet's markers) over the plot's range.
async fn marks(ui: &Ui, view: &View) -> Result<Vec<svg::Marker>, PageError> {
    let instance = view.instance.clone().unwrap_or_default();
    let (since_unix_ms, until_unix_ms) = (plot_since(view).max(0), view.range.until_unix_ms);
    let annotations = ui
        .annotations(AnnotationsRequest {
            instance: instance.clone(),
            since_unix_ms,
            until_unix_ms,
            limit: MAX_MARKS,
            id: 0,
        })
        .await?;
    let events = ui
        .events(EventsRequest {
            instance,
            since_unix_ms,
            until_unix_ms,
            open_only: false,
            limit: MAX_MARKS,
            kind: String::new(),
        })
        .await?;
    let mut out: Vec<svg::Marker> = annotations
        .into_iter()
        .map(|a| svg::Marker { at: a.at_unix_ms, label: format!("marker: {}", a.text), kind: MarkerKind::Annotation })
        .collect();
    out.extend(events.into_iter().map(|e| svg::Marker {
        at: e.opened_unix_ms,
        label: format!(
            "{} on {}: {} ({})",
            e.kind.replace('_', " "),
            e.instance,
            html::digest_hex(e.digest),
            e.evidence
        ),
        // A plan change is drawn as one, whoever recorded it.
        kind: if e.kind == "plan_changed" { MarkerKind::Plan } else { MarkerKind::Event },
    }));
    Ok(out)
}

/// The plots of a statement series: rate and errors, latency percentiles,
/// and the latency heatmap, each with `markers`.
fn statement_plots(view: &View, series: &SeriesResponse, markers: &[svg::Marker]) -> String {
    let (x0, x1) = plot_range(view, series);
    let mut out = String::from("<section class=\"plots\">");
    out.push_str(&svg::line_chart(
        "Rate",
        Unit::PerSecond,
        &[
            rate_line("statements/s", series, |p| p.count as f64 / seconds(p)),
            rate_line("errors/s", series, |p| p.errors as f64 / seconds(p)),
        ],
        markers,
        x0,
        x1,
    ));
    out.push_str(&svg::line_chart(
        "Latency percentiles",
        Unit::Nanos,
        &[
            line("p50", series, |p| p.p50_ns as f64),
            line("p95", series, |p| p.p95_ns as f64),
            line("p99", series, |p| p.p99_ns as f64),
        ],
        markers,
        x0,
        x1,
    ));
    out.push_str(&svg::heatmap("Latency heatmap", &heat_columns(series), markers, x0, x1));
    out.push_str("</section>");
    out
}

/// Findings as a list opened by `open` (a `<ul>` with its class and id):
/// what was seen, where, the suggestion and what to check first.
pub(super) fn finding_list(body: &mut String, open: &str, findings: &[sqlbee_proto::v1::Finding]) {
    body.push_str(open);
    for f in findings {
        let _ = write!(
            body,
            "<li data-kind=\"{}\"><strong>{}</strong> at <code>{}</code>: {}",
            html::esc(&f.kind),
            html::esc(&f.kind.replace('_', " ")),
            html::esc(&f.plan_line),
            html::esc(&f.detail)
        );
        if !f.suggestion.is_empty() {
            let _ = write!(body, "<br><code class=\"suggestion\">{}</code>", html::esc(&f.suggestion));
            if !f.check_first.is_empty() {
                let _ =
                    write!(body, "<br><small class=\"check-first\">Check first: {}</small>", html::esc(&f.check_first));
            }
        }
        body.push_str("</li>");
    }
    body.push_str("</ul>");
}
