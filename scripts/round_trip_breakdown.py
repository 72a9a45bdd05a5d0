#!/usr/bin/env python3
"""Where a round trip's time goes, from a loopback packet capture of a bench_e2e run.

Capture RabbitMQ and Redis traffic while the bench makes sequential round trips, then read the
capture back as text into this script (tcpdump is a Debian package: apt-get install tcpdump):

    tcpdump -i lo -s 0 -w /tmp/rt.pcap 'tcp port 5672 or tcp port 6379' &
    target/release/examples/bench_e2e --broker amqp --tasks 100 --lat-n 1000
    kill %1
    tcpdump -r /tmp/rt.pcap -tt -n -A | python3 scripts/round_trip_breakdown.py

Each task id (32 hex digits) is followed through the packets that carry it: the producer's
publish, RabbitMQ's delivery to the worker, the worker's claim and complete on Redis, and the
completion message Redis sends the producer. The medians of the segments between them, and of
the gap from one task's completion message to the next task's publish (the producer waking and
enqueueing the next), add up to the round trip. Packets carry ids in their payload only, so the
capture must be of the default (unencrypted) loopback connections.
"""

import re
import statistics
import sys

HEADER = re.compile(r"^(\d+\.\d+) IP \S+\.(\d+) > \S+\.(\d+): ")
# Not inside a longer run of hex digits (a RESP length prefix ends in digits).
TASK_ID = re.compile(r"(?<![0-9a-f])[0-9a-f]{32}(?![0-9a-f])")
RABBIT, REDIS = "5672", "6379"


def packets(lines):
    """(time, src port, dst port, payload text) of each packet in `tcpdump -tt -n -A` output."""
    current = None
    for line in lines:
        m = HEADER.match(line)
        if m:
            if current:
                yield current
            current = [float(m.group(1)), m.group(2), m.group(3), []]
        elif current:
            current[3].append(line)
    if current:
        yield current


def main():
    # task id -> the times of the packets that carried it, by where they went
    events = {}
    for t, src, dst, body in packets(sys.stdin):
        # tcpdump breaks the text at each newline byte (RESP's \r\n): kept as a separator.
        text = " ".join(body)
        for task in set(TASK_ID.findall(text)):
            e = events.setdefault(task, {"to_redis": [], "from_redis": []})
            if dst == RABBIT:
                e.setdefault("publish", t)
            elif src == RABBIT:
                e.setdefault("delivery", t)
            elif dst == REDIS:
                e["to_redis"].append(t)
            elif src == REDIS:
                e["from_redis"].append(t)
    for e in events.values():
        # The worker's claim, then its complete; then Redis's completion message.
        if len(e["to_redis"]) >= 2:
            e["claim"], e["complete"] = e["to_redis"][0], e["to_redis"][1]
            later = [t for t in e["from_redis"] if t > e["complete"]]
            if later:
                e["message"] = later[0]
    complete = sorted(
        (e for e in events.values() if all(k in e for k in ("publish", "delivery", "claim", "complete", "message"))),
        key=lambda e: e["publish"],
    )
    if not complete:
        sys.exit("no task was followed from publish to completion message: was the capture on lo, unencrypted?")
    # Sequential round trips only (not the run's batches): a task published after the one
    # before it was announced.
    pairs = [(a, b) for a, b in zip(complete, complete[1:]) if b["publish"] > a["message"]]
    alone = [b for _, b in pairs]
    segments = {
        "publish -> delivery (RabbitMQ)": [e["delivery"] - e["publish"] for e in alone],
        "delivery -> claim sent (worker picks it up)": [e["claim"] - e["delivery"] for e in alone],
        "claim sent -> complete sent (claim round trip, run, result)": [e["complete"] - e["claim"] for e in alone],
        "complete sent -> completion message (Redis)": [e["message"] - e["complete"] for e in alone],
        "completion message -> next publish (producer wakes, enqueues the next)": [
            b["publish"] - a["message"] for a, b in pairs
        ],
    }
    print(f"{len(complete)} tasks followed, {len(alone)} sent one at a time; medians in microseconds")
    total = 0.0
    for name, values in segments.items():
        if values:
            med = statistics.median(values) * 1e6
            p99 = sorted(values)[int(len(values) * 0.99)] * 1e6
            total += med
            print(f"{med:8.0f}  (p99 {p99:6.0f})  {name}")
    print(f"{total:8.0f}  sum of the medians")


if __name__ == "__main__":
    main()
