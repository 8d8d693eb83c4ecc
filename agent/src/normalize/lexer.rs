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
    if misread(&tokens) {
        return false;
    }
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
            // MySQL's dialect reads `@var`, `@@session` and `user@host` as
            // one word and `0b101` as a word too; the byte lexer's reading of
            // the word's text (`@` punctuation, bit literal) is the one the
            // server has, so unquoted words go through it.
            Token::Word(word) if word.quote_style.is_none() => {
                bytes_into(word.value.as_bytes(), out, depth)
            }
            Token::Word(word) => out.push(Tok::Ident(word.value)),
            Token::Number(..)
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
            // `?12` (a numbered placeholder elsewhere): the byte lexer sees
            // `?` followed by a number.
            Token::Placeholder(p) if p.starts_with('?') => {
                out.push(Tok::Placeholder);
                if p.len() > 1 {
                    out.push(Tok::Value);
                }
            }
            Token::Question => out.push(Tok::Placeholder),
            Token::LParen => out.push(Tok::Open),
            Token::RParen => out.push(Tok::Close),
            Token::Comma => out.push(Tok::Comma),
            other => push_punct(out, &other.to_string()),
        }
    }
    true
}

/// Whether sqlparser read the text differently from MySQL; the byte lexer,
/// which follows MySQL, takes such text instead:
/// - `2events` ends at the `e` sqlparser tried as an exponent: a number (or
///   after `.`, a word) and a word where MySQL has one identifier;
/// - `|/`, `||/` and `@?` are PostgreSQL operators, so `a|/*c*/` has no
///   comment;
/// - `@` takes the next character into a word whatever it is (`@!`, `@/*`,
///   `@1.5`), and `@X'41'` hides the literal prefix; only `@name` is read
///   alike.
fn misread(tokens: &[Token]) -> bool {
    let odd_pair = tokens.windows(2).any(|pair| {
        let first = unquoted(&pair[0]);
        match &pair[1] {
            Token::Word(w) if w.quote_style.is_none() && w.value.starts_with(['e', 'E']) => {
                first.is_some() || matches!(pair[0], Token::Number(_, false))
            }
            Token::SingleQuotedString(_) => first.is_some_and(|w| ends_in_literal_prefix(w, b'\'')),
            Token::DoubleQuotedString(_) => first.is_some_and(|w| ends_in_literal_prefix(w, b'"')),
            _ => false,
        }
    });
    let odd_token = tokens.iter().any(|t| match t {
        Token::PGSquareRoot | Token::PGCubeRoot | Token::AtQuestion => true,
        _ => unquoted(t).is_some_and(|w| w.contains('@') && !at_names_only(w)),
    });
    odd_pair || odd_token
}

fn unquoted(token: &Token) -> Option<&str> {
    match token {
        Token::Word(w) if w.quote_style.is_none() => Some(&w.value),
        _ => None,
    }
}

/// Whether every `@` in a word is followed by a name (`@a`, `@@global`,
/// `user@host`).
fn at_names_only(word: &str) -> bool {
    let name_start = |c: char| c.is_alphabetic() || c == '_' || c == '$' || !c.is_ascii();
    !word.ends_with('@')
        && word.split('@').skip(1).all(|name| name.is_empty() || name.starts_with(name_start))
}

/// `@X` before `'41'`: the byte lexer reads `@` and a hex literal.
fn ends_in_literal_prefix(word: &str, quote: u8) -> bool {
    word.rsplit_once('@').is_some_and(|(_, name)| is_literal_prefix(name.as_bytes(), quote))
}

/// Operators that sqlparser splits or joins differently from the byte
/// lexer are written out one character at a time by both, so the two
/// paths agree without sharing an operator table. `Token::Char` (a
/// character sqlparser has no token for) is punctuation too, not a value.
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

