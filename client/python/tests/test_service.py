"""End-to-end tests against a real 3-worker local cluster (see conftest.py).

Every semantic of DESIGN.md is checked against ringattn.reference; the torch
comparisons (SDPA) are in test_torch.py.
"""

import socket
import threading
import time

import grpc
import numpy as np
import pytest

import ringattn
from ringattn import client as client_module
from ringattn import reference
from ringattn._tensors import round_to_wire
from ringattn.v1 import attention_pb2 as pb

from conftest import WORKERS, random_qkv


def check(client, q, k, v, atol=2e-5, wire=None, **kwargs):
    """attend() with LSE agrees with the reference; returns (O, LSE)."""
    o, l = client.attend(q, k, v, return_lse=True, wire_dtype=wire, **kwargs)
    if wire is not None:
        q, k, v = (round_to_wire(t, wire) for t in (q, k, v))
    ro, rl = reference.attention(q, k, v, **kwargs)
    assert o.shape == ro.shape and l.shape == rl.shape
    assert o.dtype == np.float32 and l.dtype == np.float32
    assert not np.isnan(o).any() and not np.isnan(l).any()
    np.testing.assert_allclose(o, ro, atol=atol, rtol=1e-4)
    assert np.array_equal(np.isneginf(l), np.isneginf(rl)), "rows seeing no key"
    finite = np.isfinite(rl)
    np.testing.assert_allclose(l[finite], rl[finite], atol=1e-4, rtol=1e-5)
    return o, l


def test_cluster_info(client):
    info = client.info()
    assert info.world_size == 3 and info.ready
    assert len(info.workers) == 3 and all(w.alive for w in info.workers)
    assert info.version


def test_dense_with_summary(client, rng):
    q, k, v = random_qkv(rng, 2, 50, 4, 16)
    check(client, q, k, v)
    summary = client.last_summary
    assert summary.request_id and summary.flops > 0
    assert len(summary.workers) == 3


@pytest.mark.parametrize("n", [97, 64])
def test_causal(client, rng, n):
    q, k, v = random_qkv(rng, 1, n, 2, 32)
    check(client, q, k, v, causal=True)


def test_causal_continuation_nq_less_than_nk(client, rng):
    q, k, v = random_qkv(rng, 2, 13, 3, 16, nk=101)
    check(client, q, k, v, causal=True)
    check(client, q, k, v, causal=False)


def test_causal_nq_greater_than_nk_rows_see_nothing(client, rng):
    q, k, v = random_qkv(rng, 1, 20, 2, 8, nk=7)
    o, l = check(client, q, k, v, causal=True)
    assert (o[:, :13] == 0).all() and np.isneginf(l[:, :, :13]).all()


@pytest.mark.parametrize("hq, hkv", [(8, 2), (4, 1)], ids=["gqa", "mqa"])
@pytest.mark.parametrize("causal", [False, True])
def test_gqa_and_mqa(client, rng, hq, hkv, causal):
    q, k, v = random_qkv(rng, 2, 41, hq, 8, hkv=hkv)
    check(client, q, k, v, causal=causal)


@pytest.mark.parametrize("combine", ["lse", "head_groups"])
@pytest.mark.parametrize("causal", [False, True])
def test_dilated(client, rng, combine, causal):
    # N = 100 is no multiple of 16, 32 or 64: every branch has a short last
    # segment; dilation 4 leaves positions some heads keep in no branch.
    q, k, v = random_qkv(rng, 1, 100, 6, 8, hkv=3)
    check(client, q, k, v, causal=causal, dilated_combine=combine,
          dilated=[(16, 1), (32, 2), (64, 4)])


def test_dilated_head_groups_uneven_groups(client, rng):
    # 5 heads in 2 groups: sizes 3 and 2.
    q, k, v = random_qkv(rng, 2, 45, 5, 4)
    check(client, q, k, v, dilated=[(9, 3), (20, 2)],
          dilated_combine="head_groups")


def _mask_of(summary):
    n = summary.mask_blocks
    return np.frombuffer(summary.block_mask, np.uint8).reshape(n, n) == 1


@pytest.mark.parametrize("causal", [False, True])
def test_block_sparse_random_blocks(client, rng, causal):
    q, k, v = random_qkv(rng, 1, 100, 2, 8)
    rules = dict(block_size=8, local=0, random=3, seed=20261122,
                 return_mask=True)
    check(client, q, k, v, causal=causal, block_sparse=rules)
    np.testing.assert_array_equal(_mask_of(client.last_summary),
                                  reference.block_mask(100, rules))


