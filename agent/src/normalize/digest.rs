//! Tokens to digest text, reduced the way the server reduces them as they
//! arrive (`digest_add_token` in MariaDB's `sql/sql_digest.cc`):
//! - a number, a string, a placeholder, a user variable's name become `?`;
//! - a sign folds into the number after it when the token before the sign
//!   starts an expression (`(`, `,`, an operator, SELECT, AND, DIV, ...):
//!   `1 DIV -2` is `? DIV ?`, but `a = -1` keeps `= - ?`;
//! - `?, ?` becomes `?, ...`, `(?)` a row, `(?, ?)` `(...)`, and rows in a
//!   row `(?) /* , ... */` or `(...) /* , ... */`;
//! - `NULL` is a value where an expression may start (`= NULL`, `(NULL`),
//!   a word elsewhere (`IS NULL`, a column's `NOT NULL`); the server takes
//!   this from its grammar, sqlbee from the token before;
//! - `NAME_CONST('v', 5)`, which the server writes in place of a stored
//!   program's variable, is one value, so a statement inside a procedure
//!   reads and groups like its literal twin.
//!
//! The text names every token differently, so two statements share a text
//! exactly when they share a token stream, as the server's digest (a hash
//! of its token stream) does: keywords in upper case (a synonym by its
//! common name, `SCHEMA` as `DATABASE`), names in backquotes with their case,
//! operators as written (`<>` as `!=`, the same token).
use super::keywords::{self, Kw};
use super::lexer::{Lexer, Tok};

/// Digest texts longer than this are cut (at a token boundary) and end in
/// `...`; statements that differ only past this point share a digest.
pub const MAX_DIGEST_TEXT: usize = 4096;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Out<'a> {
    Keyword(Kw),
    Ident(&'a [u8]),
    /// `?`
    Value,
    /// `?, ...`: two or more values in a row.
    Values,
    /// `(?)`
    Row,
    /// `(?) /* , ... */`
    Rows,
    /// `(...)`: a row of two or more values.
    Tuple,
    /// `(...) /* , ... */`
    Tuples,
    HexString,
    Charset,
    Op(&'static str),
    Char(u8),
}

/// The digest text of one statement.
pub fn build(raw: &[u8]) -> String {
    let mut builder = Builder { out: Vec::with_capacity(32) };
    let mut lexer = Lexer::new(raw);
    while let Some(tok) = lexer.next() {
        if let Tok::Ident(name) = tok
            && name.eq_ignore_ascii_case(b"NAME_CONST")
            && skip_call(&mut lexer)
        {
            builder.value();
            continue;
        }
        builder.push(tok);
    }
    while builder.out.last() == Some(&Out::Char(b';')) {
        builder.out.pop();
    }
    render(&builder.out)
}

/// Skips `( ... )` with what is nested in it, if a `(` comes next.
fn skip_call(lexer: &mut Lexer) -> bool {
    let mut ahead = lexer.clone();
    if ahead.next() != Some(Tok::Char(b'(')) {
        return false;
    }
    let mut depth = 1u32;
    for tok in ahead.by_ref() {
        match tok {
            Tok::Char(b'(') => depth += 1,
            Tok::Char(b')') => {
                depth -= 1;
                if depth == 0 {
                    break;
                }
            }
            _ => {}
        }
    }
    *lexer = ahead;
    true
}

/// Tokens after which a sign belongs to the number that follows
/// (`m_start_expr` of MariaDB's `gen_lex_token.cc`).
fn starts_expression(out: Option<&Out>) -> bool {
    use keywords::*;
    match out {
        Some(Out::Char(c)) => b"(,|&+-*/%^".contains(c),
        Some(Out::Op(op)) => matches!(*op, "||" | "&&" | "<<" | ">>"),
        Some(Out::Keyword(k)) => [
            EVERY, AT, STARTS, ENDS, DEFAULT, RETURN, IF, ELSEIF, CASE, WHEN, WHILE, UNTIL, SELECT, OR, XOR, AND, NOT,
            BETWEEN, LIKE, REGEXP, INTERVAL, DIV, MOD,
        ]
        .contains(k),
        _ => false,
    }
}

/// Tokens after which an expression may start, so that `NULL` there is a
/// value: those above, comparisons, and the clauses that take an
/// expression.
fn opens_expression(out: &[Out]) -> bool {
    use keywords::*;
    let last = out.last();
    starts_expression(last)
        || match last {
            None => true,
            Some(Out::Char(c)) => b"=<>!~:".contains(c),
            Some(Out::Op(_)) => true,
            Some(Out::Keyword(k)) => [
                WHERE,
                HAVING,
                ON,
                THEN,
                ELSE,
                DO,
                BY,
                DISTINCT,
                ALL,
                ESCAPE,
                USING,
                IN,
                FROM,
                FOR,
                RETURNING,
                SQL_CALC_FOUND_ROWS,
                HIGH_PRIORITY,
                STRAIGHT_JOIN,
                SQL_SMALL_RESULT,
                SQL_BIG_RESULT,
                SQL_BUFFER_RESULT,
                SQL_NO_CACHE,
                SQL_CACHE,
                AGAINST,
            ]
            .contains(k),
            _ => false,
        }
}

struct Builder<'a> {
    out: Vec<Out<'a>>,
}

