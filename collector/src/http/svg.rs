//! Plots drawn on the server as inline SVG: line charts over time, a
//! latency heatmap and sparklines. Drawing on the server keeps the UI one
//! response per page, with no JavaScript library to vend, pin and audit,
//! and a plot costs the browser nothing to lay out. Colours come from
//! classes in the style sheet, so the content security policy can refuse
//! every inline style.
use std::fmt::Write;

use sqlbee_vocabulary::clock;

use super::html::{bytes, duration_ns, duration_short, esc, number};

const WIDTH: f64 = 760.0;
const HEIGHT: f64 = 210.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 14.0;
const TOP: f64 = 22.0;
const BOTTOM: f64 = 26.0;
/// Points above this many get no hover target each (the SVG would grow
/// without the reader gaining anything).
const MAX_TITLED_POINTS: usize = 400;

/// How a value on the y axis is written.
#[derive(Clone, Copy)]
pub enum Unit {
    Nanos,
    PerSecond,
    Cores,
    Bytes,
    Count,
}

impl Unit {
    pub fn format(self, v: f64) -> String {
        match self {
            Unit::Nanos => duration_ns(v),
            Unit::PerSecond => format!("{}/s", number(v)),
            Unit::Cores => format!("{} cores", number(v)),
            Unit::Bytes => bytes(v),
            Unit::Count => number(v),
        }
    }

    /// On an axis: the same, shorter.
    fn tick(self, v: f64) -> String {
        match self {
            Unit::Nanos => duration_short(v),
            unit => unit.format(v),
        }
    }
}

/// One line: a label, and a value per step (None: no data in that step,
/// drawn as a gap rather than a drop to zero).
pub struct Line {
    pub label: String,
    pub points: Vec<(i64, Option<f64>)>,
}

/// 1, 2 or 5 times a power of ten at or above `raw`.
fn nice_step(raw: f64) -> f64 {
    if raw <= 0.0 || !raw.is_finite() {
        return 1.0;
    }
    let power = 10f64.powf(raw.log10().floor());
    let fraction = raw / power;
    let nice = if fraction <= 1.0 {
        1.0
    } else if fraction <= 2.0 {
        2.0
    } else if fraction <= 5.0 {
        5.0
    } else {
        10.0
    };
    nice * power
}

fn time_label(ms: i64, span_ms: i64) -> String {
    let text = clock::rfc3339(clock::from_unix_ms(ms));
    // 2026-11-25T10:00:00.000Z
    if span_ms <= 2 * 86_400_000 { text[11..16].to_string() } else { format!("{} {}", &text[5..10], &text[11..16]) }
}

fn x_of(t: i64, x0: i64, x1: i64) -> f64 {
    LEFT + (t - x0) as f64 / (x1 - x0).max(1) as f64 * (WIDTH - LEFT - RIGHT)
}

fn open(out: &mut String, title: &str, class: &str) {
    let _ = write!(
        out,
        "<figure class=\"plot {class}\"><figcaption>{}</figcaption>\
         <svg viewBox=\"0 0 {WIDTH} {HEIGHT}\" role=\"img\" aria-label=\"{}\" xmlns=\"http://www.w3.org/2000/svg\">",
        esc(title),
        esc(title)
    );
}

fn empty(out: &mut String) {
    let _ = write!(
        out,
        "<text class=\"empty\" x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">no data in this range</text>",
        WIDTH / 2.0,
        HEIGHT / 2.0
    );
}

fn time_axis(out: &mut String, x0: i64, x1: i64) {
    let base = HEIGHT - BOTTOM;
    let _ = write!(out, "<line class=\"axis\" x1=\"{LEFT}\" y1=\"{base}\" x2=\"{}\" y2=\"{base}\"/>", WIDTH - RIGHT);
    for k in 0..=4 {
        let t = x0 + (x1 - x0) * k / 4;
        let x = x_of(t, x0, x1);
        let anchor = match k {
            0 => "start",
            4 => "end",
            _ => "middle",
        };
        let _ = write!(
            out,
            "<text class=\"tick\" x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"{anchor}\">{}</text>",
            base + 16.0,
            time_label(t, x1 - x0)
        );
    }
}

/// Something that happened at one time: a vertical line with its label.
pub struct Marker {
    pub at: i64,
    pub label: String,
    pub kind: MarkerKind,
}

/// What a marker stands for; each is drawn in its own colour.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MarkerKind {
    /// A plan change of the digest the page shows.
    Plan,
    /// A marker someone wrote (`sqlbee annotate`).
    Annotation,
    /// An event the collector's detection opened.
    Event,
}

