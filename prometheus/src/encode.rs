//! Prometheus text exposition format 0.0.4.
//!
//! Metric and label names come from our own code, so an invalid one is a
//! bug: debug builds stop on it, release builds repair it so a scrape never
//! fails over one name. Label values and HELP text may carry anything
//! (digest text, paths) and are escaped.
use std::{collections::HashSet, fmt::Write};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricType {
    /// Only goes up (resets when the agent restarts); name it `..._total`.
    Counter,
    Gauge,
    /// Cumulative `_bucket{le}` series ending in `+Inf`, then `_sum` and
    /// `_count`; add its samples with `Family::histogram`.
    Histogram,
}

impl MetricType {
    fn as_str(self) -> &'static str {
        match self {
            MetricType::Counter => "counter",
            MetricType::Gauge => "gauge",
            MetricType::Histogram => "histogram",
        }
    }
}

/// Builds one exposition body.
#[derive(Default)]
pub struct Encoder {
    out: String,
    families: HashSet<String>,
}

impl Encoder {
    pub fn new() -> Encoder {
        Encoder::default()
    }

    /// Starts a family: its HELP and TYPE lines, then the samples added to
    /// the returned `Family`. Each name may appear once per body; a second
    /// family of the same name is dropped (Prometheus would reject the
    /// whole scrape).
    pub fn family(&mut self, name: &str, help: &str, kind: MetricType) -> Family<'_> {
        debug_assert!(valid_metric_name(name), "invalid metric name {name:?}");
        let name = sanitize(name, true);
        // A histogram's series names would clash with families named like
        // them, which Prometheus also refuses.
        let taken = match kind {
            MetricType::Histogram => ["", "_bucket", "_sum", "_count"].iter().map(|s| format!("{name}{s}")).collect(),
            _ => vec![name.clone()],
        };
        if taken.iter().any(|n| self.families.contains(n)) {
            debug_assert!(false, "metric family {name} encoded twice");
            tracing::warn!(%name, "metric family encoded twice; dropping the second one");
            return Family { out: None, name };
        }
        self.families.extend(taken);
        let _ = writeln!(self.out, "# HELP {name} {}", escape(help, false));
        let _ = writeln!(self.out, "# TYPE {name} {}", kind.as_str());
        Family { out: Some(&mut self.out), name }
    }

    pub fn finish(self) -> String {
        self.out
    }
}

/// The samples of one family, written as they are added so they stay
/// together, as the format requires.
pub struct Family<'a> {
    out: Option<&'a mut String>,
    name: String,
}

impl Family<'_> {
    /// One sample: `name{labels} value`. Label names must be valid and
    /// distinct; values are escaped.
    pub fn sample(&mut self, labels: &[(&str, &str)], value: impl SampleValue) -> &mut Self {
        if let Some(out) = self.out.as_deref_mut() {
            line(out, &self.name, "", labels, None, &value);
        }
        self
    }

    /// One histogram of a `MetricType::Histogram` family: `buckets` are
    /// (upper bound, count of values at or below it), bounds increasing and
    /// counts cumulative; the `+Inf` bucket is `count` and is written here.
    /// `le` is the bound exactly as given, so a caller whose data cannot
    /// answer for a bound must not offer it (see `agent_metrics`).
    pub fn histogram(&mut self, labels: &[(&str, &str)], buckets: &[(f64, u64)], sum: f64, count: u64) -> &mut Self {
        debug_assert!(
            buckets.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1)
                && buckets.last().is_none_or(|b| b.1 <= count),
            "histogram {} is not cumulative over increasing bounds: {buckets:?} of {count}",
            self.name
        );
        let Some(out) = self.out.as_deref_mut() else { return self };
        let mut le = String::new();
        for (bound, cumulative) in buckets.iter().copied().chain([(f64::INFINITY, count)]) {
            le.clear();
            // Plain decimals (Display), not the exponent form small
            // samples get: `le` is a label, read by people as well.
            let _ = if bound.is_finite() { write!(le, "{bound}") } else { write!(le, "+Inf") };
            line(out, &self.name, "_bucket", labels, Some(&le), &cumulative);
        }
        line(out, &self.name, "_sum", labels, None, &sum);
        line(out, &self.name, "_count", labels, None, &count);
        self
    }
}

