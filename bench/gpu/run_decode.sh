#!/usr/bin/env bash
# The few-row paths (decode kernel, split Hopper kernel) on a GPU machine:
# their tests, gpu_decode_bench and the PyTorch peer with the measured floor
# (peer_decode.py), from a bundle built here.
#
#   bench/gpu/run_decode.sh bundle [DIR]   on the build machine: builds the
#       binaries and copies them, their non-system libraries and these scripts
#       into DIR (default bin/gpu-decode, git-ignored)
#   bench/gpu/run_decode.sh run [DIR]      on the GPU machine: runs them all
#       from DIR (default: this script's own folder); logs go to $OUT (default
#       ./decode-run)
#
# Environment for run: KV_LENGTHS (default "1048576 4194304"), Q_LENGTHS
# (default "1 16 256 4096"), PYTHON (default /opt/torch/.venv/bin/python),
# STAGES, which of "tests bench peer" to run (default all). Prints one line
# per test binary, the tables, the summary table and "N passed, N failed,
# N skipped" (gtest cases) last; exits non-zero if anything failed.
set -uo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
BINARIES=(
  bench/gpu/gpu_decode_bench
  kernels/cuda/decode_attention_test
  kernels/cuda/attention_dispatch_test
  kernels/cuda/hopper_attention_test
)

bundle() {
  local dest=${1:-bin/gpu-decode}
  cd "$HERE/../.." || exit 1
  local targets=()
  for b in "${BINARIES[@]}"; do targets+=("//${b%/*}:${b##*/}"); done
  bazel build --noshow_progress --ui_event_filters=-info "${targets[@]}" || exit 1
  rm -rf "$dest"
  mkdir -p "$dest/lib"
  for b in "${BINARIES[@]}"; do
    install -m 755 "bazel-bin/$b" "$dest/"
    strip "$dest/${b##*/}"
  done
  cp "$HERE/run_decode.sh" "$HERE/peer_decode.py" "$dest/"
  # The shared libraries the GPU machine lacks (see run_ring_bench.sh).
  local lib
  for b in "${BINARIES[@]}"; do ldd "bazel-bin/$b"; done |
    awk '$2 == "=>" && $3 ~ /^\// { print $3 }' | sort -u |
    grep -Ev '/(libc|libm|libgcc_s|libstdc\+\+|libpthread|librt|libdl|ld-linux[^/]*|libcuda|libnccl|libcudnn[^/]*|libnvrtc[^/]*)\.so' |
    while read -r lib; do cp -L "$lib" "$dest/lib/"; done
  du -sh "$dest"
  echo "bundle in $dest; on the GPU machine: $dest/run_decode.sh run $dest"
}

# The folder of the first file named $1 under PyTorch's nvidia/ wheels.
torch_lib_dir() {
  local site found
  site=$("$PYTHON" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))' 2>/dev/null) || return
  found=$(find "$site/nvidia" -name "$1" -print -quit 2>/dev/null)
  [ -n "$found" ] && dirname "$found"
}

run() {
  local bin_dir=${1:-$HERE}
  bin_dir=$(cd "$bin_dir" && pwd) || exit 2
  OUT=${OUT:-$PWD/decode-run}
  PYTHON=${PYTHON:-/opt/torch/.venv/bin/python}
  local kv_lengths=${KV_LENGTHS:-1048576 4194304}
  local q_lengths=${Q_LENGTHS:-1 16 256 4096}
  local stages=${STAGES:-tests bench peer}
  mkdir -p "$OUT"
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  local cudnn_dir nvrtc_dir
  cudnn_dir=$(torch_lib_dir 'libcudnn.so.9')
  nvrtc_dir=$(torch_lib_dir 'libnvrtc.so.13')
  export LD_LIBRARY_PATH="$bin_dir:$bin_dir/lib:${cudnn_dir:-}:${nvrtc_dir:-}:${LD_LIBRARY_PATH:-}"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$OUT/environment.txt" 2>&1

  local passed=0 failed=0 skipped=0 status=0 summary="" name rc p s f
  if [[ " $stages " == *" tests "* ]]; then
    for name in decode_attention_test attention_dispatch_test hopper_attention_test; do
      "$bin_dir/$name" --gtest_output="xml:$OUT/$name.xml" >"$OUT/$name.log" 2>&1
      rc=$?
      p=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$OUT/$name.log" | tail -1)
      s=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) test.*/\1/p' "$OUT/$name.log" | tail -1)
      f=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' "$OUT/$name.log" | tail -1)
      p=${p:-0} s=${s:-0} f=${f:-0}
      if [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi
      [ $rc -ne 0 ] && status=1
      passed=$((passed + p)) skipped=$((skipped + s)) failed=$((failed + f))
      summary+=$(printf '%-26s exit %d: %d passed, %d failed, %d skipped' "$name" $rc "$p" "$f" "$s")$'\n'
      grep -E '^\[  FAILED  \]|Failure|seed' "$OUT/$name.log" | head -20
    done
  fi
  if [[ " $stages " == *" bench "* ]]; then
    # shellcheck disable=SC2086  # the lengths are meant to split
    "$bin_dir/gpu_decode_bench" --kv_lengths="$(echo $kv_lengths | tr ' ' ',')" \
      --q_lengths="$(echo $q_lengths | tr ' ' ',')" --paths=dispatch,decode,hopper,cudnn \
      --csv="$OUT/ours.csv" >"$OUT/decode_bench.md" 2>"$OUT/decode_bench.err" || status=1
  fi
  if [[ " $stages " == *" peer "* ]]; then
    local ours_flag=()
    [ -s "$OUT/ours.csv" ] && ours_flag=(--ours "$OUT/ours.csv")
    # shellcheck disable=SC2086
    PYTHONUNBUFFERED=1 "$PYTHON" "$bin_dir/peer_decode.py" --kv-lengths $kv_lengths \
      --q-lengths $q_lengths "${ours_flag[@]}" >"$OUT/peer_decode.md" 2>"$OUT/peer_decode.err" || status=1
  fi
  echo "logs in $OUT"
  printf '%s' "$summary"
  local file
  for file in decode_bench.md peer_decode.md; do [ -f "$OUT/$file" ] && cat "$OUT/$file"; done
  for file in decode_bench.err peer_decode.err; do
    if [ -s "$OUT/$file" ]; then echo "--- $file:"; tail -n 12 "$OUT/$file"; fi
  done
  echo
  echo "$passed passed, $failed failed, $skipped skipped"
  return $status
}

case "${1:-}" in
  bundle) shift; bundle "$@" ;;
  run) shift; run "$@"; exit $? ;;
  *) echo "usage: $0 bundle [DIR] | run [DIR]" >&2; exit 2 ;;
esac
