//! Query tags: what frameworks write about a statement in a comment, read
//! from its text before the digest drops comments.
//!
//! Two forms are read. sqlcommenter (`/*controller='orders',
//! traceparent='00-...'*/`, what Django, Rails, Spring and OpenTelemetry
//! write): `key='value'` pairs, keys and values URL-encoded. Marginalia
//! (`/*application:shop,controller:orders*/`): `key:value` pairs. A comment
//! is read only when every pair in it parses, so prose stays prose.
//! Executable comments (`/*!...*/`, `/*M!...*/`) are SQL, never tags, and
//! a comment inside a quoted string is no comment.
//!
//! A `traceparent` is unique per request: it is never a tag. Its trace and
//! span ids come back apart (`Trace`), for an exemplar.
//!
//! Tag values leave the agent, so unless samples are raw they go through
//! rules of their own: a value holding `@` (an email) becomes `?`, and so
//! does any run of four or more digits and any long token of letters and
//! digits (an id, a session key) within it.
//!
//! Bounded: one pass over the text, and a text with no `/*` costs one
//! `memchr` search. Frameworks write the same few comments over and over,
//! so what a comment's pairs are is remembered (`CACHE_ENTRIES`), keyed by
//! the comment with its `traceparent` value left out: a traced statement
//! costs the scan, a hash and the trace's hex, not a parse.
use std::{collections::HashMap, sync::Arc};

use super::redact::Samples;

/// `--query-tags` by default.
pub const DEFAULT_KEYS: &str = "controller,action,route,application,framework,db_driver";
/// Keys `--query-tags` may name.
pub const MAX_KEYS: usize = 16;
/// Longest key kept; a longer one is no tag.
pub const MAX_KEY_LEN: usize = 64;
/// Longest value kept (bytes, cut at a character's end).
pub const MAX_VALUE_LEN: usize = 128;
/// Digit runs at least this long are values, not names.
const LONG_NUMBER: usize = 4;
/// Tokens of letters and digits at least this long, with both, are ids.
const LONG_TOKEN: usize = 16;
/// Distinct comments whose pairs are remembered; past it, they start over.
const CACHE_ENTRIES: usize = 4096;
const TRACEPARENT: &[u8] = b"traceparent='";

/// A W3C trace context, as `traceparent` carries it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Trace {
    /// Not all zero.
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
}

impl Trace {
    /// 32 lower-case hex digits.
    pub fn trace_hex(&self) -> String {
        hex(&self.trace_id)
    }

    /// 16 lower-case hex digits.
    pub fn span_hex(&self) -> String {
        hex(&self.span_id)
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Kept keys with their (redacted) values, in the comments' order.
pub type Tags = Arc<[(Arc<str>, Arc<str>)]>;

/// The tags of one statement text and its trace context.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QueryTags {
    pub tags: Tags,
    pub trace: Option<Trace>,
}

/// Reads the tags `--query-tags` keeps.
#[derive(Clone, Debug)]
pub struct TagReader {
    keys: Vec<Arc<str>>,
    raw: bool,
    /// A comment's kept pairs by its hash (its trace value left out);
    /// None: not a tag list.
    cache: HashMap<u64, Option<Tags>>,
}

impl TagReader {
    /// `keys` are matched without regard to case.
    pub fn new(keys: &[String], samples: Samples) -> Self {
        let keys = keys.iter().map(|k| Arc::from(k.trim().to_ascii_lowercase())).collect();
        Self { keys, raw: samples == Samples::Raw, cache: HashMap::new() }
    }

    /// The tags and trace context in `text`'s comments; None when there are
    /// none (most statements: one search for `/*`).
    pub fn read(&mut self, text: &[u8]) -> Option<QueryTags> {
        if !memchr::memchr_iter(b'/', text).any(|i| text.get(i + 1) == Some(&b'*')) {
            return None;
        }
        let mut found: Option<Tags> = None;
        let mut trace = None;
        let mut tagged = false;
        for body in comments(text) {
            let (key, trace_here) = fingerprint(body);
            let pairs = match key.and_then(|k| self.cache.get(&k)) {
                Some(known) => known.clone(),
                None => {
                    let parsed = self.parse(body);
                    if let Some(key) = key {
                        if self.cache.len() >= CACHE_ENTRIES {
                            self.cache.clear();
                        }
                        self.cache.insert(key, parsed.clone());
                    }
                    parsed
                }
            };
            let Some(pairs) = pairs else { continue };
            tagged = true;
            trace = trace_here.or(trace);
            found = Some(match found {
                None => pairs,
                Some(before) => merge(&before, &pairs),
            });
        }
        let tags = found.unwrap_or_else(|| Arc::from([]));
        (tagged && (!tags.is_empty() || trace.is_some())).then_some(QueryTags { tags, trace })
    }

