"""Replays the statements the ClickHouse store sent to ClickHouse 18.16, in
order, on chdb (the current ClickHouse engine, in-process) in a fresh
session, so the store's SQL is known to run on a current version too.

Usage: python chdb_replay.py DIR, where DIR/statements.jsonl holds one
{"database", "sql", "rows", "answer_len"} per line (see xtask::chdb).
Prints chdb's ClickHouse version and exits 0, or prints one JSON object
{"index", "sql", "error"} for the first statement chdb refuses or answers
differently, and exits 1.
"""
import json
import os
import sys
import time

from chdb import session


def wait_for_mutations(s):
    # The store waits for its deletes before it reads again; a replay that
    # did not would compare answers read before and after the delete.
    started = time.monotonic()
    while True:
        pending = s.query(
            "SELECT count() FROM system.mutations WHERE database = currentDatabase() AND is_done = 0", "CSV"
        )
        if str(pending).strip() == "0":
            return
        if time.monotonic() - started > 60:
            raise RuntimeError("a mutation has not finished after 60 s")
        time.sleep(0.05)


def run(s, directory, statement):
    sql = statement["sql"]
    if statement["rows"] is not None:
        # chdb takes a query as text, and RowBinary rows are not text: the
        # very bytes 18.16 took go in through FROM INFILE, in the same
        # format and columns, so the current engine parses them too.
        head, sep, fmt = sql.rpartition(" FORMAT ")
        if not sep:
            raise RuntimeError("an INSERT with rows but no FORMAT clause")
        path = os.path.join(directory, statement["rows"])
        return s.query(f"{head} FROM INFILE '{path}' FORMAT {fmt}")
    answer = s.query(sql)
    if " DELETE WHERE " in sql:
        wait_for_mutations(s)
    return answer


def main(directory):
    # The session's files live in DIR, which the caller removes.
    s = session.Session(os.path.join(directory, "chdb"))
    version = str(s.query("SELECT version()", "TSV")).strip()
    current = None
    with open(os.path.join(directory, "statements.jsonl")) as lines:
        for index, line in enumerate(lines):
            statement = json.loads(line)
            try:
                database = statement["database"]
                if database is not None and database != current:
                    s.query(f"USE {database}")
                    current = database
                answer = run(s, directory, statement)
                expected = statement["answer_len"]
                if expected is not None:
                    got = len(answer.bytes())
                    # Rows may come in another order (GROUP BY without
                    # ORDER BY), but the same rows take the same bytes.
                    if got != expected:
                        raise RuntimeError(f"answered {got} bytes of RowBinary where 18.16 answered {expected}")
            except Exception as e:
                print(json.dumps({"index": index, "sql": statement["sql"], "error": str(e)}))
                return 1
    print(version)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
