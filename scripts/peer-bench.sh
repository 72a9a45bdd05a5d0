#!/usr/bin/env bash
# ferriq beside taskiq, dramatiq and Celery: the same workload on the same machine in the same hour.
#   bash scripts/peer-bench.sh [ROUNDS] [amqp|redis]   (default 1 round, amqp: each framework once, in turn)
# Each framework: 200 warm-up tasks, then 10,000 `add` tasks with results, enqueued in batches
# of 1,000, every result awaited (end-to-end tasks/s); then 300 sequential round trips (p50 /
# p99); the worker's peak RSS (its whole process tree). taskiq runs on RabbitMQ
# (taskiq-aio-pika's defaults: quorum queue, publisher confirms) with taskiq-redis results, one
# worker process with 100 concurrent tasks; dramatiq on RabbitMQ with its Results middleware on
# Redis and its defaults (2 processes x 8 threads, classic queue, no confirms); Celery on
# RabbitMQ with its Redis result backend and its defaults (prefork, a process per CPU, classic
# queue, no confirms) but without gossip, mingle, heartbeat events and remote control (common in
# production; here they would leave Celery's broadcast exchanges on the shared RabbitMQ); ferriq as
# `bench_e2e --broker amqp` runs it (quorum queue, confirms, claims and exactly-once results in
# Redis, one worker process). The peers install into .tools/peer-bench (PyPI); Redis DB 5 and
# queues named ferriq.peer.* are theirs: the queues and taskiq's keys are deleted afterwards,
# dramatiq's result keys (md5 names) and Celery's (celery-task-meta-*) expire after 10 minutes.
# With `redis`: ferriq as `bench_e2e --broker redis` runs it (its Streams broker, claims and
# results on the same Redis) beside taskiq-redis's RedisStreamBroker with taskiq-redis results
# (one worker process with 100 concurrent tasks), on the same Redis.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/services.sh
rounds=${1:-1}
family=${2:-amqp}
case $family in
  amqp) peers="taskiq dramatiq celery" ;;
  redis) peers="taskiq_redis" ;;
  *) echo "usage: bash scripts/peer-bench.sh [ROUNDS] [amqp|redis]" >&2; exit 2 ;;
esac

ensure_redis
ensure_rabbitmq
venv=.tools/peer-bench/venv
if ! "$venv/bin/python" -c 'import taskiq_aio_pika, taskiq_redis, dramatiq, celery, pika, psutil' 2>/dev/null; then
  echo "peers: installing taskiq and dramatiq into $venv" >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r bench/peers/requirements.txt
fi
py="$PWD/$venv/bin/python"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "building ferriq's benchmark (release)" >&2
cargo build --quiet --release -p ferriq-examples --example bench_e2e

# The peak RSS (MiB) of process $1 and its children, sampled every 0.2 s until $2 exists.
sample_rss() {
  "$py" - "$1" "$2" <<'PY'
import os, sys, time, psutil
root, stop = psutil.Process(int(sys.argv[1])), sys.argv[2]
peak = 0
while not os.path.exists(stop):
    try:
        procs = [root] + root.children(recursive=True)
        peak = max(peak, sum(p.memory_info().rss for p in procs))
    except psutil.Error:
        break
    time.sleep(0.2)
print(round(peak / 2**20, 1))
PY
}

# Runs peer $1 once; prints its JSON report with the worker's RSS added.
run_peer() {
  local name=$1 queue="ferriq.peer.$1.$$" worker
  cd bench/peers
  export PEER_QUEUE=$queue
  case $name in
    taskiq) "$PWD/../../$venv/bin/taskiq" worker peer_taskiq:broker --workers 1 --max-async-tasks 100 >"$work/$name.log" 2>&1 & ;;
    taskiq_redis) "$PWD/../../$venv/bin/taskiq" worker peer_taskiq_redis:broker --workers 1 --max-async-tasks 100 >"$work/$name.log" 2>&1 & ;;
    dramatiq) "$PWD/../../$venv/bin/dramatiq" peer_dramatiq >"$work/$name.log" 2>&1 & ;;
    celery) "$PWD/../../$venv/bin/celery" -A peer_celery worker --loglevel=WARNING --without-gossip --without-mingle --without-heartbeat >"$work/$name.log" 2>&1 & ;;
  esac
  worker=$!
  rm -f "$work/stop"
  sample_rss "$worker" "$work/stop" >"$work/rss" &
  local sampler=$!
  local line
  line=$(timeout 600 "$py" "peer_$name.py" | tail -n1) || { echo "$name failed; its worker's log:" >&2; tail -20 "$work/$name.log" >&2; }
  touch "$work/stop"
  wait "$sampler" || true
  kill -TERM "$worker" 2>/dev/null || true
  # taskiq's worker on RedisStreamBroker may not stop on SIGTERM: 10 s, then SIGKILL (the
  # whole tree: `taskiq worker` forks its worker processes).
  for _ in $(seq 1 50); do kill -0 "$worker" 2>/dev/null || break; sleep 0.2; done
  pkill -KILL -P "$worker" 2>/dev/null || true
  kill -KILL "$worker" 2>/dev/null || true
  wait "$worker" 2>/dev/null || true
  "$py" cleanup.py "$queue" || true
  cd - >/dev/null
  [ -n "$line" ] && echo "$line" | "$py" -c "import json,sys; r=json.load(sys.stdin); r['rss_mib']=float(open('$work/rss').read() or 0); print(json.dumps(r))"
}

run_ferriq() {
  target/release/examples/bench_e2e --broker "$family" | tail -n1 | "$py" -c "
import json, sys
f = dict(kv.split('=') for kv in sys.stdin.read().split())
print(json.dumps({'peer': 'ferriq', 'e2e_tasks_per_s': int(f['e2e_tasks_per_s']), 'p50_ms': float(f['p50_ms']), 'p99_ms': float(f['p99_ms']), 'rss_mib': float(f['rss_mib']), 'raw_msgs_per_s': int(f['raw_msgs_per_s'])}))"
}

cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')
echo "$(nproc) vCPU, $cpu; $(date -u '+%Y-%m-%d %H:%M UTC')" >&2
for round in $(seq 1 "$rounds"); do
  for who in ferriq $peers; do
    echo "round $round: $who" >&2
    case $who in
      ferriq) run_ferriq ;;
      *) run_peer "$who" ;;
    esac
  done
done | tee "$work/all.jsonl" >&2
"$py" - "$work/all.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print("| framework | end to end tasks/s | round trip p50 / p99 ms | worker peak RSS MiB |")
print("|---|---|---|---|")
for peer in ["ferriq", "taskiq", "dramatiq", "celery", "taskiq_redis"]:
    mine = [r for r in rows if r["peer"] == peer]
    if not mine:
        continue
    e2e = " / ".join(f"{r['e2e_tasks_per_s']:,}" for r in mine)
    rt = " ; ".join(f"{r['p50_ms']} / {r['p99_ms']}" for r in mine)
    rss = " / ".join(str(r["rss_mib"]) for r in mine)
    print(f"| {peer} | {e2e} | {rt} | {rss} |")
ferriq = [r["e2e_tasks_per_s"] for r in rows if r["peer"] == "ferriq"]
for peer in ["taskiq", "dramatiq", "celery", "taskiq_redis"]:
    theirs = [r["e2e_tasks_per_s"] for r in rows if r["peer"] == peer]
    if ferriq and theirs:
        print(f"ferriq / {peer}: {min(ferriq) / max(theirs):.1f}-{max(ferriq) / min(theirs):.1f}x end to end")
PY
