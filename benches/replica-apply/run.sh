#!/usr/bin/env bash
# What the replica-apply probes cost a replica's applier: a private
# row-based primary and replica pair (one applier thread), the replica's
# SQL thread stopped while sysbench writes EVENTS transactions on the
# primary, then started and timed until it has applied them all; rounds
# alternate without and with `sqlbee agent` attached to the replica.
# Usage: run.sh SQLBEE_BINARY[,SQLBEE_BINARY...] [ROUNDS] [EVENTS]: each
# binary is an arm of its own (agent1, agent2, ...), so two builds compare
# side by side. Needs root and sysbench (./x setup installs both).
set -euo pipefail
IFS=, read -r -a binaries <<<"${1:?the sqlbee binary}"
rounds=${2:-6}
events=${3:-3000}
dir=$(mktemp -d /tmp/sqlbee-replica-bench-XXXX)
cleanup() {
    [ -n "${agent:-}" ] && kill "$agent" 2>/dev/null || true
    for side in primary replica; do
        [ -f "$dir/$side.pid" ] && kill "$(cat "$dir/$side.pid")" 2>/dev/null || true
    done
    sleep 2
    rm -rf "$dir"
}
trap cleanup EXIT
port=$((20000 + RANDOM % 20000))
start() { # side port extra...
    local side=$1 p=$2
    shift 2
    mariadb-install-db --user=root --datadir="$dir/$side" >/dev/null 2>&1
    mariadbd --no-defaults --user=root --datadir="$dir/$side" --socket="$dir/$side.sock" --port="$p" \
        --bind-address=127.0.0.1 --pid-file="$dir/$side.pid" "$@" >"$dir/$side.log" 2>&1 &
    for _ in $(seq 100); do [ -S "$dir/$side.sock" ] && return; sleep 0.1; done
    echo "$side did not start" >&2; cat "$dir/$side.log" >&2; exit 1
}
start primary "$port" --server-id=1 --log-bin=primary-bin --binlog-format=ROW
start replica $((port + 1)) --server-id=2 --relay-log=replica-relay --slave-parallel-threads=0
on() { local side=$1; shift; mariadb -S "$dir/$side.sock" -N -e "$*"; }
on primary "CREATE USER repl@'127.0.0.1' IDENTIFIED BY 'repl'; GRANT REPLICATION SLAVE ON *.* TO repl@'127.0.0.1';
            CREATE USER bench@'localhost'; GRANT ALL ON *.* TO bench@'localhost'; CREATE DATABASE sbtest;"
on replica "CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT=$port, MASTER_USER='repl', MASTER_PASSWORD='repl',
            MASTER_USE_GTID=slave_pos; START SLAVE;"
bench() {
    sysbench oltp_write_only --db-driver=mysql --mysql-socket="$dir/primary.sock" --mysql-user=bench \
        --tables=1 --table-size=10000 "$@" >/dev/null
}
bench prepare
seq_of() { sed -n 's/.*0-1-\([0-9]*\).*/\1/p' <<<"$1"; }
caught_up() {
    local want
    want=$(seq_of "$(on primary 'SELECT @@gtid_binlog_pos')")
    while [ "$(seq_of "$(on replica 'SELECT @@gtid_slave_pos')")" != "$want" ]; do sleep 0.02; done
}
caught_up
replica_pid=$(cat "$dir/replica.pid")
echo "round arm transactions seconds transactions_per_second"
for round in $(seq "$rounds"); do
    # Rotate which arm goes first, so drift favours none.
    arms=(control)
    for i in "${!binaries[@]}"; do arms+=("agent$((i + 1))"); done
    shift_by=$((round % ${#arms[@]}))
    arms=("${arms[@]:shift_by}" "${arms[@]:0:shift_by}")
    for arm in "${arms[@]}"; do
        on replica "STOP SLAVE SQL_THREAD"
        before=$(seq_of "$(on replica 'SELECT @@gtid_slave_pos')")
        bench run --events="$events" --time=0 --threads=4
        want=$(seq_of "$(on primary 'SELECT @@gtid_binlog_pos')")
        agent=
        if [ "$arm" != control ]; then
            "${binaries[${arm#agent} - 1]}" agent --pid="$replica_pid" --window=1s >/dev/null 2>"$dir/agent.log" &
            agent=$!
            for _ in $(seq 200); do grep -q "attached" "$dir/agent.log" && break; sleep 0.05; done
            sleep 1
        fi
        t0=$(date +%s.%N)
        on replica "START SLAVE SQL_THREAD"
        caught_up
        t1=$(date +%s.%N)
        if [ -n "$agent" ]; then kill -INT "$agent"; wait "$agent" || true; agent=; fi
        n=$((want - before))
        awk -v r="$round" -v a="$arm" -v n="$n" -v t0="$t0" -v t1="$t1" \
            'BEGIN { s = t1 - t0; printf "%d %s %d %.3f %.1f\n", r, a, n, s, n / s }'
    done
done