def test_block_sparse_every_rule_as_dataclass(client, rng):
    q, k, v = random_qkv(rng, 2, 77, 4, 8, hkv=2)
    rules = ringattn.BlockSparse(block_size=7, local=1, global_=1, dilated=4,
                                 random=1, seed=2**64 - 5,
                                 pairs=((10, 2), (3, 9)), return_mask=True)
    check(client, q, k, v, causal=True, block_sparse=rules)
    np.testing.assert_array_equal(_mask_of(client.last_summary),
                                  reference.block_mask(77, rules))


@pytest.mark.parametrize("grid", [(7, 9), (8, 8), (1, 31)])
def test_hilbert(client, rng, grid):
    n = grid[0] * grid[1]
    q, k, v = random_qkv(rng, 1, n, 2, 8)
    check(client, q, k, v, causal=True, hilbert=grid)


def test_hilbert_with_block_sparse_and_dilated(client, rng):
    q, k, v = random_qkv(rng, 1, 60, 2, 8)
    check(client, q, k, v, hilbert=(6, 10),
          block_sparse=dict(block_size=8, local=0, random=2, seed=1))
    check(client, q, k, v, hilbert=(6, 10), causal=True, dilated=[(16, 2)])


@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("causal", [False, True])
def test_fewer_tokens_than_workers(client, rng, n, causal):
    q, k, v = random_qkv(rng, 2, n, 2, 8)
    check(client, q, k, v, causal=causal)


def test_three_dimensional_inputs(client, rng):
    q, k, v = random_qkv(rng, 1, 30, 2, 8, nk=40)
    o, l = client.attend(q[0], k[0], v[0], causal=True, return_lse=True)
    ro, rl = reference.attention(q[0], k[0], v[0], causal=True)
    assert o.shape == (30, 2, 8) and l.shape == (2, 30)
    np.testing.assert_allclose(o, ro, atol=2e-5)
    np.testing.assert_allclose(l, rl, atol=1e-4)
    only_o = client.attend(q[0], k[0], v[0])
    assert isinstance(only_o, np.ndarray) and only_o.shape == (30, 2, 8)


def test_scale_and_large_head_dim(client, rng):
    q, k, v = random_qkv(rng, 1, 20, 1, 256)
    check(client, q, k, v, scale=0.01)
    check(client, q, k, v, causal=True)


@pytest.mark.parametrize("wire", ["fp16", "bf16"])
def test_low_precision_wire_from_fp32_inputs(client, rng, wire):
    # The client rounds to the wire dtype; the result (fp32) matches the
    # reference on the rounded inputs to fp32 accuracy.
    q, k, v = random_qkv(rng, 2, 33, 4, 16, hkv=2)
    check(client, q, k, v, wire=wire, causal=True)


def test_fp16_inputs_give_fp16_output(client, rng):
    q, k, v = random_qkv(rng, 1, 40, 2, 16, dtype=np.float16)
    o, l = client.attend(q, k, v, causal=True, return_lse=True)
    assert o.dtype == np.float16 and l.dtype == np.float32
    ro, rl = reference.attention(q, k, v, causal=True)
    np.testing.assert_allclose(o.astype(np.float64), ro, atol=2e-3, rtol=2e-3)
    np.testing.assert_allclose(l, rl, atol=1e-4, rtol=1e-5)
    assert client.last_summary.bytes_in == 3 * q.size * 2


def test_low_precision_output_travels_in_its_dtype(client, rng):
    q, k, v = random_qkv(rng, 1, 41, 4, 80, hkv=2, dtype=np.float16)
    o, l = client.attend(q, k, v, causal=True, return_lse=True)
    # fp16 O (2 bytes a value) and fp32 LSE came back, not fp32 O.
    assert client.last_summary.bytes_out == o.size * 2 + l.size * 4
    wide = client.attend(q, k, v, causal=True, output_dtype="fp32")
    assert wide.dtype == np.float16
    # The server rounds its fp32 result once, as the client would have.
    np.testing.assert_array_equal(o, wide)
    as_bf16 = client.attend(q, k, v, causal=True, output_dtype="bf16")
    np.testing.assert_allclose(as_bf16.astype(np.float64),
                               reference.attention(q, k, v, causal=True)[0],
                               atol=2e-2, rtol=1e-2)


