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

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy (all targets, warnings are errors)"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "cargo check: the backends' TLS features still build"
cargo check --locked --quiet -p ferriq-valkey -p ferriq-amqp --features ferriq-valkey/tls,ferriq-amqp/tls

step "cargo test (unit, integration, doc tests; real Redis and RabbitMQ)"
timeout 40m cargo test --workspace --locked

step "quickstart"
cargo run --locked --quiet --example quickstart

step "all green"