/// `name{labels[,le]} value`, for a plain sample or one series of a
/// histogram.
fn line(
    out: &mut String,
    name: &str,
    suffix: &str,
    labels: &[(&str, &str)],
    le: Option<&str>,
    value: &dyn SampleValue,
) {
    out.push_str(name);
    out.push_str(suffix);
    let le = le.map(|le| ("le", le));
    if !labels.is_empty() || le.is_some() {
        out.push('{');
        for (i, (label, value)) in labels.iter().chain(le.as_ref()).enumerate() {
            debug_assert!(valid_label_name(label), "invalid label name {label:?} on {name}");
            debug_assert!(
                le.is_none() || i == labels.len() || *label != "le",
                "a histogram's own label `le` given on {name}"
            );
            if i > 0 {
                out.push(',');
            }
            out.push_str(&sanitize(label, false));
            out.push_str("=\"");
            out.push_str(&escape(value, true));
            out.push('"');
        }
        out.push('}');
    }
    out.push(' ');
    value.write_to(out);
    out.push('\n');
}

/// A number as the format spells it.
pub trait SampleValue {
    fn write_to(&self, out: &mut String);
}

impl SampleValue for f64 {
    fn write_to(&self, out: &mut String) {
        // Debug keeps every digit needed to read the same float back and
        // switches to exponent notation for very large or small values;
        // only the infinities are spelled differently from Go's parser.
        let _ = match *self {
            f64::INFINITY => write!(out, "+Inf"),
            f64::NEG_INFINITY => write!(out, "-Inf"),
            v => write!(out, "{v:?}"),
        };
    }
}

macro_rules! integer_value {
    ($($t:ty),*) => {$(
        impl SampleValue for $t {
            fn write_to(&self, out: &mut String) {
                let _ = write!(out, "{self}");
            }
        }
    )*};
}
integer_value!(u64, u32, usize, i64, i32);

/// HELP text escapes backslash and newline; label values also escape the
/// double quote that would end them.
fn escape(text: &str, quote: bool) -> std::borrow::Cow<'_, str> {
    if !text.contains(['\\', '\n']) && !(quote && text.contains('"')) {
        return text.into();
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '"' if quote => out.push_str("\\\""),
            c => out.push(c),
        }
    }
    out.into()
}

/// `[a-zA-Z_:][a-zA-Z0-9_:]*`; label names are the same without `:`.
fn valid_name_char(c: char, first: bool, colon: bool) -> bool {
    c.is_ascii_alphabetic() || c == '_' || (colon && c == ':') || (!first && c.is_ascii_digit())
}

fn valid_metric_name(name: &str) -> bool {
    !name.is_empty() && name.chars().enumerate().all(|(i, c)| valid_name_char(c, i == 0, true))
}

/// Names starting with `__` are reserved for Prometheus itself.
fn valid_label_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with("__")
        && name.chars().enumerate().all(|(i, c)| valid_name_char(c, i == 0, false))
}

