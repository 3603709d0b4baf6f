#!/usr/bin/env bash
# Two builds of the GPU worker, alternating, on the same queries of a resident
# context: for each round and each build a coordinator and one worker per GPU
# start, service_bench uploads the context and times its queries, and both
# stop. The coordinator and service_bench are the first build's; only the
# worker (and FLAGS_A / FLAGS_B, service_bench flags of each side) changes, so
# a worker change (or a client option: DIR_B = DIR_A) is measured with all
# else equal. With WHOLE_SIDES=1 each side runs its own coordinator and
# service_bench too (a client or coordinator change).
#
#   bench/service/query_ab.sh OUT_DIR DIR_A DIR_B
#
# DIR_A and DIR_B each hold ringattn-worker (DIR_A also ringattn-coordinator
# and service_bench) with the libraries they need in DIR/lib or on
# LD_LIBRARY_PATH. Environment: ROUNDS (default 2), GPUS (default 1), LENGTH
# (context tokens, default 4194304), QUERY_ROWS (default
# "16,64,256,1024,4096"), REPEATS (each query's, default 10), BENCH_FLAGS
# (more service_bench flags, default "--kv_heads=8 --check_rows=1
# --decode_steps=20": the client's automatic streams, 4 each way from 8 MiB;
# forcing 4 costs a small query 0.5-1 ms to attach them). Writes
# OUT_DIR/ROUND_NAME.md
# (service_bench's tables) and the processes' logs; prints each run's rows.
set -uo pipefail

out=${1:?usage: query_ab.sh OUT_DIR DIR_A DIR_B}
dirs=("${2:?DIR_A}" "${3:?DIR_B}")
rounds=${ROUNDS:-2}
gpus=${GPUS:-1}
length=${LENGTH:-4194304}
query_rows=${QUERY_ROWS:-16,64,256,1024,4096}
repeats=${REPEATS:-10}
flags=${BENCH_FLAGS:---kv_heads=8 --check_rows=1 --decode_steps=20}
port=50171
mkdir -p "$out"

run_one() {
  local name=$1 dir=$2 side_flags=$3 pids=() i rc
  local lib="$dir/lib:${LD_LIBRARY_PATH:-}" front=${dirs[0]}
  [ "${WHOLE_SIDES:-0}" = 1 ] && front=$dir
  local first="$front/lib:${LD_LIBRARY_PATH:-}"
  LD_LIBRARY_PATH=$first \
    "$front/ringattn-coordinator" --world_size="$gpus" --host=127.0.0.1 \
    --port=$port --http_port=0 --max_request_bytes=$((1 << 40)) \
    --max_inflight_bytes=$((1 << 40)) >"$out/$name.coordinator.log" 2>&1 &
  pids+=($!)
  for ((i = 0; i < gpus; i++)); do
    LD_LIBRARY_PATH=$lib "$dir/ringattn-worker" --coordinator=127.0.0.1:$port \
      --device="cuda:$i" >"$out/$name.worker$i.log" 2>&1 &
    pids+=($!)
  done
  # shellcheck disable=SC2086
  LD_LIBRARY_PATH=$first timeout 540 \
    "$front/service_bench" --target=127.0.0.1:$port \
    --wait_ready_seconds=120 --lengths="$length" --query_rows="$query_rows" \
    --query_repeats="$repeats" $flags $side_flags >"$out/$name.md" \
    2>"$out/$name.err"
  rc=$?
  kill "${pids[@]}" 2>/dev/null
  wait "${pids[@]}" 2>/dev/null
  echo "## $name (exit $rc)"
  grep -E '^\| [0-9]+ \|' "$out/$name.md"
  return $rc
}

status=0
for ((r = 1; r <= rounds; r++)); do
  for which in 0 1; do
    side=a side_flags=${FLAGS_A:-}
    [ $which = 1 ] && side=b side_flags=${FLAGS_B:-}
    run_one "r${r}_$side" "${dirs[$which]}" "$side_flags" || status=1
  done
done
exit $status
