#!/usr/bin/env bash
# The GPU ring: the worker's GPU tests, ring_bench and its PyTorch peer
# (context parallel), on a GPU machine, from a bundle of binaries built here.
#
#   bench/ring/run_ring_bench.sh bundle [DIR]   on the build machine: builds the
#       binaries and copies them, their non-system libraries and these scripts
#       into DIR (default bin/gpu-ring, git-ignored); ONLY="worker/x_test ..."
#       bundles just those of BINARIES (a quicker build, a smaller bundle), and
#       ONLY=gpu-tests every test tagged gpu (with STAGES=tests, a run checks a
#       GPU machine end to end) but gpu_load_run_test, which needs the service's
#       binaries as runfiles
#   bench/ring/run_ring_bench.sh run [DIR]      on the GPU machine: runs them all
#       from DIR (default: this script's own folder if it is a bundle, else
#       bin/gpu-ring); logs go to $OUT (default ./ring-run)
#
# Environment for run: LENGTHS, the lengths for both masks (default
# "65536 262144"); LONG, lengths run causal only, once each, after the others
# in the same processes (default 1048576; empty to skip); MASKS, ring_bench's
# masks (default "dense,causal"; "sparse" adds causal block-sparse, "dilated"
# causal LongNet branches); RING_FLAGS, more ring_bench flags (e.g.
# --iterations=1); GPUS, how many GPUs
# the multi-GPU runs use (default: all, at most 2; on a one-GPU machine the
# bench stage runs the two-GPU ring's ranks alone, one after the other on that
# GPU, ring_bench --ranks_alone); PYTHON, the interpreter
# with PyTorch (default /opt/torch/.venv/bin/python); STAGES, which of
# "tests bench peer service" to run (default the first three; each fits a
# 10-minute call on its own). The service stage starts a coordinator and one
# GPU worker per GPU and sends service_bench's requests through them, causal,
# at SERVICE_LENGTHS (default "262144 1048576 4194304"), with SERVICE_FLAGS
# added to its command line (default "--upload_streams=4 --download_streams=4",
# the fastest measured; e.g. --q_len=16), once for each GPU count in
# SERVICE_GPUS (default: GPUS). BASELINE, a folder holding an earlier build's
# ring_bench (its libraries beside it in BASELINE/lib or in this bundle's):
# the bench stage then runs ROUNDS (default 2) rounds of ours and the baseline
# alternating, with the same flags (the baseline without --skip_transfers),
# its rows named "ringattn baseline", and prints both TFLOP/s per case. Prints
# the test summary, the tables and "N passed, N failed, N skipped" (gtest
# cases) last; exits non-zero if anything failed.
set -uo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
BINARIES=(
  bench/ring/ring_bench
  bench/service/service_bench
  server/ringattn-coordinator
  worker/ringattn-worker
  kernels/cuda/partial_merge_test
  worker/gpu_device_test
  worker/gpu_device_context_store_test
  worker/gpu_dilated_tasks_test
  worker/gpu_dilated_test
  worker/gpu_nccl_communicator_test
  worker/gpu_partial_reduction_test
  worker/gpu_ring_executor_test
  worker/gpu_ring_tiles_test
  worker/gpu_worker_service_test
)
if [ -n "${ONLY:-}" ]; then read -ra BINARIES <<<"$ONLY"; fi

