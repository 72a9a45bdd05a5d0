#!/usr/bin/env bash
# A worker's allocation calls per task on RabbitMQ + Valkey: heaptrack attached to the worker
# process of one `bench_e2e --broker amqp` run (from its first delivery to its exit), its
# allocation calls divided by the run's tasks. Needs RabbitMQ and Redis (scripts/services.sh)
# and heaptrack (apt-get install heaptrack).
#
#   bash scripts/worker-allocs.sh [TASKS] [extra bench_e2e arguments]   # default 20000
set -euo pipefail
cd "$(dirname "$0")/.."
tasks="${1:-20000}"
shift || true
lat=10
command -v heaptrack >/dev/null || { echo "worker-allocs: needs heaptrack (apt-get install heaptrack)" >&2; exit 1; }
cargo build --release --quiet -p ferriq-examples --example bench_e2e
bin="${CARGO_TARGET_DIR:-target}/release/examples/bench_e2e"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
"$bin" --broker amqp --tasks "$tasks" --lat-n "$lat" "$@" >"$out/bench.log" 2>&1 &
bench=$!
# The bench starts its worker as a process of its own; attach as soon as it is there.
worker=""
for _ in $(seq 1 600); do
  worker="$(pgrep -n -f -- "--role worker" || true)"
  [ -n "$worker" ] && break
  sleep 0.05
done
[ -n "$worker" ] || { echo "worker-allocs: the bench's worker did not start" >&2; exit 1; }
heaptrack -o "$out/worker" -p "$worker" >"$out/heaptrack.log" 2>&1 &
tracker=$!
wait "$bench"
wait "$tracker" || true
calls="$(heaptrack_print -f "$out"/worker.*zst 2>/dev/null | sed -n 's/^calls to allocation functions: \([0-9]*\).*/\1/p')"
[ -n "$calls" ] || { echo "worker-allocs: heaptrack recorded nothing (see $out/heaptrack.log)" >&2; exit 1; }
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
grep -E "end to end \(enqueue" "$out/bench.log" || true
awk -v c="$calls" -v n="$((tasks + lat))" \
  'BEGIN { printf "worker_allocs_per_task=%.1f (allocation calls in the worker process ÷ %d tasks)\n", c / n, n }'
