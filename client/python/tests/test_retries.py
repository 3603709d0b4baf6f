"""Client(max_attempts=N) against an in-process server that refuses every
call with UNAVAILABLE, as the coordinator does while its cluster is not
ready: the call is sent N times, then the error reaches the caller."""

import threading
from concurrent import futures

import grpc
import numpy as np
import pytest

import ringattn
from ringattn.v1 import attention_pb2_grpc as pb_grpc


class NotReady(pb_grpc.AttentionServicer):
    """Counts the calls and ends each with UNAVAILABLE after its first
    message, before any response; with `unchanged`, marked as the coordinator
    marks a call it took back."""

    def __init__(self):
        self.calls = 0
        self.unchanged = True
        self._lock = threading.Lock()

    def _refuse(self, context):
        with self._lock:
            self.calls += 1
        if self.unchanged:
            context.set_trailing_metadata((("ringattn-unchanged", "1"),))
        context.abort(grpc.StatusCode.UNAVAILABLE,
                      "cluster not ready: 1 of 2 workers alive")

    def Attend(self, request_iterator, context):
        next(request_iterator)
        self._refuse(context)

    def QueryOnce(self, request, context):
        self._refuse(context)


@pytest.fixture
def not_ready():
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    servicer = NotReady()
    pb_grpc.add_AttentionServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, f"127.0.0.1:{port}"
    server.stop(None)


def small_inputs():
    rng = np.random.default_rng(5)
    q = rng.standard_normal((3, 4, 16), dtype=np.float32)
    kv = rng.standard_normal((7, 2, 16), dtype=np.float32)
    return q, kv


@pytest.mark.parametrize("attempts", [1, 3])
def test_refused_attend_is_tried_max_attempts_times(not_ready, attempts):
    servicer, target = not_ready
    q, kv = small_inputs()
    with ringattn.Client(target, timeout=30, max_attempts=attempts) as client:
        with pytest.raises(ringattn.UnavailableError,
                           match="cluster not ready"):
            client.attend(q, kv, kv)
    assert servicer.calls == attempts


def test_refused_query_is_tried_again(not_ready):
    servicer, target = not_ready
    q, _ = small_inputs()
    with ringattn.Client(target, timeout=30, max_attempts=2) as client:
        with pytest.raises(ringattn.UnavailableError):
            client.query("doc", q)
    assert servicer.calls == 2


@pytest.mark.parametrize("unchanged", [True, False])
def test_query_with_new_rows_goes_again_only_when_marked_unchanged(
        not_ready, unchanged):
    servicer, target = not_ready
    servicer.unchanged = unchanged
    q, kv = small_inputs()
    with ringattn.Client(target, timeout=30, max_attempts=3) as client:
        with pytest.raises(ringattn.UnavailableError) as raised:
            client.query("doc", q[:1], k_new=kv[:1], v_new=kv[:1])
    assert raised.value.unchanged == unchanged
    assert servicer.calls == (3 if unchanged else 1)


@pytest.mark.parametrize("attempts", [0, 6])
def test_max_attempts_out_of_range_is_a_value_error(attempts):
    with pytest.raises(ValueError, match="max_attempts"):
        ringattn.Client("127.0.0.1:1", max_attempts=attempts)
