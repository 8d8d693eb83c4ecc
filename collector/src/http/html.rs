//! The page shell (header, navigation, range and instance pickers) and the
//! way every page writes text and numbers. Everything that comes from the
//! store or the URL goes through `esc`: digest texts, samples, instance
//! names and error messages are data, never markup.
use std::fmt::Write;

use sqlbee_vocabulary::clock;

use super::params::{PRESETS, View};

/// HTML-escapes text for element content and quoted attribute values.
pub fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A latency: ns as the unit that keeps three significant digits.
pub fn duration_ns(ns: f64) -> String {
    match ns {
        ns if ns <= 0.0 => "0".into(),
        ns if ns < 1e3 => format!("{ns:.0} ns"),
        ns if ns < 1e6 => format!("{:.3} us", ns / 1e3),
        ns if ns < 1e9 => format!("{:.3} ms", ns / 1e6),
        ns if ns < 60e9 => format!("{:.3} s", ns / 1e9),
        ns if ns < 3600e9 => format!("{:.1} min", ns / 60e9),
        ns => format!("{:.1} h", ns / 3600e9),
    }
}

/// A latency for an axis: as `duration_ns`, without trailing zeros.
pub fn duration_short(ns: f64) -> String {
    let long = duration_ns(ns);
    match long.split_once(' ') {
        Some((number, unit)) if number.contains('.') => {
            format!("{} {unit}", number.trim_end_matches('0').trim_end_matches('.'))
        }
        _ => long,
    }
}

/// A count, exact, grouped by thousands with thin spaces (tests and
/// scripts read the exact figure from the row's data attributes).
pub fn count(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() * 2);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push('\u{2009}');
        }
        out.push(c);
    }
    out
}

/// A float with a unit prefix (k, M, G) and three significant digits.
pub fn number(v: f64) -> String {
    let a = v.abs();
    if a == 0.0 {
        "0".into()
    } else if a >= 1e9 {
        format!("{:.2}G", v / 1e9)
    } else if a >= 1e6 {
        format!("{:.2}M", v / 1e6)
    } else if a >= 1e4 {
        format!("{:.1}k", v / 1e3)
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.4}")
    }
}

pub fn bytes(b: f64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 { format!("{v:.0} B") } else { format!("{v:.1} {}", UNITS[unit]) }
}

/// A UTC time, seconds precision; `-` for none.
pub fn time(ms: i64) -> String {
    if ms <= 0 {
        return "-".into();
    }
    let text = clock::rfc3339(clock::from_unix_ms(ms));
    // 2026-11-25T10:00:00.123Z -> 2026-11-25 10:00:00Z
    let mut short: String = text.chars().take(19).collect();
    short = short.replacen('T', " ", 1);
    short.push('Z');
    short
}

/// How long ago, in the largest unit that fits.
pub fn ago(ms: i64, now_unix_ms: i64) -> String {
    if ms <= 0 {
        return "never".into();
    }
    let s = (now_unix_ms - ms) / 1000;
    match s {
        s if s < 0 => "in the future (clock skew)".into(),
        s if s < 120 => format!("{s} s ago"),
        s if s < 7200 => format!("{} min ago", s / 60),
        s if s < 172_800 => format!("{} h ago", s / 3600),
        s => format!("{} d ago", s / 86_400),
    }
}

/// A digest id as every page and `/api/` writes it.
pub fn digest_hex(digest: u64) -> String {
    format!("{digest:016x}")
}

/// Text cut to `max` characters, the cut marked.
pub fn cut(text: &str, max: usize) -> String {
    let mut out: String = text.chars().take(max).collect();
    if out.len() < text.len() {
        out.push('…');
    }
    out
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Nav {
    Fleet,
    Top,
    Digest,
    Locks,
    Replication,
    Plans,
    Tables,
    Compare,
    Events,
    Clients,
    Activity,
    Hosts,
    Cost,
    Login,
}

const NAV: [(Nav, &str, &str); 12] = [
    (Nav::Fleet, "/", "Fleet"),
    (Nav::Activity, "/activity", "Activity"),
    (Nav::Top, "/top", "Top digests"),
    (Nav::Locks, "/locks", "Lock waits"),
    (Nav::Replication, "/replication", "Replication"),
    (Nav::Compare, "/compare", "Compare"),
    (Nav::Events, "/events", "Events"),
    (Nav::Clients, "/clients", "Clients"),
    (Nav::Tables, "/tables", "Tables"),
    (Nav::Plans, "/plans", "Plan changes"),
    (Nav::Hosts, "/hosts", "Hosts"),
    (Nav::Cost, "/cost", "Agent cost"),
];

/// What the header needs to draw the pickers.
pub struct Header<'a> {
    pub title: &'a str,
    pub nav: Nav,
    pub path: &'a str,
    pub view: Option<&'a View>,
    /// Instance names for the filter.
    pub instances: &'a [String],
    /// Parameters of this page the pickers must keep (a digest id).
    pub keep: &'a [(&'a str, &'a str)],
    pub signed_in: bool,
}