/// Every invalid character becomes `_`, and a name that would start with a
/// digit gets a `_` in front.
fn sanitize(name: &str, colon: bool) -> String {
    let mut out = String::with_capacity(name.len() + 1);
    if name.is_empty() || name.starts_with(|c: char| c.is_ascii_digit()) {
        out.push('_');
    }
    out.extend(name.chars().map(|c| if valid_name_char(c, false, colon) { c } else { '_' }));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_output() {
        let mut enc = Encoder::new();
        enc.family("sqlbee_statements_total", "Statements seen.", MetricType::Counter)
            .sample(&[("instance", "db1:3306"), ("command", "select")], 42u64)
            .sample(&[("instance", "db1:3306"), ("command", "insert")], 7u64);
        enc.family("sqlbee_host_load1", "Load average over 1 minute.", MetricType::Gauge).sample(&[], 0.52);
        enc.family("sqlbee_odd_values", "Floats as Prometheus reads them.", MetricType::Gauge)
            .sample(&[("v", "one")], 1.0)
            .sample(&[("v", "big")], 1e300)
            .sample(&[("v", "inf")], f64::INFINITY)
            .sample(&[("v", "-inf")], f64::NEG_INFINITY)
            .sample(&[("v", "nan")], f64::NAN)
            .sample(&[("v", "neg")], -3i64);
        assert_eq!(
            enc.finish(),
            "# HELP sqlbee_statements_total Statements seen.\n\
             # TYPE sqlbee_statements_total counter\n\
             sqlbee_statements_total{instance=\"db1:3306\",command=\"select\"} 42\n\
             sqlbee_statements_total{instance=\"db1:3306\",command=\"insert\"} 7\n\
             # HELP sqlbee_host_load1 Load average over 1 minute.\n\
             # TYPE sqlbee_host_load1 gauge\n\
             sqlbee_host_load1 0.52\n\
             # HELP sqlbee_odd_values Floats as Prometheus reads them.\n\
             # TYPE sqlbee_odd_values gauge\n\
             sqlbee_odd_values{v=\"one\"} 1.0\n\
             sqlbee_odd_values{v=\"big\"} 1e300\n\
             sqlbee_odd_values{v=\"inf\"} +Inf\n\
             sqlbee_odd_values{v=\"-inf\"} -Inf\n\
             sqlbee_odd_values{v=\"nan\"} NaN\n\
             sqlbee_odd_values{v=\"neg\"} -3\n"
        );
    }

    #[test]
    fn histograms_end_in_inf_then_sum_and_count() {
        let mut enc = Encoder::new();
        enc.family("sqlbee_latency_seconds", "Latency.", MetricType::Histogram)
            .histogram(&[("instance", "db1:3306")], &[(0.000098303, 3), (0.25, 5)], 1.5, 6)
            .histogram(&[], &[(0.25, 0)], 0.0, 0);
        assert_eq!(
            enc.finish(),
            "# HELP sqlbee_latency_seconds Latency.\n\
             # TYPE sqlbee_latency_seconds histogram\n\
             sqlbee_latency_seconds_bucket{instance=\"db1:3306\",le=\"0.000098303\"} 3\n\
             sqlbee_latency_seconds_bucket{instance=\"db1:3306\",le=\"0.25\"} 5\n\
             sqlbee_latency_seconds_bucket{instance=\"db1:3306\",le=\"+Inf\"} 6\n\
             sqlbee_latency_seconds_sum{instance=\"db1:3306\"} 1.5\n\
             sqlbee_latency_seconds_count{instance=\"db1:3306\"} 6\n\
             sqlbee_latency_seconds_bucket{le=\"0.25\"} 0\n\
             sqlbee_latency_seconds_bucket{le=\"+Inf\"} 0\n\
             sqlbee_latency_seconds_sum 0.0\n\
             sqlbee_latency_seconds_count 0\n"
        );
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "not cumulative")]
    fn a_histogram_that_is_not_cumulative_is_a_bug() {
        let mut enc = Encoder::new();
        enc.family("h", "h", MetricType::Histogram).histogram(&[], &[(0.1, 5), (0.2, 3)], 1.0, 5);
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "encoded twice")]
    fn a_family_named_like_a_histogram_series_is_a_bug() {
        let mut enc = Encoder::new();
        enc.family("h", "h", MetricType::Histogram);
        enc.family("h_count", "h", MetricType::Gauge);
    }

    #[test]
    fn label_values_and_help_are_escaped() {
        let mut enc = Encoder::new();
        enc.family("sqlbee_digest_info", "Digest \"text\" with a \\ and\na newline.", MetricType::Gauge)
            .sample(&[("digest", "SELECT \"a\\b\"\nFROM t"), ("schema", "plain")], 1u32);
        assert_eq!(
            enc.finish(),
            "# HELP sqlbee_digest_info Digest \"text\" with a \\\\ and\\na newline.\n\
             # TYPE sqlbee_digest_info gauge\n\
             sqlbee_digest_info{digest=\"SELECT \\\"a\\\\b\\\"\\nFROM t\",schema=\"plain\"} 1\n"
        );
    }

    #[test]
    fn names_are_validated_and_sanitized() {
        assert!(valid_metric_name("sqlbee:rate_5m"));
        assert!(valid_metric_name("_x1"));
        assert!(!valid_metric_name("1x"));
        assert!(!valid_metric_name("a-b"));
        assert!(!valid_metric_name(""));
        assert!(valid_label_name("instance"));
        assert!(!valid_label_name("a:b"));
        assert!(!valid_label_name("__name__"));
        assert_eq!(sanitize("1st-metric.value", true), "_1st_metric_value");
        assert_eq!(sanitize("a:b", false), "a_b");
        assert_eq!(sanitize("a:b", true), "a:b");
        assert_eq!(sanitize("", true), "_");
        assert_eq!(sanitize("héllo", true), "h_llo");
    }

    #[test]
    #[cfg(not(debug_assertions))]
    fn a_repeated_family_is_dropped_in_release() {
        let mut enc = Encoder::new();
        enc.family("x", "first", MetricType::Gauge).sample(&[], 1u64);
        enc.family("x", "second", MetricType::Gauge).sample(&[], 2u64);
        assert_eq!(enc.finish(), "# HELP x first\n# TYPE x gauge\nx 1\n");
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "encoded twice")]
    fn a_repeated_family_is_a_bug() {
        let mut enc = Encoder::new();
        enc.family("x", "first", MetricType::Gauge);
        enc.family("x", "second", MetricType::Gauge);
    }
}
