//! Two ways from raw text to the same token stream: sqlparser's tokenizer
//! (MySQL dialect) for text it accepts, and a byte lexer for the rest
//! (invalid UTF-8, a statement cut at the capture limit, syntax sqlparser
//! does not know). Both classify words with sqlparser's keyword list, so a
//! statement yields the same digest whichever path it takes.
use sqlparser::{
    dialect::MySqlDialect,
    keywords::ALL_KEYWORDS,
    tokenizer::{Token, Tokenizer, Whitespace},
};

/// Tokens that matter for a digest; whitespace and comments are gone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Tok {
    /// Unquoted keyword, upper-cased.
    Keyword(String),
    /// Identifier (quoted or not) without its quotes.
    Ident(String),
    /// Any literal value.
    Value,
    /// A `?` placeholder of a prepared statement.
    Placeholder,
    Open,
    Close,
    Comma,
    /// Operators and other punctuation, as written.
    Punct(String),
}

/// Executable comments nest at most this deep before we stop expanding.
const MAX_COMMENT_DEPTH: u32 = 4;

pub fn tokenize_with_sqlparser(text: &str) -> Option<Vec<Tok>> {
    let mut out = Vec::new();
    sqlparser_into(text, &mut out, 0).then_some(out)
}

fn sqlparser_into(text: &str, out: &mut Vec<Tok>, depth: u32) -> bool {
    let Ok(tokens) = Tokenizer::new(&MySqlDialect {}, text).tokenize() else {
        return false;
    };
    for token in tokens {
        match token {
            Token::EOF => {}
            Token::Whitespace(Whitespace::MultiLineComment(body)) => {
                if let Some(inner) = executable_comment(&body) {
                    if depth >= MAX_COMMENT_DEPTH {
                        continue;
                    }
                    if !sqlparser_into(inner, out, depth + 1) {
                        bytes_into(inner.as_bytes(), out, depth + 1);
                    }
                }
            }
            Token::Whitespace(_) => {}
            Token::Word(word) => out.push(classify_word(&word.value, word.quote_style.is_some())),
            Token::Number(..)
            | Token::Char(_)
            | Token::SingleQuotedString(_)
            | Token::DoubleQuotedString(_)
            | Token::TripleSingleQuotedString(_)
            | Token::TripleDoubleQuotedString(_)
            | Token::DollarQuotedString(_)
            | Token::SingleQuotedByteStringLiteral(_)
            | Token::DoubleQuotedByteStringLiteral(_)
            | Token::TripleSingleQuotedByteStringLiteral(_)
            | Token::TripleDoubleQuotedByteStringLiteral(_)
            | Token::SingleQuotedRawStringLiteral(_)
            | Token::DoubleQuotedRawStringLiteral(_)
            | Token::TripleSingleQuotedRawStringLiteral(_)
            | Token::TripleDoubleQuotedRawStringLiteral(_)
            | Token::NationalStringLiteral(_)
            | Token::QuoteDelimitedStringLiteral(_)
            | Token::NationalQuoteDelimitedStringLiteral(_)
            | Token::EscapedStringLiteral(_)
            | Token::UnicodeStringLiteral(_)
            | Token::HexStringLiteral(_) => out.push(Tok::Value),
            Token::Placeholder(p) if p == "?" => out.push(Tok::Placeholder),
            Token::Question => out.push(Tok::Placeholder),
            Token::LParen => out.push(Tok::Open),
            Token::RParen => out.push(Tok::Close),
            Token::Comma => out.push(Tok::Comma),
            other => push_punct(out, &other.to_string()),
        }
    }
    true
}

/// Operators that sqlparser splits or joins differently from the byte
/// lexer are written out one character at a time by both, so the two
/// paths agree without sharing an operator table.
fn push_punct(out: &mut Vec<Tok>, text: &str) {
    for c in text.chars() {
        out.push(Tok::Punct(c.to_string()));
    }
}

/// The body of `/*!NNNNN ... */` (run by the server) or `None` for a plain
/// comment or an optimizer hint.
fn executable_comment(body: &str) -> Option<&str> {
    let rest = body.strip_prefix('!')?;
    Some(rest.trim_start_matches(|c: char| c.is_ascii_digit()))
}

fn classify_word(value: &str, quoted: bool) -> Tok {
    if !quoted && is_keyword(value) {
        Tok::Keyword(value.to_ascii_uppercase())
    } else {
        Tok::Ident(value.to_string())
    }
}

fn is_keyword(word: &str) -> bool {
    if word.is_empty() || word.len() > 40 || !word.is_ascii() {
        return false;
    }
    let upper = word.to_ascii_uppercase();
    ALL_KEYWORDS.binary_search(&upper.as_str()).is_ok()
}

pub fn tokenize_bytes(raw: &[u8]) -> Vec<Tok> {
    let mut out = Vec::new();
    bytes_into(raw, &mut out, 0);
    out
}

fn is_word_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'$' || b >= 0x80
}

