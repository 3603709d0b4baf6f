"""The wire form of tensors: TensorChunk messages out, OutputChunk messages in.

Internal, and free of gRPC calls so that it can be tested alone. A tensor
[B, N, H, D] goes out batch entry by batch entry as runs of whole token rows of
at most `chunk_bytes` wire bytes (one row per chunk where a single row is
larger); output rows come back in OutputChunks and are assembled in place.
"""

import threading

import numpy as np

from . import _tensors
from .errors import DataLossError, InternalError

DEFAULT_CHUNK_BYTES = 1 << 20
LEAST_SPLIT_CHUNK_BYTES = 256 << 10


def split_chunk_bytes(total_bytes, chunk_bytes):
    """The chunk size for an upload of `total_bytes` wire bytes.

    At most `chunk_bytes`, and about an eighth of the upload (never under
    LEAST_SPLIT_CHUNK_BYTES): the coordinator forwards a chunk's rows to the
    workers while the client still sends the next, so an upload of a few MiB
    in several chunks overlaps its hops (as the C++ client does,
    client/chunking.h).
    """
    return min(chunk_bytes, max(LEAST_SPLIT_CHUNK_BYTES, total_bytes // 8))


def chunk_ranges(batch, tokens, row_bytes, chunk_bytes=DEFAULT_CHUNK_BYTES):
    """(batch entry, first token, token count) of every chunk, in send order."""
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be >= 1, got {chunk_bytes}")
    rows = max(1, chunk_bytes // max(1, row_bytes))
    for b in range(batch):
        for begin in range(0, tokens, rows):
            yield b, begin, min(rows, tokens - begin)


# Runs of chunks per upload stream: a stream that finishes its run early takes
# one no stream has begun, so a slow stream holds back little of the upload.
RUNS_PER_STREAM = 4


class SharedChunks:
    """The chunks of a request's tensors, shared out among its upload streams.

    `tensors` is [(pb.Q / pb.K / pb.V, 4-D tensor), ...] in send order. The
    chunks are cut into runs of about equal length, RUNS_PER_STREAM per
    stream; stream i starts on run i, so the streams carry rows of different
    regions (and so of different workers) from the start, and when its run is
    done takes the next that no stream has begun. Chunks are converted to the
    wire dtype on the thread that iterates the stream, outside any lock.
    Iterate each stream(i) once, from one thread; on_bytes(n) may then be
    called from several threads.
    """

    def __init__(self, pb, tensors, wire, chunk_bytes, streams,
                 on_bytes=None):
        self._pb = pb
        self._wire = wire
        self._on_bytes = on_bytes
        self._chunks = []
        for name, x in tensors:
            batch, tokens, heads, dim = _tensors.shape_of(x)
            row_bytes = heads * dim * _tensors.WIRE_ITEMSIZE[wire]
            self._chunks.extend(
                (name, x, b, begin, count) for b, begin, count in
                chunk_ranges(batch, tokens, row_bytes, chunk_bytes))
        runs = min(len(self._chunks), streams * RUNS_PER_STREAM)
        self._runs = [(len(self._chunks) * r // runs,
                       len(self._chunks) * (r + 1) // runs)
                      for r in range(runs)]
        self._lock = threading.Lock()
        self._next_run = min(streams, runs)

    def stream(self, index):
        """TensorChunk messages for upload stream `index` (0-based)."""
        run = index if index < self._next_run else None
        while run is not None:
            for i in range(*self._runs[run]):
                name, x, b, begin, count = self._chunks[i]
                data = _tensors.rows_to_wire(x, b, begin, begin + count,
                                             self._wire)
                yield self._pb.TensorChunk(tensor=name, batch=b,
                                           token_offset=begin,
                                           token_count=count, data=data)
                if self._on_bytes is not None:
                    self._on_bytes(len(data))
            with self._lock:
                run = None
                if self._next_run < len(self._runs):
                    run = self._next_run
                    self._next_run += 1


class OutputAssembler:
    """Collects OutputChunks into O [B, N, H, D] and LSE [B, H, N] (float32).

    O arrives in the wire dtype `wire` (the request's output_dtype) and is
    widened to float32, which is exact. Checks that every token row arrives
    exactly once with data of the right size; a violation raises
    InternalError, missing rows DataLossError. add() may be called from
    several threads (one per download stream).
    """

    def __init__(self, batch, tokens, heads, dim, with_lse,
                 wire=_tensors.FP32):
        self.shape = (batch, tokens, heads, dim)
        self.with_lse = with_lse
        self.wire = wire
        self._lock = threading.Lock()
        self.output = np.zeros(self.shape, dtype=np.float32)
        self.lse = (np.full((batch, heads, tokens), -np.inf, dtype=np.float32)
                    if with_lse else None)
        self._received = np.zeros((batch, tokens), dtype=bool)
        self.bytes_received = 0

    @property
    def total_bytes(self):
        batch, tokens, heads, dim = self.shape
        per_row = (heads * dim * _tensors.WIRE_ITEMSIZE[self.wire] +
                   (heads * 4 if self.with_lse else 0))
        return batch * tokens * per_row

    def add(self, chunk):
        """Places one OutputChunk; returns the bytes it carried."""
        with self._lock:
            return self._add(chunk)

    def _add(self, chunk):
        batch, tokens, heads, dim = self.shape
        b, begin, count = chunk.batch, chunk.token_offset, chunk.token_count
        where = f"output rows [{begin}, {begin + count}) of batch entry {b}"
        if not (0 <= b < batch and 0 <= begin and count >= 1
                and begin + count <= tokens):
            raise InternalError(
                f"server sent {where}, outside the output [{batch}, {tokens}, "
                f"{heads}, {dim}]")
        if self._received[b, begin:begin + count].any():
            raise InternalError(f"server sent {where} twice")
        expected = count * heads * dim * _tensors.WIRE_ITEMSIZE[self.wire]
        if len(chunk.data) != expected:
            raise InternalError(
                f"server sent {len(chunk.data)} bytes for {where}, expected "
                f"{expected}")
        expected_lse = count * heads * 4 if self.with_lse else 0
        if len(chunk.lse) != expected_lse:
            raise InternalError(
                f"server sent {len(chunk.lse)} LSE bytes for {where}, expected "
                f"{expected_lse}")
        self.output[b, begin:begin + count] = _tensors.wire_to_float32(
            chunk.data, self.wire).reshape(count, heads, dim)
        if self.with_lse:
            self.lse[b, :, begin:begin + count] = np.frombuffer(
                chunk.lse, dtype="<f4").reshape(heads, count)
        self._received[b, begin:begin + count] = True
        self.bytes_received += len(chunk.data) + len(chunk.lse)
        return len(chunk.data) + len(chunk.lse)

    def check_complete(self):
        missing = np.argwhere(~self._received)
        if len(missing):
            b, t = (int(i) for i in missing[0])
            raise DataLossError(
                f"the response ended with {len(missing)} output rows missing, "
                f"the first token {t} of batch entry {b}")
