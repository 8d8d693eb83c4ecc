//! Raw text to tokens, read the way MariaDB's own lexer reads it
//! (`Lex_input_stream::lex_one_token` in `sql/sql_lex.cc`, default
//! `sql_mode`, a UTF-8 connection): the server computes its digests over
//! those tokens, so reading them alike is what makes sqlbee group
//! statements as the server does.
//!
//! Where the server gives up (an unterminated string, quote or comment: a
//! syntax error, so no digest at all), the rest of the text is one token,
//! which keeps the kernel's text hash sound: that hash skips the content of
//! a string to the end of the text too (`sqlbee_kernel_abi::text_hash`).
//!
//! Never fails and never panics: any bytes give some tokens.
use super::keywords::{self, Kw, WORDS};

/// One token. Borrowed from the text: lexing allocates nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tok<'a> {
    Keyword(Kw),
    /// An identifier as written, without its backquotes (doubled backquotes
    /// inside stay doubled, as the server keeps them).
    Ident(&'a [u8]),
    /// A number: a sign before it may fold into it.
    Number,
    /// Any other value: a string, a placeholder, the name of a user
    /// variable (`@a`, which the server reads as a value, so `@a` and `@b`
    /// share a digest), a host name (`user@host`).
    Value,
    /// `X'..'`: the server keeps it apart from other values.
    HexString,
    /// A character set introducer (`_utf8mb4'a'`, `_latin1 0x41`); all of
    /// them read alike.
    Charset,
    /// An operator of more than one character.
    Op(&'static str),
    /// Any other character.
    Char(u8),
}

/// The server version that executable comments (`/*!50100 ... */`) are
/// compared with (`MYSQL_VERSION_ID`; 101199 is 10.11.99): the server runs
/// the body of those for its version and below. The 10.11 series it is:
/// the normalizer does not know which server a statement ran on.
const SERVER_VERSION: u32 = 101_199;

/// The character sets a `_name` introducer may name (`SHOW CHARACTER SET`,
/// plus `utf8` and `filename`), lower case and sorted.
const CHARSETS: &[&[u8]] = &[
    b"armscii8",
    b"ascii",
    b"big5",
    b"binary",
    b"cp1250",
    b"cp1251",
    b"cp1256",
    b"cp1257",
    b"cp850",
    b"cp852",
    b"cp866",
    b"cp932",
    b"dec8",
    b"eucjpms",
    b"euckr",
    b"filename",
    b"gb2312",
    b"gbk",
    b"geostd8",
    b"greek",
    b"hebrew",
    b"hp8",
    b"keybcs2",
    b"koi8r",
    b"koi8u",
    b"latin1",
    b"latin2",
    b"latin5",
    b"latin7",
    b"macce",
    b"macroman",
    b"sjis",
    b"swe7",
    b"tis620",
    b"ucs2",
    b"ujis",
    b"utf16",
    b"utf16le",
    b"utf32",
    b"utf8",
    b"utf8mb3",
    b"utf8mb4",
];

/// Longest keyword: longer words are names without a look-up.
const MAX_KEYWORD: usize = 32;

/// Letters, digits, `_`, `$` and every byte of a multi-byte character.
#[inline]
fn is_ident_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'$' || b >= 0x80
}

/// MariaDB's `my_isspace` for ASCII.
#[inline]
fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c)
}

/// The keyword a word is, if any; `call` when `(` follows right after it
/// (then function names such as `COUNT` are keywords too).
fn keyword(word: &[u8], call: bool) -> Option<Kw> {
    if word.is_empty() || word.len() > MAX_KEYWORD || !word.is_ascii() {
        return None;
    }
    let mut buf = [0u8; MAX_KEYWORD];
    let upper = &mut buf[..word.len()];
    upper.copy_from_slice(word);
    upper.make_ascii_uppercase();
    let found = WORDS.binary_search_by(|(w, ..)| w.as_bytes().cmp(upper)).ok()?;
    let (_, kw, function_only) = WORDS[found];
    (call || !function_only).then_some(kw)
}

fn is_charset(name: &[u8]) -> bool {
    if name.len() > 10 {
        return false;
    }
    let mut buf = [0u8; 10];
    let lower = &mut buf[..name.len()];
    lower.copy_from_slice(name);
    lower.make_ascii_lowercase();
    CHARSETS.binary_search(&&*lower).is_ok()
}

/// What the previous token leaves for the next one, as the server's
/// `next_state` does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Next {
    Any,
    /// A name was followed by `.`: it is a separator, even before a digit
    /// (`t.5` names a column, `(t).5`... is a number).
    Separator,
    /// After a qualifying `.`: the next word is a name whatever it spells
    /// (`t.select`), but for a few functions (`db.TRIM(`).
    Qualified,
    /// The second `@` of `@@`.
    SecondAt,
    /// After `@@`: the next word may be a keyword (`@@session.x`).
    SystemVariable,
    /// After the `@` of a user variable: its name, a value.
    UserVariable,
}

