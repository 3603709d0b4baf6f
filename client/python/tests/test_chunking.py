"""Unit tests of chunking, wire conversion and output assembly (no server)."""

import io

import numpy as np
import pytest

import ringattn
from google.protobuf import message as message_module

from ringattn import _chunking, _tensors, _wire
from ringattn import client as client_module
from ringattn.v1 import attention_pb2 as pb

MIB = 1 << 20


def test_chunks_are_whole_rows_under_four_mib_covering_every_token_once():
    batch, tokens, heads, dim = 3, 5000, 8, 64
    row_bytes = heads * dim * 4
    seen = np.zeros((batch, tokens), dtype=int)
    count = 0
    for b, begin, n in _chunking.chunk_ranges(batch, tokens, row_bytes):
        assert n >= 1 and n * row_bytes <= 4 * MIB
        seen[b, begin:begin + n] += 1
        count += 1
    assert (seen == 1).all()
    # 2048 rows of 2 KiB per chunk: ceil(5000 / 2048) = 3 chunks per entry.
    assert count == 3 * 3


def test_a_row_larger_than_a_chunk_goes_alone():
    ranges = list(_chunking.chunk_ranges(1, 3, row_bytes=5000,
                                         chunk_bytes=4096))
    assert ranges == [(0, 0, 1), (0, 1, 1), (0, 2, 1)]
    with pytest.raises(ValueError):
        list(_chunking.chunk_ranges(1, 3, 10, chunk_bytes=0))


def test_uploads_under_128_mib_split_into_32_never_under_256_kib():
    split = _chunking.split_chunk_bytes
    assert split(2 * MIB, MIB) == 256 << 10
    assert split(6 * MIB, 4 * MIB) == 256 << 10
    assert split(32 * MIB, 4 * MIB) == MIB
    assert split(64 * MIB, MIB) == MIB
    assert split(256 * MIB, 4 * MIB) == 4 * MIB
    assert split(100 << 10, MIB) == 256 << 10
    # A limit under the floor still holds.
    assert split(2 * MIB, 4096) == 4096


def _rebuild(chunks, tensors, wire):
    """The tensors the chunks carry, widened to float32; NaN where none did."""
    rebuilt = {name: np.full(x.shape, np.nan, dtype=np.float32)
               for name, x in tensors}
    for chunk in chunks:
        x = rebuilt[chunk.tensor]
        span = slice(chunk.token_offset, chunk.token_offset + chunk.token_count)
        assert np.isnan(x[chunk.batch, span]).all(), "a row sent twice"
        heads, dim = x.shape[2:]
        assert len(chunk.data) == (chunk.token_count * heads * dim *
                                   _tensors.WIRE_ITEMSIZE[wire])
        x[chunk.batch, span] = _tensors.wire_to_float32(
            chunk.data, wire).reshape(chunk.token_count, heads, dim)
    return rebuilt


@pytest.mark.parametrize("wire", ["fp32", "fp16", "bf16"])
def test_chunks_reassemble_to_the_wire_rounded_tensor(wire):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 37, 3, 5)).astype(np.float32)
    sent = []
    chunks = list(_chunking.SharedChunks([(pb.K, x)], wire, 100, 1,
                                         sent.append).stream(0))
    for chunk in chunks:
        assert len(chunk.data) <= 100 or chunk.token_count == 1
    # One stream sends in order.
    assert [(c.batch, c.token_offset) for c in chunks] == sorted(
        (c.batch, c.token_offset) for c in chunks)
    rebuilt = _rebuild(chunks, [(pb.K, x)], wire)
    np.testing.assert_array_equal(rebuilt[pb.K],
                                  _tensors.round_to_wire(x, wire))
    assert sum(sent) == x.size * _tensors.WIRE_ITEMSIZE[wire]


