#!/usr/bin/env bash
# Runs ringattn's GPU tests and the GPU attention benchmark beside its PyTorch
# peer, on a GPU machine, from a folder of binaries built elsewhere.
#
#   bench/gpu/run_gpu.sh BIN_DIR
#   bench/gpu/run_gpu.sh bundle [DIR]   on the build machine: builds the GPU
#       tests of //kernels/cuda and both benchmarks and copies them, their
#       non-system libraries and these scripts into DIR (default bin/gpu-kernel)
#
# BIN_DIR holds the GPU test binaries (named below, from //kernels/cuda),
# gpu_attention_bench, gpu_fold_bench and gpu_sparse_bench; the shared
# libraries they need but the machine lacks sit in BIN_DIR or BIN_DIR/lib.
# cuDNN 9.19 and NVRTC come from PyTorch's wheels (the system cuDNN is older).
# Environment: OUT, the folder for logs (default ./gpu-run); PYTHON, the
# interpreter that has PyTorch (default /opt/torch/.venv/bin/python);
# BENCH_LENGTHS, the sequence lengths (default "4096 16384 65536"); HEAD_DIMS,
# the head dimensions benchmarked (default "128 64"); GPU_TESTS,
# the test binaries to run (default: the GPU tests of //kernels/cuda); PEER=0 skips
# the PyTorch peer; SPARSE_LENGTHS, the lengths of the block-sparse benchmark
# (default "65536 262144"; empty to skip it), SPARSE_FLAGS more of its flags;
# FOLD=0 skips gpu_fold_bench (a ring tile folded by the kernel against a merge
# kernel after it).
# Prints one line per test binary, the tables (the block-sparse one last), and
# "N passed, N failed, N skipped" (gtest cases) last; exits non-zero if
# anything failed.
set -uo pipefail

