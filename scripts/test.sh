#!/usr/bin/env bash
# The whole test suite, from a fresh machine: starts what is missing, then runs formatting,
# lints and every test against the real services. `.ci/run` calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/services.sh

step() { printf '\n==> %s (%s UTC)\n' "$*" "$(date -u +%H:%M:%S)"; }

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

step "minimum Rust version: the library crates build with Cargo.toml's rust-version"
msrv=$(sed -n 's/^rust-version = "\(.*\)"$/\1/p' Cargo.toml | head -n1)
if rustup run "$msrv" rustc --version >/dev/null 2>&1 \
  || rustup toolchain install "$msrv" --profile minimal >/dev/null 2>&1; then
  cargo "+$msrv" check --locked --quiet --target-dir target/msrv -p ferriq --all-features \
    -p ferriq-macros -p ferriq-cron -p ferriq-amqp -p ferriq-valkey -p ferriq-dashboard
  echo "rust $msrv: ok"
else
  echo "WARNING: could not install Rust $msrv with rustup (no network to static.rust-lang.org?):" \
    "the minimum-version check did not run" >&2
fi

step "packaging: what crates.io would get (cargo package, each published crate)"
cargo package --locked --no-verify --quiet --allow-dirty -p ferriq-cron -p ferriq-macros -p ferriq \
  -p ferriq-amqp -p ferriq-valkey -p ferriq-sqs -p ferriq-dashboard -p ferriq-cli

step "cargo test (unit, integration, doc tests; real Redis and RabbitMQ), three test binaries at a time"
timeout 40m bash scripts/test-lanes.sh 3

step "TLS for real (a throwaway CA made with openssl, private TLS servers; the tls features)"
command -v openssl >/dev/null || { echo "openssl is needed for the TLS tests" >&2; exit 1; }
timeout 15m cargo test --workspace --locked --features ferriq-valkey/tls,ferriq-amqp/tls --test tls

step "fault harness, small size (worker processes, a private redis-server, proxies; see RELIABILITY.md)"
# Built by the test build above (the harness's own tests run it): a `cargo build -p` here
# would resolve features for the harness alone and rebuild tokio and everything above it.
test -x target/debug/fault-harness || { echo "the test build made no fault-harness" >&2; exit 1; }
timeout 25m target/debug/fault-harness --size small

step "quickstart"
out=$(cargo run --locked --quiet --example quickstart)
echo "$out"
# Its output is deterministic: both failing tasks are parked, every time.
echo "$out" | grep -q 'dead-lettered  -> 2 message(s)' || { echo "quickstart output changed" >&2; exit 1; }

step "all green"