fn classify_word(value: &str) -> Tok {
    if is_keyword(value) {
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
    // Where the last word or identifier ended: a `.` right there qualifies
    // it (`t.5`), anywhere else it may start a number (`.5`).
    let mut word_end = None;
    while i < n {
        let b = raw[i];
        let next = raw.get(i + 1).copied();
        match b {
            b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c => i += 1,
            b'#' => i = skip_line(raw, i),
            // Like sqlparser: `--` starts a comment only before whitespace.
            b'-' if next == Some(b'-') && starts_with_whitespace(&raw[i + 2..]) => {
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
                let (name, end) = quoted_ident(raw, i);
                out.push(Tok::Ident(name));
                i = end;
                word_end = Some(i);
            }
            b'0'..=b'9' | b'.'
                if b != b'.' || (next.is_some_and(|c| c.is_ascii_digit()) && word_end != Some(i)) =>
            {
                let bits = raw[i..].starts_with(b"0b");
                i = lex_number(raw, i, out);
                // `1abc` is a word, and so is `0b101` to sqlparser.
                if bits || matches!(out.last(), Some(Tok::Ident(_) | Tok::Keyword(_))) {
                    word_end = Some(i);
                }
            }
            // sqlparser reads `!=` as `<>`, and `!!` as one token (so `!!=`
            // is not `!` `!=`).
            b'!' if next == Some(b'=') => {
                out.extend([Tok::Punct("<".into()), Tok::Punct(">".into())]);
                i += 2;
            }
            b'!' if next == Some(b'!') => {
                out.extend([Tok::Punct("!".into()), Tok::Punct("!".into())]);
                i += 2;
            }
            // sqlparser reads `?12` as one (numbered) placeholder.
            b'?' => {
                out.push(Tok::Placeholder);
                let digits = raw[i + 1..].iter().take_while(|c| c.is_ascii_digit()).count();
                if digits > 0 {
                    out.push(Tok::Value);
                }
                i += 1 + digits;
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
                // X'..', B'..', B"..", N'..' are literals. A `_charset`
                // introducer stays a word, as sqlparser has it.
                if let Some(&quote) = raw.get(i).filter(|&&q| is_literal_prefix(word, q)) {
                    i = skip_quoted(raw, i, quote);
                    out.push(Tok::Value);
                } else {
                    out.push(classify_word(&String::from_utf8_lossy(word)));
                    word_end = Some(i);
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

fn is_literal_prefix(word: &[u8], quote: u8) -> bool {
    match quote {
        b'\'' => matches!(word, b"x" | b"X" | b"b" | b"B" | b"n" | b"N"),
        b'"' => matches!(word, b"b" | b"B"),
        _ => false,
    }
}

/// Whether `rest` starts with a whitespace character (sqlparser's
/// `char::is_whitespace`, so a non-ASCII one such as U+00A0 counts).
fn starts_with_whitespace(rest: &[u8]) -> bool {
    let head = &rest[..rest.len().min(4)];
    let valid = match std::str::from_utf8(head) {
        Ok(text) => text,
        Err(e) => std::str::from_utf8(&head[..e.valid_up_to()]).unwrap_or_default(),
    };
    valid.chars().next().is_some_and(char::is_whitespace)
}

/// A backquoted identifier starting at `i` (doubled backquotes stand for
/// one) and the index after it; an unterminated one runs to the end.
fn quoted_ident(raw: &[u8], i: usize) -> (String, usize) {
    let mut name = Vec::new();
    let mut j = i + 1;
    while j < raw.len() {
        if raw[j] == b'`' {
            if raw.get(j + 1) != Some(&b'`') {
                return (String::from_utf8_lossy(&name).into_owned(), j + 1);
            }
            j += 1;
        }
        name.push(raw[j]);
        j += 1;
    }
    (String::from_utf8_lossy(&name).into_owned(), raw.len())
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

/// A number starting at `i` (a digit, or `.` before a digit), split the way
/// sqlparser splits it: `0x` (lower case only, as in MySQL) takes hex digits,
/// `0b` binary digits, a decimal takes one `.` and an exponent.
fn lex_number(raw: &[u8], i: usize, out: &mut Vec<Tok>) -> usize {
    let n = raw.len();
    let digits_from = |from: usize, accept: fn(&u8) -> bool| {
        from + raw[from..].iter().take_while(|c| accept(c)).count()
    };
    let is_bit = |c: &u8| matches!(c, b'0' | b'1');
    let mut j;
    if raw[i..].starts_with(b"0x") {
        out.push(Tok::Value);
        return digits_from(i + 2, u8::is_ascii_hexdigit);
    } else if raw[i..].starts_with(b"0b") && raw.get(i + 2).is_some_and(is_bit) {
        j = digits_from(i + 2, is_bit);
    } else {
        j = digits_from(i, u8::is_ascii_digit);
        if raw.get(j) == Some(&b'.') {
            j = digits_from(j + 1, u8::is_ascii_digit);
        }
        if matches!(raw.get(j), Some(b'e' | b'E')) {
            let sign = usize::from(matches!(raw.get(j + 1), Some(b'+' | b'-')));
            if raw.get(j + 1 + sign).is_some_and(u8::is_ascii_digit) {
                // sqlparser takes an `L` suffix (a long literal) here.
                out.push(Tok::Value);
                let end = digits_from(j + 1 + sign, u8::is_ascii_digit);
                return end + usize::from(raw.get(end) == Some(&b'L'));
            }
        }
    }
    // `1abc` (and `0b12`) is an identifier in MySQL, not a number followed
    // by a word.
    if j < n && is_word_byte(raw[j]) {
        while j < n && is_word_byte(raw[j]) {
            j += 1;
        }
        out.push(classify_word(&String::from_utf8_lossy(&raw[i..j])));
        return j;
    }
    out.push(Tok::Value);
    j
}