GPU_TEST_TARGETS="hopper_attention_test flash_attention_test cudnn_attention_test attention_dispatch_test convert_test merge_with_lse_test partial_merge_test decode_attention_test"
if [ "${1:-}" = bundle ]; then
  dest=${2:-bin/gpu-kernel}
  cd "$(dirname "$0")/../.." || exit 1
  targets=(//bench/gpu:gpu_attention_bench //bench/gpu:gpu_fold_bench
    //bench/gpu:gpu_sparse_bench)
  binaries=(bench/gpu/gpu_attention_bench bench/gpu/gpu_fold_bench
    bench/gpu/gpu_sparse_bench)
  for t in $GPU_TEST_TARGETS; do
    targets+=("//kernels/cuda:$t")
    binaries+=("kernels/cuda/$t")
  done
  bazel build --noshow_progress --ui_event_filters=-info "${targets[@]}" || exit 1
  rm -rf "$dest"
  mkdir -p "$dest/lib"
  for b in "${binaries[@]}"; do
    install -m 755 "bazel-bin/$b" "$dest/"
    strip "$dest/${b##*/}"
  done
  cp bench/gpu/run_gpu.sh bench/gpu/peer_sdpa.py "$dest/"
  # As bench/ring/run_ring_bench.sh: all but the C and C++ runtimes, the CUDA
  # driver, NCCL, cuDNN and NVRTC (the GPU machine brings those).
  for b in "${binaries[@]}"; do ldd "bazel-bin/$b"; done |
    awk '$2 == "=>" && $3 ~ /^\// { print $3 }' | sort -u |
    grep -Ev '/(libc|libm|libgcc_s|libstdc\+\+|libpthread|librt|libdl|ld-linux[^/]*|libcuda|libnccl|libcudnn[^/]*|libnvrtc[^/]*)\.so' |
    while read -r lib; do cp -L "$lib" "$dest/lib/"; done
  du -sh "$dest"
  echo "bundle in $dest; on the GPU machine: $dest/run_gpu.sh $dest"
  exit 0
fi

if [ $# -ne 1 ] || [ ! -d "$1" ]; then
  echo "usage: $0 BIN_DIR" >&2
  exit 2
fi
BIN_DIR=$(cd "$1" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-$PWD/gpu-run}
PYTHON=${PYTHON:-/opt/torch/.venv/bin/python}
BENCH_LENGTHS=${BENCH_LENGTHS:-4096 16384 65536}
GPU_TESTS=${GPU_TESTS:-$GPU_TEST_TARGETS}
mkdir -p "$OUT"

# Never let NCCL, PyTorch or NVSHMEM use NVLink multicast on these machines.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

# The folder of the first file named $1 under PyTorch's nvidia/ wheels.
torch_lib_dir() {
  local site
  site=$("$PYTHON" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))' 2>/dev/null) || return
  local found
  found=$(find "$site/nvidia" -name "$1" -print -quit 2>/dev/null)
  [ -n "$found" ] && dirname "$found"
}
CUDNN_DIR=$(torch_lib_dir 'libcudnn.so.9')
NVRTC_DIR=$(torch_lib_dir 'libnvrtc.so.13')
export LD_LIBRARY_PATH="$BIN_DIR:$BIN_DIR/lib:${CUDNN_DIR:-}:${NVRTC_DIR:-}:${LD_LIBRARY_PATH:-}"
{
  echo "cuDNN from: ${CUDNN_DIR:-not found among the PyTorch wheels}"
  echo "NVRTC from: ${NVRTC_DIR:-not found among the PyTorch wheels}"
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
} >"$OUT/environment.txt" 2>&1

passed=0 failed=0 skipped=0 status=0
summary=""
for name in $GPU_TESTS; do
  test="$BIN_DIR/$name"
  if [ ! -x "$test" ]; then
    echo "$test: not found" >"$OUT/$name.log"
    rc=127
  else
    "$test" --gtest_output="xml:$OUT/$name.xml" >"$OUT/$name.log" 2>&1
    rc=$?
  fi
  # gtest's own closing lines: "[  PASSED  ] N tests.", "[  SKIPPED ] N tests,",
  # "[  FAILED  ] N tests,".
  p=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$OUT/$name.log" | tail -1)
  s=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) test.*/\1/p' "$OUT/$name.log" | tail -1)
  f=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' "$OUT/$name.log" | tail -1)
  p=${p:-0} s=${s:-0} f=${f:-0}
  if [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi  # crashed before its summary
  [ $rc -ne 0 ] && status=1
  passed=$((passed + p)) skipped=$((skipped + s)) failed=$((failed + f))
  summary+=$(printf '%-28s exit %d: %d passed, %d failed, %d skipped' "$name" $rc "$p" "$f" "$s")$'\n'
done

for dim in ${HEAD_DIMS:-128 64}; do
  # shellcheck disable=SC2086  # the lengths are meant to split
  "$BIN_DIR/gpu_attention_bench" --lengths="$(echo $BENCH_LENGTHS | tr ' ' ',')" \
    --head_dim="$dim" >"$OUT/attention_bench_d$dim.md" 2>"$OUT/attention_bench_d$dim.err" || status=1
  if [ "${PEER:-1}" != 0 ]; then
    # shellcheck disable=SC2086
    PYTHONUNBUFFERED=1 "$PYTHON" "$HERE/peer_sdpa.py" --lengths $BENCH_LENGTHS \
      --head-dim "$dim" >"$OUT/peer_sdpa_d$dim.md" 2>"$OUT/peer_sdpa_d$dim.err" || status=1
  fi
done

if [ "${FOLD:-1}" != 0 ]; then
  "$BIN_DIR/gpu_fold_bench" >"$OUT/fold_bench.md" 2>"$OUT/fold_bench.err" || status=1
fi

SPARSE_LENGTHS=${SPARSE_LENGTHS-65536 262144}
if [ -n "$SPARSE_LENGTHS" ]; then
  # shellcheck disable=SC2086
  "$BIN_DIR/gpu_sparse_bench" --lengths="$(echo $SPARSE_LENGTHS | tr ' ' ',')" \
    ${SPARSE_FLAGS:-} >"$OUT/sparse_bench.md" 2>"$OUT/sparse_bench.err" || status=1
fi

echo "logs in $OUT"
printf '%s' "$summary"
cat "$OUT"/attention_bench_d*.md "$OUT"/peer_sdpa_d*.md "$OUT"/fold_bench.md \
  "$OUT"/sparse_bench.md 2>/dev/null
for err in "$OUT"/attention_bench_d*.err "$OUT"/peer_sdpa_d*.err "$OUT"/fold_bench.err \
  "$OUT"/sparse_bench.err; do
  if [ -s "$err" ]; then
    echo "--- $(basename "$err"):"
    tail -n 5 "$err"
  fi
done
echo
echo "$passed passed, $failed failed, $skipped skipped"
exit $status
