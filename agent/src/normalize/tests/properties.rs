//! Properties over generated input: nothing panics, the lexers agree on
//! well-formed token streams, and the cache never changes an answer.
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::select;

use super::super::{MAX_DIGEST_TEXT, Normalizer, digest, digest_text, lexer};
use super::{corpus_statements, digest_of};

/// Tokens of every kind the lexers distinguish, each complete on its own.
const TOKENS: &[&str] = &[
    "SELECT", "select", "FROM", "WHERE", "AND", "NOT", "IN", "IS", "NULL", "TRUE", "VALUES", "THEN",
    "id", "value", "t", "c1", "`t`", "`a``b`", "`sel ect`", "prénom", "_utf8mb4", "x", "N", "b",
    "0", "42", "-7", "+3", "1.5", ".5", "1e5", "2E-3", "0x1F", "0b101", "X'1F'", "b'01'", "N'n'",
    "'s'", "'it''s'", r"'a\'b'", "\"dq\"", "?", "@v", "@@session", "@@GLOBAL.x", "=", "<>", "!=",
    "<=>", ">=", "->", "->>", ":=", "||", "&&", "-", "+", "*", "/", "%", ".", ",", "(", ")", ";",
    "/* c */", "/*+ BKA(t) */", "/*!50100 t */", "-- c\n", "# c\n",
];

/// Fragments that leave things open: quotes, comments, escapes.
const OPENERS: &[&str] =
    &["'", "\"", "`", "/*", "/*!", "*/", "--", "#", "\\", "@", "0x", "e", "\n", "\u{a0}", "\0"];

fn statement_pool() -> Vec<&'static str> {
    corpus_statements().map(|(_, sql)| sql).collect()
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic(raw in vec(any::<u8>(), 0..=4096)) {
        prop_assert!(digest_text(&raw).len() <= MAX_DIGEST_TEXT);
        // Most random bytes are not UTF-8; feed valid text to the byte
        // lexer too, as happens when sqlparser declines it.
        digest::build(&lexer::tokenize_bytes(&raw));
    }

    #[test]
    fn sql_shaped_soups_never_panic(parts in vec(select([TOKENS, OPENERS].concat()), 0..64)) {
        // Random bytes rarely reach the lexers' deeper states; SQL fragments
        // glued without spaces do.
        let sql = parts.concat();
        digest_text(sql.as_bytes());
        digest::build(&lexer::tokenize_bytes(sql.as_bytes()));
    }

    #[test]
    fn both_paths_agree_on_spaced_tokens(tokens in vec(select(TOKENS), 0..40)) {
        let sql = tokens.join(" ");
        if let Some(tokens) = lexer::tokenize_with_sqlparser(&sql) {
            let bytes = digest::build(&lexer::tokenize_bytes(sql.as_bytes()));
            prop_assert_eq!(digest::build(&tokens), bytes, "{:?}", sql);
        }
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