/// The lexer, an iterator over the tokens of one text.
#[derive(Clone)]
pub struct Lexer<'a> {
    raw: &'a [u8],
    i: usize,
    /// Inside the body of an executable comment: `*/` ends it.
    in_comment: bool,
    next: Next,
}

impl<'a> Lexer<'a> {
    pub fn new(raw: &'a [u8]) -> Self {
        Self { raw, i: 0, in_comment: false, next: Next::Any }
    }

    /// Where the last token ended.
    pub fn position(&self) -> usize {
        self.i
    }

    fn peek(&self, ahead: usize) -> u8 {
        self.raw.get(self.i + ahead).copied().unwrap_or(0)
    }

    fn ident_end(&self, from: usize) -> usize {
        from + self.raw[from..].iter().take_while(|&&b| is_ident_byte(b)).count()
    }

    fn digits_end(&self, from: usize) -> usize {
        from + self.raw[from..].iter().take_while(|b| b.is_ascii_digit()).count()
    }

    /// Skips whitespace and comments; false at the end of the text.
    fn skip_space(&mut self) -> bool {
        loop {
            let Some(&b) = self.raw.get(self.i) else { return false };
            match b {
                _ if is_space(b) => self.i += 1,
                b'#' => self.skip_line(),
                // `--` starts a comment before a space or a control
                // character, and at the very end (the server sees the
                // terminating NUL there).
                b'-' if self.peek(1) == b'-' && {
                    let next = self.peek(2);
                    is_space(next) || next < 0x20 || next == 0x7f
                } =>
                {
                    self.skip_line()
                }
                b'/' if self.peek(1) == b'*' => self.comment(),
                b'*' if self.in_comment && self.peek(1) == b'/' => {
                    self.in_comment = false;
                    self.i += 2;
                }
                _ => return true,
            }
        }
    }

    fn skip_line(&mut self) {
        self.i = self.raw[self.i..].iter().position(|&c| c == b'\n').map_or(self.raw.len(), |p| self.i + p + 1);
    }

    /// A comment starting at `/*`: an executable one (`/*!`, `/*M!`, with
    /// an optional 5 or 6 digit version) has its body read as code, every
    /// other one (optimizer hints too) is skipped. Inside an executable
    /// comment, another one is a plain comment.
    fn comment(&mut self) {
        let mariadb = self.peek(2) == b'M' && self.peek(3) == b'!';
        if (self.peek(2) == b'!' || mariadb) && !self.in_comment {
            let start = self.i + if mariadb { 4 } else { 3 };
            let digits = self.digits_end(start) - start;
            let runs = if digits >= 5 {
                let len = if digits >= 6 { 6 } else { 5 };
                let version: u32 =
                    std::str::from_utf8(&self.raw[start..start + len]).ok().and_then(|v| v.parse().ok()).unwrap_or(0);
                // MySQL 5.7 and later syntax is left out unless marked
                // MariaDB's own (`/*M!`).
                let runs = version <= SERVER_VERSION && (!(50700..=99999).contains(&version) || mariadb);
                if runs {
                    self.i = start + len;
                }
                runs
            } else {
                self.i = start;
                true
            };
            if runs {
                self.in_comment = true;
                return;
            }
        }
        self.i = match find(self.raw, self.i + 2, b"*/") {
            Some(end) => end + 2,
            None => self.raw.len(),
        };
    }

    /// A quoted string starting at `i` (the quote), honouring backslash
    /// escapes and doubled quotes; an unterminated one runs to the end.
    fn skip_quoted(&mut self, quote: u8) {
        let raw = self.raw;
        let mut j = self.i + 1;
        while j < raw.len() {
            match raw[j] {
                b'\\' => j += 2,
                c if c == quote => {
                    if raw.get(j + 1) == Some(&quote) {
                        j += 2;
                    } else {
                        self.i = j + 1;
                        return;
                    }
                }
                _ => j += 1,
            }
        }
        self.i = raw.len();
    }

