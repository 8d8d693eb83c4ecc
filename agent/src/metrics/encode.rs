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
}

impl MetricType {
    fn as_str(self) -> &'static str {
        match self {
            MetricType::Counter => "counter",
            MetricType::Gauge => "gauge",
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
        if !self.families.insert(name.clone()) {
            debug_assert!(false, "metric family {name} encoded twice");
            tracing::warn!(%name, "metric family encoded twice; dropping the second one");
            return Family { out: None, name };
        }
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
        let Some(out) = self.out.as_deref_mut() else { return self };
        out.push_str(&self.name);
        if !labels.is_empty() {
            out.push('{');
            for (i, (label, value)) in labels.iter().enumerate() {
                debug_assert!(valid_label_name(label), "invalid label name {label:?} on {}", self.name);
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
        self
    }
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
