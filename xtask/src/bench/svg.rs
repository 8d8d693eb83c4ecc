//! A tiny SVG chart: named series of (x, y) points drawn as lines or as
//! scatter dots, linear axes with round ticks (or a log2 x axis for thread
//! counts), and a legend. Enough for the benchmark's plots, without a
//! plotting dependency. Pure: it returns text and writes nothing.
use std::fmt::Write as _;

pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
    /// Index into the palette, so a series keeps its colour across charts.
    pub color: usize,
}

pub struct Chart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    /// Log2 x axis with a tick at every x in the data (thread counts).
    pub x_log2: bool,
    /// Join each series' points in x order; otherwise a scatter plot.
    pub lines: bool,
    pub series: Vec<Series>,
}

const WIDTH: f64 = 720.0;
const HEIGHT: f64 = 420.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 190.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 56.0;
const COLORS: [&str; 10] =
    ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// Round tick positions covering `lo..=hi`, about five of them.
fn ticks(lo: f64, hi: f64) -> Vec<f64> {
    let raw = (hi - lo) / 5.0;
    let magnitude = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0].iter().map(|m| m * magnitude).find(|s| raw <= *s).unwrap_or(10.0 * magnitude);
    let mut v = (lo / step).ceil() * step;
    let mut out = Vec::new();
    while v <= hi + step * 1e-9 {
        out.push(v);
        v += step;
    }
    out
}

fn label(v: f64) -> String {
    let a = v.abs();
    if a >= 1000.0 {
        let k = format!("{:.1}", v / 1000.0);
        format!("{}k", k.trim_end_matches(".0"))
    } else if a >= 100.0 || v == v.round() {
        format!("{v:.0}")
    } else if a >= 1.0 {
        format!("{v:.1}")
    } else {
        let s = format!("{v:.4}");
        s.trim_end_matches('0').to_string()
    }
}

