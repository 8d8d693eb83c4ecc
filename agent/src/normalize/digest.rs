//! Token stream -> digest text.
use super::lexer::Tok;

/// Digest texts longer than this are cut (at a token boundary) and end in
/// `...`; statements that differ only past this point share a digest.
pub const MAX_DIGEST_TEXT: usize = 4096;

#[derive(Clone, Debug, PartialEq, Eq)]
enum Out {
    Word(String),
    Value,
    Open,
    Close,
    Comma,
    Punct(String),
    /// `(...)`: a list of two or more values.
    List,
    /// ` /* , ... */`: further rows after the first.
    MoreRows,
}

pub fn build(tokens: &[Tok]) -> String {
    let folded = fold_values(tokens);
    let lists = collapse_lists(folded);
    let rows = collapse_rows(lists);
    render(&rows)
}

fn is_operand(out: Option<&Out>) -> bool {
    match out {
        Some(Out::Value | Out::Close | Out::List) => true,
        Some(Out::Word(w)) => w.starts_with('`') || matches!(w.as_str(), "NULL" | "TRUE" | "FALSE"),
        _ => false,
    }
}

/// Literals and placeholders become one value marker; a sign that is not a
/// binary operator (`= -1`, `(+2`) folds into the value it precedes.
fn fold_values(tokens: &[Tok]) -> Vec<Out> {
    let mut out: Vec<Out> = Vec::with_capacity(tokens.len());
    let mut i = 0;
    while i < tokens.len() {
        match &tokens[i] {
            Tok::Punct(p) if (p == "-" || p == "+") && !is_operand(out.last()) => {
                // Skip a run of signs if a value follows it.
                let mut j = i;
                while matches!(tokens.get(j), Some(Tok::Punct(s)) if s == "-" || s == "+") {
                    j += 1;
                }
                if matches!(tokens.get(j), Some(Tok::Value | Tok::Placeholder)) {
                    i = j;
                    continue;
                }
                out.push(Out::Punct(p.clone()));
            }
            Tok::Value | Tok::Placeholder => out.push(Out::Value),
            Tok::Keyword(k) => out.push(Out::Word(k.clone())),
            Tok::Ident(name) => out.push(Out::Word(format!("`{name}`"))),
            Tok::Open => out.push(Out::Open),
            Tok::Close => out.push(Out::Close),
            Tok::Comma => out.push(Out::Comma),
            Tok::Punct(p) => out.push(Out::Punct(p.clone())),
        }
        i += 1;
    }
    while matches!(out.last(), Some(Out::Punct(p)) if p == ";") {
        out.pop();
    }
    out
}

/// `( ?, ?, ... )` with two or more values -> `(...)`.
fn collapse_lists(input: Vec<Out>) -> Vec<Out> {
    let mut out = Vec::with_capacity(input.len());
    let mut i = 0;
    while i < input.len() {
        if input[i] == Out::Open {
            let mut j = i + 1;
            let mut values = 0;
            while input.get(j) == Some(&Out::Value) {
                values += 1;
                j += 1;
                if input.get(j) == Some(&Out::Comma) && input.get(j + 1) == Some(&Out::Value) {
                    j += 1;
                } else {
                    break;
                }
            }
            if values >= 2 && input.get(j) == Some(&Out::Close) {
                out.push(Out::List);
                i = j + 1;
                continue;
            }
        }
        out.push(input[i].clone());
        i += 1;
    }
    out
}

/// Length of a row (`(...)` or `(?)`) starting at `i`, or 0.
fn row_len(input: &[Out], i: usize) -> usize {
    match input.get(i) {
        Some(Out::List) => 1,
        Some(Out::Open)
            if input.get(i + 1) == Some(&Out::Value) && input.get(i + 2) == Some(&Out::Close) =>
        {
            3
        }
        _ => 0,
    }
}

/// Two or more rows separated by commas -> the first row and a marker.
fn collapse_rows(input: Vec<Out>) -> Vec<Out> {
    let mut out = Vec::with_capacity(input.len());
    let mut i = 0;
    while i < input.len() {
        let first = row_len(&input, i);
        if first > 0 {
            let mut j = i + first;
            let mut rows = 1;
            while input.get(j) == Some(&Out::Comma) {
                let next = row_len(&input, j + 1);
                if next == 0 {
                    break;
                }
                rows += 1;
                j += 1 + next;
            }
            out.extend_from_slice(&input[i..i + first]);
            if rows > 1 {
                out.push(Out::MoreRows);
            }
            i = j;
            continue;
        }
        out.push(input[i].clone());
        i += 1;
    }
    out
}

fn render(items: &[Out]) -> String {
    let mut text = String::new();
    let mut glue_next = true;
    for item in items {
        let (piece, glue_before, glue_after) = match item {
            Out::Word(w) => (w.as_str(), false, false),
            Out::Value => ("?", false, false),
            Out::Open => ("(", false, true),
            Out::Close => (")", true, false),
            Out::Comma => (",", true, false),
            Out::List => ("(...)", false, false),
            Out::MoreRows => ("/* , ... */", false, false),
            Out::Punct(p) => {
                let tight = matches!(p.as_str(), "." | "@");
                (p.as_str(), p == ".", tight)
            }
        };
        if text.len() + piece.len() + 1 > MAX_DIGEST_TEXT {
            text.push_str(" ...");
            break;
        }
        if !text.is_empty() && !glue_next && !glue_before {
            text.push(' ');
        }
        text.push_str(piece);
        glue_next = glue_after;
    }
    text
}
