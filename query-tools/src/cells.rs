//! Cells both renderers print the same way: cut text and times.
use sqlbee_vocabulary::clock;

/// `text` cut to `max_chars` characters, `...` marking the cut.
pub(super) fn cut(text: &str, max_chars: usize) -> String {
    let mut out: String = text.chars().take(max_chars).collect();
    if out.len() < text.len() {
        out.push_str("...");
    }
    out
}

/// An RFC 3339 time for ms since the epoch; `-` for none.
pub(super) fn time(ms: i64) -> String {
    if ms <= 0 {
        return "-".into();
    }
    clock::rfc3339(clock::from_unix_ms(ms))
}