def test_float64_inputs_go_as_fp32(client, rng):
    q, k, v = random_qkv(rng, 1, 10, 2, 4, dtype=np.float64)
    o = client.attend(q, k, v)
    assert o.dtype == np.float32
    np.testing.assert_allclose(o, reference.attention(q, k, v)[0], atol=2e-5)


def test_many_chunks(cluster, rng):
    # 600 tokens x 8 heads x 64 fp32 = 2 KiB rows: 128 rows per 256 KiB chunk
    # (the floor: a thirty-second of the upload is less).
    q, k, v = random_qkv(rng, 1, 600, 8, 64, hkv=2)
    with ringattn.Client(cluster) as default_chunks:
        check(default_chunks, q, k, v, causal=True)
    # Tiny chunks: every row travels alone (also output rows, in order).
    small = random_qkv(rng, 2, 50, 2, 8)
    with ringattn.Client(cluster, chunk_bytes=100) as tiny_chunks:
        check(tiny_chunks, *small)


@pytest.mark.parametrize("uploads, downloads", [(3, 1), (1, 3), (4, 2),
                                                (5, 7)])
def test_several_streams_each_way_give_one_streams_result(cluster, rng,
                                                          uploads, downloads):
    # N prime, GQA, D=80, a batch of 2; small chunks, so that every stream
    # carries several, and an output of several coordinator chunks.
    q, k, v = random_qkv(rng, 2, 997, 4, 80, hkv=2)
    with ringattn.Client(cluster, chunk_bytes=16 << 10, timeout=120) as c:
        one = c.attend(q, k, v, causal=True, return_lse=True,
                       upload_streams=1, download_streams=1)
        many = c.attend(q, k, v, causal=True, return_lse=True,
                        upload_streams=uploads, download_streams=downloads)
        assert len(c._attached_channels) == max(uploads, downloads) - 1
    np.testing.assert_array_equal(many[0], one[0])
    np.testing.assert_array_equal(many[1], one[1])
    ro, rl = reference.attention(q, k, v, causal=True)
    np.testing.assert_allclose(many[0], ro, atol=2e-5, rtol=1e-4)
    np.testing.assert_allclose(many[1], rl, atol=1e-4, rtol=1e-5)


def test_large_requests_take_several_streams_by_default(cluster, rng,
                                                        monkeypatch):
    q, k, v = random_qkv(rng, 1, 300, 2, 16)
    monkeypatch.setattr(client_module, "AUTO_STREAMS_MIN_BYTES", 200 << 10)
    with ringattn.Client(cluster, chunk_bytes=8 << 10) as c:
        # 3 x 37.5 KiB up, 40 KiB down: one stream each way.
        check(c, q, k, v)
        assert c._attached_channels == []
        monkeypatch.setattr(client_module, "AUTO_STREAMS_MIN_BYTES", 30 << 10)
        check(c, q, k, v, causal=True)
        assert len(c._attached_channels) == client_module.AUTO_STREAMS - 1


def test_a_refused_request_over_several_streams_says_why(cluster, rng):
    q, k, v = random_qkv(rng, 1, 10, 3, 8, hkv=2)
    with ringattn.Client(cluster, timeout=60) as c:
        with pytest.raises(ringattn.InvalidArgumentError, match="q_heads"):
            c.attend(q, k, v, upload_streams=3, download_streams=2)
        # The client is still good for the next call.
        q, k, v = random_qkv(rng, 1, 10, 2, 8)
        o = c.attend(q, k, v, upload_streams=2, download_streams=3)
        np.testing.assert_allclose(o, reference.attention(q, k, v)[0],
                                   atol=2e-5)


def test_progress_bar_when_asked(client, rng, capsys):
    q, k, v = random_qkv(rng, 1, 16, 2, 8)
    client.attend(q, k, v, progress=True)
    assert "B" in capsys.readouterr().err  # tqdm's byte counter
    client.attend(q, k, v, progress=False)
    assert capsys.readouterr().err == ""


def test_bearer_token_is_accepted(cluster, rng):
    q, k, v = random_qkv(rng, 1, 8, 1, 4)
    with ringattn.Client(cluster, token="s3cret") as c:
        check(c, q, k, v)


