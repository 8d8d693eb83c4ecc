//! Properties over generated input: nothing panics, spacing and case of
//! keywords never matter, and the cache never changes an answer.
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::select;

use super::super::{MAX_DIGEST_TEXT, Normalizer, digest_text};
use super::{corpus_statements, digest_of};

/// Tokens of every kind the lexer distinguishes, each complete on its own.
const TOKENS: &[&str] = &[
    "SELECT",
    "select",
    "FROM",
    "WHERE",
    "AND",
    "NOT",
    "IN",
    "IS",
    "NULL",
    "TRUE",
    "VALUES",
    "THEN",
    "id",
    "value",
    "t",
    "c1",
    "`t`",
    "`a``b`",
    "`sel ect`",
    "prénom",
    "_utf8mb4",
    "x",
    "N",
    "b",
    "0",
    "42",
    "-7",
    "+3",
    "1.5",
    ".5",
    "1e5",
    "2E-3",
    "0x1F",
    "0b101",
    "X'1F'",
    "b'01'",
    "N'n'",
    "'s'",
    "'it''s'",
    r"'a\'b'",
    "\"dq\"",
    "?",
    "@v",
    "@@session",
    "@@GLOBAL.x",
    "=",
    "<>",
    "!=",
    "<=>",
    ">=",
    "->",
    "->>",
    ":=",
    "||",
    "&&",
    "-",
    "+",
    "*",
    "/",
    "%",
    ".",
    ",",
    "(",
    ")",
    ";",
    "/* c */",
    "/*+ BKA(t) */",
    "/*!50100 t */",
    "-- c\n",
    "# c\n",
];

/// Fragments that leave things open: quotes, comments, escapes.
const OPENERS: &[&str] = &["'", "\"", "`", "/*", "/*!", "*/", "--", "#", "\\", "@", "0x", "e", "\n", "\u{a0}", "\0"];

fn statement_pool() -> Vec<&'static str> {
    corpus_statements().map(|(_, sql)| sql).collect()
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic(raw in vec(any::<u8>(), 0..=4096)) {
        prop_assert!(digest_text(&raw).len() <= MAX_DIGEST_TEXT);
    }

    #[test]
    fn sql_shaped_soups_never_panic(parts in vec(select([TOKENS, OPENERS].concat()), 0..64)) {
        // Random bytes rarely reach the lexer's deeper states; SQL fragments
        // glued without spaces do.
        let sql = parts.concat();
        prop_assert!(digest_text(sql.as_bytes()).len() <= MAX_DIGEST_TEXT);
    }

    #[test]
    fn spacing_and_keyword_case_do_not_matter(tokens in vec(select(TOKENS), 0..40), lower in any::<bool>()) {
        // Whole tokens separated by one space or by several blanks, with
        // keywords in either case, read alike. Tokens that a blank would
        // change (`-- c`, a sign before `-`, `--`) are not in TOKENS.
        let spaced = tokens.join(" ");
        let blanks = tokens.join(" \t\n ");
        let cased: Vec<String> = tokens
            .iter()
            .map(|t| if lower && t.len() > 1 && t.chars().all(|c| c.is_ascii_uppercase()) { t.to_ascii_lowercase() } else { t.to_string() })
            .collect();
        let text = digest_text(spaced.as_bytes());
        prop_assert_eq!(&digest_text(blanks.as_bytes()), &text, "{:?}", spaced);
        prop_assert_eq!(&digest_text(cased.join(" ").as_bytes()), &text, "{:?}", spaced);
    }

    #[test]
    fn normalizing_twice_gives_the_same_digest(raw in vec(any::<u8>(), 0..512)) {
        let mut normalizer = Normalizer::new(16);
        let first = normalizer.normalize(&raw);
        prop_assert_eq!(&normalizer.normalize(&raw), &first);
        prop_assert_eq!(normalizer.cache_stats().hits, 1);
        prop_assert_eq!(first, digest_of(&raw));
    }

    #[test]
    fn a_tiny_cache_never_changes_the_answer(picks in vec(select(statement_pool()), 1..150)) {
        // Two entries against hundreds of distinct texts: constant eviction,
        // promotion from the old generation, and the odd hit.
        let mut normalizer = Normalizer::new(2);
        for sql in picks {
            prop_assert_eq!(normalizer.normalize(sql.as_bytes()), digest_of(sql), "{:?}", sql);
            prop_assert!(normalizer.cache_stats().entries <= 2);
        }
    }
}