bundle() {
  local dest=${1:-bin/gpu-ring}
  cd "$HERE/../.." || exit 1
  if [ "${ONLY:-}" = gpu-tests ]; then
    mapfile -t BINARIES < <(bazel query --noshow_progress \
      'attr(tags, gpu, tests(//...)) except //bench/load:gpu_load_run_test' |
      sed 's|^//||; s|:|/|')
  fi
  local targets=()
  for b in "${BINARIES[@]}"; do targets+=("//${b%/*}:${b##*/}"); done
  bazel build --noshow_progress --ui_event_filters=-info "${targets[@]}" || exit 1
  rm -rf "$dest"
  mkdir -p "$dest/lib"
  for b in "${BINARIES[@]}"; do
    install -m 755 "bazel-bin/$b" "$dest/"
    strip "$dest/${b##*/}"
  done
  cp "$HERE/run_ring_bench.sh" "$HERE/peer_context_parallel.py" "$dest/"
  # The shared libraries the GPU machine lacks: everything but the C and C++
  # runtimes (it has newer ones) and what it brings itself (the CUDA driver,
  # NCCL; cuDNN and NVRTC come from PyTorch's wheels there).
  local lib
  for b in "${BINARIES[@]}"; do ldd "bazel-bin/$b"; done |
    awk '$2 == "=>" && $3 ~ /^\// { print $3 }' | sort -u |
    grep -Ev '/(libc|libm|libgcc_s|libstdc\+\+|libpthread|librt|libdl|ld-linux[^/]*|libcuda|libnccl|libcudnn[^/]*|libnvrtc[^/]*)\.so' |
    while read -r lib; do cp -L "$lib" "$dest/lib/"; done
  du -sh "$dest"
  echo "bundle in $dest; on the GPU machine: $dest/run_ring_bench.sh run $dest"
}

# The folder of the first file named $1 under PyTorch's nvidia/ wheels.
torch_lib_dir() {
  local site found
  site=$("$PYTHON" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))' 2>/dev/null) || return
  found=$(find "$site/nvidia" -name "$1" -print -quit 2>/dev/null)
  [ -n "$found" ] && dirname "$found"
}

