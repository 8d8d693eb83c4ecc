//! Literal values out of the texts that leave the agent: statement samples
//! and error messages. A redacted sample keeps the statement's own shape
//! (its case, spacing, identifiers, value lists), unlike the digest text,
//! and replaces every literal with `?`: strings, numbers, hex and bit
//! values, and so dates and times too, which SQL writes as strings.
//!
//! Statements that carry a secret (passwords, keys: `IDENTIFIED BY`,
//! `SET PASSWORD`, `MASTER_PASSWORD`, `AES_ENCRYPT(.., key)`, ...) are
//! redacted in every mode, raw samples included.
//!
//! Works on bytes, so invalid UTF-8 and statements cut at the capture
//! limit (an unterminated string swallows the rest) are redacted too.
//! Pure and bounded: one pass over the text.

/// What the agent does with statement text it sends as a sample.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Samples {
    /// Literals replaced with `?` (the default).
    #[default]
    Redacted,
    /// As the server had it, except statements that carry a secret.
    Raw,
    /// No sample texts at all; digest texts only.
    Off,
}

impl Samples {
    /// The sample to keep of a statement's `raw` text, at most `max` bytes
    /// of it.
    pub fn statement(self, raw: &[u8], max: usize) -> String {
        let raw = &raw[..raw.len().min(max)];
        match self {
            Samples::Off => String::new(),
            Samples::Raw if !carries_secret(raw) => String::from_utf8_lossy(raw).into_owned(),
            Samples::Raw | Samples::Redacted => statement(raw),
        }
    }

    /// An error message the server sent, with the values it quotes
    /// replaced (raw samples keep it as it was).
    pub fn message(self, message: &str) -> String {
        match self {
            Samples::Raw => message.to_string(),
            Samples::Redacted | Samples::Off => self::message(message),
        }
    }
}

/// Words that mark a statement carrying a secret, upper case.
const SECRET_MARKERS: [&str; 6] = ["IDENTIFIED", "PASSWORD", "ENCRYPT", "ENCODE", "DECODE", "DES_"];

/// Whether the statement may carry a password or a key. Errs on the side
/// of yes: a false match only redacts a sample that raw mode would keep.
pub fn carries_secret(raw: &[u8]) -> bool {
    let upper: Vec<u8> = raw.iter().map(u8::to_ascii_uppercase).collect();
    SECRET_MARKERS.iter().any(|m| upper.windows(m.len()).any(|w| w == m.as_bytes()))
}

fn is_word(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'$' || b >= 0x80
}

/// Index just past a quoted run that starts at `start` (the opening
/// quote), honouring backslash escapes and doubled quotes; the text's end
/// when it is unterminated.
fn skip_quoted(raw: &[u8], start: usize, backslash: bool) -> usize {
    let quote = raw[start];
    let mut i = start + 1;
    while i < raw.len() {
        let b = raw[i];
        if backslash && b == b'\\' {
            i += 2;
        } else if b == quote {
            if raw.get(i + 1) == Some(&quote) {
                i += 2;
            } else {
                return i + 1;
            }
        } else {
            i += 1;
        }
    }
    raw.len()
}

/// Whether `word` (a run of word bytes that starts with a digit) is a
/// number: decimal, hex `0x..` or bit `0b..`. Otherwise it is an
/// identifier (MySQL allows `2events`) and is kept.
fn is_number(word: &[u8]) -> bool {
    let lower: Vec<u8> = word.iter().map(u8::to_ascii_lowercase).collect();
    if let Some(hex) = lower.strip_prefix(b"0x") {
        return !hex.is_empty() && hex.iter().all(u8::is_ascii_hexdigit);
    }
    if let Some(bits) = lower.strip_prefix(b"0b") {
        return !bits.is_empty() && bits.iter().all(|b| *b == b'0' || *b == b'1');
    }
    // Digits, with an exponent at most (`1e5`; `1e` is a word).
    let mut parts = lower.splitn(2, |b| *b == b'e');
    let mantissa = parts.next().unwrap_or_default();
    let exponent = parts.next();
    !mantissa.is_empty()
        && mantissa.iter().all(u8::is_ascii_digit)
        && exponent.is_none_or(|e| !e.is_empty() && e.iter().all(u8::is_ascii_digit))
}

