//! Spellings that MariaDB's lexer reads in its own way, with the digest
//! text each must get. Where two spellings share a digest here, they share
//! one in the server too (checked by hand against `performance_schema` of
//! MariaDB 10.11, and on a large scale by `agent/tests/digest_agreement.rs`).
use super::digest_of;

const SPELLINGS: &[(&str, &str)] = &[
    // Operators of several characters are one token; `<>` and `!=` are the
    // same one.
    (
        "SELECT a FROM t WHERE b != 1 AND c <> 2 AND d <= 3 AND e >= 4 AND f <=> 5 AND g < = 6",
        "SELECT `a` FROM `t` WHERE `b` != ? AND `c` != ? AND `d` <= ? AND `e` >= ? AND `f` <=> ? AND `g` < = ?",
    ),
    (
        "SELECT a || b, a && b, a | b, a & b, a << 2, a >> 2, @x := 1",
        "SELECT `a` || `b`, `a` && `b`, `a` | `b`, `a` & `b`, `a` << ?, `a` >> ?, @? := ?",
    ),
    // `!!` is two `!`, and `!!=` a `!` and a `!=`.
    ("SELECT !!a, a!!=b", "SELECT ! ! `a`, `a` ! != `b`"),
    // MySQL's JSON operators (MariaDB has none).
    ("SELECT doc->'$.a', doc->>'$.b' FROM t", "SELECT `doc` -> ?, `doc` ->> ? FROM `t`"),
    // A user variable's name is a value to the server: `@a` and `@b` share
    // a digest. `@@` names a system variable, whose name stays.
    ("SELECT @a, @b1, @`c`, @'d'", "SELECT @?, @?, @`c`, @?"),
    (
        "SELECT @@session.sql_mode, @@GLOBAL.port, @@version",
        "SELECT @@SESSION.`sql_mode`, @@GLOBAL.`port`, @@`version`",
    ),
    ("SELECT 'u'@'h', u@h", "SELECT ? @?, `u` @?"),
    // A character set introducer reads alike whatever the character set;
    // `_nosuch` is a name.
    (
        "SELECT _utf8mb4'x', _latin1 'y', _utf32 'z', _latin1 0x41, _nosuch 'z'",
        "SELECT _charset ?, _charset ?, _charset ?, _charset ?, `_nosuch` ?",
    ),
    // X'..' is kept apart from other values, as in the server; b'..' and
    // N'..' are values, `b"01"` is the name `b` and a string.
    ("SELECT X'41', x'4142', _binary X'41'", "SELECT X'?', X'?', _charset X'?'"),
    ("SELECT b'01', N'n', n'n', 0b101, 0x1F", "SELECT ?, ..."),
    ("SELECT b\"01\"", "SELECT `b` ?"),
    // `0X1F`, `0b12` and `2events` are names.
    ("SELECT 0X1F, 0b12, 0b, 0x, 2events, 1ea", "SELECT `0X1F`, `0b12`, `0b`, `0x`, `2events`, `1ea`"),
    ("SELECT 1e5, 1e-5, 1.e5, 1.5e3, .5", "SELECT ?, ..."),
    // After a name and `.`, a name follows even if it starts with a digit;
    // elsewhere `.5` is a number.
    ("SELECT t.5, t .5, `t`.5", "SELECT `t`.`5`, `t` ?, `t` ?"),
    ("SELECT 1.2.3", "SELECT ? ?"),
    ("SELECT 1..2", "SELECT ? .. ?"),
    ("SELECT `a``b`, ````", "SELECT `a``b`, ````"),
    // `--` starts a comment before a space or a control character, and at
    // the very end.
    ("SELECT 1 -- x", "SELECT ?"),
    ("SELECT 1 --", "SELECT ?"),
    ("SELECT 1 --x", "SELECT ? - - `x`"),
    ("SELECT 1 --\u{a0}x", "SELECT ? - - `\u{a0}x`"),
    // Executable comments run unless they are for MySQL 5.7 and later or a
    // version above the server's; hints are comments.
    (
        "SELECT /*! STRAIGHT_JOIN */ a /*!50700 b */ /*M!50700 c */ /*!999999 d */ /*+ BKA(t) */ FROM t",
        "SELECT STRAIGHT_JOIN `a` `c` FROM `t`",
    ),
    // Words that MariaDB does not know keep their case as names; its
    // keywords (even the ones a column may be called) are upper case.
    ("select audit, id, name, status from audit_log", "SELECT `audit`, ID, NAME, STATUS FROM `audit_log`"),
    // A function name is a keyword only right before `(`, and a qualified
    // name never is, but for a few functions.
    (
        "SELECT count(*), count (*), now(), t.count, t.select, db.trim('a')",
        "SELECT COUNT (*), `count` (*), NOW (), `t`.`count`, `t`.`select`, `db`.TRIM (?)",
    ),
    // Synonyms are one token, read by their common name.
    ("SHOW SCHEMAS", "SHOW DATABASES"),
    ("DESCRIBE t", "EXPLAIN `t`"),
    ("SELECT a FROM t WHERE b RLIKE 'x'", "SELECT `a` FROM `t` WHERE `b` REGEXP ?"),
    // A sign folds into a number after a token that starts an expression.
    (
        "SELECT 1 DIV -2, 3 DIV 4, -1, - -1, 5 - -1, a - 1, a -1, a = -1, (-1), IF(a, -1, +2)",
        "SELECT ? DIV ?, ... DIV ?, ... - ?, `a` - ?, `a` - ?, `a` = - ?, (?), IF (`a`, ?, ...)",
    ),
    // Only before a number: a placeholder keeps its sign.
    ("SELECT a FROM t WHERE b = ? AND c IN (-?)", "SELECT `a` FROM `t` WHERE `b` = ? AND `c` IN (- ?)"),
    // NULL is a value where an expression may start.
    (
        "SELECT NULL, a IS NULL, a IS NOT NULL, NOT NULL, (NULL), TRIM(NULL FROM 'x'), - NULL",
        "SELECT ?, `a` IS NULL, `a` IS NOT NULL, NOT ?, (?), TRIM (? FROM ?), - ?",
    ),
    (
        "CREATE TABLE t (a INT NULL, b INT NOT NULL DEFAULT NULL, c VARCHAR(10) NULL, \
         FOREIGN KEY (a) REFERENCES p (id) ON DELETE SET NULL)",
        "CREATE TABLE `t` (`a` INT NULL, `b` INT NOT NULL DEFAULT ?, `c` VARCHAR (?) NULL, \
         FOREIGN KEY (`a`) REFERENCES `p` (ID) ON DELETE SET NULL)",
    ),
    ("SELECT \\N, a\\b", "SELECT ?, `a` \\ `b`"),
    // The server's stand-in for a stored program's variable is a value.
    (
        "SELECT * FROM t WHERE id = NAME_CONST('v', 5) AND b IN (NAME_CONST('x', _utf8mb4'a' COLLATE 'utf8mb4_bin'), 2)",
        "SELECT * FROM `t` WHERE ID = ? AND `b` IN (...)",
    ),
    ("SELECT name_const", "SELECT `name_const`"),
    // Characters without a token of their own are punctuation.
    ("SELECT a\u{1}b", "SELECT `a` \u{1} `b`"),
];

