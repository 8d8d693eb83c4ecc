//! Load averages from /proc/loadavg.

#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct LoadAverage {
    pub one: f64,
    pub five: f64,
    pub fifteen: f64,
}

/// `0.52 0.58 0.59 2/345 12345`; only the first three fields matter.
pub(super) fn parse_loadavg(text: &str) -> Option<LoadAverage> {
    let mut fields = text.split_whitespace().map(|f| f.parse::<f64>().ok().filter(|v| v.is_finite() && *v >= 0.0));
    Some(LoadAverage { one: fields.next()??, five: fields.next()??, fifteen: fields.next()?? })
}
