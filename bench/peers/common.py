"""What the peers' producers share: the settings from the environment, percentiles, the
report line, and the worker's memory."""

import json
import os
import time

AMQP_URL = os.environ.get("PEER_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
REDIS_URL = os.environ.get("PEER_REDIS_URL", "redis://127.0.0.1:6379/5")
TASKS = int(os.environ.get("PEER_TASKS", "10000"))
BATCH = int(os.environ.get("PEER_BATCH", "1000"))
ROUND_TRIPS = int(os.environ.get("PEER_ROUND_TRIPS", "300"))
WARM_UP = 200


def percentile(samples, p):
    ordered = sorted(samples)
    if not ordered:
        return float("nan")
    k = min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))
    return ordered[k]


def report(name, e2e_seconds, round_trips):
    """One JSON line: what the orchestrator reads."""
    print(
        json.dumps(
            {
                "peer": name,
                "tasks": TASKS,
                "e2e_tasks_per_s": round(TASKS / e2e_seconds),
                "p50_ms": round(percentile(round_trips, 50) * 1000, 2),
                "p99_ms": round(percentile(round_trips, 99) * 1000, 2),
            }
        ),
        flush=True,
    )


def now():
    return time.perf_counter()


def measure(name, send, wait_all):
    """The workload of a peer whose client blocks: `send(i)` enqueues `add(i, 1)` and returns
    its handle, `wait_all(handles)` waits for their results. Warm-up, the batches, then the
    sequential round trips; prints the report line."""
    wait_all([send(i) for i in range(WARM_UP)])
    start = now()
    handles = []
    for first in range(0, TASKS, BATCH):
        last = min(first + BATCH, TASKS)
        handles += [send(i) for i in range(first, last)]
    wait_all(handles)
    e2e = now() - start
    round_trips = []
    for i in range(ROUND_TRIPS):
        t = now()
        wait_all([send(i)])
        round_trips.append(now() - t)
    report(name, e2e, round_trips)
