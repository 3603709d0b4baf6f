#!/usr/bin/env bash
# The service's own cost per byte, with no GPU: a coordinator and CPU workers on
# this machine, then service_bench (a) uploading a resident context of
# 65536 x 2 x 8 KiB rows (1.07 GB, --upload_only) and (b) one one-shot request
# whose compute is cheap next to its bytes (131072 query rows of 8 KiB, 2 keys,
# dense: 1.07 GB up, 1.07 GB of bf16 output down) and (c) one one-shot request
# whose bytes are nearly all upload (the K/V of (a) and 2 query rows). Each
# line: service_bench's table row, then the CPU seconds the client, the
# coordinator and the workers spent on it. On a small machine the CPU seconds
# are the steadier measure.
#
#   bench/service/local_transport_bench.sh [BIN_DIR] [WORKERS] [REPEATS]
#
# UPLOAD_STREAMS=N (default 1) sends the one-shot requests over N streams
# each (service_bench --upload_streams); their output comes back over one.
#
# BIN_DIR holds server/ringattn-coordinator, worker/ringattn-worker and
# bench/service/service_bench as bazel-bin lays them out (default bazel-bin).
set -euo pipefail
bin=${1:-bazel-bin}
workers=${2:-1}
repeats=${3:-3}
port=${PORT:-50261}
upload_streams=${UPLOAD_STREAMS:-1}
logs=$(mktemp -d)
pids=()
cleanup() {
  kill "${pids[@]}" 2>/dev/null || true
  wait "${pids[@]}" 2>/dev/null || true
}
trap cleanup EXIT
"$bin/server/ringattn-coordinator" --world_size="$workers" --host=127.0.0.1 \
  --port="$port" --http_port=0 --max_request_bytes=$((1 << 40)) \
  --max_inflight_bytes=$((1 << 40)) >"$logs/coordinator.log" 2>&1 &
pids+=($!)
for ((i = 0; i < workers; i++)); do
  "$bin/worker/ringattn-worker" --coordinator="127.0.0.1:$port" --device=cpu \
    >"$logs/worker$i.log" 2>&1 &
  pids+=($!)
done
bench=$bin/bench/service/service_bench

# CPU seconds (user + system) of the processes given, in clock ticks.
ticks() {
  local total=0 fields pid
  for pid in "$@"; do
    read -r -a fields <"/proc/$pid/stat"
    total=$((total + fields[13] + fields[14]))
  done
  echo "$total"
}

measure() {
  local name=$1 coordinator workers_before row client
  shift
  coordinator=$(ticks "${pids[0]}")
  workers_before=$(ticks "${pids[@]:1}")
  # The subshell's `times` ends with its children's CPU: service_bench's.
  row=$( ("$bench" --target="127.0.0.1:$port" "$@" 2>>"$logs/$name.err" |
    tail -1 && times >"$logs/client.$name"))
  client=$(awk 'END { split($1 " " $2, t, /[ms ]+/)
    printf "%.2f", t[1] * 60 + t[2] + t[3] * 60 + t[4] }' "$logs/client.$name")
  awk -v name="$name" -v row="$row" -v client="$client" \
    -v coordinator=$(($(ticks "${pids[0]}") - coordinator)) \
    -v workers=$(($(ticks "${pids[@]:1}") - workers_before)) \
    -v hz="$(getconf CLK_TCK)" 'BEGIN {
      printf "%s %s CPU s: client %s, coordinator %.2f, workers %.2f\n",
             name, row, client, coordinator / hz, workers / hz }'
}

"$bench" --target="127.0.0.1:$port" --wait_ready_seconds=60 --lengths=64 \
  --upload_only >/dev/null
for ((r = 0; r < repeats; r++)); do
  measure context --lengths=65536 --kv_heads=32 --upload_only --upload_streams=1
  measure "one-shot($upload_streams)" --lengths=2 --q_len=131072 \
    --causal=false --check_rows=2 --threads=1 --upload_streams="$upload_streams" \
    --download_streams=1
  measure "one-shot-up($upload_streams)" --lengths=65536 --q_len=2 \
    --kv_heads=32 --causal=false --check_rows=1 --threads=1 \
    --upload_streams="$upload_streams" --download_streams=1
done
