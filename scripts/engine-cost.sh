#!/usr/bin/env bash
# The embedded engine's cost per task, in counts that do not move with the machine's speed:
# instructions (valgrind's callgrind, the whole run of ferriq's part divided by its tasks) and
# allocation calls (counted by bench_e2e's allocator over the same run).
#
#   bash scripts/engine-cost.sh [TASKS] [RUNS]   # defaults 20000 (+ 100 sequential round trips), 3
#
# One run's counts move by a few per cent with how the threads happened to interleave (how
# many deliveries each receive took, how often a thread parked): the last line is the median
# of RUNS runs, each printed above it.
set -euo pipefail
cd "$(dirname "$0")/.."
tasks="${1:-20000}"
runs="${2:-3}"
lat=100
command -v valgrind >/dev/null || { echo "engine-cost: needs valgrind (apt-get install valgrind)" >&2; exit 1; }
cargo build --release --quiet -p ferriq-examples --example bench_e2e
bin="${CARGO_TARGET_DIR:-target}/release/examples/bench_e2e"
out="$(mktemp)"
trap 'rm -f "$out" "$out.log" "$out.runs"' EXIT
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
for run in $(seq "$runs"); do
  allocs="$("$bin" --broker memory --tasks "$tasks" --lat-n "$lat" --no-raw | sed -n 's/^engine_allocs_per_task=\([0-9.]*\).*/\1/p')"
  valgrind --tool=callgrind --callgrind-out-file="$out" \
    "$bin" --broker memory --tasks "$tasks" --lat-n "$lat" --no-raw >/dev/null 2>"$out.log"
  instructions="$(sed -n 's/.*Collected : \([0-9]*\).*/\1/p' "$out.log")"
  awk -v r="$run" -v i="$instructions" -v n="$((tasks + lat))" -v a="$allocs" \
    'BEGIN { printf "run %d: instructions_per_task=%.0f allocs_per_task=%s\n", r, i / n, a }' | tee -a "$out.runs"
done
sed 's/.*instructions_per_task=\([0-9]*\) allocs_per_task=\([0-9.]*\)/\1 \2/' "$out.runs" | awk -v n="$((tasks + lat))" '
  { i[NR] = $1; a[NR] = $2 }
  function median(v, k,   j, t, m) {
    for (m = 1; m <= k; m++) for (j = m + 1; j <= k; j++) if (v[j] < v[m]) { t = v[m]; v[m] = v[j]; v[j] = t }
    return k % 2 ? v[(k + 1) / 2] : (v[k / 2] + v[k / 2 + 1]) / 2
  }
  END { printf "engine_instructions_per_task=%.0f engine_allocs_per_task=%.1f tasks=%d runs=%d (medians)\n", median(i, NR), median(a, NR), n, NR }'
