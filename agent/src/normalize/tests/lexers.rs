//! sqlparser's tokenizer and the byte lexer must yield the same digest: a
//! statement cut at the capture limit, or carrying invalid UTF-8, goes
//! through the byte lexer while its intact twin goes through sqlparser, and
//! the two must still be counted together.
use super::super::{digest, lexer};
use super::{corpus_statements, digest_of};

/// The digest by each path; `None` where sqlparser declines the text.
fn both_paths(sql: &str) -> (Option<String>, String) {
    let sqlparser = lexer::tokenize_with_sqlparser(sql).map(|tokens| digest::build(&tokens));
    (sqlparser, digest::build(&lexer::tokenize_bytes(sql.as_bytes())))
}

/// Lists each statement where sqlparser accepted the text but the paths
/// differ, and counts the statements sqlparser accepted.
fn disagreements<'a>(statements: impl IntoIterator<Item = &'a str>) -> (Vec<String>, usize) {
    let mut failures = Vec::new();
    let mut accepted = 0;
    for sql in statements {
        if let (Some(sqlparser), bytes) = both_paths(sql) {
            accepted += 1;
            if sqlparser != bytes {
                failures.push(format!(
                    "  {sql:?}\n    sqlparser: {sqlparser}\n    bytes:     {bytes}"
                ));
            }
        }
    }
    (failures, accepted)
}

#[test]
fn both_paths_agree_on_the_corpus() {
    let total = corpus_statements().count();
    let (failures, accepted) = disagreements(corpus_statements().map(|(_, sql)| sql));
    assert!(failures.is_empty(), "{} disagreements:\n{}", failures.len(), failures.join("\n"));
    // The comparison says little if sqlparser declined most of the corpus.
    assert!(accepted * 10 >= total * 9, "sqlparser accepted only {accepted} of {total}");
}

/// Spellings where the two tokenizers differ by nature (operator tables,
/// quirks of sqlparser's MySQL dialect), with the digest both must give.
const TRICKY: &[(&str, &str)] = &[
    // sqlparser prints `!=` as `<>`; grouping them is what the server does.
    ("SELECT a FROM t WHERE b != 1", "SELECT `a` FROM `t` WHERE `b` < > ?"),
    ("SELECT a FROM t WHERE b <> 1", "SELECT `a` FROM `t` WHERE `b` < > ?"),
    ("SELECT !!a, a!!=b", "SELECT ! ! `a`, `a` ! ! = `b`"),
    // MySQL's dialect makes `@a` and `@@session` one word.
    (
        "SELECT @a, @@session.sql_mode, @@GLOBAL.port",
        "SELECT @`a`, @@SESSION.`sql_mode`, @@GLOBAL.`port`",
    ),
    ("SELECT 'u'@'h', u@h", "SELECT ? @?, `u` @`h`"),
    // `0b101` is a bit literal; `0X1F` and `0b12` are identifiers in MySQL.
    ("SELECT 0b101, 0x1F, 0X1F, 0b12, 0b", "SELECT ?, ..., `0X1F`, `0b12`, `0b`"),
    ("SELECT 0b101.5", "SELECT ?.?"),
    // A charset introducer stays a word whether or not a space follows it.
    (
        "SELECT _utf8mb4'x', _latin1 'y', _binary X'41'",
        "SELECT `_utf8mb4` ?, `_latin1` ?, `_binary` ?",
    ),
    ("SELECT b\"01\", N'n', n'n', X'41', x'41'", "SELECT ?, ..."),
    ("SELECT `a``b`, ````", "SELECT `a``b`, ````"),
    ("SELECT 1.2.3, .5, t.5, t .5", "SELECT ? ?, ..., `t`.?, `t` ?"),
    ("SELECT 1e5, 1e5L, 1e-5, 1.e5", "SELECT ?, ..."),
    ("SELECT ?12, ?", "SELECT ? ?, ..."),
    // `--` needs whitespace after it to start a comment, even at the end.
    ("SELECT 1 --", "SELECT ? - -"),
    ("SELECT 1 --x", "SELECT ? - - `x`"),
    ("SELECT 1 --\u{a0}x", "SELECT ?"),
    // Characters sqlparser has no token for are punctuation, not values.
    ("SELECT a\\b, a\u{1}b", "SELECT `a` \\ `b`, `a` \u{1} `b`"),
];

#[test]
fn both_paths_agree_on_tricky_spellings() {
    let (failures, accepted) = disagreements(TRICKY.iter().map(|(sql, _)| *sql));
    assert!(failures.is_empty(), "{} disagreements:\n{}", failures.len(), failures.join("\n"));
    assert_eq!(accepted, TRICKY.len());
    for (sql, expected) in TRICKY {
        assert_eq!(&*digest_of(sql).text, *expected, "{sql:?}");
    }
}

/// Text sqlparser reads differently from MySQL: it must decline it so the
/// byte lexer, which follows MySQL, decides.
const MISREAD: &[(&str, &str)] = &[
    ("SELECT * FROM 2events", "SELECT * FROM `2events`"),
    ("SELECT t.5e FROM t", "SELECT `t`.`5e` FROM `t`"),
    ("SELECT a|/*c*/b", "SELECT `a` | `b`"),
    ("SELECT @X'41'", "SELECT @?"),
    ("SELECT @1.5", "SELECT @?"),
    ("SELECT a@/*c*/b", "SELECT `a` @`b`"),
];

#[test]
fn sqlparser_declines_what_it_misreads() {
    for (sql, expected) in MISREAD {
        assert!(lexer::tokenize_with_sqlparser(sql).is_none(), "sqlparser path took {sql:?}");
        assert_eq!(&*digest_of(sql).text, *expected, "{sql:?}");
    }
}