run() {
  local bin_dir=${1:-}
  if [ -z "$bin_dir" ]; then
    if [ -x "$HERE/ring_bench" ]; then bin_dir=$HERE; else bin_dir=bin/gpu-ring; fi
  fi
  bin_dir=$(cd "$bin_dir" && pwd) || exit 2
  OUT=${OUT:-$PWD/ring-run}
  PYTHON=${PYTHON:-/opt/torch/.venv/bin/python}
  local lengths=${LENGTHS:-65536 262144}
  local long=${LONG-1048576}
  mkdir -p "$OUT"

  # Never let NCCL, PyTorch or NVSHMEM use NVLink multicast on these machines.
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  local cudnn_dir nvrtc_dir
  cudnn_dir=$(torch_lib_dir 'libcudnn.so.9')
  nvrtc_dir=$(torch_lib_dir 'libnvrtc.so.13')
  # Only our binaries see the bundled libraries: PyTorch keeps the machine's.
  local ours_path="$bin_dir/lib:${cudnn_dir:-}:${nvrtc_dir:-}:${LD_LIBRARY_PATH:-}:/usr/local/cuda/lib64"
  local gpus
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
  gpus=${GPUS:-$((gpus > 2 ? 2 : gpus))}
  {
    echo "cuDNN from: ${cudnn_dir:-not found among the PyTorch wheels}"
    echo "NVRTC from: ${nvrtc_dir:-not found among the PyTorch wheels}"
    echo "LD_LIBRARY_PATH of ringattn's binaries: $ours_path"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    nvidia-smi topo -m
  } >"$OUT/environment.txt" 2>&1

  local stages=" ${STAGES:-tests bench peer} "
  local passed=0 failed=0 skipped=0 status=0 summary="" test name rc p s f
  for test in "$bin_dir"/*_test; do
    [[ $stages == *" tests "* ]] || break
    [ -x "$test" ] || continue
    name=$(basename "$test")
    LD_LIBRARY_PATH=$ours_path timeout 900 "$test" --gtest_output="xml:$OUT/$name.xml" >"$OUT/$name.log" 2>&1
    rc=$?
    p=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$OUT/$name.log" | tail -1)
    s=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) test.*/\1/p' "$OUT/$name.log" | tail -1)
    f=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' "$OUT/$name.log" | tail -1)
    p=${p:-0} s=${s:-0} f=${f:-0}
    if [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi  # crashed or timed out
    [ $rc -ne 0 ] && status=1
    passed=$((passed + p)) skipped=$((skipped + s)) failed=$((failed + f))
    summary+=$(printf '%-30s exit %d: %d passed, %d failed, %d skipped' "$name" $rc "$p" "$f" "$s")$'\n'
  done

  local gpu_list=1,2 alone=--ranks_alone
  [ "$gpus" -ge 2 ] && gpu_list=1,$gpus alone=
  local failed_logs=()
  if [[ $stages == *" bench "* ]]; then
    # shellcheck disable=SC2086,SC2206  # the lengths and RING_FLAGS are meant to split
    local ring_flags=(--gpus="$gpu_list" --lengths="$(echo $lengths | tr ' ' ',')"
      --masks="${MASKS:-dense,causal}" --long_lengths="$(echo $long | tr ' ' ',')"
      ${RING_FLAGS:-})
    # $alone is for our build only: a baseline's may predate the flag.
    # shellcheck disable=SC2086
    LD_LIBRARY_PATH=$ours_path timeout 1800 "$bin_dir/ring_bench" --skip_transfers $alone \
      "${ring_flags[@]}" >"$OUT/ring_bench.md" 2>"$OUT/ring_bench.err" ||
      failed_logs+=("$OUT/ring_bench.err")
    if [ -n "${BASELINE:-}" ]; then
      local round base_dir
      base_dir=$(cd "$BASELINE" && pwd) || exit 2
      for ((round = 1; round <= ${ROUNDS:-2}; round++)); do
        if [ "$round" -gt 1 ]; then
          # shellcheck disable=SC2086
          LD_LIBRARY_PATH=$ours_path timeout 1800 "$bin_dir/ring_bench" $alone "${ring_flags[@]}" \
            >"$OUT/ring_bench_round$round.md" 2>"$OUT/ring_bench_round$round.err" ||
            failed_logs+=("$OUT/ring_bench_round$round.err")
        fi
        LD_LIBRARY_PATH=$base_dir/lib:$ours_path timeout 1800 "$base_dir/ring_bench" \
          "${ring_flags[@]}" 2>"$OUT/ring_bench_baseline_round$round.err" |
          sed 's/^| ringattn |/| ringattn baseline |/' \
            >"$OUT/ring_bench_baseline_round$round.md" ||
          failed_logs+=("$OUT/ring_bench_baseline_round$round.err")
      done
    fi
  fi

  local world worlds=""
  local torchrun=("$PYTHON" -m torch.distributed.run --standalone)
  if [[ $stages == *" peer "* ]]; then
    worlds="$([ "$gpus" -ge 2 ] && echo "$gpus") 1"
  fi
  for world in $worlds; do
    # shellcheck disable=SC2086
    PYTHONUNBUFFERED=1 timeout 1800 "${torchrun[@]}" --nproc_per_node=$world \
      "$bin_dir/peer_context_parallel.py" --header --lengths $lengths \
      --long-lengths $long >"$OUT/peer_cp_$world.md" 2>"$OUT/peer_cp_$world.err" ||
      failed_logs+=("$OUT/peer_cp_$world.err")
  done

  local service_gpus
  if [[ $stages == *" service "* ]]; then
    for service_gpus in ${SERVICE_GPUS:-$gpus}; do
      run_service "$bin_dir" "$service_gpus" "$ours_path" ||
        failed_logs+=("$OUT/service_bench_${service_gpus}gpu.err")
    done
  fi

  echo "logs in $OUT"
  printf '%s' "$summary"
  [ -f "$OUT/ring_bench.md" ] && cat "$OUT/ring_bench.md"
  for f in "$OUT"/service_bench_*gpu.md; do
    [ -f "$f" ] && { echo "${f##*/service_bench_} (service_bench through one worker per GPU):"; cat "$f"; }
  done
  echo
  # Per-GPU throughput of the ring against one GPU, and what the transfers
  # cost against the same run with local copies in their place.
  awk -F'|' '
    $2 ~ /ringattn/ && $7 + 0 > 0 {
      gsub(/ /, "", $3); gsub(/ /, "", $4); gsub(/ /, "", $5)
      key = $4 " N=" $5
      if ($2 ~ /local copies/) bare[key "/" $3] = $6
      else {
        ms[key "/" $3] = $6; tf[key "/" $3] = $7
        if ($3 > 1) { multi[key] = $3; if ($2 ~ /ranks alone/) alone[key] = 1 }
      }
    }
    END {
      for (key in multi) {
        g = multi[key]
        line = sprintf("%s on %d GPUs%s:", key, g, key in alone ? " (ranks alone on one)" : "")
        if ((key "/1") in tf)
          line = line sprintf(" %.0f%% of one GPU'"'"'s TFLOP/s per GPU;", 100 * tf[key "/" g] / tf[key "/1"])
        if ((key "/" g) in bare)
          line = line sprintf(" transfers add %.1f%% to the time", 100 * (ms[key "/" g] / bare[key "/" g] - 1))
        print line
      }
    }' "$OUT/ring_bench.md" 2>/dev/null | sort
  if [ -n "${BASELINE:-}" ]; then
    echo "TFLOP/s per GPU, ours then the baseline, round by round (GPUs, mask, N):"
    cat "$OUT"/ring_bench.md "$OUT"/ring_bench_round*.md "$OUT"/ring_bench_baseline_round*.md 2>/dev/null |
      awk -F'|' '$2 ~ /^ ringattn (baseline )?$/ && $7 + 0 > 0 {
        gsub(/^ +| +$/, "", $2); gsub(/ /, "", $3); gsub(/ /, "", $4); gsub(/ /, "", $5)
        key = $3 " " $4 " " $5; if (!(key in seen)) { seen[key] = 1; order[++n] = key }
        rate[key, $2] = rate[key, $2] " " ($7 + 0)
      }
      END { for (i = 1; i <= n; i++)
        printf "  %s:%s | baseline%s\n", order[i], rate[order[i], "ringattn"], rate[order[i], "ringattn baseline"] }'
  fi
  for f in "$OUT"/peer_cp_*.md; do [ -f "$f" ] && cat "$f"; done
  grep -hs 'cuDNN not used' "$OUT/ring_bench.err"
  for f in "${failed_logs[@]}"; do
    status=1
    echo "--- $(basename "$f") (failed; last lines):"
    tail -n 8 "$f"
  done
  echo
  echo "$passed passed, $failed failed, $skipped skipped"
  return $status
}

# A coordinator and $2 GPU workers on this machine, service_bench through
# them, and everything stopped again. Logs in $OUT/service_*, the table in
# $OUT/service_bench_$2gpu.md.
run_service() {
  local bin_dir=$1 gpus=$2 ours_path=$3 port=50151 pids=() i rc
  LD_LIBRARY_PATH=$ours_path "$bin_dir/ringattn-coordinator" --world_size="$gpus" \
    --host=127.0.0.1 --port=$port --http_port=0 --ring_timeout_seconds=900 \
    --max_request_bytes=$((1 << 40)) --max_inflight_bytes=$((1 << 40)) \
    >"$OUT/service_coordinator_${gpus}gpu.log" 2>&1 &
  pids+=($!)
  for ((i = 0; i < gpus; i++)); do
    LD_LIBRARY_PATH=$ours_path "$bin_dir/ringattn-worker" --coordinator=127.0.0.1:$port \
      --device="cuda:$i" --ring_timeout_seconds=900 >"$OUT/service_worker_${gpus}gpu_$i.log" 2>&1 &
    pids+=($!)
  done
  local lengths=${SERVICE_LENGTHS:-262144 1048576 4194304}
  local flags="--upload_streams=4 --download_streams=4"
  [ -n "${SERVICE_FLAGS+set}" ] && flags=$SERVICE_FLAGS
  # shellcheck disable=SC2086
  LD_LIBRARY_PATH=$ours_path timeout 1500 "$bin_dir/service_bench" \
    --target=127.0.0.1:$port --wait_ready_seconds=120 \
    --lengths="$(echo $lengths | tr ' ' ',')" $flags \
    >"$OUT/service_bench_${gpus}gpu.md" 2>"$OUT/service_bench_${gpus}gpu.err"
  rc=$?
  kill "${pids[@]}" 2>/dev/null
  wait "${pids[@]}" 2>/dev/null
  return $rc
}

case "${1:-}" in
  bundle) shift; bundle "$@" ;;
  run) shift; run "$@"; exit $? ;;
  *)
    sed -n '2,/^set /p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