    /// A backquoted name starting at `i`; doubled backquotes stand inside it.
    fn quoted_ident(&mut self) -> Tok<'a> {
        let raw = self.raw;
        let start = self.i + 1;
        let mut j = start;
        while j < raw.len() {
            if raw[j] == b'`' {
                if raw.get(j + 1) != Some(&b'`') {
                    self.i = j + 1;
                    return Tok::Ident(&raw[start..j]);
                }
                j += 1;
            }
            j += 1;
        }
        self.i = raw.len();
        Tok::Ident(&raw[start..])
    }

    /// A token starting with a digit: a number, or a name such as `1abc`.
    fn number(&mut self) -> Tok<'a> {
        let raw = self.raw;
        let start = self.i;
        let name = |lexer: &mut Self| {
            let end = lexer.ident_end(start);
            lexer.i = end;
            lexer.qualifies(end);
            Tok::Ident(&raw[start..end])
        };
        if raw[start] == b'0' && matches!(self.peek(1), b'x' | b'b') {
            let hex = self.peek(1) == b'x';
            let digits = raw[start + 2..]
                .iter()
                .take_while(|&&c| if hex { c.is_ascii_hexdigit() } else { c == b'0' || c == b'1' })
                .count();
            let end = start + 2 + digits;
            if digits > 0 && !raw.get(end).is_some_and(|&c| is_ident_byte(c)) {
                self.i = end;
                return Tok::Number;
            }
            return name(self);
        }
        let end = self.digits_end(start);
        match raw.get(end).copied() {
            Some(b'e' | b'E') => {
                let sign = usize::from(matches!(raw.get(end + 1), Some(b'+' | b'-')));
                if raw.get(end + 1 + sign).is_some_and(u8::is_ascii_digit) {
                    self.i = self.exponent_end(end + 1 + sign);
                    Tok::Number
                } else {
                    name(self)
                }
            }
            Some(c) if is_ident_byte(c) => name(self),
            Some(b'.') if raw.get(end + 1) != Some(&b'.') => {
                self.i = end;
                self.fraction()
            }
            _ => {
                self.i = end;
                Tok::Number
            }
        }
    }

    /// The rest of a number from its `.`: digits and an exponent.
    fn fraction(&mut self) -> Tok<'a> {
        let raw = self.raw;
        let end = self.digits_end(self.i + 1);
        self.i = end;
        if matches!(raw.get(end), Some(b'e' | b'E')) {
            let sign = usize::from(matches!(raw.get(end + 1), Some(b'+' | b'-')));
            // Without a digit the server refuses the statement; the number
            // ends before the `e` here.
            if raw.get(end + 1 + sign).is_some_and(u8::is_ascii_digit) {
                self.i = self.exponent_end(end + 1 + sign);
            }
        }
        Tok::Number
    }

    /// The end of an exponent's digits starting at `from`, with a `.` and
    /// digits after them: the server reads `1e-5.5` as two numbers (and
    /// refuses the statement), but the kernel's text hash skips `5.5` after
    /// the sign as one, so that `1e-5.5` and `1e-5` hash alike; they must
    /// read alike here too.
    fn exponent_end(&self, from: usize) -> usize {
        let end = self.digits_end(from);
        if self.raw.get(end) == Some(&b'.') { self.digits_end(end + 1) } else { end }
    }

    /// After a name that ends at `end`: a `.` right there followed by a
    /// name character qualifies it.
    fn qualifies(&mut self, end: usize) {
        if self.raw.get(end) == Some(&b'.') && self.raw.get(end + 1).is_some_and(|&c| is_ident_byte(c)) {
            self.next = Next::Separator;
        }
    }

    /// A word starting with a letter, `_`, `$` or a multi-byte character.
    fn word(&mut self) -> Tok<'a> {
        let raw = self.raw;
        let start = self.i;
        let first = raw[start];
        let quote = raw.get(start + 1).copied();
        if quote == Some(b'\'') {
            match first {
                b'x' | b'X' => {
                    self.i += 1;
                    self.skip_quoted(b'\'');
                    return Tok::HexString;
                }
                b'b' | b'B' => {
                    self.i += 1;
                    self.skip_quoted(b'\'');
                    return Tok::Number;
                }
                b'n' | b'N' => {
                    self.i += 1;
                    self.skip_quoted(b'\'');
                    return Tok::Value;
                }
                _ => {}
            }
        }
        let end = self.ident_end(start);
        self.i = end;
        let word = &raw[start..end];
        if raw.get(end) == Some(&b'.') && raw.get(end + 1).is_some_and(|&c| is_ident_byte(c)) {
            // `db.t`: a qualifier is a name, never a keyword.
            self.next = Next::Separator;
            return Tok::Ident(word);
        }
        if let Some(kw) = keyword(word, raw.get(end) == Some(&b'(')) {
            return Tok::Keyword(kw);
        }
        if first == b'_' && word.is_ascii() && is_charset(&word[1..]) {
            return Tok::Charset;
        }
        Tok::Ident(word)
    }

    /// A word right after a qualifying `.` or after `@@`.
    fn name_after(&mut self, keywords: bool) -> Tok<'a> {
        let raw = self.raw;
        let start = self.i;
        let end = self.ident_end(start);
        self.i = end;
        let word = &raw[start..end];
        if raw.get(end) == Some(&b'.') {
            self.next = Next::Separator;
        }
        let call = raw.get(end) == Some(&b'(');
        let kw = if keywords {
            keyword(word, call)
        } else if call {
            // `db.TRIM(`: the functions the grammar spells with keywords.
            const QUALIFIED: [&[u8]; 4] = [b"SUBSTRING", b"SUBSTR", b"TRIM", b"REPLACE"];
            QUALIFIED.iter().any(|f| f.eq_ignore_ascii_case(word)).then(|| keyword(word, true)).flatten()
        } else {
            None
        };
        kw.map_or(Tok::Ident(word), Tok::Keyword)
    }

    /// The comparison operators MariaDB reads as one token.
    fn comparison(&mut self, c: u8) -> Tok<'a> {
        let next = self.peek(1);
        let op = match (c, next) {
            (b'<', b'=') if self.peek(2) == b'>' => "<=>",
            (b'<', b'=') => "<=",
            (b'<', b'>') | (b'!', b'=') => "!=",
            (b'<', b'<') => "<<",
            (b'>', b'=') => ">=",
            (b'>', b'>') => ">>",
            _ => {
                self.i += 1;
                return Tok::Char(c);
            }
        };
        self.i += op.len();
        Tok::Op(op)
    }
}

