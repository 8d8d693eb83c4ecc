//! Input the probe really delivers: statements cut at the capture limit,
//! bytes that are not UTF-8, huge statements, and nothing at all.
use super::super::MAX_DIGEST_TEXT;
use super::{corpus_statements, digest_of};

fn text_of(raw: impl AsRef<[u8]>) -> String {
    digest_of(raw).text.to_string()
}

#[test]
fn a_statement_cut_inside_a_token_keeps_its_digest() {
    // The cut drops the rest of the token and nothing else, so the digest is
    // that of the complete statement.
    let cases: &[(&str, &str)] = &[
        ("SELECT * FROM t WHERE name = 'abc", "SELECT * FROM t WHERE name = 'abcdef'"),
        ("SELECT * FROM t WHERE name = 'it\\'s a", "SELECT * FROM t WHERE name = 'x'"),
        ("SELECT * FROM t WHERE name = \"abc", "SELECT * FROM t WHERE name = \"abc\""),
        ("SELECT * FROM t WHERE flags = X'1F", "SELECT * FROM t WHERE flags = X'1F'"),
        ("SELECT * FROM t /* unfinished comm", "SELECT * FROM t"),
        ("SELECT * FROM t /*+ BKA(t", "SELECT * FROM t"),
        ("SELECT * FROM t -- trailing comm", "SELECT * FROM t"),
        ("SELECT * FROM t # trailing comm", "SELECT * FROM t"),
        ("SELECT * FROM `ord", "SELECT * FROM `ord`"),
        ("SELECT * FROM `a``b", "SELECT * FROM `a``b`"),
        ("/*!40101 SET NAMES utf8mb4", "/*!40101 SET NAMES utf8mb4 */"),
        ("SELECT c FROM sbtest1 WHERE id=50", "SELECT c FROM sbtest1 WHERE id=5021"),
    ];
    for (cut, complete) in cases {
        assert_eq!(text_of(cut), text_of(complete), "{cut:?}");
    }
}

#[test]
fn every_prefix_of_every_corpus_statement_digests() {
    // Byte prefixes: the cut may split a UTF-8 character as well as a token.
    for (_, sql) in corpus_statements() {
        for end in 0..=sql.len() {
            let prefix = &sql.as_bytes()[..end];
            let text = text_of(prefix);
            assert!(text.len() <= MAX_DIGEST_TEXT, "{}", String::from_utf8_lossy(prefix));
        }
    }
}

#[test]
fn invalid_utf8_in_a_literal_or_comment_changes_nothing() {
    // Binary values and Latin-1 text arrive as they are, and must give the
    // digest of a valid twin.
    let cases: &[(&[u8], &str)] = &[
        (b"SELECT s FROM t WHERE s = '\xff\xfe' AND k", "SELECT s FROM t WHERE s = 'x' AND k"),
        // Latin-1 text, and a UTF-8 character cut in two.
        (b"SELECT s FROM t WHERE s = 'caf\xe9' AND k", "SELECT s FROM t WHERE s = 'x' AND k"),
        (b"SELECT s FROM t WHERE s = 'caf\xc3' AND k", "SELECT s FROM t WHERE s = 'x' AND k"),
        (b"INSERT INTO t VALUES (_binary'\x00\x80', 1)", "INSERT INTO t VALUES (_binary'x', 1)"),
        (b"SELECT 1 /* \xff */", "SELECT 1"),
        (b"SELECT 'caf\xc3", "SELECT 'cafe'"),
    ];
    for (raw, valid) in cases {
        assert!(std::str::from_utf8(raw).is_err());
        assert_eq!(text_of(raw), text_of(valid), "{}", String::from_utf8_lossy(raw));
    }
    // In an identifier the bad bytes are replaced, not dropped.
    assert_eq!(text_of(b"SELECT `caf\xe9` FROM t"), "SELECT `caf\u{fffd}` FROM `t`");
}

const MIB: usize = 1 << 20;

/// A statement of at least `size` bytes: `head`, then `item` repeated with
/// `sep`, then `tail`.
fn long(size: usize, head: &str, item: impl Fn(usize) -> String, sep: &str, tail: &str) -> String {
    let mut sql = String::from(head);
    let mut i = 0;
    while sql.len() < size {
        if i > 0 {
            sql.push_str(sep);
        }
        sql.push_str(&item(i));
        i += 1;
    }
    sql + tail
}

#[test]
fn a_huge_statement_has_a_capped_digest_text() {
    let wide = long(MIB, "SELECT ", |i| format!("col_{i}"), ", ", " FROM t");
    let text = text_of(&wide);
    assert!(text.len() <= MAX_DIGEST_TEXT, "{} bytes", text.len());
    assert!(text.starts_with("SELECT `col_0`, `col_1`, "), "{}", &text[..40]);
    assert!(text.ends_with(" ..."), "{}", &text[text.len() - 40..]);
    // Statements that differ only past the cap share a digest (documented).
    let other_table = format!("{} FROM other", wide.strip_suffix(" FROM t").unwrap());
    assert_eq!(digest_of(&wide), digest_of(&other_table));
}

#[test]
fn the_cap_holds_wherever_the_cut_falls() {
    // Short tokens after a prefix of every length: one of them ends right
    // at the limit, where the ` ...` marker must still fit.
    for pad in 0..16 {
        let head = format!("SELECT {} ", "x".repeat(pad + 1));
        let sql = long(2 * MAX_DIGEST_TEXT, &head, |_| "a".into(), "+", "");
        let text = text_of(&sql);
        assert!(text.len() <= MAX_DIGEST_TEXT, "pad {pad}: {} bytes", text.len());
        assert!(text.ends_with(" ..."), "pad {pad}");
    }
    // A single token longer than the cap.
    let name = "n".repeat(2 * MAX_DIGEST_TEXT);
    assert_eq!(text_of(format!("SELECT `{name}` FROM t")), "SELECT ...");
    assert_eq!(text_of(format!("`{name}`")), "...");
}

#[test]
fn huge_value_lists_collapse_to_the_short_digest() {
    let rows = long(MIB, "INSERT INTO t (a, b) VALUES ", |i| format!("({i}, 'v{i}')"), ",", "");
    assert_eq!(text_of(&rows), "INSERT INTO `t` (`a`, `b`) VALUES (...) /* , ... */");
    let list = long(MIB, "SELECT * FROM t WHERE a IN (", |i| i.to_string(), ",", ")");
    assert_eq!(text_of(&list), "SELECT * FROM `t` WHERE `a` IN (...)");
    let literal = format!("SELECT '{}'", "x".repeat(MIB));
    assert_eq!(text_of(&literal), "SELECT ?");
}

#[test]
fn nothing_to_digest_gives_an_empty_text() {
    for raw in [
        "",
        " \t\r\n",
        ";",
        " ; ;",
        "/* just a comment */",
        "-- just a comment",
        "# just a comment",
        "/*+ NO_ICP(t) */",
        "/*!40101 */",
        "/* a */ -- b\n# c\n/* d */",
        "/* unterminated",
    ] {
        assert_eq!(text_of(raw), "", "{raw:?}");
    }
}