#[test]
fn spellings_read_as_mariadb_reads_them() {
    let mut failures = Vec::new();
    for (sql, expected) in SPELLINGS {
        let text = digest_of(sql).text;
        if &*text != *expected {
            failures.push(format!("  {sql:?}\n    => {text}\n  expected {expected}"));
        }
    }
    assert!(failures.is_empty(), "{} unexpected digests:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn what_the_server_groups_shares_a_digest() {
    // Pairs `performance_schema` gives one digest (MariaDB 10.11).
    let alike = [
        ("SELECT 1 DIV -2", "SELECT 1 DIV 2"),
        ("SELECT _utf32 'a'", "SELECT _ucs2 'a'"),
        ("SELECT @a", "SELECT @b"),
        ("SELECT X'41'", "SELECT X'4142'"),
        ("SELECT a FROM t WHERE b <> 1", "SELECT a FROM t WHERE b != 2"),
        ("CREATE DATABASE d", "CREATE SCHEMA d"),
        ("SELECT 1 IN (1, NULL)", "SELECT 2 IN (3, 4)"),
        ("SELECT (1, NULL)", "SELECT (NULL, 1)"),
        ("SELECT -NULL", "SELECT - 'a'"),
    ];
    for (a, b) in alike {
        assert_eq!(digest_of(a), digest_of(b), "{a:?} vs {b:?}");
    }
    let apart = [
        ("SELECT X'41'", "SELECT 'A'"),
        ("SELECT _latin1 'a'", "SELECT 'a'"),
        ("SELECT a FROM t", "SELECT A FROM t"),
        ("SELECT count(*) FROM t", "SELECT COUNT(a) FROM t"),
        ("SELECT a = -1", "SELECT a = 1"),
        ("SELECT a || b", "SELECT a | b"),
    ];
    for (a, b) in apart {
        assert_ne!(digest_of(a), digest_of(b), "{a:?} vs {b:?}");
    }
}
