#!/usr/bin/env bash
# Installs the CUDA 13 toolkit pieces that `./dev build` compiles and links against (nvcc,
# CUDA runtime, NCCL, cuDNN) into /usr/local/cuda-13.0, from NVIDIA's PyPI wheels, in the
# layout of the build machines: one merged include/ and lib/, lib64 -> lib, and
# /usr/local/cuda -> cuda-13.0. Used by the build stage of deploy/Containerfile.*.
set -euo pipefail
PREFIX=${CUDA_PREFIX:-/usr/local/cuda-13.0}
WHEELS=(
  nvidia-cuda-nvcc==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-cuda-cccl==13.0.85
  nvidia-cuda-runtime==13.0.96 nvidia-nvvm==13.0.88 nvidia-cuda-nvrtc==13.0.88
  nvidia-cuda-culibos==13.0.85 nvidia-nccl-cu13==2.28.9 nvidia-cudnn-cu13==9.19.0.56
)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 \
  --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux_2_27_x86_64 --platform manylinux_2_18_x86_64 \
  --platform manylinux_2_17_x86_64 -d "$tmp/whl" "${WHEELS[@]}"
mkdir -p "$PREFIX"
python3 - "$tmp/whl" "$PREFIX" <<'PY'
import glob, os, shutil, sys, zipfile
wheels, prefix = sys.argv[1], sys.argv[2]
for wheel in sorted(glob.glob(wheels + "/*.whl")):
    with zipfile.ZipFile(wheel) as z:
        for info in z.infolist():
            parts = info.filename.split("/")
            # nvidia/<package>/<bin|include|lib|nvvm>/...
            if len(parts) < 4 or parts[0] != "nvidia" or info.is_dir():
                continue
            dest = os.path.join(prefix, *parts[2:])
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            with z.open(info) as src, open(dest, "wb") as out:
                shutil.copyfileobj(src, out)
            mode = (info.external_attr >> 16) & 0o777
            os.chmod(dest, mode or 0o644)
PY
cd "$PREFIX/lib"
# The wheels carry only versioned libraries; add the unversioned names the linker wants.
for f in lib*.so.*; do
  base=${f%%.so.*}.so
  [ -e "$base" ] || ln -s "$f" "$base"
done
cd "$PREFIX"
[ -e lib64 ] || ln -s lib lib64
mkdir -p targets/x86_64-linux
ln -sfn ../../include targets/x86_64-linux/include
ln -sfn ../../lib targets/x86_64-linux/lib
ln -sfn "$(basename "$PREFIX")" /usr/local/cuda
