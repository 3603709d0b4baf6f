"""Fixtures: a real local ringattn cluster, started once per test session.

The cluster is `bin/ringattn local --workers 3 --port 0 --http_port 0`, run
from $RINGATTN_BIN_DIR (default: <repo>/bin, built by `./dev build`). Its one
stdout line `ready 127.0.0.1:PORT` gives the target; it is stopped with
SIGTERM (then SIGKILL) at the end of the session. Its log goes to a temporary
file that is printed if it fails to start.
"""

import os
import pathlib
import selectors
import signal
import subprocess
import tempfile
import time
import zlib

import numpy as np
import pytest

import ringattn

REPO_ROOT = pathlib.Path(__file__).resolve().parents[3]
WORKERS = 3
READY_TIMEOUT_S = 60


def _bin_dir():
    return pathlib.Path(os.environ.get("RINGATTN_BIN_DIR", REPO_ROOT / "bin"))


def _die_with_parent():
    """In the child: ask Linux for SIGTERM when the test process dies, so a
    killed pytest leaves no cluster behind (best effort; Linux only)."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)
    except Exception:  # pragma: no cover - not Linux
        pass


def _read_ready_line(process, timeout):
    """The target from the `ready HOST:PORT` line, or None on timeout/exit."""
    selector = selectors.DefaultSelector()
    selector.register(process.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    line = b""
    try:
        while time.monotonic() < deadline:
            if not selector.select(timeout=max(0.0, deadline - time.monotonic())):
                continue
            byte = os.read(process.stdout.fileno(), 1)
            if not byte:
                return None  # the process closed stdout: it ended
            if byte == b"\n":
                break
            line += byte
        else:
            return None
    finally:
        selector.close()
    parts = line.decode(errors="replace").split()
    if len(parts) == 2 and parts[0] == "ready":
        return parts[1]
    raise RuntimeError(f"unexpected first line from ringattn local: {line!r}")


@pytest.fixture(scope="session")
def cluster():
    """The target ("127.0.0.1:PORT") of a running 3-worker local cluster."""
    binary = _bin_dir() / "ringattn"
    if not binary.exists():
        pytest.fail(f"{binary} not found: build it first with `./dev build` "
                    "(or set RINGATTN_BIN_DIR)", pytrace=False)
    log = tempfile.NamedTemporaryFile(prefix="ringattn-local-", suffix=".log",
                                      delete=False)
    process = subprocess.Popen(
        [str(binary), "local", "--workers", str(WORKERS), "--port", "0",
         "--http_port", "0"],
        stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL,
        cwd=str(REPO_ROOT), preexec_fn=_die_with_parent)
    try:
        target = _read_ready_line(process, READY_TIMEOUT_S)
        if target is None:
            log.flush()
            text = pathlib.Path(log.name).read_text(errors="replace")[-4000:]
            pytest.fail(f"ringattn local was not ready within "
                        f"{READY_TIMEOUT_S} s (exit status {process.poll()}); "
                        f"log:\n{text}", pytrace=False)
        yield target
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        process.stdout.close()
        log.close()
        os.unlink(log.name)


@pytest.fixture(scope="session")
def client(cluster):
    with ringattn.Client(cluster, timeout=60) as c:
        yield c


@pytest.fixture
def rng(request):
    # A seed per test, stable across runs.
    seed = zlib.crc32(request.node.nodeid.encode())
    return np.random.default_rng(seed)


def random_qkv(rng, batch, nq, hq, dim, nk=None, hkv=None, dtype=np.float32):
    """Random Q [batch, nq, hq, dim], K and V [batch, nk, hkv, dim]."""
    nk = nq if nk is None else nk
    hkv = hq if hkv is None else hkv
    q = rng.standard_normal((batch, nq, hq, dim)).astype(dtype)
    k = rng.standard_normal((batch, nk, hkv, dim)).astype(dtype)
    v = rng.standard_normal((batch, nk, hkv, dim)).astype(dtype)
    return q, k, v