impl Chart {
    pub fn render(&self) -> String {
        let points: Vec<(f64, f64)> = self
            .series
            .iter()
            .flat_map(|s| s.points.iter().copied())
            .filter(|(x, y)| x.is_finite() && y.is_finite())
            .collect();
        let fx = |x: f64| if self.x_log2 { x.max(f64::MIN_POSITIVE).log2() } else { x };
        let (mut x_lo, mut x_hi) =
            points.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), p| (lo.min(fx(p.0)), hi.max(fx(p.0))));
        let y_hi = points.iter().fold(0.0f64, |hi, p| hi.max(p.1));
        if points.is_empty() {
            (x_lo, x_hi) = (0.0, 1.0);
        }
        if x_hi - x_lo < 1e-12 {
            (x_lo, x_hi) = (x_lo - 1.0, x_hi + 1.0);
        } else {
            let pad = (x_hi - x_lo) * 0.05;
            (x_lo, x_hi) = (x_lo - pad, x_hi + pad);
        }
        let y_hi = if y_hi > 0.0 { y_hi * 1.08 } else { 1.0 };
        let (plot_w, plot_h) = (WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM);
        let sx = |x: f64| LEFT + (fx(x) - x_lo) / (x_hi - x_lo) * plot_w;
        let sy = |y: f64| TOP + plot_h - y / y_hi * plot_h;

        let mut svg = String::new();
        let _ = writeln!(
            svg,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{HEIGHT}\" viewBox=\"0 0 {WIDTH} {HEIGHT}\" \
             font-family=\"sans-serif\" font-size=\"12\">"
        );
        let _ = writeln!(svg, "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>");
        let _ = writeln!(
            svg,
            "<text x=\"{}\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">{}</text>",
            LEFT + plot_w / 2.0,
            escape(&self.title)
        );

        // Grid and tick labels.
        for y in ticks(0.0, y_hi) {
            let py = sy(y);
            let _ = writeln!(
                svg,
                "<line x1=\"{LEFT}\" y1=\"{py:.1}\" x2=\"{:.1}\" y2=\"{py:.1}\" stroke=\"#e4e4e4\"/>",
                LEFT + plot_w
            );
            let _ = writeln!(
                svg,
                "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
                LEFT - 6.0,
                py + 4.0,
                label(y)
            );
        }
        let x_ticks: Vec<f64> = if self.x_log2 {
            let mut xs: Vec<f64> = points.iter().map(|p| p.0).collect();
            xs.sort_by(f64::total_cmp);
            xs.dedup();
            xs
        } else {
            ticks(x_lo, x_hi)
        };
        for x in x_ticks {
            let px = sx(x);
            let _ = writeln!(
                svg,
                "<line x1=\"{px:.1}\" y1=\"{TOP}\" x2=\"{px:.1}\" y2=\"{:.1}\" stroke=\"#e4e4e4\"/>",
                TOP + plot_h
            );
            let _ = writeln!(
                svg,
                "<text x=\"{px:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
                TOP + plot_h + 16.0,
                label(x)
            );
        }
        let _ = writeln!(
            svg,
            "<rect x=\"{LEFT}\" y=\"{TOP}\" width=\"{plot_w:.1}\" height=\"{plot_h:.1}\" fill=\"none\" stroke=\"#444\"/>"
        );
        let _ = writeln!(
            svg,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
            LEFT + plot_w / 2.0,
            HEIGHT - 14.0,
            escape(&self.x_label)
        );
        let _ = writeln!(
            svg,
            "<text transform=\"translate(18 {:.1}) rotate(-90)\" text-anchor=\"middle\">{}</text>",
            TOP + plot_h / 2.0,
            escape(&self.y_label)
        );

        // Series, then the legend on the right.
        for (i, series) in self.series.iter().enumerate() {
            let color = COLORS[series.color % COLORS.len()];
            let mut pts: Vec<(f64, f64)> =
                series.points.iter().copied().filter(|(x, y)| x.is_finite() && y.is_finite()).collect();
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            if self.lines && pts.len() > 1 {
                let path: Vec<String> = pts.iter().map(|&(x, y)| format!("{:.1},{:.1}", sx(x), sy(y))).collect();
                let _ = writeln!(
                    svg,
                    "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"2\" points=\"{}\"/>",
                    path.join(" ")
                );
            }
            for &(x, y) in &pts {
                let _ = writeln!(svg, "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3.5\" fill=\"{color}\"/>", sx(x), sy(y));
            }
            let ly = TOP + 8.0 + i as f64 * 18.0;
            let lx = LEFT + plot_w + 14.0;
            let _ = writeln!(
                svg,
                "<rect x=\"{lx:.1}\" y=\"{:.1}\" width=\"12\" height=\"12\" fill=\"{color}\"/>",
                ly - 10.0
            );
            let _ = writeln!(svg, "<text x=\"{:.1}\" y=\"{ly:.1}\">{}</text>", lx + 18.0, escape(&series.name));
        }
        if points.is_empty() {
            let _ = writeln!(
                svg,
                "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" fill=\"#888\">no data</text>",
                LEFT + plot_w / 2.0,
                TOP + plot_h / 2.0
            );
        }
        svg.push_str("</svg>\n");
        svg
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round() {
        assert_eq!(ticks(0.0, 10.0), vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
        assert_eq!(ticks(0.0, 23_000.0), vec![0.0, 5000.0, 10_000.0, 15_000.0, 20_000.0]);
        assert_eq!(
            (label(2500.0), label(10_000.0), label(0.05), label(12.5)),
            ("2.5k".into(), "10k".into(), "0.05".into(), "12.5".into())
        );
    }

    #[test]
    fn a_chart_is_well_formed_even_when_empty() {
        let chart = Chart {
            title: "QPS <by> threads".into(),
            x_label: "threads".into(),
            y_label: "QPS".into(),
            x_log2: true,
            lines: true,
            series: vec![Series {
                name: "control".into(),
                points: vec![(1.0, 100.0), (4.0, 300.0), (16.0, 350.0)],
                color: 0,
            }],
        };
        let svg = chart.render();
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        assert!(svg.contains("&lt;by&gt;") && svg.contains("<polyline"));
        let empty = Chart { series: Vec::new(), ..chart }.render();
        assert!(empty.contains("no data"));
    }
}