    /// A comment's kept pairs, redacted; None when it is not a tag list.
    fn parse(&self, body: &[u8]) -> Option<Tags> {
        let pairs = pairs(std::str::from_utf8(body).ok()?)?;
        let mut kept: Vec<(Arc<str>, Arc<str>)> = Vec::new();
        for (key, value) in pairs {
            let Some(key) = self.keys.iter().find(|k| k.eq_ignore_ascii_case(&key)) else { continue };
            let value: Arc<str> = Arc::from(if self.raw { cut(&value) } else { redact(&value) });
            match kept.iter_mut().find(|(k, _)| k == key) {
                Some(slot) => slot.1 = value,
                None => kept.push((key.clone(), value)),
            }
        }
        Some(kept.into())
    }
}

/// Pairs of two comments, the later one's value winning for a key both name.
fn merge(before: &Tags, later: &Tags) -> Tags {
    let mut out: Vec<(Arc<str>, Arc<str>)> =
        before.iter().filter(|(k, _)| !later.iter().any(|(l, _)| l == k)).cloned().collect();
    out.extend(later.iter().cloned());
    out.into()
}

/// A comment's cache key (its hash with the `traceparent` value left out;
/// None when that value is not plain hex and dashes, which could parse
/// otherwise) and its trace context.
fn fingerprint(body: &[u8]) -> (Option<u64>, Option<Trace>) {
    use xxhash_rust::xxh3::xxh3_64;
    let Some(at) = memchr::memmem::find(body, TRACEPARENT) else { return (Some(xxh3_64(body)), None) };
    let start = at + TRACEPARENT.len();
    let Some(len) = memchr::memchr(b'\'', &body[start..]) else { return (None, None) };
    let value = &body[start..start + len];
    if !value.iter().all(|b| b.is_ascii_hexdigit() || *b == b'-') {
        return (None, None);
    }
    let key = xxh3_64(&body[..start]) ^ xxh3_64(&body[start + len..]).rotate_left(1);
    (Some(key), std::str::from_utf8(value).ok().and_then(trace))
}

/// The bodies of `text`'s plain block comments, skipping quoted strings,
/// line comments and executable comments.
fn comments(text: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut i = 0;
    std::iter::from_fn(move || {
        while i < text.len() {
            match text[i] {
                quote @ (b'\'' | b'"' | b'`') => i = past_quoted(text, i, quote),
                b'#' => i = past_line(text, i),
                b'-' if text.get(i + 1) == Some(&b'-') && text.get(i + 2).is_none_or(|c| *c <= b' ') => {
                    i = past_line(text, i)
                }
                b'/' if text.get(i + 1) == Some(&b'*') => {
                    let body = i + 2;
                    let end = memchr::memmem::find(&text[body..], b"*/").map(|p| body + p);
                    i = end.map_or(text.len(), |e| e + 2);
                    let executable = text.get(body) == Some(&b'!') || text[body..].starts_with(b"M!");
                    // An unterminated comment was cut at the capture limit.
                    if let Some(end) = end
                        && !executable
                    {
                        return Some(&text[body..end]);
                    }
                }
                _ => i += 1,
            }
        }
        None
    })
}

fn past_quoted(text: &[u8], start: usize, quote: u8) -> usize {
    let mut i = start + 1;
    while i < text.len() {
        match text[i] {
            b'\\' if quote != b'`' => i += 2,
            b if b == quote => return i + 1,
            _ => i += 1,
        }
    }
    text.len()
}

fn past_line(text: &[u8], start: usize) -> usize {
    memchr::memchr(b'\n', &text[start..]).map_or(text.len(), |p| start + p + 1)
}

/// A comment's `key='value'` (sqlcommenter) or `key:value` (marginalia)
/// pairs, decoded; None unless every comma-separated part is one.
fn pairs(comment: &str) -> Option<Vec<(String, String)>> {
    let comment = comment.trim();
    if comment.is_empty() {
        return None;
    }
    sqlcommenter(comment).or_else(|| marginalia(comment))
}

fn sqlcommenter(comment: &str) -> Option<Vec<(String, String)>> {
    let bytes = comment.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    loop {
        let eq = i + comment[i..].find('=')?;
        let key = sqlbee_vocabulary::percent::decode(comment[i..eq].trim())?;
        if !is_key(&key) {
            return None;
        }
        let mut j = eq + 1;
        while bytes.get(j) == Some(&b' ') {
            j += 1;
        }
        if bytes.get(j) != Some(&b'\'') {
            return None;
        }
        let mut value = String::new();
        j += 1;
        loop {
            match bytes.get(j)? {
                b'\\' if bytes.get(j + 1) == Some(&b'\'') => {
                    value.push('\'');
                    j += 2;
                }
                b'\'' => break,
                _ => {
                    let c = comment[j..].chars().next()?;
                    value.push(c);
                    j += c.len_utf8();
                }
            }
        }
        out.push((key, sqlbee_vocabulary::percent::decode(&value)?));
        j += 1;
        while bytes.get(j) == Some(&b' ') {
            j += 1;
        }
        match bytes.get(j) {
            None => return Some(out),
            Some(b',') => i = j + 1,
            Some(_) => return None,
        }
    }
}

fn marginalia(comment: &str) -> Option<Vec<(String, String)>> {
    comment
        .split(',')
        .map(|part| {
            let (key, value) = part.split_once(':')?;
            let (key, value) = (key.trim(), value.trim());
            (is_key(key) && !value.is_empty()).then(|| (key.to_string(), value.to_string()))
        })
        .collect()
}

/// `--query-tags`' keys: at most `MAX_KEYS`, each a key a comment could
/// carry (`none` alone turns tags off); the error says which is not.
pub fn check_keys(keys: &[String]) -> Result<(), String> {
    if keys.len() > MAX_KEYS {
        return Err(format!("{} keys, at most {MAX_KEYS}", keys.len()));
    }
    for key in keys.iter().map(|k| k.trim()) {
        if key.eq_ignore_ascii_case("traceparent") {
            return Err("`traceparent` is never a tag (it is unique per request): it is kept as an exemplar".into());
        }
        if !is_key(key) && !(key.eq_ignore_ascii_case("none") && keys.len() == 1) {
            return Err(format!(
                "{key:?} is not a tag key: letters, digits, `_`, `-` and `.`, at most {MAX_KEY_LEN} bytes, or `none` alone"
            ));
        }
    }
    Ok(())
}

fn is_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= MAX_KEY_LEN
        && key.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

/// `00-<trace id>-<span id>-<flags>`; None for any other form or an
/// all-zero id, which the W3C spec makes invalid.
fn trace(value: &str) -> Option<Trace> {
    let mut parts = value.trim().split('-');
    let (version, trace_id, span_id, flags) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let hex = |s: &str, len: usize| s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit());
    let valid = hex(version, 2)
        && version != "ff"
        && hex(trace_id, 32)
        && hex(span_id, 16)
        && hex(flags, 2)
        && trace_id.bytes().any(|b| b != b'0')
        && span_id.bytes().any(|b| b != b'0');
    if !valid {
        return None;
    }
    let mut trace = Trace { trace_id: [0; 16], span_id: [0; 8] };
    for (out, pair) in trace
        .trace_id
        .iter_mut()
        .chain(trace.span_id.iter_mut())
        .zip(trace_id.as_bytes().chunks(2).chain(span_id.as_bytes().chunks(2)))
    {
        *out = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
    }
    Some(trace)
}

