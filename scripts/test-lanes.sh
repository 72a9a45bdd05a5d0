#!/usr/bin/env bash
# Every test of the workspace (`cargo test --workspace`), its test binaries run in a few lanes
# side by side instead of one after the other. Most of the suite's time is waiting (real
# delays, leases running out, a second worker taking over), not CPU: one binary at a time took
# 7.5 minutes of which the CPU was busy 2. Each lane is `cargo test --workspace` with a share
# of the test targets, so all lanes use the build made first (same features, nothing rebuilt);
# the tests within a binary run in parallel threads as they always do, and every test already
# uses its own queue names and key prefixes, so the lanes share the servers like threads do.
#
#   scripts/test-lanes.sh [LANES]     (default 3; 1 runs the targets one after the other)
set -euo pipefail
cd "$(dirname "$0")/.."
lanes=${1:-3}

# The build, once: every test binary, the examples (built, not run), as `cargo test` does.
cargo test --workspace --locked --no-run

# The test targets by name (a name may be several packages' targets, e.g. `delays`), split
# into lanes: the slowest first, each to the lane with the least time so far. The seconds are
# what each name took on a 2-vCPU machine, one binary at a time; a name not listed counts 3.
# They only order the split: a wrong figure makes one lane end later, never skips a test.
mapfile -t plan < <(cargo metadata --locked --no-deps --format-version 1 | python3 -c '
import json, sys
lanes = int(sys.argv[1])
took = {"delays": 83, "macros": 33, "fifo": 31, "conformance": 29, "leases": 27, "ops": 27,
        "processes": 23, "schedules": 18, "roundtrip": 16, "streams": 14, "cluster": 14,
        "browser": 13, "dead_index": 11, "permissions": 10, "reconnect": 8, "workflows": 8}
meta = json.load(sys.stdin)
names = sorted({t["name"] for p in meta["packages"] for t in p["targets"] if "test" in t["kind"]})
names.sort(key=lambda n: -took.get(n, 3))
# Lane 0 also runs the unit tests (libraries and binaries), about 5 s.
load, share = [5] + [0] * (lanes - 1), [["--lib", "--bins"]] + [[] for _ in range(lanes - 1)]
for name in names:
    lane = load.index(min(load))
    load[lane] += took.get(name, 3)
    share[lane] += ["--test", name]
for args in share:
    print(" ".join(args))
' "$lanes")

# A plan that failed to come out (cargo metadata or python3 failing inside the process
# substitution) must not pass as a run of nothing.
if ((${#plan[@]} != lanes)) || [[ "${plan[*]}" != *--test* ]]; then
  echo "could not split the test targets into $lanes lanes: ${plan[*]:-nothing}" >&2
  exit 1
fi

logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
pids=()
for i in "${!plan[@]}"; do
  # shellcheck disable=SC2086 # the plan is a list of words
  timeout 30m cargo test --workspace --locked ${plan[$i]} >"$logs/lane$i.log" 2>&1 &
  pids+=($!)
done
failed=()
for i in "${!pids[@]}"; do
  if ! wait "${pids[$i]}"; then failed+=("$i"); fi
done
for i in "${!plan[@]}"; do
  printf '\n---- lane %s: %s\n' "$i" "${plan[$i]}"
  cat "$logs/lane$i.log"
done
if ((${#failed[@]})); then
  echo "FAILED: lane(s) ${failed[*]} (their logs above)" >&2
  exit 1
fi

# The documentation's examples last: rustdoc compiles each one, the CPU-heavy part.
timeout 10m cargo test --workspace --locked --doc
