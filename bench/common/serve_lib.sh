# Shell helpers the serving benchmarks share (sourced by bench/serve/run.sh, bench/pd/run.sh).

# bench_free_port: a free TCP port on 127.0.0.1.
bench_free_port() {
  /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# bench_wait_healthy PID PORT LOG: waits for http://127.0.0.1:PORT/health (up to 15 min: a cold
# page cache reads the weights from disk); fails, showing the end of LOG, when PID exits first.
bench_wait_healthy() {
  local pid=$1 port=$2 log=$3 waited=0
  until curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1; do
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "run.sh: the server exited; the end of $log:" >&2
      tail -n 20 "$log" >&2
      return 1
    fi
    sleep 1
    waited=$((waited + 1))
    if [[ $waited -ge 900 ]]; then
      echo "run.sh: no /health after 900 s" >&2
      return 1
    fi
  done
}

# The server a benchmark started (its start_server sets server_pid); bench_stop_server ends it
# and waits for it (the scripts also run it on EXIT).
server_pid=""
bench_stop_server() {
  if [[ -n $server_pid ]]; then
    kill -TERM "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
    server_pid=""
  fi
}