/// `value` cut to `MAX_VALUE_LEN` bytes, control characters dropped.
fn cut(value: &str) -> String {
    let mut out = String::new();
    for c in value.chars().filter(|c| !c.is_control()) {
        if out.len() + c.len_utf8() > MAX_VALUE_LEN {
            break;
        }
        out.push(c);
    }
    out
}

/// A tag value with what could be a literal replaced: the whole value when
/// it holds `@`, else each long number and each long id in it.
pub fn redact(value: &str) -> String {
    if value.contains('@') {
        return "?".into();
    }
    let mut out = String::with_capacity(value.len());
    let mut token = String::new();
    for c in value.chars() {
        if c.is_ascii_alphanumeric() {
            token.push(c);
        } else {
            push_token(&mut token, &mut out);
            out.push(c);
        }
    }
    push_token(&mut token, &mut out);
    cut(&out)
}

/// A run of letters and digits into `out`, or `?` for a long number or id.
fn push_token(token: &mut String, out: &mut String) {
    let digits = token.bytes().filter(u8::is_ascii_digit).count();
    let id = token.len() >= LONG_TOKEN && digits > 0 && digits < token.len();
    if longest_digit_run(token) >= LONG_NUMBER || id {
        out.push('?');
    } else {
        out.push_str(token);
    }
    token.clear();
}

