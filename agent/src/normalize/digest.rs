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
    /// `?, ...`: two or more values in a row outside parentheses.
    ValueRun,
    /// ` /* , ... */`: further rows after the first.
    MoreRows,
}

pub fn build(tokens: &[Tok]) -> String {
    let folded = fold_values(tokens);
    let lists = collapse_lists(folded);
    let rows = collapse_rows(lists);
    render(&rows)
}

/// Keywords that a value may follow directly (`THEN -1`, `BETWEEN -5`).
/// Any other keyword is taken as an operand: sqlparser's list holds common
/// column names (`id`, `value`, `status`), and `value - 1` is a subtraction.
const TAKES_OPERAND: &[&str] = &[
    "ALL", "AND", "ANY", "BETWEEN", "BY", "CASE", "DEFAULT", "DISTINCT", "DISTINCTROW", "DIV",
    "ELSE", "ELSEIF", "ESCAPE", "HAVING", "IN", "INTERVAL", "IS", "LIKE", "LIMIT", "MAXVALUE",
    "MINVALUE", "MOD", "NOT", "OFFSET", "ON", "OR", "REGEXP", "RETURN", "RLIKE", "SELECT", "SOME",
    "THEN", "UNTIL", "WHEN", "WHERE", "WHILE", "WITH", "XOR",
];

fn is_operand(out: Option<&Out>) -> bool {
    match out {
        Some(Out::Value | Out::Close | Out::List) => true,
        Some(Out::Word(w)) => w.starts_with('`') || !TAKES_OPERAND.contains(&w.as_str()),
        _ => false,
    }
}

/// `NULL` is a value (`= NULL`, `VALUES (1, NULL)`) except where it is
/// syntax: `IS [NOT] NULL` and the column attributes `NOT NULL`, `INT NULL`
/// (the server's digests draw the same line).
fn null_is_value(prev: Option<&Out>) -> bool {
    !is_operand(prev) && !matches!(prev, Some(Out::Word(w)) if w == "IS" || w == "NOT")
}

/// Where MariaDB's digest folds a sign into the value after it: at the
/// start, after `(`, `,`, another sign, and after SELECT, AND, OR, XOR and
/// BETWEEN. After `=`, `<`, WHERE or THEN it keeps `- ?` (checked against
/// `events_statements_summary_by_digest` of MariaDB 10.11).
fn sign_folds(prev: Option<&Out>) -> bool {
    match prev {
        None | Some(Out::Open | Out::Comma) => true,
        Some(Out::Punct(p)) => p == "-" || p == "+",
        Some(Out::Word(w)) => matches!(w.as_str(), "SELECT" | "AND" | "OR" | "XOR" | "BETWEEN"),
        _ => false,
    }
}

/// Literals and placeholders become one value marker; a sign folds into
/// the value it precedes where `sign_folds` says so.
fn fold_values(tokens: &[Tok]) -> Vec<Out> {
    let mut out: Vec<Out> = Vec::with_capacity(tokens.len());
    let mut i = 0;
    while i < tokens.len() {
        match &tokens[i] {
            Tok::Punct(p) if (p == "-" || p == "+") && sign_folds(out.last()) => {
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
            Tok::Keyword(k) if k == "NULL" && null_is_value(out.last()) => out.push(Out::Value),
            Tok::Keyword(k) => out.push(Out::Word(k.clone())),
            Tok::Ident(name) => out.push(Out::Word(format!("`{}`", name.replace('`', "``")))),
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

/// Length of a run `?, ?, ...` starting at `i`, in values.
fn value_run(input: &[Out], i: usize) -> (usize, usize) {
    let (mut j, mut values) = (i, 0);
    while input.get(j) == Some(&Out::Value) {
        values += 1;
        j += 1;
        if input.get(j) == Some(&Out::Comma) && input.get(j + 1) == Some(&Out::Value) {
            j += 1;
        } else {
            break;
        }
    }
    (values, j)
}

/// `( ?, ?, ... )` with two or more values -> `(...)`; two or more values
/// elsewhere (`SELECT 1, 2`, `LIMIT 5, 10`) -> `?, ...`, as the server does.
fn collapse_lists(input: Vec<Out>) -> Vec<Out> {
    let mut out = Vec::with_capacity(input.len());
    let mut i = 0;
    while i < input.len() {
        if input[i] == Out::Value {
            let (values, end) = value_run(&input, i);
            if values >= 2 {
                out.push(Out::ValueRun);
                i = end;
                continue;
            }
        }
        if input[i] == Out::Open {
            let (values, j) = value_run(&input, i + 1);
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
    const CUT: &str = " ...";
    let mut text = String::new();
    let mut glue_next = true;
    // The longest token-boundary prefix that still has room for `CUT`.
    let mut cut_at = 0;
    for item in items {
        let (piece, glue_before, glue_after) = match item {
            Out::Word(w) => (w.as_str(), false, false),
            Out::Value => ("?", false, false),
            Out::Open => ("(", false, true),
            Out::Close => (")", true, false),
            Out::Comma => (",", true, false),
            Out::List => ("(...)", false, false),
            Out::ValueRun => ("?, ...", false, false),
            Out::MoreRows => ("/* , ... */", false, false),
            Out::Punct(p) => {
                let tight = matches!(p.as_str(), "." | "@");
                (p.as_str(), p == ".", tight)
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