impl<'a> Builder<'a> {
    fn last_two(&self) -> (Option<&Out<'a>>, Option<&Out<'a>>) {
        let n = self.out.len();
        (self.out.last(), n.checked_sub(2).and_then(|i| self.out.get(i)))
    }

    fn push(&mut self, tok: Tok<'a>) {
        match tok {
            Tok::Number => {
                // `- - 1` after an operator is one value.
                while let (Some(Out::Char(b'-' | b'+')), before) = self.last_two()
                    && starts_expression(before)
                {
                    self.out.pop();
                }
                self.value();
            }
            Tok::Value => self.value(),
            Tok::Keyword(keywords::NULL) => {
                let value = match self.out.split_last() {
                    // `NOT NULL`: a value where NOT starts an expression
                    // (`WHERE NOT NULL`), a column's attribute elsewhere.
                    Some((Out::Keyword(keywords::NOT), before)) => {
                        before.last() != Some(&Out::Keyword(keywords::IS)) && opens_expression(before)
                    }
                    _ => opens_expression(&self.out),
                };
                if value {
                    self.value();
                } else {
                    self.out.push(Out::Keyword(keywords::NULL));
                }
            }
            Tok::Char(b')') => self.close(),
            Tok::Keyword(k) => self.out.push(Out::Keyword(k)),
            Tok::Ident(name) => self.out.push(Out::Ident(name)),
            Tok::HexString => self.out.push(Out::HexString),
            Tok::Charset => self.out.push(Out::Charset),
            Tok::Op(op) => self.out.push(Out::Op(op)),
            Tok::Char(c) => self.out.push(Out::Char(c)),
        }
    }

    /// A value, joining `?, ?` into `?, ...`.
    fn value(&mut self) {
        if let (Some(Out::Char(b',')), Some(Out::Value | Out::Values)) = self.last_two() {
            self.out.truncate(self.out.len() - 2);
            self.out.push(Out::Values);
        } else {
            self.out.push(Out::Value);
        }
    }

    /// `)`, closing `(?)` and `(?, ...)` into rows, and rows in a row.
    fn close(&mut self) {
        let (row, rows) = match self.last_two() {
            (Some(Out::Value), Some(Out::Char(b'('))) => (Out::Row, Out::Rows),
            (Some(Out::Values), Some(Out::Char(b'('))) => (Out::Tuple, Out::Tuples),
            _ => {
                self.out.push(Out::Char(b')'));
                return;
            }
        };
        self.out.truncate(self.out.len() - 2);
        match self.last_two() {
            (Some(Out::Char(b',')), Some(before)) if *before == row || *before == rows => {
                self.out.truncate(self.out.len() - 2);
                self.out.push(rows);
            }
            _ => self.out.push(row),
        }
    }
}

fn render(items: &[Out]) -> String {
    const CUT: &str = " ...";
    let mut text = String::new();
    let mut glue_next = true;
    // The longest token-boundary prefix that still has room for `CUT`.
    let mut cut_at = 0;
    let mut name = String::new();
    for item in items {
        let (piece, glue_before, glue_after) = match item {
            Out::Keyword(k) => (k.name(), false, false),
            Out::Ident(raw) => {
                name.clear();
                name.push('`');
                name.push_str(&String::from_utf8_lossy(raw));
                name.push('`');
                (name.as_str(), false, false)
            }
            Out::Value => ("?", false, false),
            Out::Values => ("?, ...", false, false),
            Out::Row => ("(?)", false, false),
            Out::Rows => ("(?) /* , ... */", false, false),
            Out::Tuple => ("(...)", false, false),
            Out::Tuples => ("(...) /* , ... */", false, false),
            Out::HexString => ("X'?'", false, false),
            Out::Charset => ("_charset", false, false),
            Out::Op(op) => (*op, false, false),
            Out::Char(c) => {
                let piece = char_str(*c);
                match c {
                    b'(' => (piece, false, true),
                    b')' | b',' => (piece, true, false),
                    b'.' => (piece, true, true),
                    b'@' => (piece, false, true),
                    _ => (piece, false, false),
                }
            }
        };
        let space = !text.is_empty() && !glue_next && !glue_before;
        if text.len() + usize::from(space) + piece.len() > MAX_DIGEST_TEXT {
            text.truncate(cut_at);
            text.push_str(if text.is_empty() { &CUT[1..] } else { CUT });
            break;
        }
        if space {
            text.push(' ');
        }
        text.push_str(piece);
        glue_next = glue_after;
        if text.len() + CUT.len() <= MAX_DIGEST_TEXT {
            cut_at = text.len();
        }
    }
    text
}

/// One character as text; a byte that is not ASCII (a stray piece of a
/// multi-byte character) as the replacement character.
fn char_str(c: u8) -> &'static str {
    static ASCII: [u8; 128] = {
        let mut all = [0u8; 128];
        let mut i = 0;
        while i < 128 {
            all[i] = i as u8;
            i += 1;
        }
        all
    };
    ASCII.get(c as usize..=c as usize).and_then(|one| std::str::from_utf8(one).ok()).unwrap_or("\u{fffd}")
}
