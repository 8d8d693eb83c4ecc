//! What a page or an `/api/` call asks for, read from its URL. The time
//! range and the instance filter live in the URL, so a link shows the same
//! view to whoever opens it. Pure: text in, values out.
use sqlbee_vocabulary::duration;

#[derive(Debug, thiserror::Error)]
#[error("{name}={value:?}: {expected}")]
pub struct BadParam {
    pub name: &'static str,
    pub value: String,
    pub expected: &'static str,
}

/// A URL's query string, decoded. A name given twice keeps its first value.
#[derive(Debug, Default)]
pub struct Params(Vec<(String, String)>);

impl Params {
    pub fn parse(query: &str) -> Params {
        Params(
            query
                .split('&')
                .filter(|pair| !pair.is_empty())
                .map(|pair| {
                    let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
                    (decode(name), decode(value))
                })
                .collect(),
        )
    }

    /// Every name given, in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(|(name, _)| name.as_str())
    }

    /// The value of `name`; an empty value counts as absent, as an empty
    /// form field does.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0.iter().find(|(n, v)| n == name && !v.is_empty()).map(|(_, v)| v.as_str())
    }
}

fn hex(b: u8) -> Option<u8> {
    (b as char).to_digit(16).map(|d| d as u8)
}

/// Percent-decoding with `+` as a space (form encoding). A broken escape
/// stays as written, and invalid UTF-8 becomes U+FFFD: a filter that
/// matches nothing, never an error page over one byte.
pub fn decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => match (bytes.get(i + 1).copied().and_then(hex), bytes.get(i + 2).copied().and_then(hex)) {
                (Some(hi), Some(lo)) => {
                    out.push(hi << 4 | lo);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Percent-encoding for a query-string value: everything but unreserved
/// characters.
pub fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The time range of a view: `since` and `until` as the user wrote them
/// (kept for links, so "last hour" stays the last hour on reload) and as
/// milliseconds since the epoch.
#[derive(Clone, Debug)]
pub struct Range {
    pub since: String,
    pub until: String,
    pub since_unix_ms: i64,
    /// 0: now (the query API's "no end").
    pub until_unix_ms: i64,
    /// The end used to lay out plots and rates: `until_unix_ms`, or now.
    pub end_unix_ms: i64,
}

pub const DEFAULT_SINCE: &str = "1h";
/// The ranges the page header offers.
pub const PRESETS: [&str; 6] = ["15m", "1h", "6h", "24h", "7d", "30d"];

impl Range {
    pub fn from(params: &Params, now_unix_ms: i64) -> Result<Range, BadParam> {
        let since = params.get("since").unwrap_or(DEFAULT_SINCE).to_string();
        let until = params.get("until").unwrap_or("now").to_string();
        let since_unix_ms = match since.as_str() {
            "all" => 0,
            text => duration::unix_ms_ago(text, now_unix_ms).map_err(|_| BadParam {
                name: "since",
                value: since.clone(),
                expected: "a duration ago (15m, 1h, 7d), `all`, or milliseconds since the epoch",
            })?,
        };
        let until_unix_ms = match until.as_str() {
            "now" => 0,
            text => duration::unix_ms_ago(text, now_unix_ms).map_err(|_| BadParam {
                name: "until",
                value: until.clone(),
                expected: "`now`, a duration ago (15m, 1h, 7d), or milliseconds since the epoch",
            })?,
        };
        if until_unix_ms != 0 && until_unix_ms <= since_unix_ms {
            return Err(BadParam { name: "until", value: until, expected: "a time after `since`" });
        }
        let end_unix_ms = if until_unix_ms == 0 { now_unix_ms } else { until_unix_ms };
        Ok(Range { since, until, since_unix_ms, until_unix_ms, end_unix_ms })
    }
}

/// What every page keeps across links: the range and the instance filter.
#[derive(Clone, Debug)]
pub struct View {
    pub range: Range,
    pub instance: Option<String>,
}

impl View {
    pub fn from(params: &Params, now_unix_ms: i64) -> Result<View, BadParam> {
        Ok(View { range: Range::from(params, now_unix_ms)?, instance: params.get("instance").map(str::to_string) })
    }

    /// A link to `path` with this view and `extra` parameters (an empty
    /// value drops the parameter).
    pub fn link(&self, path: &str, extra: &[(&str, &str)]) -> String {
        self.link_with(path, &self.range.since, &self.range.until, self.instance.as_deref(), extra)
    }

    /// The same link with another range.
    pub fn link_range(&self, path: &str, since: &str, extra: &[(&str, &str)]) -> String {
        self.link_with(path, since, "now", self.instance.as_deref(), extra)
    }

    fn link_with(
        &self,
        path: &str,
        since: &str,
        until: &str,
        instance: Option<&str>,
        extra: &[(&str, &str)],
    ) -> String {
        let mut pairs: Vec<(&str, &str)> = vec![("since", since)];
        if until != "now" {
            pairs.push(("until", until));
        }
        if let Some(instance) = instance {
            pairs.push(("instance", instance));
        }
        pairs.extend(extra.iter().filter(|(_, v)| !v.is_empty()));
        let query: Vec<String> = pairs.iter().map(|(n, v)| format!("{n}={}", encode(v))).collect();
        format!("{path}?{}", query.join("&"))
    }
}

/// A digest id as pages write it: 16 hex digits.
pub fn digest_id(params: &Params) -> Result<u64, BadParam> {
    let text = params.get("id").unwrap_or("");
    u64::from_str_radix(text, 16).ok().filter(|d| *d != 0 && text.len() <= 16).ok_or_else(|| BadParam {
        name: "id",
        value: text.to_string(),
        expected: "a digest id: 16 hex digits, as the top page links it",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decoding_keeps_what_it_cannot_decode() {
        assert_eq!(decode("a%20b+c"), "a b c");
        assert_eq!(decode("100%"), "100%");
        assert_eq!(decode("%zz%4"), "%zz%4");
        assert_eq!(decode("%C3%A9"), "é");
        assert_eq!(decode("%FF"), "\u{FFFD}");
        assert_eq!(decode(&encode("db-1:3306 & more/é")), "db-1:3306 & more/é");
    }

    #[test]
    fn ranges_from_urls() {
        let now = 10_000_000;
        let r = Range::from(&Params::parse("since=1h"), now).unwrap();
        assert_eq!((r.since_unix_ms, r.until_unix_ms, r.end_unix_ms), (now - 3_600_000, 0, now));
        let r = Range::from(&Params::parse("since=1000&until=5000"), now).unwrap();
        assert_eq!((r.since_unix_ms, r.until_unix_ms), (1000, 5000));
        assert!(Range::from(&Params::parse("since=5000&until=1000"), now).is_err());
        assert!(Range::from(&Params::parse("since=yesterday"), now).is_err());
        assert_eq!(Range::from(&Params::parse(""), now).unwrap().since, "1h");
    }

    #[test]
    fn links_keep_the_view() {
        let view = View::from(&Params::parse("since=7d&instance=db%3A3306"), 100_000_000_000).unwrap();
        assert_eq!(
            view.link("/top", &[("order", "p99"), ("schema", "")]),
            "/top?since=7d&instance=db%3A3306&order=p99"
        );
        assert_eq!(view.link_range("/", "1h", &[]), "/?since=1h&instance=db%3A3306");
    }

    #[test]
    fn digest_ids() {
        assert_eq!(digest_id(&Params::parse("id=00000000000000ff")).unwrap(), 255);
        assert!(digest_id(&Params::parse("id=0")).is_err());
        assert!(digest_id(&Params::parse("id=xyz")).is_err());
        assert!(digest_id(&Params::parse("id=10000000000000000")).is_err());
    }
}
