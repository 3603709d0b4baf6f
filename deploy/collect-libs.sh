#!/usr/bin/env bash
# Copies the shared libraries that BINARIES need (per ldd) into LIBDIR, leaving out the ones
# the target image brings itself: glibc, libgcc_s, libstdc++ (the CUDA images' are newer),
# and the CUDA driver, NCCL, cuDNN and NVRTC (the CUDA + cuDNN runtime image's).
#   deploy/collect-libs.sh LIBDIR BINARY...
# With --cuda first, copies only the CUDA-toolkit libraries the binaries link from
# /usr/local/cuda (NCCL, NVRTC, cuDNN's loader): what the CPU image needs, because the worker
# links the GPU path even when it runs on CPU.
#   deploy/collect-libs.sh --cuda LIBDIR BINARY...
set -euo pipefail
cuda=0
if [ "$1" = --cuda ]; then
  cuda=1
  shift
fi
libdir=$1
shift
mkdir -p "$libdir"
ldd "$@" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }' | sort -u | while read -r lib; do
  if [ "$cuda" = 1 ]; then
    case "$lib" in /usr/local/cuda*) cp -L "$lib" "$libdir/" ;; esac
    continue
  fi
  case "$(basename "$lib")" in
    linux-vdso* | ld-linux* | libc.so* | libm.so* | libdl.so* | libpthread.so* | librt.so* | \
      libutil.so* | libresolv.so* | libgcc_s.so* | libstdc++.so* | libcuda.so* | libnccl.so* | \
      libcudnn* | libnvrtc* | libcublas*) ;;
    *) cp -L "$lib" "$libdir/" ;;
  esac
done
if ldd "$@" | grep 'not found'; then
  echo "collect-libs: unresolved libraries above" >&2
  exit 1
fi
