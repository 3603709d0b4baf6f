#!/usr/bin/env bash
# Runs the Python client's tests against a real local cluster.
#
#   client/python/run_tests.sh [JUNIT_XML]
#
# Creates (or reuses) a venv in <repo>/.cache/python-venv, installs the pinned
# test environment (requirements-test.txt; torch from requirements-torch.txt
# unless RINGATTN_PYTHON_TORCH=0) from PyPI, installs this package, and runs
# pytest, writing JUnit XML to JUNIT_XML if given. Exits with pytest's status.
# Each step is skipped when its inputs have not changed since the last run.
# The tests start bin/ringattn local themselves ($RINGATTN_BIN_DIR, default
# <repo>/bin: run `./dev build` first).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
venv="$repo/.cache/python-venv"
junit=""
if [[ $# -ge 1 && -n "$1" ]]; then
  mkdir -p "$(dirname "$1")"
  junit="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
fi

log() { echo "run_tests.sh: $*" >&2; }

python=""
for candidate in python3.11 python3; do
  if command -v "$candidate" >/dev/null 2>&1; then python="$candidate"; break; fi
done
[[ -n "$python" ]] || { log "no python3 found"; exit 2; }

if ! "$venv/bin/python" -c 'import sys' >/dev/null 2>&1; then
  log "creating $venv"
  rm -rf "$venv"
  mkdir -p "$(dirname "$venv")"
  "$python" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)

hash_files() { cat "$@" | sha256sum | cut -d' ' -f1; }

# 1. The pinned test environment.
want_torch="${RINGATTN_PYTHON_TORCH:-1}"
requirements=("$here/requirements-test.txt")
[[ "$want_torch" != 0 ]] && requirements+=("$here/requirements-torch.txt")
deps_stamp="$venv/.ringattn-deps"
deps_hash="$(hash_files "${requirements[@]}")-$want_torch"
if [[ "$(cat "$deps_stamp" 2>/dev/null)" != "$deps_hash" ]]; then
  log "installing the pinned test environment"
  "${pip[@]}" install -r "$here/requirements-test.txt"
  complete=1
  if [[ "$want_torch" != 0 ]]; then
    log "installing torch (large; RINGATTN_PYTHON_TORCH=0 skips it)"
    if ! "${pip[@]}" install -r "$here/requirements-torch.txt" ||
       ! "$venv/bin/python" -c 'import torch' >/dev/null 2>&1; then
      log "WARNING: torch could not be installed; its tests will be skipped"
      # A half-installed torch (a full disk, say) fails to import with an
      # OSError, which pytest.importorskip does not skip, and pip would take
      # it as installed next time.
      "${pip[@]}" uninstall -y torch >/dev/null 2>&1 || true
      # pip removes only what it recorded; an install cut short before its
      # record leaves files that still fail to import.
      if ! "$venv/bin/python" -c 'import torch' >/dev/null 2>&1; then
        site="$("$venv/bin/python" -c \
          'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
        rm -rf "$site/torch" "$site/torchgen" "$site/functorch" \
          "$site"/torch-*.dist-info
      fi
      complete=0  # try again next time
    fi
  fi
  if [[ "$complete" == 1 ]]; then echo "$deps_hash" >"$deps_stamp"; fi
fi

# 2. This package (stubs generated from ../../proto by setup.py's build hook).
package_stamp="$venv/.ringattn-package"
package_hash="$(cd "$here" && find pyproject.toml setup.py src ../../proto/ringattn \
    -type f \( -name '*.py' -o -name '*.proto' -o -name '*.toml' \) \
    -not -path '*/__pycache__/*' -not -name '*_pb2*.py' | LC_ALL=C sort |
  xargs sha256sum | sha256sum | cut -d' ' -f1)"
if [[ "$(cat "$package_stamp" 2>/dev/null)" != "$package_hash" ]] ||
   ! "$venv/bin/python" -c 'import ringattn.v1.attention_pb2_grpc' >/dev/null 2>&1; then
  log "installing the ringattn package"
  rm -rf "$here/build"
  "${pip[@]}" install --no-deps --no-build-isolation --force-reinstall "$here"
  echo "$package_hash" >"$package_stamp"
fi

# 3. The tests.
args=(-q -rs -p no:cacheprovider)
[[ -n "$junit" ]] && args+=("--junitxml=$junit")
cd "$here"
set +e
"$venv/bin/python" -m pytest "${args[@]}" tests
status=$?
set -e
exit "$status"