/// A statement with every literal value replaced by `?`.
pub fn statement(raw: &[u8]) -> String {
    let mut out: Vec<u8> = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        let b = raw[i];
        let prev = out.last().copied();
        match b {
            // Strings; double quotes too, which are strings unless
            // ANSI_QUOTES is set (then identifiers, redacted all the same).
            b'\'' | b'"' => {
                // `X'..'`, `B'..'`, `N'..'` and `_charset'..'`: the prefix
                // is already out and stays.
                i = skip_quoted(raw, i, true);
                out.push(b'?');
            }
            // Identifiers are kept whole, whatever they hold.
            b'`' => {
                let end = skip_quoted(raw, i, false);
                out.extend_from_slice(&raw[i..end]);
                i = end;
            }
            b'0'..=b'9' if !prev.is_some_and(|p| is_word(p) || p == b'@') => {
                let mut end = i;
                while end < raw.len() && (is_word(raw[end]) || raw[end] == b'.') {
                    // `1.5e-3`: a sign right after an exponent belongs to it.
                    end += 1;
                    if end < raw.len()
                        && (raw[end] == b'-' || raw[end] == b'+')
                        && raw[end - 1].eq_ignore_ascii_case(&b'e')
                        && raw[i..end - 1].iter().all(|c| c.is_ascii_digit() || *c == b'.')
                    {
                        end += 1;
                    }
                }
                let word: Vec<u8> =
                    raw[i..end].iter().copied().filter(|c| *c != b'.' && *c != b'-' && *c != b'+').collect();
                if is_number(&word) {
                    out.push(b'?');
                } else {
                    out.extend_from_slice(&raw[i..end]);
                }
                i = end;
            }
            // `.5`
            b'.' if raw.get(i + 1).is_some_and(u8::is_ascii_digit) && !prev.is_some_and(is_word) => {
                let mut end = i + 1;
                while end < raw.len() && raw[end].is_ascii_digit() {
                    end += 1;
                }
                out.push(b'?');
                i = end;
            }
            // Comments may hold anything; executable ones (`/*!50100 ..*/`,
            // `/*M!..*/`) hold SQL and are redacted as SQL.
            b'/' if raw.get(i + 1) == Some(&b'*') => {
                let executable = matches!(raw.get(i + 2), Some(b'!'))
                    || (raw.get(i + 2) == Some(&b'M') && raw.get(i + 3) == Some(&b'!'));
                if executable {
                    let marker = if raw[i + 2] == b'M' { 4 } else { 3 };
                    out.extend_from_slice(&raw[i..i + marker]);
                    i += marker;
                    // The version number of the marker is not a value.
                    while i < raw.len() && raw[i].is_ascii_digit() {
                        out.push(raw[i]);
                        i += 1;
                    }
                } else {
                    let end = raw[i + 2..].windows(2).position(|w| w == b"*/").map_or(raw.len(), |p| i + 2 + p + 2);
                    out.extend_from_slice(b"/* ? */");
                    i = end;
                }
            }
            b'#' => {
                i = raw[i..].iter().position(|c| *c == b'\n').map_or(raw.len(), |p| i + p);
                out.extend_from_slice(b"# ?");
            }
            b'-' if raw.get(i + 1) == Some(&b'-') && raw.get(i + 2).is_none_or(|c| c.is_ascii_whitespace()) => {
                i = raw[i..].iter().position(|c| *c == b'\n').map_or(raw.len(), |p| i + p);
                out.extend_from_slice(b"-- ?");
            }
            _ => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// An error message with every quoted part (`'...'`, `"..."`) replaced by
/// `'?'`: servers quote the offending value there (`Duplicate entry
/// 'ann@example.com' for key 'email'`).
pub fn message(message: &str) -> String {
    let raw = message.as_bytes();
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        let b = raw[i];
        if b == b'\'' || b == b'"' {
            i = skip_quoted(raw, i, false);
            out.extend_from_slice(&[b, b'?', b]);
        } else {
            out.push(b);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_go_and_the_shape_stays() {
        let cases = [
            ("SELECT * FROM users WHERE email = 'ann@example.com'", "SELECT * FROM users WHERE email = ?"),
            ("select c from t where id in (1, 2, 3)", "select c from t where id in (?, ?, ?)"),
            (
                "INSERT INTO t1 (a, b2) VALUES (-1.5e-3, 0xFF), (.5, 0b101)",
                "INSERT INTO t1 (a, b2) VALUES (-?, ?), (?, ?)",
            ),
            (
                "SELECT x'4142', b'01', N'abc', _utf8mb4'abc' COLLATE utf8mb4_bin",
                "SELECT x?, b?, N?, _utf8mb4? COLLATE utf8mb4_bin",
            ),
            ("SELECT * FROM `we'ird` WHERE d > DATE '2020-01-01'", "SELECT * FROM `we'ird` WHERE d > DATE ?"),
            ("SELECT 'it''s', \"dq \\\" x\", 2events FROM t3", "SELECT ?, ?, 2events FROM t3"),
            ("SELECT 1 /* user=ann */ -- card 4111\n# 5555\n", "SELECT ? /* ? */ -- ?\n# ?\n"),
            (
                "SELECT /*!50100 SQL_NO_CACHE 42 */ @v1, @@max_connections",
                "SELECT /*!50100 SQL_NO_CACHE ? */ @v1, @@max_connections",
            ),
            ("UPDATE t SET a = ? WHERE id = ?", "UPDATE t SET a = ? WHERE id = ?"),
            ("SELECT 'unterminated and cut at the lim", "SELECT ?"),
        ];
        for (raw, redacted) in cases {
            assert_eq!(statement(raw.as_bytes()), redacted, "{raw}");
        }
        assert_eq!(statement(b"SELECT '\xff\xfe' FROM t WHERE a = 4111111111111111"), "SELECT ? FROM t WHERE a = ?");
    }

    #[test]
    fn secrets_are_redacted_even_in_raw_mode() {
        for raw in [
            "CREATE USER 'bob'@'%' IDENTIFIED BY 's3cret!'",
            "ALTER USER bob IDENTIFIED VIA ed25519 USING PASSWORD('s3cret!')",
            "SET PASSWORD FOR bob = PASSWORD('s3cret!')",
            "GRANT ALL ON *.* TO bob IDENTIFIED BY 's3cret!'",
            "CHANGE MASTER TO MASTER_HOST='h', MASTER_PASSWORD='s3cret!'",
            "SELECT AES_ENCRYPT('card', 's3cret!')",
        ] {
            let kept = Samples::Raw.statement(raw.as_bytes(), 1024);
            assert!(!kept.contains("s3cret"), "{raw} -> {kept}");
        }
        assert_eq!(Samples::Raw.statement(b"SELECT 'ann'", 1024), "SELECT 'ann'");
        assert_eq!(Samples::Off.statement(b"SELECT 'ann'", 1024), "");
        assert_eq!(Samples::Redacted.statement(b"SELECT 'ann' FROM t", 8), "SELECT ?");
    }

    #[test]
    fn messages_lose_their_quoted_values() {
        assert_eq!(message("Duplicate entry 'ann@example.com' for key 'email'"), "Duplicate entry '?' for key '?'");
        assert_eq!(message("Unknown column \"4111 1111\" in 'where clause'"), "Unknown column \"?\" in '?'");
        assert_eq!(message("cut in the middle 'ann@exa"), "cut in the middle '?'");
        assert_eq!(Samples::Raw.message("Duplicate entry 'a'"), "Duplicate entry 'a'");
    }
}