def test_concurrent_requests(client, rng):
    # Workers run at most 2 executions at once and answer RESOURCE_EXHAUSTED
    # ("retry later") beyond that; two threads stay within the limit, and a
    # retry covers an execution still winding down from an earlier test.
    inputs = [random_qkv(rng, 1, 50 + i, 2, 8) for i in range(4)]
    errors = []

    def run(batch):
        try:
            for qkv in batch:
                for attempt in range(20):
                    try:
                        check(client, *qkv, causal=True)
                        break
                    except ringattn.ResourceExhaustedError:
                        time.sleep(0.05 * (attempt + 1))
                else:
                    raise AssertionError("still RESOURCE_EXHAUSTED")
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(inputs[i::2],))
               for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


# --------------------------------------------------------------------------
# Errors.


def test_q_heads_not_a_multiple_of_kv_heads(client, rng):
    q, k, v = random_qkv(rng, 1, 10, 3, 8, hkv=2)
    with pytest.raises(ringattn.InvalidArgumentError) as info:
        client.attend(q, k, v)
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "q_heads" in info.value.message
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, ringattn.RingattnError)


@pytest.mark.parametrize("kwargs, field", [
    (dict(dilated=[(4, 8)]), "dilated[0].dilation"),
    (dict(hilbert=(3, 3)), "hilbert"),
    (dict(block_sparse=dict(block_size=4)), "block_sparse"),
    (dict(block_sparse=dict(block_size=4, pairs=[(0, 9)])),
     "block_sparse.pairs[0]"),
    (dict(dilated=[(4, 1)], block_sparse=dict(block_size=4, local=0)),
     "block_sparse"),
    (dict(scale=-1.0), "scale"),
])
def test_bad_specs_name_the_field(client, rng, kwargs, field):
    q, k, v = random_qkv(rng, 1, 10, 2, 8)
    with pytest.raises(ringattn.InvalidArgumentError) as info:
        client.attend(q, k, v, **kwargs)
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert field in info.value.message


def test_patterns_need_equal_lengths(client, rng):
    q, k, v = random_qkv(rng, 1, 10, 2, 8, nk=12)
    with pytest.raises(ringattn.InvalidArgumentError, match="q_len"):
        client.attend(q, k, v, dilated=[(4, 2)])


def _unused_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("make, message", [
    (lambda q, k, v: (q, k, v[:, :-1]), "same shape"),
    (lambda q, k, v: (q[:, :, :, :4], k, v), "head_dim"),
    (lambda q, k, v: (q[0], k, v), "batch dimension"),
    (lambda q, k, v: (q, k[:1], v[:1]), "batch size"),
    (lambda q, k, v: (q.astype(np.int32), k, v), "dtype"),
    (lambda q, k, v: (q.astype(np.float16), k, v), "same dtype"),
    (lambda q, k, v: (q[0, 0], k[0, 0], v[0, 0]), "shape"),
    (lambda q, k, v: (q.tolist(), k, v), "numpy array or a torch.Tensor"),
])
def test_bad_tensors_are_caught_client_side(rng, make, message):
    # The target has no server: a request that got as far as an RPC would fail
    # with UNAVAILABLE instead.
    q, k, v = random_qkv(rng, 2, 6, 2, 8)
    with ringattn.Client(f"127.0.0.1:{_unused_port()}") as nowhere:
        with pytest.raises(ValueError, match=message) as info:
            nowhere.attend(*make(q, k, v))
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT


def test_bad_options_are_caught_client_side(rng):
    q, k, v = random_qkv(rng, 1, 6, 2, 8)
    with ringattn.Client(f"127.0.0.1:{_unused_port()}") as nowhere:
        with pytest.raises(ValueError, match="dilated_combine"):
            nowhere.attend(q, k, v, dilated=[(2, 1)], dilated_combine="sum")
        with pytest.raises(ValueError, match="wire_dtype"):
            nowhere.attend(q, k, v, wire_dtype="int8")
        with pytest.raises(ValueError, match="output_dtype"):
            nowhere.attend(q, k, v, output_dtype="int8")
        for streams in (0, 65, True, 2.0, "4"):
            with pytest.raises(ValueError, match=r"upload_streams .*\[1, 64\]"):
                nowhere.attend(q, k, v, upload_streams=streams)
            with pytest.raises(ValueError, match="download_streams"):
                nowhere.attend(q, k, v, download_streams=streams)
        with pytest.raises(ValueError, match="unknown keys"):
            nowhere.attend(q, k, v, block_sparse={"block_size": 2, "lcl": 1})


