#!/usr/bin/env bash
# The trap's price: each loop bare, then with a counting bpftrace uprobe
# on the function (see trap.c). Needs root, gcc and bpftrace (./x setup).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=$(mktemp -d)/trap
gcc -O2 -o "$bin" "$here/trap.c"
rounds=${ROUNDS:-5}
echo "bare:"
for _ in $(seq "$rounds"); do "$bin" 2000000 0; "$bin" 2000000 2; "$bin" 2000000 3; "$bin" 2000000 1; "$bin" 2000000 4; done
bpftrace -e "uprobe:$bin:probe_me { @nop = count(); } uprobe:$bin:probe_lea { @lea = count(); } uprobe:$bin:probe_nop5 { @nop5 = count(); }" >/dev/null 2>&1 &
tracer=$!
trap 'kill $tracer 2>/dev/null || true' EXIT
sleep 4
echo "with a counting uprobe on each function:"
for _ in $(seq "$rounds"); do "$bin" 1000000 0; "$bin" 100000 2; "$bin" 1000000 3; done
