#!/usr/bin/env bash
# Several hosts, simulated: the coordinator and three CPU workers each in a network
# namespace of their own ("hosts" 10.201.0.1 and 10.201.0.11-13), cabled by veth pairs to a
# bridge in a fifth namespace (the "switch"), so that the Gloo ring and every gRPC call
# cross real interfaces and nothing touches the root namespace's addresses or firewall.
#
#   tests/netns/netns_test.sh RESULT.xml [BIN_DIR]
#
# Cases (written as JUnit XML to RESULT.xml; all skipped, with the reason, when not root or
# `ip netns` does not work here):
#   ring_across_hosts       a request through the CLI matches the reference
#   link_cut_unavailable    cutting one worker's cable during a long request fails it with
#                           UNAVAILABLE within a bound
#   heals_after_link_back   with the cable back the cluster is ready again and the next
#                           request matches the reference
# Namespaces, links and processes are its own (names start with a per-run prefix) and are
# removed on every exit path. Exits 0 when every case passed or all were skipped.
set -uo pipefail

XML=${1:?usage: netns_test.sh RESULT.xml [BIN_DIR]}
mkdir -p "$(dirname "$XML")"
BIN=$(cd "${2:-bin}" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
NPY_CHECK="$HERE/../../deploy/npy_check.py"
PREFIX="ranet$$"
SWITCH="${PREFIX}sw"
COORD="${PREFIX}c"
WORKERS=("${PREFIX}w0" "${PREFIX}w1" "${PREFIX}w2")
PORT=50051
HTTP_PORT=8080
# Long enough that the cut lands while the request is running; how long the cut request
# may take to fail (the coordinator's ring timeout is 10 s, heartbeats 3 s).
CUT_BOUND_S=30

WORK=$(mktemp -d)
PIDS=()
CASES=()  # "name|status|seconds|message"

log() { printf '[netns] %s\n' "$*" >&2; }

cleanup() {
  local pid ns
  for pid in "${PIDS[@]}"; do kill -KILL "$pid" 2>/dev/null; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null; done
  for ns in "$COORD" "${WORKERS[@]}" "$SWITCH"; do
    ip netns delete "$ns" 2>/dev/null
  done
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

xml_escape() {
  local s=$1
  s=${s//&/&amp;}; s=${s//</&lt;}; s=${s//>/&gt;}; s=${s//\"/&quot;}
  printf '%s' "$s"
}

write_xml() {
  local failures=0 skipped=0 entry name status seconds message
  for entry in "${CASES[@]}"; do
    IFS='|' read -r name status seconds message <<<"$entry"
    [ "$status" = failed ] && failures=$((failures + 1))
    [ "$status" = skipped ] && skipped=$((skipped + 1))
  done
  {
    printf '<?xml version="1.0" encoding="UTF-8"?>\n<testsuites>\n'
    printf '<testsuite name="netns" tests="%d" failures="%d" skipped="%d">\n' \
      "${#CASES[@]}" "$failures" "$skipped"
    for entry in "${CASES[@]}"; do
      IFS='|' read -r name status seconds message <<<"$entry"
      printf '  <testcase classname="netns" name="%s" time="%s">' "$name" "$seconds"
      case $status in
        failed) printf '<failure message="%s"/>' "$(xml_escape "$message")" ;;
        skipped) printf '<skipped message="%s"/>' "$(xml_escape "$message")" ;;
      esac
      printf '</testcase>\n'
    done
    printf '</testsuite>\n</testsuites>\n'
  } >"$XML"
}

record() {  # name passed|failed|skipped seconds [message]
  CASES+=("$1|$2|$3|${4:-}")
  log "$1: $2${4:+ ($4)}"
}

skip_all() {
  local name
  for name in ring_across_hosts link_cut_unavailable heals_after_link_back; do
    record "$name" skipped 0 "$1"
  done
  write_xml
  exit 0
}

[ "$(id -u)" -eq 0 ] || skip_all "needs root to make network namespaces"
command -v ip >/dev/null || skip_all "ip (iproute2) is not installed"
ip netns add "$SWITCH" 2>"$WORK/err" ||
  skip_all "ip netns does not work here: $(head -c 200 "$WORK/err")"

# One "host" per namespace, each with a cable (veth pair) into the switch's bridge.
setup_network() {
  local ns i=0 addresses=(10.201.0.1/24 10.201.0.11/24 10.201.0.12/24 10.201.0.13/24)
  ip -n "$SWITCH" link add br0 type bridge || return 1
  ip -n "$SWITCH" link set br0 up || return 1
  for ns in "$COORD" "${WORKERS[@]}"; do
    ip netns add "$ns" || return 1
    ip -n "$SWITCH" link add "port$i" type veth peer name eth0 netns "$ns" || return 1
    ip -n "$SWITCH" link set "port$i" master br0 up || return 1
    ip -n "$ns" addr add "${addresses[$i]}" dev eth0 || return 1
    ip -n "$ns" link set eth0 up || return 1
    ip -n "$ns" link set lo up || return 1
    i=$((i + 1))
  done
}
setup_network || skip_all "cannot make veth pairs and a bridge in namespaces"

# Starts `ringattn-worker` in namespace WORKERS[$1].
start_worker() {
  ip netns exec "${WORKERS[$1]}" "$BIN/ringattn-worker" --coordinator "10.201.0.1:$PORT" \
    --host "10.201.0.1$(($1 + 1))" --device cpu >>"$WORK/worker$1.log" 2>&1 &
  PIDS+=($!)
}

# Waits up to $1 seconds for the coordinator to say ready.
wait_ready() {
  local until=$((SECONDS + $1))
  while [ $SECONDS -lt "$until" ]; do
    ip netns exec "$COORD" "$BIN/ringattn" info --target "127.0.0.1:$PORT" --timeout 2 \
      2>/dev/null | grep -q ', ready,' && return 0
    sleep 0.2  # polling the cluster's state
  done
  return 1
}

# Sends the request in directory $1 through the CLI and checks it against the reference.
attend_and_check() {
  ip netns exec "$COORD" timeout 120 "$BIN/ringattn" attend --target "127.0.0.1:$PORT" \
    --q "$1/q.npy" --k "$1/k.npy" --v "$1/v.npy" --out "$1/o.npy" --causal --timeout 60 \
    >"$1/attend.log" 2>&1 &&
    python3 "$NPY_CHECK" check "$1" "$1/o.npy" --causal >"$1/check.log" 2>&1
}

ip netns exec "$COORD" "$BIN/ringattn-coordinator" --host 0.0.0.0 --port "$PORT" \
  --http_port "$HTTP_PORT" --world_size 3 --ring_timeout_seconds 10 >"$WORK/coordinator.log" 2>&1 &
PIDS+=($!)
for i in 0 1 2; do start_worker "$i"; done

# 1. A real request across the three hosts.
mkdir -p "$WORK/small"
python3 "$NPY_CHECK" gen "$WORK/small" 333 4 64 7
start=$SECONDS
if ! wait_ready 60; then
  record ring_across_hosts failed $((SECONDS - start)) "cluster not ready in 60 s"
elif attend_and_check "$WORK/small"; then
  record ring_across_hosts passed $((SECONDS - start))
else
  record ring_across_hosts failed $((SECONDS - start)) \
    "$(tail -n 3 "$WORK/small/attend.log" "$WORK/small/check.log" 2>/dev/null | tr '\n' ' ')"
fi

# 2. A long request (dense, 65536 tokens: seconds of compute on the ring), and worker 1's
# cable cut once the coordinator has admitted it.
mkdir -p "$WORK/long"
python3 - "$WORK/long" <<'PY'
import array, os, random, struct, sys
n, h, d = 65536, 1, 64
header = "{'descr': '<f4', 'fortran_order': False, 'shape': (%d, %d, %d), }" % (n, h, d)
header += " " * (64 - (10 + len(header) + 1) % 64) + "\n"
rng = random.Random(3)
block = array.array("f", [rng.uniform(-1, 1) for _ in range(4093)]).tobytes()
body = (block * (4 * n * h * d // len(block) + 1))[:4 * n * h * d]
for name in "qkv":
    with open(os.path.join(sys.argv[1], name + ".npy"), "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + body)
PY
# Whether the coordinator holds admitted request bytes now (its /metrics).
admitted_now() {
  ip netns exec "$COORD" python3 -c "
import sys, urllib.request
text = urllib.request.urlopen('http://127.0.0.1:$HTTP_PORT/metrics', timeout=2).read().decode()
sys.exit(0 if sum(float(l.split()[-1]) for l in text.splitlines()
                  if l.startswith('ringattn_inflight_bytes')) > 0 else 1)
" 2>/dev/null
}
start=$SECONDS
ip netns exec "$COORD" timeout 120 "$BIN/ringattn" attend --target "127.0.0.1:$PORT" \
  --q "$WORK/long/q.npy" --k "$WORK/long/k.npy" --v "$WORK/long/v.npy" \
  --out "$WORK/long/o.npy" --timeout 100 >"$WORK/long/attend.log" 2>&1 &
attend_pid=$!
PIDS+=("$attend_pid")
admitted=0
until=$((SECONDS + 30))
while [ $SECONDS -lt $until ] && kill -0 "$attend_pid" 2>/dev/null; do
  if admitted_now; then
    admitted=1
    break
  fi
  sleep 0.1  # polling the coordinator's metrics
done
cut_at=$SECONDS
ip -n "$SWITCH" link set port2 down  # port2: worker 1's cable
wait "$attend_pid"
attend_status=$?
took=$((SECONDS - cut_at))
message=$(tail -n 2 "$WORK/long/attend.log" | tr '\n' ' ')
if [ $admitted -eq 0 ]; then
  record link_cut_unavailable failed $((SECONDS - start)) "the request was never admitted: $message"
elif [ $attend_status -eq 0 ]; then
  record link_cut_unavailable failed $((SECONDS - start)) "the request succeeded despite the cut"
elif ! grep -q 'UNAVAILABLE' "$WORK/long/attend.log"; then
  record link_cut_unavailable failed $((SECONDS - start)) "not UNAVAILABLE: $message"
elif [ $took -gt $CUT_BOUND_S ]; then
  record link_cut_unavailable failed $((SECONDS - start)) "failed only after ${took} s: $message"
else
  record link_cut_unavailable passed $((SECONDS - start))
  log "the cut request failed ${took} s after the cut: $message"
fi

# 3. The cable back: the cluster is ready again and serves the next request.
ip -n "$SWITCH" link set port2 up
mkdir -p "$WORK/again"
python3 "$NPY_CHECK" gen "$WORK/again" 211 4 64 8
start=$SECONDS
if ! wait_ready 60; then
  record heals_after_link_back failed $((SECONDS - start)) "cluster not ready 60 s after the cable came back"
elif attend_and_check "$WORK/again"; then
  record heals_after_link_back passed $((SECONDS - start))
else
  record heals_after_link_back failed $((SECONDS - start)) \
    "$(tail -n 3 "$WORK/again/attend.log" "$WORK/again/check.log" 2>/dev/null | tr '\n' ' ')"
fi

write_xml
if grep -q '<failure' "$XML"; then
  for f in "$WORK"/*.log; do
    log "--- $(basename "$f") (last lines)"
    tail -n 15 "$f" >&2
  done
  exit 1
fi
exit 0
