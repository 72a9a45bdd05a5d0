#!/usr/bin/env bash
# The embedded engine's cost per task, in counts that do not move with the machine's speed:
# instructions (valgrind's callgrind, the whole run of ferriq's part divided by its tasks) and
# allocation calls (counted by bench_e2e's allocator over the same run).
#
#   bash scripts/engine-cost.sh [TASKS]      # default 20000 (+ 100 sequential round trips)
set -euo pipefail
cd "$(dirname "$0")/.."
tasks="${1:-20000}"
lat=100
command -v valgrind >/dev/null || { echo "engine-cost: needs valgrind (apt-get install valgrind)" >&2; exit 1; }
cargo build --release --quiet -p ferriq-examples --example bench_e2e
bin="${CARGO_TARGET_DIR:-target}/release/examples/bench_e2e"
out="$(mktemp)"
trap 'rm -f "$out"' EXIT
allocs="$("$bin" --broker memory --tasks "$tasks" --lat-n "$lat" --no-raw | sed -n 's/^engine_allocs_per_task=\([0-9.]*\).*/\1/p')"
valgrind --tool=callgrind --callgrind-out-file="$out" \
  "$bin" --broker memory --tasks "$tasks" --lat-n "$lat" --no-raw >/dev/null 2>"$out.log"
instructions="$(sed -n 's/.*Collected : \([0-9]*\).*/\1/p' "$out.log")"
rm -f "$out.log"
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
awk -v i="$instructions" -v n="$((tasks + lat))" -v a="$allocs" \
  'BEGIN { printf "engine_instructions_per_task=%.0f engine_allocs_per_task=%s tasks=%d\n", i / n, a, n }'