@pytest.mark.parametrize("streams", [2, 3, 7, 40])
def test_streams_share_every_chunk_once_starting_apart(streams):
    rng = np.random.default_rng(streams)
    tensors = [(pb.Q, rng.standard_normal((1, 29, 2, 4)).astype(np.float32)),
               (pb.K, rng.standard_normal((2, 31, 2, 4)).astype(np.float32)),
               (pb.V, rng.standard_normal((2, 31, 2, 4)).astype(np.float32))]
    shared = _chunking.SharedChunks(tensors, "bf16", 40, streams)
    # Streams advance in turn, a chunk each, as concurrent senders might.
    iterators = [shared.stream(i) for i in range(streams)]
    firsts, chunks = [], []
    while iterators:
        for it in list(iterators):
            chunk = next(it, None)
            if chunk is None:
                iterators.remove(it)
                continue
            if len(firsts) < streams:
                firsts.append((chunk.tensor, chunk.batch, chunk.token_offset))
            chunks.append(chunk)
    # Rows of 16 bytes, two a chunk: 15 chunks of Q, 2 x 16 each of K and V.
    assert len(chunks) == 79
    assert len(set(firsts)) == len(firsts), "two streams began in one place"
    rebuilt = _rebuild(chunks, tensors, "bf16")
    for name, x in tensors:
        np.testing.assert_array_equal(rebuilt[name],
                                      _tensors.round_to_wire(x, "bf16"))


@pytest.mark.parametrize("request_type", [pb.AttendRequest, pb.QueryRequest,
                                          pb.AttachUploadRequest,
                                          pb.ContextUpload])
def test_framed_chunks_are_the_request_messages_protobuf_would_write(
        request_type):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 700, 2, 3)).astype(np.float32)
    shared = _chunking.SharedChunks([(pb.V, x)], "bf16", 600, 1)
    framed = list(shared.stream(0, framed=True))
    chunks = list(_chunking.SharedChunks([(pb.V, x)], "bf16", 600,
                                         1).stream(0))
    # Offsets past 127 and batch 1 take varints of two bytes and of one;
    # batch 0 and offset 0 are left out, as protobuf leaves them.
    assert len(framed) == len(chunks) == 2 * 14  # 50 rows of 12 bytes each
    for raw, chunk in zip(framed, chunks):
        assert raw == request_type(chunk=chunk).SerializeToString()
        assert request_type.FromString(raw).chunk == chunk


def test_output_chunks_are_read_in_place_and_anything_else_by_protobuf():
    data = np.arange(24, dtype="<f4").tobytes()
    chunk = pb.OutputChunk(batch=3, token_offset=300, token_count=2, data=data,
                           lse=b"\x01\x02\x03\x04")
    view = _wire.parse_attend_response(
        pb.AttendResponse(output=chunk).SerializeToString())
    assert view.WhichOneof("kind") == "output"
    got = view.output
    assert (got.batch, got.token_offset, got.token_count) == (3, 300, 2)
    assert bytes(got.data) == data and bytes(got.lse) == b"\x01\x02\x03\x04"
    empty = _wire.parse_attend_response(
        pb.AttendResponse(output=pb.OutputChunk(token_count=1))
        .SerializeToString())
    assert empty.output.batch == 0 and len(empty.output.data) == 0
    summary = pb.AttendResponse(summary=pb.Summary(request_id="r", flops=2.0))
    parsed = _wire.parse_attend_response(summary.SerializeToString())
    assert parsed == summary
    # An unknown field inside the chunk is skipped.
    inner = chunk.SerializeToString() + b"\x30\x07"  # field 6, varint 7
    message = b"\x0a" + _wire._varint(len(inner)) + inner
    assert bytes(_wire.parse_attend_response(message).output.data) == data
    # A truncated message goes to protobuf, which refuses it.
    raw = pb.AttendResponse(output=chunk).SerializeToString()
    with pytest.raises(message_module.DecodeError):
        _wire.parse_attend_response(raw[:-5])