impl MarkerKind {
    fn class(self) -> &'static str {
        match self {
            MarkerKind::Plan => "marker plan",
            MarkerKind::Annotation => "marker annotation",
            MarkerKind::Event => "marker event",
        }
    }
}

/// The markers in [x0, x1), over the plot's height.
fn draw_markers(out: &mut String, markers: &[Marker], x0: i64, x1: i64) {
    for marker in markers.iter().filter(|m| (x0..x1).contains(&m.at)) {
        let x = x_of(marker.at, x0, x1);
        let _ = write!(
            out,
            "<line class=\"{}\" x1=\"{x:.1}\" y1=\"{TOP}\" x2=\"{x:.1}\" y2=\"{:.1}\"><title>{}</title></line>",
            marker.kind.class(),
            HEIGHT - BOTTOM,
            esc(&marker.label)
        );
    }
}

/// Lines over the time range [x0, x1), y from zero, with the markers in
/// that range (every time plot takes them: markers and events belong on
/// all of them).
pub fn line_chart(title: &str, unit: Unit, lines: &[Line], markers: &[Marker], x0: i64, x1: i64) -> String {
    let mut out = String::new();
    open(&mut out, title, "lines");
    let max = lines.iter().flat_map(|l| l.points.iter().filter_map(|(_, v)| *v)).fold(0.0f64, f64::max);
    let step = nice_step(max / 4.0);
    let top = (max / step).ceil().max(1.0) * step;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let y_of = |v: f64| TOP + plot_h - v / top * plot_h;
    let mut tick = 0.0;
    while tick <= top + step / 2.0 {
        let y = y_of(tick);
        y_tick(&mut out, y, &esc(&unit.tick(tick)));
        tick += step;
    }
    time_axis(&mut out, x0, x1);
    let has_data = lines.iter().any(|l| l.points.iter().any(|(_, v)| v.is_some()));
    if !has_data {
        empty(&mut out);
    }
    for (n, line) in lines.iter().enumerate() {
        // A gap ends a run: each run is its own polyline.
        let mut runs: Vec<Vec<(f64, f64)>> = vec![Vec::new()];
        for (t, v) in &line.points {
            match v {
                Some(v) => runs.last_mut().expect("one run at least").push((x_of(*t, x0, x1), y_of(*v))),
                None if runs.last().is_some_and(|r| !r.is_empty()) => runs.push(Vec::new()),
                None => {}
            }
        }
        for run in runs.iter().filter(|r| !r.is_empty()) {
            if run.len() == 1 {
                let _ = write!(out, "<circle class=\"s{n}\" cx=\"{:.1}\" cy=\"{:.1}\" r=\"2\"/>", run[0].0, run[0].1);
                continue;
            }
            let points: Vec<String> = run.iter().map(|(x, y)| format!("{x:.1},{y:.1}")).collect();
            let _ = write!(out, "<polyline class=\"s{n}\" points=\"{}\"/>", points.join(" "));
        }
        let _ = write!(
            out,
            "<text class=\"legend s{n}\" x=\"{:.1}\" y=\"14\" text-anchor=\"end\">{}</text>",
            WIDTH - RIGHT - (lines.len() - 1 - n) as f64 * 90.0,
            esc(&line.label)
        );
    }
    draw_markers(&mut out, markers, x0, x1);
    // Hover targets: the value of every line at each step.
    let steps = lines.first().map_or(0, |l| l.points.len());
    if steps <= MAX_TITLED_POINTS && has_data {
        let width = (WIDTH - LEFT - RIGHT) / steps.max(1) as f64;
        for i in 0..steps {
            let t = lines[0].points[i].0;
            let values: Vec<String> = lines
                .iter()
                .filter_map(|l| l.points.get(i).map(|(_, v)| (l, v)))
                .map(|(l, v)| format!("{}: {}", l.label, v.map_or("-".into(), |v| unit.format(v))))
                .collect();
            let _ = write!(
                out,
                "<rect class=\"hover\" x=\"{:.1}\" y=\"{TOP}\" width=\"{width:.1}\" height=\"{plot_h:.1}\"><title>{} {}</title></rect>",
                x_of(t, x0, x1) - width / 2.0,
                esc(&time_label(t, 0)),
                esc(&values.join(", "))
            );
        }
    }
    out.push_str("</svg></figure>");
    out
}

/// One column of the heatmap: a step and its latency buckets (low ns,
/// high ns, statements).
pub struct Column {
    pub start: i64,
    pub end: i64,
    pub buckets: Vec<(u64, u64, u64)>,
}

