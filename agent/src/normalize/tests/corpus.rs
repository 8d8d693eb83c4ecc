//! Realistic MySQL/MariaDB statements, grouped by the digest they must get.
//!
//! Each group lists statements that must share one digest (they differ only
//! in literals, list lengths, row counts, spacing, letter case of keywords,
//! comments and hints); statements of different groups must not. Where the
//! digest text is obvious it is spelled out, which pins the output format.

pub struct Group {
    /// The exact digest text, for groups where it is worth pinning.
    pub text: Option<&'static str>,
    pub statements: &'static [&'static str],
}

const fn exact(text: &'static str, statements: &'static [&'static str]) -> Group {
    Group { text: Some(text), statements }
}

const fn same(statements: &'static [&'static str]) -> Group {
    Group { text: None, statements }
}

pub const GROUPS: &[Group] = &[
    // ---- sysbench oltp_* ----
    exact(
        "SELECT `c` FROM `sbtest1` WHERE ID = ?",
        &[
            "SELECT c FROM sbtest1 WHERE id=?",
            "SELECT c FROM sbtest1 WHERE id=5021",
            "select c from sbtest1 where id = 17",
            "SELECT c\n  FROM sbtest1\n WHERE id = 42 /* sysbench */",
            "SELECT /*+ NO_INDEX_MERGE(sbtest1) */ c FROM sbtest1 WHERE id=9",
        ],
    ),
    same(&["SELECT c FROM sbtest2 WHERE id=?", "SELECT c FROM sbtest2 WHERE id=77"]),
    // MariaDB keeps a sign after `=` apart (`= - ?`), so do we.
    exact(
        "SELECT `c` FROM `sbtest1` WHERE ID = - ?",
        &["SELECT c FROM sbtest1 WHERE id=-3", "SELECT c FROM sbtest1 WHERE id = - 3"],
    ),
    exact(
        "SELECT `c` FROM `sbtest1` WHERE ID BETWEEN ? AND ?",
        &[
            "SELECT c FROM sbtest1 WHERE id BETWEEN ? AND ?",
            "SELECT c FROM sbtest1 WHERE id BETWEEN 4975 AND 5074",
            "SELECT c FROM sbtest1 WHERE id BETWEEN -10 AND +10",
        ],
    ),
    exact(
        "SELECT SUM (`k`) FROM `sbtest1` WHERE ID BETWEEN ? AND ?",
        &[
            "SELECT SUM(k) FROM sbtest1 WHERE id BETWEEN ? AND ?",
            "SELECT SUM(k) FROM sbtest1 WHERE id BETWEEN 1 AND 100",
        ],
    ),
    same(&[
        "SELECT c FROM sbtest1 WHERE id BETWEEN ? AND ? ORDER BY c",
        "SELECT c FROM sbtest1 WHERE id BETWEEN 10 AND 109 ORDER BY c",
    ]),
    exact(
        "SELECT DISTINCT `c` FROM `sbtest1` WHERE ID BETWEEN ? AND ? ORDER BY `c`",
        &[
            "SELECT DISTINCT c FROM sbtest1 WHERE id BETWEEN ? AND ? ORDER BY c",
            "SELECT DISTINCT c FROM sbtest1 WHERE id BETWEEN 2001 AND 2100 ORDER BY c",
        ],
    ),
    exact(
        "UPDATE `sbtest1` SET `k` = `k` + ? WHERE ID = ?",
        &[
            "UPDATE sbtest1 SET k=k+1 WHERE id=?",
            "UPDATE sbtest1 SET k=k+1 WHERE id=4986",
            "update sbtest1 set k = k + 1 where id = 1",
        ],
    ),
    same(&[
        "UPDATE sbtest1 SET c=? WHERE id=?",
        "UPDATE sbtest1 SET c='83868641912-28773972837-60736120486-75162659906' WHERE id=5003",
    ]),
    exact(
        "DELETE FROM `sbtest1` WHERE ID = ?",
        &["DELETE FROM sbtest1 WHERE id=?", "DELETE FROM sbtest1 WHERE id=4999"],
    ),
    exact(
        "INSERT INTO `sbtest1` (ID, `k`, `c`, `pad`) VALUES (...)",
        &[
            "INSERT INTO sbtest1 (id, k, c, pad) VALUES (?, ?, ?, ?)",
            "INSERT INTO sbtest1 (id, k, c, pad) VALUES (5001, 4993, '0-1-2', '3-4')",
        ],
    ),
    exact(
        "INSERT INTO `sbtest1` (`k`, `c`, `pad`) VALUES (...) /* , ... */",
        &[
            "INSERT INTO sbtest1 (k, c, pad) VALUES (1,'a','b'),(2,'c','d')",
            "INSERT INTO sbtest1 (k, c, pad) VALUES (1,'a','b'), (2,'c','d'), (3, 'e', 'f')",
            "INSERT INTO sbtest1 (k, c, pad) VALUES (?,?,?),(?,?,?)",
        ],
    ),
    exact("BEGIN", &["BEGIN", "begin", "BEGIN;", "  Begin  "]),
    exact("COMMIT", &["COMMIT", "commit", "COMMIT;"]),
    same(&["ROLLBACK", "rollback"]),
    exact("START TRANSACTION", &["START TRANSACTION", "start transaction"]),
    same(&["START TRANSACTION READ ONLY"]),
    same(&["START TRANSACTION WITH CONSISTENT SNAPSHOT"]),
    // ---- locking reads ----
    same(&["SELECT c FROM sbtest1 WHERE id=? FOR UPDATE", "SELECT c FROM sbtest1 WHERE id=12 FOR UPDATE"]),
    exact(
        "SELECT ID FROM `jobs` WHERE `state` = ? ORDER BY ID LIMIT ? FOR UPDATE SKIP LOCKED",
        &[
            "SELECT id FROM jobs WHERE state = 'queued' ORDER BY id LIMIT 10 FOR UPDATE SKIP LOCKED",
            "SELECT id FROM jobs WHERE state = 'retry' ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED",
        ],
    ),
    same(&["SELECT id FROM jobs WHERE state = 'queued' ORDER BY id LIMIT 10 FOR UPDATE NOWAIT"]),
    same(&[
        "SELECT * FROM accounts WHERE id = 3 LOCK IN SHARE MODE",
        "SELECT * FROM accounts WHERE id = 4 LOCK IN SHARE MODE",
    ]),
    same(&["SELECT * FROM accounts WHERE id = 3 FOR SHARE"]),
    // ---- IN lists ----
    exact(
        "SELECT * FROM `users` WHERE ID IN (...)",
        &[
            "SELECT * FROM users WHERE id IN (1,2,3)",
            "SELECT * FROM users WHERE id IN (4, 5)",
            "SELECT * FROM users WHERE id IN ( ?, ?, ?, ? )",
            "SELECT * FROM users WHERE id IN (-1, 2, +3)",
            "SELECT * FROM users WHERE id IN ('a', 'b', 3, NULL)",
        ],
    ),
    exact(
        "SELECT * FROM `users` WHERE ID IN (?)",
        &["SELECT * FROM users WHERE id IN (7)", "SELECT * FROM users WHERE id IN ('x')"],
    ),
    same(&["SELECT * FROM users WHERE id NOT IN (1, 2, 3)", "SELECT * FROM users WHERE id NOT IN (9, 8)"]),
    exact(
        "SELECT `a` FROM `t` WHERE (`a`, `b`) IN ((...) /* , ... */)",
        &["SELECT a FROM t WHERE (a, b) IN ((1,2),(3,4))", "SELECT a FROM t WHERE (a, b) IN ((5, 6), (7, 8), (9, 10))"],
    ),
    // ---- joins and subqueries ----
    same(&[
        "SELECT o.id, c.email FROM orders o JOIN customers c ON c.id = o.customer_id WHERE o.total > 100",
        "SELECT o.id, c.email FROM orders o JOIN customers c ON c.id = o.customer_id WHERE o.total > 2.50",
    ]),
    same(&[
        "SELECT o.id, c.email FROM orders AS o LEFT JOIN customers AS c ON c.id = o.customer_id WHERE c.id IS NULL",
        "select o.id, c.email from orders as o left join customers as c on c.id = o.customer_id where c.id is null",
    ]),
    same(&[
        "SELECT p.sku, SUM(oi.qty) FROM order_items oi INNER JOIN products p ON p.id = oi.product_id \
         INNER JOIN orders o ON o.id = oi.order_id WHERE o.created_at >= '2024-01-01' GROUP BY p.sku",
        "SELECT p.sku, SUM(oi.qty) FROM order_items oi INNER JOIN products p ON p.id = oi.product_id \
         INNER JOIN orders o ON o.id = oi.order_id WHERE o.created_at >= '2025-06-30' GROUP BY p.sku",
    ]),
    same(&[
        "SELECT * FROM a STRAIGHT_JOIN b ON a.id = b.a_id WHERE b.x = 1",
        "SELECT * FROM a STRAIGHT_JOIN b ON a.id = b.a_id WHERE b.x = 2",
    ]),
    same(&["SELECT * FROM a NATURAL JOIN b", "SELECT * FROM a natural join b"]),
    same(&["SELECT * FROM a CROSS JOIN b LIMIT 5"]),
    same(&["SELECT * FROM a RIGHT JOIN b USING (id) WHERE a.x = 'q'"]),
    same(&[
        "SELECT * FROM t WHERE a = (SELECT MAX(a) FROM t2 WHERE b = 3)",
        "SELECT * FROM t WHERE a = (SELECT MAX(a) FROM t2 WHERE b = 'three')",
    ]),
    same(&[
        "SELECT * FROM customers c WHERE EXISTS (SELECT 1 FROM orders o WHERE o.customer_id = c.id AND o.total > 10)",
        "SELECT * FROM customers c WHERE EXISTS (SELECT 1 FROM orders o WHERE o.customer_id = c.id AND o.total > 99)",
    ]),
    same(&["SELECT * FROM customers WHERE id IN (SELECT customer_id FROM orders WHERE total > 5)"]),
    same(&["SELECT x.n FROM (SELECT COUNT(*) AS n FROM orders GROUP BY customer_id) AS x WHERE x.n > 3"]),
    same(&["SELECT id FROM t1 UNION SELECT id FROM t2", "SELECT id FROM t1\nUNION\nSELECT id FROM t2"]),
    same(&["SELECT id FROM t1 UNION ALL SELECT id FROM t2"]),
    same(&[
        "SELECT status, COUNT(*) FROM orders GROUP BY status HAVING COUNT(*) > 5",
        "SELECT status, COUNT(*) FROM orders GROUP BY status HAVING COUNT(*) > 500",
    ]),
    same(&["SELECT status, COUNT(*) FROM orders GROUP BY status WITH ROLLUP"]),
    // ---- LIMIT ----
    exact(
        "SELECT * FROM `posts` ORDER BY `created_at` DESC LIMIT ?, ...",
        &[
            "SELECT * FROM posts ORDER BY created_at DESC LIMIT 20, 10",
            "SELECT * FROM posts ORDER BY created_at DESC LIMIT 0,10",
            "SELECT * FROM posts ORDER BY created_at DESC LIMIT ?, ?",
        ],
    ),
    exact(
        "SELECT * FROM `posts` ORDER BY `created_at` DESC LIMIT ? OFFSET ?",
        &[
            "SELECT * FROM posts ORDER BY created_at DESC LIMIT 10 OFFSET 20",
            "SELECT * FROM posts ORDER BY created_at DESC LIMIT 10 OFFSET 0",
        ],
    ),
    same(&[
        "SELECT * FROM posts ORDER BY created_at DESC LIMIT 10",
        "SELECT * FROM posts ORDER BY created_at DESC LIMIT 50",
    ]),
    // ---- INSERT / REPLACE ----
    exact(
        "INSERT INTO `t` (`a`, `b`) VALUES (...) ON DUPLICATE KEY UPDATE `b` = VALUES (`b`)",
        &[
            "INSERT INTO t (a, b) VALUES (1, 2) ON DUPLICATE KEY UPDATE b = VALUES(b)",
            "INSERT INTO t (a,b) VALUES (3,'x') ON DUPLICATE KEY UPDATE b=VALUES(b)",
        ],
    ),
    same(&[
        "INSERT INTO t (a, b) VALUES (1, 2), (3, 4) ON DUPLICATE KEY UPDATE b = VALUES(b)",
        "INSERT INTO t (a, b) VALUES (1, 2), (3, 4), (5, 6) ON DUPLICATE KEY UPDATE b = VALUES(b)",
    ]),
    same(&[
        "INSERT INTO counters (name, hits) VALUES ('home', 1) ON DUPLICATE KEY UPDATE hits = hits + 1",
        "INSERT INTO counters (name, hits) VALUES ('about', 1) ON DUPLICATE KEY UPDATE hits = hits + 1",
    ]),
    same(&[
        "INSERT INTO t (a, b) VALUES (1, 2) AS new ON DUPLICATE KEY UPDATE b = new.b",
        "INSERT INTO t (a, b) VALUES (7, 8) AS new ON DUPLICATE KEY UPDATE b = new.b",
    ]),
    exact(
        "REPLACE INTO `kv` (`k`, `v`) VALUES (...)",
        &["REPLACE INTO kv (k, v) VALUES ('a', 'b')", "replace into kv (k, v) values ('c', 'd')"],
    ),
    same(&["REPLACE INTO kv (k, v) VALUES ('a', 'b'), ('c', 'd')"]),
    same(&["INSERT IGNORE INTO kv (k, v) VALUES ('a', 'b')", "INSERT IGNORE INTO kv (k, v) VALUES ('z', '')"]),
    same(&["INSERT INTO archive SELECT * FROM orders WHERE created_at < '2020-01-01'"]),
    same(&["INSERT INTO kv SET k = 'a', v = 'b'", "INSERT INTO kv SET k='c', v='d'"]),
    exact(
        "INSERT INTO `tags` (NAME) VALUES (?) /* , ... */",
        &["INSERT INTO tags (name) VALUES ('a'),('b'),('c')", "INSERT INTO tags (name) VALUES ('a'), ('b')"],
    ),
    exact(
        "INSERT INTO `tags` (NAME) VALUES (?)",
        &["INSERT INTO tags (name) VALUES ('a')", "INSERT INTO tags (name) VALUES (NULL)"],
    ),
    same(&["INSERT INTO tags (name) VALUE ('b')"]),
    // NULL is a value in a row, so rows with and without NULLs collapse.
    exact(
        "INSERT INTO PROFILES (`user_id`, `bio`, `avatar`) VALUES (...) /* , ... */",
        &[
            "INSERT INTO profiles (user_id, bio, avatar) VALUES (1, NULL, NULL), (2, 'hi', NULL)",
            "INSERT INTO profiles (user_id, bio, avatar) VALUES (3, 'a', 'b.png'), (4, 'c', 'd.png')",
        ],
    ),
    same(&["INSERT INTO events (created_at, kind) VALUES (NOW(), DEFAULT)"]),
    same(&["INSERT INTO t VALUES ()"]),
    // ---- UPDATE / DELETE ----
    same(&[
        "UPDATE orders o JOIN customers c ON c.id = o.customer_id SET o.vip = 1 WHERE c.tier = 'gold'",
        "UPDATE orders o JOIN customers c ON c.id = o.customer_id SET o.vip = 0 WHERE c.tier = 'lead'",
    ]),
    // `value` and `id` are MariaDB keywords.
    exact(
        "UPDATE `counters` SET VALUE = VALUE - ? WHERE ID = ?",
        &["UPDATE counters SET value = value - 1 WHERE id = 3", "UPDATE counters SET value = value-5 WHERE id = 4"],
    ),
    exact(
        "UPDATE `counters` SET VALUE = VALUE + ? WHERE ID = ?",
        &["UPDATE counters SET value = value + 1 WHERE id = 3"],
    ),
    exact(
        "UPDATE `accounts` SET `balance` = ? WHERE ID = ?",
        &["UPDATE accounts SET balance = 1.5e3 WHERE id = 2", "UPDATE accounts SET balance = .5 WHERE id = 2"],
    ),
    exact(
        "UPDATE `accounts` SET `balance` = - ? WHERE ID = ?",
        &["UPDATE accounts SET balance = -100 WHERE id = 1", "UPDATE accounts SET balance = - 100 WHERE id = 1"],
    ),
    exact("UPDATE `accounts` SET `balance` = + ? WHERE ID = ?", &["UPDATE accounts SET balance = +100 WHERE id = 1"]),
    exact(
        "UPDATE `accounts` SET `balance` = `balance` - ? WHERE ID = ?",
        &[
            "UPDATE accounts SET balance = balance - 100 WHERE id = 1",
            "UPDATE accounts SET balance = balance -100 WHERE id = 1",
        ],
    ),
    same(&["UPDATE accounts SET balance = balance + 100 WHERE id = 1"]),
    same(&["UPDATE LOW_PRIORITY items SET qty = 0 WHERE qty < 0 ORDER BY id LIMIT 100"]),
    same(&[
        "DELETE FROM sessions WHERE expires_at < NOW() ORDER BY expires_at LIMIT 1000",
        "DELETE FROM sessions WHERE expires_at < NOW() ORDER BY expires_at LIMIT 50",
    ]),
    same(&["DELETE s FROM sessions s JOIN users u ON u.id = s.user_id WHERE u.banned = 1"]),
    same(&["DELETE FROM sessions"]),
    // ---- comments ----
    exact(
        "SELECT NAME FROM `users` WHERE `email` = ?",
        &[
            "SELECT name FROM users WHERE email = 'a@example.com'",
            "SELECT name FROM users WHERE email = ? -- login",
            "SELECT name FROM users WHERE email = ? # login",
            "SELECT name /* who */ FROM users WHERE email = 'b@example.com'",
            "-- app: login\nSELECT name FROM users WHERE email = ?",
            "# app: login\nSELECT name FROM users WHERE email = ?",
            "/* controller:sessions,action:create */ SELECT name FROM users WHERE email = ?",
            "SELECT name FROM users WHERE email = ? /* multi\nline\ncomment */",
            "SELECT /*+ MAX_EXECUTION_TIME(1000) */ name FROM users WHERE email = ?",
            "SELECT /*+ BKA(users) NO_ICP(users) */ name FROM users WHERE email = ?",
        ],
    ),
    // The body of an executable comment is kept: the server runs it.
    exact(
        "SET NAMES `utf8mb4`",
        &["/*!40101 SET NAMES utf8mb4 */", "SET NAMES utf8mb4", "/*!50503 SET NAMES utf8mb4 */;"],
    ),
    same(&["SELECT /*!40001 SQL_NO_CACHE */ * FROM `t1`", "SELECT SQL_NO_CACHE * FROM t1"]),
    exact(
        "CREATE TABLE `t` (ID INT) ENGINE = `InnoDB` DEFAULT CHARSET = `utf8mb4`",
        &[
            "CREATE TABLE t (id INT) /*!50100 ENGINE=InnoDB */ /*!40101 DEFAULT CHARSET=utf8mb4 */",
            "CREATE TABLE t (id INT) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4",
        ],
    ),
    same(&[
        "/*!40101 SET @OLD_CHARACTER_SET_CLIENT=@@CHARACTER_SET_CLIENT */",
        "SET @OLD_CHARACTER_SET_CLIENT=@@CHARACTER_SET_CLIENT",
    ]),
    same(&["/*!40014 SET @OLD_UNIQUE_CHECKS=@@UNIQUE_CHECKS, UNIQUE_CHECKS=0 */"]),
    same(&["/*!40000 ALTER TABLE `orders` DISABLE KEYS */"]),
    // ---- identifiers ----
    exact(
        "SELECT `user_id`, `Total` FROM `shop`.`orders`",
        &[
            "SELECT `user_id`, `Total` FROM `shop`.`orders`",
            "SELECT user_id, Total FROM shop.orders",
            "select user_id,Total from shop . orders",
        ],
    ),
    same(&["SELECT user_id, total FROM shop.orders"]),
    same(&["SELECT `select`, `from` FROM `where`"]),
    exact("SELECT `a``b` FROM `t`", &["SELECT `a``b` FROM t"]),
    same(&[
        "SELECT `users`.* FROM `users` WHERE `users`.`id` = 1 LIMIT 1",
        "SELECT `users`.* FROM `users` WHERE `users`.`id` = 77 LIMIT 1",
    ]),
    same(&[
        "select user0_.id as id1_0_, user0_.email as email2_0_ from users user0_ where user0_.email=?",
        "select user0_.id as id1_0_, user0_.email as email2_0_ from users user0_ where user0_.email='x@y.z'",
    ]),
    same(&["SELECT `prénom`, `名前` FROM `clients`"]),
    // ---- literals ----
    exact(
        "SELECT * FROM `t` WHERE `s` = ?",
        &[
            "SELECT * FROM t WHERE s = 'it''s'",
            r"SELECT * FROM t WHERE s = 'a\'b'",
            r#"SELECT * FROM t WHERE s = "dq \" x""#,
            r"SELECT * FROM t WHERE s = 'back\\slash'",
            "SELECT * FROM t WHERE s = ''",
            "SELECT * FROM t WHERE s = N'national'",
            "SELECT * FROM t WHERE s = 'héllo wörld 😀'",
            "SELECT * FROM t WHERE s = 'line1\nline2'",
            "SELECT * FROM t WHERE s = 'not -- a comment'",
            "SELECT * FROM t WHERE s = '/* nor this */'",
        ],
    ),
    // An introducer reads alike whatever the character set, as in MariaDB.
    exact(
        "SELECT * FROM `t` WHERE `s` = _charset ?",
        &[
            "SELECT * FROM t WHERE s = _utf8mb4'x'",
            "SELECT * FROM t WHERE s = _utf8mb4 'yy'",
            "SELECT * FROM t WHERE s = _latin1 'z'",
        ],
    ),
    exact(
        "SELECT * FROM `t` WHERE `flags` = ?",
        &[
            "SELECT * FROM t WHERE flags = 0x1F",
            "SELECT * FROM t WHERE flags = b'1010'",
            "SELECT * FROM t WHERE flags = 0b1010",
            "SELECT * FROM t WHERE flags = B'1'",
            "SELECT * FROM t WHERE flags = 12345678901234567890",
        ],
    ),
    // MariaDB keeps X'..' apart from every other value.
    exact(
        "SELECT * FROM `t` WHERE `flags` = X'?'",
        &["SELECT * FROM t WHERE flags = X'1F'", "SELECT * FROM t WHERE flags = x'ff'"],
    ),
    exact(
        "SELECT * FROM `t` WHERE `a` IS NULL",
        &["SELECT * FROM t WHERE a IS NULL", "select * from t where a is null"],
    ),
    same(&["SELECT * FROM t WHERE a IS NOT NULL"]),
    same(&["SELECT * FROM t WHERE a = TRUE", "SELECT * FROM t WHERE a = true"]),
    exact("SELECT ?", &["SELECT 1", "select 2", "SELECT -1", "SELECT 'one'", "SELECT ?", "SELECT NULL"]),
    // A sign after a comma folds; runs of values collapse as in MariaDB.
    exact("SELECT ?, ...", &["SELECT 1, 2", "SELECT 'a', -3", "SELECT 1, 2, 3"]),
    exact("SELECT * FROM `t` WHERE `flags` = - ?", &["SELECT * FROM t WHERE flags = -0.000001"]),
    exact("SELECT ? - ?", &["SELECT 1 - -1", "SELECT 5 - 3"]),
    same(&["SELECT 1 + 1"]),
    same(&[
        "SELECT DATE '2024-01-01', TIMESTAMP '2024-01-01 00:00:00'",
        "SELECT DATE '1999-12-31', TIMESTAMP '2000-01-01 10:00:00'",
    ]),
    same(&[
        "SELECT * FROM logs WHERE ts > NOW() - INTERVAL 7 DAY",
        "SELECT * FROM logs WHERE ts > NOW() - INTERVAL 30 DAY",
    ]),
    same(&["SELECT * FROM logs WHERE ts > NOW() - INTERVAL 7 HOUR"]),
    // ---- operators ----
    exact(
        "SELECT * FROM `t` WHERE `c` != ?",
        &["SELECT * FROM t WHERE c != 1", "SELECT * FROM t WHERE c <> 2", "SELECT * FROM t WHERE c!=3"],
    ),
    same(&["SELECT * FROM t WHERE c = 1", "SELECT * FROM t WHERE c = NULL"]),
    same(&["SELECT * FROM t WHERE c <=> NULL"]),
    same(&["SELECT * FROM t WHERE a >= 1 AND a <= 5", "SELECT * FROM t WHERE a>=10 AND a<=50"]),
    same(&["SELECT * FROM t WHERE a > 1 OR NOT b < 5"]),
    same(&["SELECT a & 1, a | 2, a ^ 3, ~a, a << 4, a >> 5 FROM t"]),
    same(&["SELECT 7 DIV 2, 7 MOD 2, 7 % 2"]),
    same(&["SELECT * FROM t WHERE name LIKE 'ab%'", "SELECT * FROM t WHERE name LIKE '%z'"]),
    same(&["SELECT * FROM t WHERE name LIKE 'a!%%' ESCAPE '!'"]),
    // RLIKE and REGEXP are one token.
    exact(
        "SELECT * FROM `t` WHERE NAME REGEXP ?",
        &[
            "SELECT * FROM t WHERE name REGEXP '^[a-z]+$'",
            "SELECT * FROM t WHERE name REGEXP '^x'",
            "SELECT * FROM t WHERE name RLIKE '^x'",
        ],
    ),
    same(&["SELECT * FROM articles WHERE MATCH (title, body) AGAINST ('mysql' IN NATURAL LANGUAGE MODE)"]),
    same(&["SELECT * FROM articles WHERE MATCH (title, body) AGAINST ('+mysql -oracle' IN BOOLEAN MODE)"]),
    same(&[
        "SELECT CASE WHEN score > 90 THEN 'A' WHEN score > 80 THEN 'B' ELSE 'C' END FROM results",
        "SELECT CASE WHEN score > 50 THEN 'pass' WHEN score > 40 THEN 'retry' ELSE 'fail' END FROM results",
    ]),
    // THEN and ELSE keep the sign apart, as MariaDB does.
    same(&["SELECT CASE WHEN x > 0 THEN -1 ELSE 1 END FROM t", "SELECT CASE WHEN x > 3 THEN -2 ELSE 7 END FROM t"]),
    same(&["SELECT CASE WHEN x > 5 THEN 1 ELSE -1 END FROM t"]),
    same(&["SELECT IF(a > 0, 'pos', 'neg'), IFNULL(b, 0), COALESCE(c, d, 0) FROM t"]),
    same(&[
        "SELECT CAST(a AS DECIMAL(10,2)), CONVERT(b, CHAR) FROM t",
        "SELECT CAST(a AS DECIMAL(12,4)), CONVERT(b, CHAR) FROM t",
    ]),
    same(&["SELECT CONCAT(first, ' ', last) FROM people", "SELECT CONCAT(first, '-', last) FROM people"]),
    same(&["SELECT GROUP_CONCAT(name ORDER BY name SEPARATOR ', ') FROM tags GROUP BY post_id"]),
    same(&["SELECT * FROM t ORDER BY FIELD(id, 3, 1, 2)", "SELECT * FROM t ORDER BY FIELD(id, 9, 8, 7)"]),
    same(&["SELECT * FROM t WHERE a = 'x' COLLATE utf8mb4_bin"]),
    // ---- window functions, CTEs, JSON ----
    exact(
        "SELECT ROW_NUMBER () OVER (PARTITION BY `dept` ORDER BY `salary` DESC) FROM `emp`",
        &[
            "SELECT ROW_NUMBER() OVER (PARTITION BY dept ORDER BY salary DESC) FROM emp",
            "select row_number() over (partition by dept order by salary desc) from emp",
        ],
    ),
    same(&["SELECT dept, SUM(salary) OVER w FROM emp WINDOW w AS (PARTITION BY dept)"]),
    same(&[
        "SELECT ts, AVG(v) OVER (ORDER BY ts ROWS BETWEEN 3 PRECEDING AND CURRENT ROW) FROM metrics",
        "SELECT ts, AVG(v) OVER (ORDER BY ts ROWS BETWEEN 10 PRECEDING AND CURRENT ROW) FROM metrics",
    ]),
    same(&["SELECT RANK() OVER (ORDER BY score DESC), LAG(score, 1) OVER (ORDER BY ts) FROM results"]),
    same(&[
        "WITH recent AS (SELECT * FROM orders WHERE created_at > '2024-01-01') SELECT COUNT(*) FROM recent",
        "WITH recent AS (SELECT * FROM orders WHERE created_at > '2025-01-01') SELECT COUNT(*) FROM recent",
    ]),
    same(&[
        "WITH RECURSIVE seq (n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM seq WHERE n < 10) SELECT * FROM seq",
        "WITH RECURSIVE seq (n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM seq WHERE n < 100) SELECT * FROM seq",
    ]),
    same(&["SELECT JSON_EXTRACT(doc, '$.name') FROM docs", "SELECT JSON_EXTRACT(doc, '$.age') FROM docs"]),
    same(&["SELECT doc->'$.name' FROM docs", "SELECT doc -> '$.id' FROM docs"]),
    same(&["SELECT doc->>'$.name' FROM docs"]),
    same(&["SELECT * FROM docs WHERE JSON_CONTAINS(tags, '\"red\"') AND JSON_LENGTH(tags) > 2"]),
    same(&["UPDATE docs SET doc = JSON_SET(doc, '$.seen', TRUE) WHERE id = 1"]),
    same(&["SELECT JSON_OBJECT('id', id, 'name', name), JSON_ARRAYAGG(tag) FROM docs GROUP BY id"]),
    same(&[
        "SELECT jt.* FROM docs, JSON_TABLE(doc, '$[*]' COLUMNS (id INT PATH '$.id')) AS jt",
        "SELECT jt.* FROM docs, JSON_TABLE(doc, '$.items[*]' COLUMNS (id INT PATH '$.sku')) AS jt",
    ]),
    // ---- MariaDB ----
    exact(
        "INSERT INTO `users` (`email`) VALUES (?) RETURNING ID, `created_at`",
        &[
            "INSERT INTO users (email) VALUES ('a@b.c') RETURNING id, created_at",
            "INSERT INTO users (email) VALUES (?) RETURNING id, created_at",
        ],
    ),
    same(&["DELETE FROM users WHERE id = 5 RETURNING email", "DELETE FROM users WHERE id = 6 RETURNING email"]),
    same(&["REPLACE INTO kv (k, v) VALUES ('a', 'b') RETURNING k"]),
    exact("CREATE SEQUENCE `s` START WITH ? INCREMENT BY ?", &["CREATE SEQUENCE s START WITH 1 INCREMENT BY 1"]),
    exact(
        "CREATE SEQUENCE `s` START WITH - ? INCREMENT BY - ?",
        &["CREATE SEQUENCE s START WITH -100 INCREMENT BY -1"],
    ),
    same(&["CREATE SEQUENCE s START WITH 1 INCREMENT BY 1 MINVALUE -10 MAXVALUE 1000 CACHE 20 CYCLE"]),
    // NEXTVAL is a MariaDB keyword, so its case does not matter.
    exact("SELECT NEXTVAL (`s`)", &["SELECT NEXTVAL(s)", "SELECT NEXTVAL( s )", "SELECT nextval(s)"]),
    same(&["SELECT NEXT VALUE FOR s", "select next value for s"]),
    same(&["SELECT PREVIOUS VALUE FOR s"]),
    same(&["SELECT SETVAL(s, 100)", "SELECT SETVAL(s, 5)"]),
    same(&["SELECT * FROM prices FOR SYSTEM_TIME AS OF TIMESTAMP '2024-01-01 00:00:00'"]),
    same(&["DELETE HISTORY FROM prices BEFORE SYSTEM_TIME '2024-01-01 00:00:00'"]),
    same(&["CREATE OR REPLACE TABLE t2 (id INT)"]),
    same(&["SELECT id FROM t1 EXCEPT SELECT id FROM t2", "SELECT id FROM t1 EXCEPT SELECT id FROM t2;"]),
    same(&["SELECT id FROM t1 INTERSECT SELECT id FROM t2"]),
    same(&["SELECT * FROM t WHERE id = 1 FOR UPDATE WAIT 5", "SELECT * FROM t WHERE id = 1 FOR UPDATE WAIT 10"]),
    // ---- DDL ----
    exact(
        "CREATE TABLE `t` (ID INT PRIMARY KEY, `c` VARCHAR (?) NOT NULL DEFAULT ?, `price` DECIMAL (...))",
        &[
            "CREATE TABLE t (id INT PRIMARY KEY, c VARCHAR(120) NOT NULL DEFAULT '', price DECIMAL(10,2))",
            "CREATE TABLE t (id INT PRIMARY KEY, c VARCHAR(255) NOT NULL DEFAULT 'x', price DECIMAL(12,4))",
        ],
    ),
    same(&[
        "CREATE TABLE IF NOT EXISTS t (id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT, PRIMARY KEY (id)) ENGINE=InnoDB",
    ]),
    // A sign after DEFAULT folds into the number.
    same(&[
        "CREATE TABLE t (n INT DEFAULT 7)",
        "CREATE TABLE t (n INT DEFAULT NULL)",
        "CREATE TABLE t (n INT DEFAULT -1)",
    ]),
    // NULL as a column attribute is syntax, not a value.
    exact("CREATE TABLE `t` (`n` INT NULL)", &["CREATE TABLE t (n INT NULL)"]),
    same(&["CREATE TABLE t (n INT NOT NULL)"]),
    same(&["CREATE TEMPORARY TABLE tmp SELECT * FROM t WHERE a = 1"]),
    same(&["CREATE TABLE t2 LIKE t"]),
    same(&["ALTER TABLE t ADD COLUMN d DATETIME NULL AFTER c", "alter table t add column d datetime null after c"]),
    same(&["ALTER TABLE t ADD INDEX idx_c (c), ALGORITHM=INPLACE, LOCK=NONE"]),
    same(&["ALTER TABLE t DROP COLUMN d"]),
    same(&["ALTER TABLE t MODIFY c VARCHAR(64) NOT NULL", "ALTER TABLE t MODIFY c VARCHAR(128) NOT NULL"]),
    same(&["ALTER TABLE t RENAME TO t_old"]),
    exact(
        "DROP TABLE IF EXISTS `t`",
        &["DROP TABLE IF EXISTS t", "DROP TABLE IF EXISTS `t`", "drop table if exists t"],
    ),
    same(&["DROP TABLE t"]),
    same(&["CREATE INDEX idx_email ON users (email)"]),
    same(&[
        "CREATE UNIQUE INDEX idx_email ON users (email(100))",
        "CREATE UNIQUE INDEX idx_email ON users (email(50))",
    ]),
    same(&["DROP INDEX idx_email ON users"]),
    same(&["TRUNCATE TABLE sessions", "truncate table sessions"]),
    same(&["RENAME TABLE t TO t_old, t_new TO t"]),
    same(&["CREATE DATABASE IF NOT EXISTS app CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci"]),
    same(&["DROP DATABASE app"]),
    same(&[
        "CREATE VIEW v AS SELECT id, email FROM users WHERE active = 1",
        "CREATE VIEW v AS SELECT id, email FROM users WHERE active = 0",
    ]),
    same(&["CREATE PROCEDURE p (IN x INT) SELECT x + 1"]),
    same(&["CREATE TRIGGER trg BEFORE INSERT ON t FOR EACH ROW SET NEW.created_at = NOW()"]),
    same(&["CREATE USER 'app'@'%' IDENTIFIED BY 'secret'", "CREATE USER 'app'@'%' IDENTIFIED BY 'other-secret'"]),
    same(&["GRANT SELECT, INSERT ON app.* TO 'app'@'localhost'", "GRANT SELECT, INSERT ON app.* TO 'web'@'10.0.0.1'"]),
    same(&["REVOKE ALL PRIVILEGES ON app.* FROM 'app'@'localhost'"]),
    // ---- SET, SHOW, session ----
    same(&["SET autocommit=0", "SET autocommit = 1", "set autocommit=1"]),
    // The server reads a user variable's name as a value: `@x` and `@y` share
    // a digest.
    exact("SET @? = ?", &["SET @x = 5", "SET @x = 'five'", "SET @y = 5"]),
    exact("SET @? = - ?", &["SET @x=-5"]),
    exact("SET @? := ?", &["SET @x := 5"]),
    same(&["SELECT @x, @y"]),
    same(&["SET @@session.sql_mode = 'STRICT_TRANS_TABLES'", "SET @@SESSION.sql_mode='ANSI'"]),
    same(&[
        "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
        "set session transaction isolation level read committed",
    ]),
    same(&["SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ"]),
    same(&["SET GLOBAL max_connections = 500", "SET GLOBAL max_connections = 1000"]),
    same(&["SET NAMES utf8mb4 COLLATE utf8mb4_unicode_ci"]),
    same(&["SET CHARACTER SET utf8"]),
    same(&["SET time_zone = '+00:00'", "SET time_zone = 'Europe/Paris'"]),
    same(&["SET SQL_SAFE_UPDATES = 1"]),
    exact("SELECT @@`version_comment` LIMIT ?", &["SELECT @@version_comment LIMIT 1"]),
    same(&["SELECT @@session.transaction_isolation", "SELECT @@SESSION.transaction_isolation"]),
    same(&["SELECT DATABASE(), USER(), VERSION()"]),
    same(&["SELECT LAST_INSERT_ID()"]),
    same(&["SELECT FOUND_ROWS()"]),
    exact("SHOW TABLES", &["SHOW TABLES", "show tables", "SHOW TABLES;"]),
    same(&["SHOW FULL TABLES FROM app"]),
    same(&["SHOW DATABASES"]),
    same(&["SHOW VARIABLES LIKE 'max_connections'", "SHOW VARIABLES LIKE 'innodb%'"]),
    same(&["SHOW GLOBAL STATUS LIKE 'Threads_connected'", "SHOW GLOBAL STATUS LIKE 'Questions'"]),
    same(&["SHOW CREATE TABLE orders"]),
    same(&["SHOW CREATE TABLE customers"]),
    same(&["SHOW PROCESSLIST"]),
    same(&["SHOW FULL PROCESSLIST"]),
    same(&["SHOW INDEX FROM orders"]),
    same(&["SHOW COLUMNS FROM orders LIKE 'c%'"]),
    same(&["SHOW ENGINE INNODB STATUS"]),
    same(&["SHOW SLAVE STATUS"]),
    same(&["SHOW WARNINGS"]),
    same(&["USE app"]),
    same(&["USE other"]),
    same(&["FLUSH PRIVILEGES"]),
    same(&["FLUSH TABLES WITH READ LOCK"]),
    same(&["KILL QUERY 1234", "KILL QUERY 99"]),
    same(&["KILL 1234"]),
    same(&["LOCK TABLES t WRITE, u READ"]),
    same(&["UNLOCK TABLES"]),
    same(&["ANALYZE TABLE orders"]),
    same(&["OPTIMIZE TABLE orders"]),
    same(&["CHECK TABLE orders"]),
    same(&["EXPLAIN SELECT * FROM orders WHERE id = 1", "EXPLAIN SELECT * FROM orders WHERE id = 2"]),
    same(&["EXPLAIN FORMAT=JSON SELECT * FROM orders WHERE id = 1"]),
    same(&["DESCRIBE orders", "describe orders"]),
    same(&["DESC orders"]),
    // ---- transactions, savepoints, XA ----
    same(&["SAVEPOINT sp1"]),
    same(&["ROLLBACK TO SAVEPOINT sp1"]),
    same(&["RELEASE SAVEPOINT sp1"]),
    same(&["XA START 'trx1'", "XA START 'trx2'"]),
    same(&["XA END 'trx1'"]),
    same(&["XA PREPARE 'trx1'"]),
    same(&["XA COMMIT 'trx1'"]),
    // ---- stored programs and prepared statements ----
    exact(
        "CALL `refresh_stats` (...)",
        &["CALL refresh_stats(1, 'daily')", "CALL refresh_stats(2, 'weekly')", "call refresh_stats(?, ?)"],
    ),
    same(&["CALL refresh_stats()"]),
    same(&["CALL refresh_stats(7)"]),
    same(&["PREPARE stmt FROM 'SELECT * FROM t WHERE id = ?'", "PREPARE stmt FROM 'SELECT 1'"]),
    same(&["EXECUTE stmt USING @a, @b"]),
    same(&["DEALLOCATE PREPARE stmt"]),
    same(&[
        "SELECT COUNT(*) INTO @n FROM orders WHERE status = 'new'",
        "SELECT COUNT(*) INTO @n FROM orders WHERE status = 'paid'",
    ]),
    same(&["DO SLEEP(1)", "DO SLEEP(0.5)"]),
    same(&["SELECT SLEEP(1)"]),
    same(&["SELECT GET_LOCK('job', 10)", "SELECT GET_LOCK('other', 0)"]),
    same(&["SELECT RELEASE_LOCK('job')"]),
    same(&["LOAD DATA LOCAL INFILE '/tmp/a.csv' INTO TABLE t FIELDS TERMINATED BY ','"]),
    same(&["HANDLER t OPEN"]),
];