fn bytes_into(raw: &[u8], out: &mut Vec<Tok>, depth: u32) {
    let mut i = 0;
    let n = raw.len();
    while i < n {
        let b = raw[i];
        let next = raw.get(i + 1).copied();
        match b {
            b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c => i += 1,
            b'#' => i = skip_line(raw, i),
            b'-' if next == Some(b'-')
                && raw.get(i + 2).is_none_or(|c| c.is_ascii_whitespace() || c.is_ascii_control()) =>
            {
                i = skip_line(raw, i)
            }
            b'/' if next == Some(b'*') => {
                let end = find(raw, i + 2, b"*/").unwrap_or(n);
                let body = &raw[i + 2..end];
                if let Some(rest) = body.strip_prefix(b"!") {
                    let start = rest.iter().take_while(|c| c.is_ascii_digit()).count();
                    if depth < MAX_COMMENT_DEPTH {
                        bytes_into(&rest[start..], out, depth + 1);
                    }
                }
                i = (end + 2).min(n);
            }
            b'\'' | b'"' => {
                i = skip_quoted(raw, i, b);
                out.push(Tok::Value);
            }
            b'`' => {
                let end = find(raw, i + 1, b"`").unwrap_or(n);
                out.push(Tok::Ident(String::from_utf8_lossy(&raw[i + 1..end]).into_owned()));
                i = (end + 1).min(n);
            }
            b'0'..=b'9' => i = lex_number(raw, i, out),
            b'.' if next.is_some_and(|c| c.is_ascii_digit())
                && !matches!(out.last(), Some(Tok::Ident(_)) | Some(Tok::Keyword(_))) =>
            {
                i = lex_number(raw, i, out)
            }
            b'?' => {
                out.push(Tok::Placeholder);
                i += 1;
            }
            b'(' => {
                out.push(Tok::Open);
                i += 1;
            }
            b')' => {
                out.push(Tok::Close);
                i += 1;
            }
            b',' => {
                out.push(Tok::Comma);
                i += 1;
            }
            _ if is_word_byte(b) => {
                let start = i;
                while i < n && is_word_byte(raw[i]) {
                    i += 1;
                }
                let word = &raw[start..i];
                // X'..', B'..', N'..', _charset'..' introduce literals.
                if i < n && raw[i] == b'\'' && is_literal_prefix(word) {
                    i = skip_quoted(raw, i, b'\'');
                    out.push(Tok::Value);
                } else {
                    let text = String::from_utf8_lossy(word);
                    out.push(classify_word(&text, false));
                }
            }
            _ => {
                // One token per punctuation character (see `push_punct`); a
                // stray UTF-8 continuation byte is skipped as punctuation.
                if b.is_ascii() {
                    out.push(Tok::Punct((b as char).to_string()));
                }
                i += 1;
            }
        }
    }
}

fn is_literal_prefix(word: &[u8]) -> bool {
    matches!(word, b"x" | b"X" | b"b" | b"B" | b"n" | b"N") || word.first() == Some(&b'_')
}

fn skip_line(raw: &[u8], i: usize) -> usize {
    raw[i..].iter().position(|&c| c == b'\n').map_or(raw.len(), |p| i + p + 1)
}

fn find(raw: &[u8], from: usize, needle: &[u8]) -> Option<usize> {
    if from >= raw.len() {
        return None;
    }
    raw[from..].windows(needle.len()).position(|w| w == needle).map(|p| from + p)
}

/// End of a quoted string starting at `i` (the quote), honouring backslash
/// escapes and doubled quotes; an unterminated string runs to the end.
fn skip_quoted(raw: &[u8], i: usize, quote: u8) -> usize {
    let mut j = i + 1;
    while j < raw.len() {
        match raw[j] {
            b'\\' => j += 2,
            c if c == quote => {
                if raw.get(j + 1) == Some(&quote) {
                    j += 2;
                } else {
                    return j + 1;
                }
            }
            _ => j += 1,
        }
    }
    raw.len()
}

fn lex_number(raw: &[u8], i: usize, out: &mut Vec<Tok>) -> usize {
    let mut j = i;
    let n = raw.len();
    if raw[j] == b'0' && j + 1 < n && matches!(raw[j + 1], b'x' | b'X' | b'b' | b'B') {
        j += 2;
        while j < n && raw[j].is_ascii_hexdigit() {
            j += 1;
        }
    } else {
        while j < n && (raw[j].is_ascii_digit() || raw[j] == b'.') {
            j += 1;
        }
        if j < n && matches!(raw[j], b'e' | b'E') {
            let mut k = j + 1;
            if k < n && matches!(raw[k], b'+' | b'-') {
                k += 1;
            }
            if k < n && raw[k].is_ascii_digit() {
                j = k;
                while j < n && raw[j].is_ascii_digit() {
                    j += 1;
                }
            }
        }
    }
    // `1abc` is an identifier in MySQL, not a number followed by a word.
    if j < n && is_word_byte(raw[j]) {
        while j < n && is_word_byte(raw[j]) {
            j += 1;
        }
        out.push(classify_word(&String::from_utf8_lossy(&raw[i..j]), false));
        return j;
    }
    out.push(Tok::Value);
    j
}