/// Latency over time: one column per step, one cell per histogram bucket
/// on a log scale, darker for more statements; markers over it.
pub fn heatmap(title: &str, columns: &[Column], markers: &[Marker], x0: i64, x1: i64) -> String {
    let mut out = String::new();
    open(&mut out, title, "heatmap");
    let cells = columns.iter().flat_map(|c| c.buckets.iter());
    let low = cells.clone().map(|b| b.0.max(1)).min().unwrap_or(1_000) as f64;
    let high = cells.clone().map(|b| b.1.max(2)).max().unwrap_or(1_000_000_000) as f64;
    let most = cells.map(|b| b.2).max().unwrap_or(0);
    let (lo, hi) = (low.log10().floor(), high.log10().ceil().max(low.log10().floor() + 1.0));
    let plot_h = HEIGHT - TOP - BOTTOM;
    let y_of = |ns: f64| TOP + plot_h - (ns.max(1.0).log10() - lo) / (hi - lo) * plot_h;
    let mut decade = lo;
    while decade <= hi {
        let y = y_of(10f64.powf(decade));
        y_tick(&mut out, y, &duration_short(10f64.powf(decade)));
        decade += 1.0;
    }
    time_axis(&mut out, x0, x1);
    if most == 0 {
        empty(&mut out);
    }
    for column in columns {
        let (xa, xb) = (x_of(column.start, x0, x1), x_of(column.end, x0, x1));
        for &(low, high, count) in column.buckets.iter().filter(|b| b.2 > 0) {
            let (ya, yb) = (y_of(high as f64), y_of(low as f64));
            // Five shades on a log scale of the count: one slow statement
            // must stay visible next to a million fast ones.
            let shade = 1 + ((count as f64).ln() / (most.max(2) as f64).ln() * 4.0).round() as u32;
            let _ = write!(
                out,
                "<rect class=\"h{}\" x=\"{xa:.1}\" y=\"{ya:.1}\" width=\"{:.1}\" height=\"{:.1}\">\
                 <title>{}: {} – {}: {count} statements</title></rect>",
                shade.min(5),
                (xb - xa).max(1.0),
                (yb - ya).max(1.0),
                esc(&time_label(column.start, 0)),
                duration_ns(low as f64),
                duration_ns(high as f64),
            );
        }
    }
    draw_markers(&mut out, markers, x0, x1);
    out.push_str("</svg></figure>");
    out
}

/// A small line without axes, for a table row.
pub fn sparkline(values: &[f64]) -> String {
    const W: f64 = 120.0;
    const H: f64 = 24.0;
    let max = values.iter().copied().fold(0.0f64, f64::max);
    if values.len() < 2 || max <= 0.0 {
        return format!(
            "<svg class=\"spark\" viewBox=\"0 0 {W} {H}\" aria-hidden=\"true\"><line class=\"flat\" x1=\"0\" y1=\"{}\" x2=\"{W}\" y2=\"{}\"/></svg>",
            H - 1.0,
            H - 1.0
        );
    }
    let points: Vec<String> = values
        .iter()
        .enumerate()
        .map(|(i, v)| format!("{:.1},{:.1}", i as f64 / (values.len() - 1) as f64 * W, H - 1.0 - v / max * (H - 2.0)))
        .collect();
    format!(
        "<svg class=\"spark\" viewBox=\"0 0 {W} {H}\" aria-hidden=\"true\"><polyline points=\"{}\"/></svg>",
        points.join(" ")
    )
}

/// A horizontal grid line at `y` with its label (already escaped) left of
/// the plot.
fn y_tick(out: &mut String, y: f64, label: &str) {
    let _ = write!(
        out,
        "<line class=\"grid\" x1=\"{LEFT}\" y1=\"{y:.1}\" x2=\"{}\" y2=\"{y:.1}\"/>\
         <text class=\"tick\" x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{label}</text>",
        WIDTH - RIGHT,
        LEFT - 6.0,
        y + 4.0,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_are_round() {
        assert_eq!(nice_step(0.3), 0.5);
        assert_eq!(nice_step(7.0), 10.0);
        assert_eq!(nice_step(1200.0), 2000.0);
    }

    #[test]
    fn gaps_split_lines_and_text_is_escaped() {
        let line = Line {
            label: "<p99>".into(),
            points: vec![(0, Some(1.0)), (10, Some(2.0)), (20, None), (30, Some(3.0)), (40, Some(1.0))],
        };
        let marker = Marker { at: 25, label: "deploy <v2>".into(), kind: MarkerKind::Annotation };
        let svg = line_chart("t & t", Unit::Count, &[line], &[marker], 0, 50);
        assert!(svg.contains("class=\"marker annotation\"") && svg.contains("deploy &lt;v2&gt;"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.contains("&lt;p99&gt;") && svg.contains("t &amp; t"));
        assert!(!svg.contains("<p99>"));
    }
}