def test_a_stream_with_no_run_sends_nothing():
    x = np.ones((1, 3, 1, 4), dtype=np.float32)
    shared = _chunking.SharedChunks([(pb.Q, x)], "fp32", 1 << 20, 4)
    assert len(list(shared.stream(0))) == 1
    assert list(shared.stream(1)) == []


def test_bf16_rounding_is_round_to_nearest_even():
    values = np.array([1.0, 1.0 + 2**-8, 1.0 + 3 * 2**-8, 1.0 + 2**-8 + 2**-20,
                       -2.5, np.inf, -np.inf, 3.4028235e38, 1e-40],
                      dtype=np.float32)
    bits = _tensors.float32_to_bf16_bits(values)
    back = _tensors.bf16_bits_to_float32(bits)
    # Ties go to the even mantissa; above the tie rounds up; fp32 max overflows
    # to infinity as the C++ core's conversion does.
    expected = np.array([1.0, 1.0, 1.0 + 4 * 2**-8, 1.0 + 2 * 2**-8, -2.5,
                         np.inf, -np.inf, np.inf, 0.0], dtype=np.float32)
    np.testing.assert_array_equal(back[:-1], expected[:-1])
    assert abs(back[-1]) < 2e-40
    nan_bits = _tensors.float32_to_bf16_bits(np.array([np.nan], np.float32))
    assert np.isnan(_tensors.bf16_bits_to_float32(nan_bits)).all()


def _output_chunk(b, begin, count, heads=2, dim=3, lse=True, value=1.0,
                  wire="fp32"):
    values = np.full(count * heads * dim, value, np.float32)
    data = (_tensors.float32_to_bf16_bits(values).astype("<u2")
            if wire == "bf16" else values.astype(
                {"fp32": "<f4", "fp16": "<f2"}[wire]))
    return pb.OutputChunk(
        batch=b, token_offset=begin, token_count=count, data=data.tobytes(),
        lse=np.full(count * heads, value, "<f4").tobytes() if lse else b"")


@pytest.mark.parametrize("wire", ["fp16", "bf16"])
def test_output_assembler_widens_low_precision_output(wire):
    assembler = _chunking.OutputAssembler(1, 4, 2, 3, with_lse=True,
                                          wire=wire)
    assert assembler.add(_output_chunk(0, 0, 4, value=-1.5,
                                       wire=wire)) == 4 * 2 * 3 * 2 + 4 * 2 * 4
    assembler.check_complete()
    assert assembler.wire_output.dtype.itemsize == 2
    wide = assembler.output_as(np.zeros(1, np.float32))
    assert wide.dtype == np.float32 and (wide == -1.5).all()
    if wire == "fp16":
        kept = assembler.output_as(np.zeros(1, np.float16))
        assert kept.dtype == np.float16 and (kept == -1.5).all()
    assert assembler.bytes_received == assembler.total_bytes
    with pytest.raises(ringattn.InternalError, match="bytes"):
        _chunking.OutputAssembler(1, 4, 2, 3, with_lse=True,
                                  wire=wire).add(_output_chunk(0, 0, 4))


def test_output_assembler_places_rows_and_lse():
    assembler = _chunking.OutputAssembler(2, 5, 2, 3, with_lse=True)
    assembler.add(_output_chunk(1, 2, 3, value=7.0))
    assembler.add(_output_chunk(0, 0, 5, value=1.0))
    with pytest.raises(ringattn.DataLossError, match="missing"):
        assembler.check_complete()
    assembler.add(_output_chunk(1, 0, 2, value=3.0))
    assembler.check_complete()
    assert (assembler.wire_output[1, 2:] == 7).all()
    assert (assembler.wire_output[1, :2] == 3).all()
    assert (assembler.lse[1, :, 2:] == 7).all()
    assert assembler.bytes_received == assembler.total_bytes