def test_unreachable_server_is_unavailable(rng):
    q, k, v = random_qkv(rng, 1, 6, 2, 8)
    with ringattn.Client(f"127.0.0.1:{_unused_port()}", timeout=10) as c:
        with pytest.raises(ringattn.UnavailableError) as info:
            c.attend(q, k, v)
        assert info.value.code == grpc.StatusCode.UNAVAILABLE
        with pytest.raises(ringattn.UnavailableError):
            c.info()


def test_decode_steps_append_and_attend_in_one_call(client, rng):
    """query(k_new=, v_new=): the rows join the context, the queries see them."""
    q, k, v = random_qkv(rng, 1, 1, 4, 8, nk=23, hkv=2)  # GQA, N prime
    client.create_context("pytest-decode", k, v)
    try:
        for rows in (1, 3, 1):  # appended in uneven pieces
            q, k_new, v_new = random_qkv(rng, 1, rows, 4, 8, hkv=2)
            o, lse = client.query("pytest-decode", q, causal=True,
                                  k_new=k_new, v_new=v_new, return_lse=True)
            k = np.concatenate([k, k_new], axis=1)
            v = np.concatenate([v, v_new], axis=1)
            ro, rl = reference.attention(q, k, v, causal=True)
            np.testing.assert_allclose(o, ro, atol=2e-5, rtol=1e-4)
            np.testing.assert_allclose(lse, rl, atol=1e-4, rtol=1e-5)
        info = {c.name: c for c in client.list_contexts()}["pytest-decode"]
        assert info.length == 23 + 5
        # A part per worker, each held in fp32 as it was uploaded, the
        # decode steps' rows counted in.
        assert [p.rank for p in info.parts] == list(range(WORKERS))
        assert sum(p.bytes for p in info.parts) == info.bytes
        assert {p.dtype for p in info.parts} == {pb.FP32}
        # A step the server refuses (three K/V heads against the context's
        # two) leaves the context as it was.
        q, k_new, v_new = random_qkv(rng, 1, 1, 3, 8, hkv=3)
        with pytest.raises(ringattn.RingattnError) as info:
            client.query("pytest-decode", q, k_new=k_new, v_new=v_new)
        assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
        lengths = {c.name: c.length for c in client.list_contexts()}
        assert lengths["pytest-decode"] == 23 + 5
    finally:
        client.delete_context("pytest-decode")


def test_small_and_large_queries_match_reference(client, rng):
    """Up to 1 MiB a query's chunks ride in its header; above, they stream.

    kv_heads is left to the server, which takes the context's.
    """
    _, k, v = random_qkv(rng, 1, 1, 8, 128, nk=37, hkv=2)
    client.create_context("pytest-sizes", k, v)
    try:
        for rows in (3, 300):  # 12 KiB and 1.2 MB of fp32 query rows
            q, _, _ = random_qkv(rng, 1, rows, 8, 128, hkv=2)
            o = client.query("pytest-sizes", q, causal=True)
            np.testing.assert_allclose(
                o, reference.attention(q, k, v, causal=True)[0], atol=2e-5,
                rtol=1e-4)
    finally:
        client.delete_context("pytest-sizes")


@pytest.mark.parametrize("strategy", ["pass_kv", "pass_q", "broadcast_q"])
def test_queries_over_several_streams_give_one_streams_result(cluster, rng,
                                                             strategy):
    """query(upload_streams=, download_streams=), a decode step's new rows
    too; N prime, GQA, D=80."""
    name = f"pytest-streams-{strategy}"
    _, k, v = random_qkv(rng, 1, 1, 4, 80, nk=997, hkv=2)
    with ringattn.Client(cluster, chunk_bytes=16 << 10, timeout=120) as c:
        c.create_context(name, k, v)
        try:
            q, _, _ = random_qkv(rng, 1, 301, 4, 80, hkv=2)
            one = c.query(name, q, causal=True, return_lse=True,
                          strategy=strategy, upload_streams=1,
                          download_streams=1)
            many = c.query(name, q, causal=True, return_lse=True,
                           strategy=strategy, upload_streams=3,
                           download_streams=2)
            assert len(c._attached_channels) == 2
            # Partials may merge in another order: equal to fp32 rounding.
            np.testing.assert_allclose(many[0], one[0], atol=1e-6, rtol=1e-5)
            np.testing.assert_allclose(many[1], one[1], atol=1e-6, rtol=1e-6)
            ro, rl = reference.attention(q, k, v, causal=True)
            np.testing.assert_allclose(many[0], ro, atol=2e-5, rtol=1e-4)
            np.testing.assert_allclose(many[1], rl, atol=1e-4, rtol=1e-5)
            q, k_new, v_new = random_qkv(rng, 1, 129, 4, 80, hkv=2)
            o = c.query(name, q, causal=True, k_new=k_new, v_new=v_new,
                        strategy=strategy, upload_streams=4,
                        download_streams=3)
            assert len(c._attached_channels) == 3
            k = np.concatenate([k, k_new], axis=1)
            v = np.concatenate([v, v_new], axis=1)
            np.testing.assert_allclose(
                o, reference.attention(q, k, v, causal=True)[0], atol=2e-5,
                rtol=1e-4)
            assert {x.name: x.length for x in c.list_contexts()}[name] == (
                997 + 129)
        finally:
            c.delete_context(name)