fn longest_digit_run(token: &str) -> usize {
    token.as_bytes().split(|b| !b.is_ascii_digit()).map(<[u8]>::len).max().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reader() -> TagReader {
        let keys: Vec<String> = DEFAULT_KEYS.split(',').map(String::from).collect();
        TagReader::new(&keys, Samples::Redacted)
    }

    fn tags(text: &str) -> Vec<(String, String)> {
        reader()
            .read(text.as_bytes())
            .map(|t| t.tags.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect())
            .unwrap_or_default()
    }

    fn pair(k: &str, v: &str) -> (String, String) {
        (k.into(), v.into())
    }

    #[test]
    fn sqlcommenter_pairs_are_read_and_decoded() {
        let text = "SELECT * FROM t WHERE id = 5 /*action='show',controller='orders',\
                    framework='django%3A4.2',route='%2Forders%2F%3Cid%3E',\
                    traceparent='00-5bd66ef5095369c7b0d1f8f4bd33716a-c532cb4098ac3dd2-01',tracestate='a%3Db'*/";
        let found = reader().read(text.as_bytes()).unwrap();
        assert_eq!(
            tags(text),
            [
                pair("action", "show"),
                pair("controller", "orders"),
                pair("framework", "django:4.2"),
                pair("route", "/orders/<id>")
            ]
        );
        let trace = found.trace.unwrap();
        assert_eq!(trace.trace_hex(), "5bd66ef5095369c7b0d1f8f4bd33716a");
        assert_eq!(trace.span_hex(), "c532cb4098ac3dd2");
        // The same comment with another trace: the remembered pairs, the new trace.
        let mut reader = reader();
        let other = text.replace("5bd66ef5095369c7b0d1f8f4bd33716a", "0af7651916cd43dd8448eb211c80319c");
        assert_eq!(reader.read(text.as_bytes()).unwrap().tags, found.tags);
        let again = reader.read(other.as_bytes()).unwrap();
        assert_eq!(
            (again.tags, again.trace.unwrap().trace_hex()),
            (found.tags, "0af7651916cd43dd8448eb211c80319c".into())
        );
        assert_eq!(reader.cache.len(), 1);
    }

    #[test]
    fn marginalia_pairs_are_read() {
        assert_eq!(
            tags("/*application:Shop,controller:orders,action:index*/ SELECT 1"),
            [pair("application", "Shop"), pair("controller", "orders"), pair("action", "index")]
        );
    }

    #[test]
    fn prose_strings_and_executable_comments_are_not_tags() {
        assert!(reader().read(b"SELECT 1 /* the nightly report: slow */").is_none());
        assert!(reader().read(b"SELECT '/*controller=''x''*/' FROM t").is_none());
        assert!(reader().read(b"SELECT \"/*controller:x*/\"").is_none());
        assert!(reader().read(b"SELECT 1 /*!50100 controller='x' */").is_none());
        assert!(reader().read(b"SELECT 1 -- /*controller:x*/").is_none());
        assert!(reader().read(b"SELECT 1 /*controller='cut at the capture lim").is_none());
        assert!(reader().read(b"SELECT 1").is_none());
        assert!(reader().read(b"SELECT 1 /*controller='x',broken*/").is_none());
    }

    #[test]
    fn keys_not_kept_are_dropped_and_a_bare_trace_is_kept() {
        let found = reader()
            .read(b"SELECT 1 /*user_id='7',traceparent='00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01'*/")
            .unwrap();
        assert!(found.tags.is_empty());
        assert_eq!(found.trace.unwrap().trace_hex(), "0af7651916cd43dd8448eb211c80319c");
        let zero = "SELECT 1 /*traceparent='00-00000000000000000000000000000000-b7ad6b7169203331-01'*/";
        assert!(reader().read(zero.as_bytes()).is_none(), "an all-zero trace id is invalid");
    }

    #[test]
    fn values_that_look_like_literals_are_replaced() {
        assert_eq!(redact("ann.secret@example.com"), "?");
        assert_eq!(redact("/orders/4111111111111111/edit"), "/orders/?/edit");
        assert_eq!(redact("v2"), "v2");
        assert_eq!(redact("orders-123"), "orders-123");
        assert_eq!(redact("session-9f8e7d6c5b4a39281706"), "session-?");
        assert_eq!(tags("SELECT 1 /*controller='ann%40example.com'*/"), [pair("controller", "?")]);
        let mut raw = TagReader::new(&["controller".into()], Samples::Raw);
        let found = raw.read(b"SELECT 1 /*controller='ann%40example.com'*/").unwrap();
        assert_eq!(&*found.tags[0].1, "ann@example.com", "raw samples keep tag values");
    }

    #[test]
    fn any_bytes_and_long_values_are_bounded() {
        let long = format!("SELECT 1 /*controller='{}'*/", "x".repeat(10_000));
        assert_eq!(tags(&long)[0].1.len(), MAX_VALUE_LEN);
        for text in [&b"/*\xff\xfe*/"[..], b"/*", b"/**/", b"/*%*/", b"/*a='%zz'*/", b"'", b"/*a:'*/"] {
            let _ = reader().read(text);
        }
    }
}
