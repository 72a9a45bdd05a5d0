#!/usr/bin/env bash
# The whole test suite, from a fresh machine: starts what is missing, then runs formatting,
# lints and every test against the real services. `.ci/run` calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/services.sh

step() { printf '\n==> %s\n' "$*"; }

step "services"
ensure_redis
ensure_rabbitmq
ensure_python_env
ensure_chromium
ensure_sqs_emulators
trap stop_sqs_emulators EXIT

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy (all targets, warnings are errors)"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "cargo check: the backends' optional features still build (TLS, the AWS credential chain)"
cargo check --locked --quiet -p ferriq-valkey -p ferriq-amqp -p ferriq-sqs -p ferriq-cli \
  --features ferriq-valkey/tls,ferriq-amqp/tls,ferriq-sqs/aws-config,ferriq-cli/tls

step "cargo test (unit, integration, doc tests; real Redis and RabbitMQ)"
timeout 40m cargo test --workspace --locked

step "TLS for real (a throwaway CA made with openssl, private TLS servers; the tls features)"
command -v openssl >/dev/null || { echo "openssl is needed for the TLS tests" >&2; exit 1; }
timeout 10m cargo test --locked -p ferriq-valkey --features tls --test tls
timeout 10m cargo test --locked -p ferriq-amqp --features tls --test tls

step "fault harness, small size (worker processes, a private redis-server, proxies; see RELIABILITY.md)"
cargo build --locked --quiet -p ferriq-harness
timeout 25m target/debug/fault-harness --size small

step "quickstart"
out=$(cargo run --locked --quiet --example quickstart)
echo "$out"
# Its output is deterministic: both failing tasks are parked, every time.
echo "$out" | grep -q 'dead-lettered  -> 2 message(s)' || { echo "quickstart output changed" >&2; exit 1; }

step "all green"