impl<'a> Iterator for Lexer<'a> {
    type Item = Tok<'a>;

    fn next(&mut self) -> Option<Tok<'a>> {
        let raw = self.raw;
        let at_name = raw.get(self.i).is_some_and(|&c| is_ident_byte(c));
        match std::mem::replace(&mut self.next, Next::Any) {
            Next::Any => {}
            Next::Separator => {
                self.i += 1;
                if raw.get(self.i).is_some_and(|&c| is_ident_byte(c)) {
                    self.next = Next::Qualified;
                }
                return Some(Tok::Char(b'.'));
            }
            Next::Qualified if at_name => return Some(self.name_after(false)),
            Next::SecondAt => {
                self.i += 1;
                if raw.get(self.i) != Some(&b'`') {
                    self.next = Next::SystemVariable;
                }
                return Some(Tok::Char(b'@'));
            }
            Next::SystemVariable if at_name => return Some(self.name_after(true)),
            Next::UserVariable => {
                // The server reads the name as a host name, a value
                // (letters, digits, `.`, `_`, `$`, multi-byte characters),
                // empty before a space.
                let len = raw[self.i..]
                    .iter()
                    .take_while(|&&b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'$') || b >= 0x80)
                    .count();
                self.i += len;
                return Some(Tok::Value);
            }
            Next::Qualified | Next::SystemVariable => {}
        }
        if !self.skip_space() {
            return None;
        }
        let c = raw[self.i];
        let next = self.peek(1);
        let tok = match c {
            b'\'' | b'"' => {
                self.skip_quoted(c);
                Tok::Value
            }
            b'`' => self.quoted_ident(),
            b'0'..=b'9' => self.number(),
            b'.' if next.is_ascii_digit() => self.fraction(),
            b'.' if next == b'.' => {
                self.i += 2;
                Tok::Op("..")
            }
            b'.' => {
                self.i += 1;
                if raw.get(self.i).is_some_and(|&c| is_ident_byte(c)) {
                    self.next = Next::Qualified;
                }
                Tok::Char(b'.')
            }
            _ if is_ident_byte(c) => self.word(),
            b'@' => {
                self.i += 1;
                self.next = match next {
                    // Two tokens, as the server has them.
                    b'@' => Next::SecondAt,
                    // `@'a'`, `` @`a` ``: a string or a name follows.
                    b'\'' | b'"' | b'`' => Next::Any,
                    _ => Next::UserVariable,
                };
                Tok::Char(b'@')
            }
            b'<' | b'>' | b'=' | b'!' => self.comparison(c),
            b'&' | b'|' if next == c => {
                self.i += 2;
                Tok::Op(if c == b'&' { "&&" } else { "||" })
            }
            b':' if next == b'=' => {
                self.i += 2;
                Tok::Op(":=")
            }
            // MySQL's JSON operators; MariaDB has none, and reads `-` `>`.
            b'-' if next == b'>' => {
                let op = if self.peek(2) == b'>' { "->>" } else { "->" };
                self.i += op.len();
                Tok::Op(op)
            }
            b'?' => {
                self.i += 1;
                Tok::Value
            }
            // `\N` is NULL.
            b'\\' if next == b'N' => {
                self.i += 2;
                Tok::Keyword(keywords::NULL)
            }
            _ => {
                self.i += 1;
                Tok::Char(c)
            }
        };
        Some(tok)
    }
}

fn find(raw: &[u8], from: usize, needle: &[u8]) -> Option<usize> {
    if from >= raw.len() {
        return None;
    }
    raw[from..].windows(needle.len()).position(|w| w == needle).map(|p| from + p)
}
