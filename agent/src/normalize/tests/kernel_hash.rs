//! The kernel's text hash (`sqlbee_kernel_abi::text_hash`) against the
//! normalizer: equal hashes must mean equal digests, and the hash must
//! still group what differs only in literal values, or in-kernel
//! kernel digests would save nothing.
use std::collections::HashMap;

use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::select;
use sqlbee_kernel_abi::text_hash::{hash, hash_by_runs};

use super::{corpus_statements, digest_of};

/// Pieces of SQL and literal values to fill in between them.
const CODE: &[&str] = &[
    "SELECT ",
    "FROM t ",
    "WHERE ",
    "id=",
    "a ",
    "b1 ",
    "t.",
    "`x`",
    "`q'`",
    "\"dq\" ",
    "\"it's\"",
    "@",
    "@@v ",
    "-- c '\n",
    "# c '\n",
    "/* c ' */",
    "/*!5 x */",
    "/*/",
    "*/",
    "(",
    ")",
    ",",
    "-",
    "+",
    ".",
    "e",
    "x",
    "?",
    "IN ",
    "\\",
    "'",
    "\"",
    "`",
    "\n",
    " ",
    "2events ",
    "0x",
    "_utf8",
    "..",
    "X",
    "N",
    "b",
    "NAME_CONST(",
    "@a",
    "-",
    "DIV",
    "NULL",
    "IS ",
    "NOT ",
];
const LITERALS: &[&str] =
    &["1", "42", "7.5", "1.", "0", "99999", "'a'", "'b c'", "'it''s'", r"'x\'y'", "''", "'--'", "'/*'"];

fn texts() -> impl Strategy<Value = (String, String)> {
    // The same code with literals drawn twice: where the hash says the two
    // are alike, the digests must agree.
    vec((select(CODE), select(LITERALS), select(LITERALS), any::<bool>()), 0..24).prop_map(|parts| {
        let (mut a, mut b) = (String::new(), String::new());
        for (code, x, y, literal) in parts {
            a.push_str(code);
            b.push_str(code);
            if literal {
                a.push_str(x);
                b.push_str(y);
            }
        }
        (a, b)
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn equal_hashes_mean_equal_digests((a, b) in texts()) {
        if hash(a.as_bytes()) == hash(b.as_bytes()) {
            prop_assert_eq!(digest_of(&a), digest_of(&b), "{:?} vs {:?}", a, b);
        }
    }

    #[test]
    fn runs_of_bytes_hash_as_single_bytes_do((a, b) in texts(), bytes in vec(any::<u8>(), 0..64)) {
        for text in [a.as_bytes(), b.as_bytes(), &bytes] {
            prop_assert_eq!(hash_by_runs(text), hash(text), "{:?}", String::from_utf8_lossy(text));
        }
    }

    #[test]
    fn random_bytes_never_merge_digests(a in vec(any::<u8>(), 0..64), b in vec(any::<u8>(), 0..64)) {
        if hash(&a) == hash(&b) {
            prop_assert_eq!(digest_of(&a), digest_of(&b));
        }
    }
}

#[test]
fn corpus_statements_with_equal_hashes_share_a_digest() {
    let mut by_hash: HashMap<u64, Vec<&str>> = HashMap::new();
    for (_, sql) in corpus_statements() {
        assert_eq!(hash_by_runs(sql.as_bytes()), hash(sql.as_bytes()), "{sql:?}");
        by_hash.entry(hash(sql.as_bytes())).or_default().push(sql);
    }
    for same in by_hash.values() {
        for sql in &same[1..] {
            assert_eq!(digest_of(sql), digest_of(same[0]), "{sql:?} and {:?} share a hash", same[0]);
        }
    }
}

#[test]
fn numbers_the_hash_skips_read_as_one_value() {
    // The hash skips the digits of a number (and one point) wherever a
    // number may start; the normalizer must not read them as anything else.
    let alike = [
        ("SELECT 1e-5.5", "SELECT 1e-7"),
        ("SELECT 1.5e-3.25 FROM t", "SELECT 1.5e-4 FROM t"),
        ("SELECT 1..10", "SELECT 12..10"),
        ("SELECT 0.`x`", "SELECT 12.`x`"),
        ("SELECT a-5.5", "SELECT a-5"),
    ];
    for (a, b) in alike {
        assert_eq!(hash(a.as_bytes()), hash(b.as_bytes()), "{a:?} vs {b:?}");
        assert_eq!(digest_of(a), digest_of(b), "{a:?} vs {b:?}");
    }
}

#[test]
fn literal_values_do_not_change_the_hash() {
    let alike = [
        ("SELECT c FROM sbtest1 WHERE id=5021", "SELECT c FROM sbtest1 WHERE id=17"),
        ("SELECT c FROM sbtest1 WHERE id BETWEEN 1 AND 100", "SELECT c FROM sbtest1 WHERE id BETWEEN 7 AND 106"),
        ("UPDATE t SET c='abc' WHERE id=1.5", "UPDATE t SET c='it\\'s -- x' WHERE id=22.75"),
        ("INSERT INTO t VALUES (1,'a'),(2,'b')", "INSERT INTO t VALUES (3,'c'),(4,'d')"),
    ];
    for (a, b) in alike {
        assert_eq!(hash(a.as_bytes()), hash(b.as_bytes()), "{a:?} vs {b:?}");
    }
    let apart = [
        ("SELECT * FROM t1", "SELECT * FROM t2"),
        ("SELECT 2events FROM t", "SELECT 3events FROM t"),
        ("SELECT t.5 FROM t", "SELECT t.6 FROM t"),
        ("SELECT \"a\" FROM t", "SELECT \"b\" FROM t"),
        ("SELECT 1 -- 'x\nFROM a", "SELECT 1 -- 'x\nFROM b"),
        ("SELECT /*!5 1 */ 2", "SELECT /*!5 3 */ 2"),
        ("SELECT 1..10", "SELECT 1.5.10"),
        ("SELECT 0.`x`", "SELECT 7.5.`x`"),
        // `--'` is no comment: its quote opens a string, so what follows
        // the next quote is code.
        ("SELECT 1--'\n''", "SELECT 1--'\n'a'"),
    ];
    for (a, b) in apart {
        assert_ne!(hash(a.as_bytes()), hash(b.as_bytes()), "{a:?} vs {b:?}");
    }
}

#[test]
fn long_runs_of_code_and_string_hash_as_single_bytes_do() {
    let pad = "67847967377-48000963322-62604785301-91415491898-96926520291";
    let texts = [
        format!("INSERT INTO sbtest1 (id, k, c, pad) VALUES (5021, 4993, '{pad}-{pad}', '{pad}')"),
        format!("UPDATE sbtest1 SET c='{pad}\\'{pad}' WHERE id=17 -- done\n/* and */ # more"),
        "SELECT `c` FROM `sbtest1` WHERE `id` = ? AND \"x\"='y'".to_string(),
        "select/*!50000 straight_join*/ a.b, c.d from aaaaaaaaaaaaaaaa a join bbbbbbbbbbbbbbbbbb c".to_string(),
    ];
    for text in &texts {
        for cut in 0..=text.len() {
            let bytes = &text.as_bytes()[..cut];
            assert_eq!(hash_by_runs(bytes), hash(bytes), "{:?}", String::from_utf8_lossy(bytes));
        }
    }
}
