#!/usr/bin/env bash
# Starts a coordinator and checks the Grafana dashboard against its /metrics
# page (check_dashboard.py): every family queried is exported and every family
# exported is shown.
set -euo pipefail
here=deploy/grafana
log=$(mktemp)
server/ringattn-coordinator --world_size=1 --port=0 --http_port=0 >"$log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -f "$log"' EXIT
port=""
for _ in $(seq 100); do  # up to 10 s for the coordinator to start
  port=$(sed -n 's/.*HTTP \([0-9][0-9]*\).*/\1/p' "$log" | head -1)
  [ -n "$port" ] && break
  kill -0 $pid 2>/dev/null || { cat "$log"; exit 1; }
  sleep 0.1
done
[ -n "$port" ] || { echo "the coordinator did not report its HTTP port"; cat "$log"; exit 1; }
python3 "$here/check_dashboard.py" "$here/ringattn-dashboard.json" "http://127.0.0.1:$port/metrics"