pub fn page(header: &Header<'_>, body: &str) -> String {
    let mut out = String::with_capacity(body.len() + 4096);
    let _ = write!(
        out,
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{} · sqlbee</title><link rel=\"stylesheet\" href=\"/static/sqlbee.css\">\
         <script src=\"/static/sqlbee.js\" defer></script></head><body>",
        esc(header.title)
    );
    out.push_str("<header><a class=\"brand\" href=\"/\">sqlbee</a><nav>");
    for (nav, href, label) in NAV {
        let href = match header.view {
            Some(view) => view.link(href, &[]),
            None => href.to_string(),
        };
        let class = if nav == header.nav { " class=\"active\"" } else { "" };
        let _ = write!(out, "<a href=\"{}\"{class}>{label}</a>", esc(&href));
    }
    out.push_str("</nav>");
    if header.signed_in {
        out.push_str(
            "<form class=\"logout\" method=\"post\" action=\"/logout\"><button type=\"submit\">Sign out</button></form>",
        );
    }
    out.push_str("</header>");
    if let Some(view) = header.view {
        pickers(&mut out, header, view);
    }
    let _ = write!(out, "<main><h1>{}</h1>{body}</main></body></html>", esc(header.title));
    out
}

/// The range presets as links, and the instance filter as a GET form: the
/// whole view stays in the URL, and nothing needs JavaScript.
fn pickers(out: &mut String, header: &Header<'_>, view: &View) {
    out.push_str("<div class=\"pickers\"><span class=\"ranges\">");
    for preset in PRESETS {
        let class = if view.range.since == preset && view.range.until == "now" { " class=\"active\"" } else { "" };
        let _ =
            write!(out, "<a href=\"{}\"{class}>{preset}</a>", esc(&view.link_range(header.path, preset, header.keep)));
    }
    let _ = write!(
        out,
        "</span><span class=\"range\">{} → {}</span>",
        time(view.range.since_unix_ms),
        if view.range.until_unix_ms == 0 { "now".to_string() } else { time(view.range.until_unix_ms) }
    );
    let _ = write!(out, "<form method=\"get\" action=\"{}\">", esc(header.path));
    let _ = write!(out, "<input type=\"hidden\" name=\"since\" value=\"{}\">", esc(&view.range.since));
    if view.range.until != "now" {
        let _ = write!(out, "<input type=\"hidden\" name=\"until\" value=\"{}\">", esc(&view.range.until));
    }
    for (name, value) in header.keep {
        let _ = write!(out, "<input type=\"hidden\" name=\"{}\" value=\"{}\">", esc(name), esc(value));
    }
    if header.instances.len() > MAX_PICKER {
        // A fleet's worth of options would make every page megabytes: past
        // MAX_PICKER the picker is a field to type a name in, with the first
        // names offered.
        let _ = write!(
            out,
            "<label>Instance <input type=\"search\" name=\"instance\" list=\"instance-names\" value=\"{}\" \
             placeholder=\"every instance ({} in all)\"></label><datalist id=\"instance-names\">",
            esc(view.instance.as_deref().unwrap_or("")),
            header.instances.len()
        );
        for name in header.instances.iter().take(MAX_PICKER) {
            let _ = write!(out, "<option value=\"{}\">", esc(name));
        }
        out.push_str("</datalist> <button type=\"submit\">Apply</button></form></div>");
        return;
    }
    out.push_str("<label>Instance <select name=\"instance\"><option value=\"\">every instance</option>");
    let mut listed = false;
    for name in header.instances {
        let selected = view.instance.as_deref() == Some(name.as_str());
        listed |= selected;
        let _ =
            write!(out, "<option value=\"{0}\"{1}>{0}</option>", esc(name), if selected { " selected" } else { "" });
    }
    // A shared link may name an instance this collector has not heard of.
    if let (Some(name), false) = (&view.instance, listed) {
        let _ = write!(out, "<option value=\"{0}\" selected>{0}</option>", esc(name));
    }
    out.push_str("</select></label> <button type=\"submit\">Apply</button></form></div>");
}

/// Instances the picker lists as options; past this it becomes a field.
pub const MAX_PICKER: usize = 200;

/// A `<th>` that sorts the table by `key` when clicked.
pub fn sort_header(view: &View, path: &str, label: &str, key: &str, current: &str, keep: &[(&str, &str)]) -> String {
    let mut extra: Vec<(&str, &str)> = keep.to_vec();
    extra.push(("order", key));
    let class = if key == current { " class=\"sorted\"" } else { "" };
    format!("<th{class}><a href=\"{}\">{}</a></th>", esc(&view.link(path, &extra)), esc(label))
}

/// A message box for what a page could not show.
pub fn notice(text: &str) -> String {
    format!("<p class=\"notice\">{}</p>", esc(text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping_leaves_no_markup() {
        assert_eq!(
            esc("<script>alert('x')</script> & \"y\""),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;y&quot;"
        );
    }

    #[test]
    fn numbers_read_well() {
        assert_eq!(count(1234567), "1\u{2009}234\u{2009}567");
        assert_eq!(count(999), "999");
        assert_eq!(duration_ns(1_500_000.0), "1.500 ms");
        assert_eq!(duration_ns(2_000.0), "2.000 us");
        assert_eq!(duration_short(500_000.0), "500 us");
        assert_eq!(duration_short(1_500_000.0), "1.5 ms");
        assert_eq!(bytes(3.0 * 1024.0 * 1024.0), "3.0 MiB");
        assert_eq!(time(1_764_064_800_000), "2025-11-25 10:00:00Z");
    }
}