@pytest.mark.parametrize("chunk, message", [
    (_output_chunk(0, 4, 2), "outside"),
    (_output_chunk(2, 0, 1), "outside"),
    (_output_chunk(0, 0, 1, lse=False), "LSE bytes"),
    (pb.OutputChunk(batch=0, token_offset=0, token_count=1, data=b"x"),
     "bytes"),
])
def test_output_assembler_rejects_bad_chunks(chunk, message):
    assembler = _chunking.OutputAssembler(2, 5, 2, 3, with_lse=True)
    with pytest.raises(ringattn.InternalError, match=message) as info:
        assembler.add(chunk)
    assert info.value.code.name == "INTERNAL"


def test_output_assembler_rejects_repeated_rows():
    assembler = _chunking.OutputAssembler(1, 5, 2, 3, with_lse=False)
    assembler.add(_output_chunk(0, 0, 3, lse=False))
    with pytest.raises(ringattn.InternalError, match="twice"):
        assembler.add(_output_chunk(0, 2, 1, lse=False))


def test_progress_bar_only_for_big_requests_on_a_terminal(monkeypatch):
    big, small = 9 * MIB, 1 * MIB
    assert client_module._show_progress(True, small)
    assert not client_module._show_progress(False, big)
    monkeypatch.setattr("sys.stderr", io.StringIO())  # not a tty
    assert not client_module._show_progress(None, big)

    class Tty(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr("sys.stderr", Tty())
    assert client_module._show_progress(None, big)
    assert not client_module._show_progress(None, small)


def test_wire_dtype_names():
    assert _tensors.parse_wire_dtype(None, "fp16") == "fp16"
    assert _tensors.parse_wire_dtype(None, "fp64") == "fp32"
    assert _tensors.parse_wire_dtype("BFloat16", "fp32") == "bf16"
    assert _tensors.parse_wire_dtype(np.float16, "fp32") == "fp16"
    with pytest.raises(ValueError, match="wire_dtype"):
        _tensors.parse_wire_dtype("int8", "fp32")


def test_block_sparse_forms_are_equivalent():
    from ringattn import _spec
    a = _spec.parse_block_sparse({"block_size": 4, "global": 1,
                                  "pairs": [[0, 2]]})
    b = _spec.parse_block_sparse(ringattn.BlockSparse(block_size=4, global_=1,
                                                      pairs=[(0, 2)]))
    assert a == b
    with pytest.raises(ValueError, match="seed"):
        _spec.parse_block_sparse({"block_size": 4, "random": 1, "seed": -1})
    with pytest.raises(ValueError, match="block_size"):
        _spec.parse_block_sparse({"local": 1})


def test_malloc_thresholds_are_raised_once_unless_the_caller_tuned_them(
        monkeypatch):
    from ringattn import _malloc
    monkeypatch.setattr(_malloc, "_done", None)
    monkeypatch.setenv("RINGATTN_KEEP_MALLOC", "0")
    assert not _malloc.keep_large_buffers()
    assert not _malloc.keep_large_buffers()  # decided once
    monkeypatch.setattr(_malloc, "_done", None)
    monkeypatch.delenv("RINGATTN_KEEP_MALLOC")
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "1000")
    assert not _malloc.keep_large_buffers()
    monkeypatch.setattr(_malloc, "_done", None)
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_")
    # This project's machines run glibc, whose mallopt takes both.
    assert _malloc.keep_large_buffers()


def test_a_large_output_faulted_in_ahead_keeps_every_row(monkeypatch):
    # Every output counts as large here: its pages are written with zeros on
    # a thread of their own, which must be done before any row lands.
    monkeypatch.setattr(_chunking, "PREFAULT_MIN_BYTES", 0)
    rng = np.random.default_rng(3)
    values = rng.standard_normal((1, 3000, 2, 3)).astype(np.float32)
    assembler = _chunking.OutputAssembler(1, 3000, 2, 3, with_lse=False)
    for begin in range(0, 3000, 1000):
        assembler.add(pb.OutputChunk(
            batch=0, token_offset=begin, token_count=1000,
            data=values[0, begin:begin + 1000].tobytes()))
    assembler.check_complete()
    np.testing.assert_array_equal(assembler.wire_output, values)