def test_contexts_upload_over_several_streams(cluster, rng):
    """create_context/append_context(upload_streams=): the context answers as
    one uploaded over one stream; N prime, GQA, D=80."""
    _, k, v = random_qkv(rng, 1, 1, 4, 80, nk=997, hkv=2)
    _, k_more, v_more = random_qkv(rng, 1, 1, 4, 80, nk=131, hkv=2)
    with ringattn.Client(cluster, chunk_bytes=16 << 10, timeout=120) as c:
        c.create_context("pytest-upload-streams", k, v, upload_streams=3)
        try:
            assert len(c._attached_channels) == 2
            info = c.append_context("pytest-upload-streams", k_more, v_more,
                                    upload_streams=4)
            assert info.length == 997 + 131
            assert len(c._attached_channels) == 3
            q, _, _ = random_qkv(rng, 1, 19, 4, 80, hkv=2)
            o = c.query("pytest-upload-streams", q, causal=True)
            k = np.concatenate([k, k_more], axis=1)
            v = np.concatenate([v, v_more], axis=1)
            np.testing.assert_allclose(
                o, reference.attention(q, k, v, causal=True)[0], atol=2e-5,
                rtol=1e-4)
            # A refused append over several streams says why and leaves the
            # context as it was.
            _, k_bad, v_bad = random_qkv(rng, 1, 1, 4, 80, nk=50, hkv=4)
            with pytest.raises(ringattn.RingattnError) as refused:
                c.append_context("pytest-upload-streams", k_bad, v_bad,
                                 upload_streams=3)
            assert refused.value.code in (grpc.StatusCode.INVALID_ARGUMENT,
                                          grpc.StatusCode.FAILED_PRECONDITION)
            lengths = {x.name: x.length for x in c.list_contexts()}
            assert lengths["pytest-upload-streams"] == 997 + 131
        finally:
            c.delete_context("pytest-upload-streams")


def test_bad_decode_steps_are_caught_client_side(rng):
    q, k, v = random_qkv(rng, 1, 1, 4, 8, hkv=2)
    with ringattn.Client(f"127.0.0.1:{_unused_port()}") as nowhere:
        with pytest.raises(ValueError, match="both or neither"):
            nowhere.query("ctx", q, k_new=k)
        with pytest.raises(ValueError, match="kv_heads is 4"):
            nowhere.query("ctx", q, kv_heads=4, k_new=k, v_new=v)
        with pytest.raises(ValueError, match="head_dim"):
            nowhere.query("ctx", q, k_new=k[..., :4], v_new=v[..., :4])


def test_resident_context_rpcs(client, rng):
    """UNIMPLEMENTED today; once the server has them, a create/query/delete."""
    q, k, v = random_qkv(rng, 1, 24, 2, 8)
    try:
        created = client.create_context("pytest-ctx", k, v)
    except ringattn.UnimplementedError as e:
        assert e.code == grpc.StatusCode.UNIMPLEMENTED and e.message
        calls = [
            lambda: client.append_context("pytest-ctx", k, v),
            lambda: client.query("pytest-ctx", q[:, :4], causal=True),
            lambda: client.delete_context("pytest-ctx"),
            lambda: client.list_contexts(),
        ]
        for call in calls:
            with pytest.raises(ringattn.UnimplementedError) as info:
                call()
            assert info.value.code == grpc.StatusCode.UNIMPLEMENTED
        return
    try:
        assert created.length == 24
        assert "pytest-ctx" in [c.name for c in client.list_contexts()]
        o = client.query("pytest-ctx", q[:, :4], causal=True, kv_heads=2)
        np.testing.assert_allclose(
            o, reference.attention(q[:, :4], k, v, causal=True)[0], atol=2e-5)
    finally:
        client.delete_context("pytest-ctx")
