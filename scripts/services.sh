# Sourced by scripts/test.sh and the benchmarks: make sure the services the tests use answer,
# starting them if they do not. Never stops, flushes or reconfigures a running service.

REDIS_PORT=${FERRIQ_TEST_REDIS_PORT:-6379}
AMQP_PORT=${FERRIQ_TEST_AMQP_PORT:-5672}
export FERRIQ_TEST_REDIS_URL=${FERRIQ_TEST_REDIS_URL:-redis://127.0.0.1:${REDIS_PORT}}
export FERRIQ_TEST_AMQP_URL=${FERRIQ_TEST_AMQP_URL:-amqp://guest:guest@127.0.0.1:${AMQP_PORT}/%2f}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_port() { # port seconds name
  local deadline=$((SECONDS + $2))
  until port_open "$1"; do
    if ((SECONDS >= deadline)); then echo "$3 did not open port $1 within $2 s" >&2; return 1; fi
    sleep 0.5
  done
}

ensure_redis() {
  if command -v redis-cli >/dev/null && redis-cli -h 127.0.0.1 -p "$REDIS_PORT" ping 2>/dev/null | grep -q PONG; then
    echo "redis: answering on $REDIS_PORT"
    return
  fi
  echo "redis: not answering on $REDIS_PORT, starting it"
  redis-server --daemonize yes --port "$REDIS_PORT" --save "" --appendonly no >/dev/null
  wait_port "$REDIS_PORT" 30 redis
  until redis-cli -h 127.0.0.1 -p "$REDIS_PORT" ping 2>/dev/null | grep -q PONG; do sleep 0.2; done
}

ensure_rabbitmq() {
  if port_open "$AMQP_PORT"; then
    echo "rabbitmq: answering on $AMQP_PORT"
    return
  fi
  echo "rabbitmq: not answering on $AMQP_PORT, starting it"
  rabbitmq-server -detached
  wait_port "$AMQP_PORT" 120 rabbitmq
  rabbitmqctl await_startup >/dev/null 2>&1 || true
}

# A real browser for the dashboard's tests: Debian's headless chromium.
ensure_chromium() {
  if command -v chromium >/dev/null; then
    echo "chromium: $(chromium --version 2>/dev/null | head -n1)"
  else
    echo "chromium: not installed, installing Debian's package"
    local sudo=""
    [ "$(id -u)" = 0 ] || sudo="sudo"
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null \
      || { $sudo apt-get update -q >/dev/null && $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null; }
  fi
  export FERRIQ_TEST_CHROMIUM="$(command -v chromium)"
}

# Python taskiq for the interop tests, in an ignored folder; reused when already there.
ensure_python_env() {
  local venv=.venv-interop
  export FERRIQ_TEST_PYTHON="$PWD/$venv/bin/python"
  if [ -x "$FERRIQ_TEST_PYTHON" ] && "$FERRIQ_TEST_PYTHON" -c 'import taskiq, taskiq_aio_pika, taskiq_redis, taskiq_aio_sqs, opentelemetry.sdk, taskiq.middlewares.opentelemetry_middleware' 2>/dev/null; then
    echo "python: $venv ready"
    return
  fi
  echo "python: creating $venv (taskiq, taskiq-aio-pika, taskiq-aio-sqs, taskiq-redis)"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r scripts/requirements-interop.txt
}

# The SQS emulators (fauxqs, moto), installed and started by scripts/sqs-emulator.sh under
# .tools/; their endpoints exported for the tests. Those this shell started are stopped by
# stop_sqs_emulators.
STARTED_EMULATORS=()
ensure_sqs_emulators() {
  local which out
  for which in fauxqs moto; do
    out=$(bash scripts/sqs-emulator.sh "$which" 2>&1) || { echo "$out" >&2; return 1; }
    echo "$out" | grep -v '^http' >&2 || true
    case "$out" in *started*) STARTED_EMULATORS+=("$which") ;; esac
    case "$which" in
      fauxqs) export FERRIQ_SQS_ENDPOINT=$(echo "$out" | tail -n1) ;;
      moto) export FERRIQ_MOTO_ENDPOINT=$(echo "$out" | tail -n1) ;;
    esac
  done
  echo "sqs: fauxqs at $FERRIQ_SQS_ENDPOINT, moto at $FERRIQ_MOTO_ENDPOINT"
}

stop_sqs_emulators() {
  if [ ${#STARTED_EMULATORS[@]} -gt 0 ]; then
    bash scripts/sqs-emulator.sh stop >/dev/null 2>&1 || true
  fi
}
