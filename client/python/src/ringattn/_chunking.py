"""The wire form of tensors: TensorChunk messages out, OutputChunk messages in.

Internal, and free of gRPC calls so that it can be tested alone. A tensor
[B, N, H, D] goes out batch entry by batch entry as runs of whole token rows of
at most `chunk_bytes` wire bytes (one row per chunk where a single row is
larger); output rows come back in OutputChunks and are assembled in place.
"""

import threading

import numpy as np

from . import _tensors, _wire
from .errors import DataLossError, InternalError
from .v1 import attention_pb2 as pb

# As the C++ client's: on one H200 a 256K request took 4.5-5.2 s in 4 MiB
# chunks and 5.8-6.4 s in 1 MiB ones (docs/results/h200-s21.md).
DEFAULT_CHUNK_BYTES = 4 << 20
LEAST_SPLIT_CHUNK_BYTES = 256 << 10


def split_chunk_bytes(total_bytes, chunk_bytes):
    """The chunk size for an upload of `total_bytes` wire bytes.

    At most `chunk_bytes`, and about a thirty-second of the upload (never
    under LEAST_SPLIT_CHUNK_BYTES): the coordinator forwards a chunk's rows to
    the workers while the client still sends the next, so an upload of a few
    MiB in several chunks overlaps its hops, and each of several streams
    carries several (as the C++ client does, client/chunking.h).
    """
    return min(chunk_bytes, max(LEAST_SPLIT_CHUNK_BYTES, total_bytes // 32))


def chunk_ranges(batch, tokens, row_bytes, chunk_bytes=DEFAULT_CHUNK_BYTES):
    """(batch entry, first token, token count) of every chunk, in send order."""
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be >= 1, got {chunk_bytes}")
    rows = max(1, chunk_bytes // max(1, row_bytes))
    for b in range(batch):
        for begin in range(0, tokens, rows):
            yield b, begin, min(rows, tokens - begin)


# An output of at least this many bytes has its pages faulted in on a thread
# of its own while the request uploads and computes, not as its chunks land.
PREFAULT_MIN_BYTES = 64 << 20
PAGE_BYTES = 4096

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

    def __init__(self, tensors, wire, chunk_bytes, streams, on_bytes=None):
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

    def stream(self, index, framed=False):
        """The chunks of upload stream `index` (0-based): TensorChunk
        messages or, `framed`, serialized request messages with the chunk in
        their `chunk` field (_wire.framed_chunk_request: one copy of the rows
        instead of three).
        """
        run = index if index < self._next_run else None
        while run is not None:
            for i in range(*self._runs[run]):
                name, x, b, begin, count = self._chunks[i]
                rows = _tensors.rows_to_wire(x, b, begin, begin + count,
                                             self._wire)
                if framed:
                    yield _wire.framed_chunk_request(name, b, begin, count,
                                                     rows)
                else:
                    yield pb.TensorChunk(
                        tensor=name, batch=b, token_offset=begin,
                        token_count=count, data=rows.tobytes())
                if self._on_bytes is not None:
                    self._on_bytes(rows.nbytes)
            with self._lock:
                run = None
                if self._next_run < len(self._runs):
                    run = self._next_run
                    self._next_run += 1


def output_bytes(shape, with_lse, wire):
    """Bytes an output of `shape` [B, N, H, D] travels in: O in the wire dtype
    and, with LSE, fp32 [B, H, N]."""
    batch, tokens, heads, dim = shape
    per_row = (heads * dim * _tensors.WIRE_ITEMSIZE[wire] +
               (heads * 4 if with_lse else 0))
    return batch * tokens * per_row


class OutputAssembler:
    """Collects OutputChunks into O [B, N, H, D] and LSE [B, H, N] (float32).

    O is kept as it travels, in the wire dtype `wire` (the request's
    output_dtype; bf16 as its uint16 bit patterns): each chunk is one copy,
    and output_as() converts once at the end, if at all. Checks that every
    token row arrives exactly once with data of the right size; a violation
    raises InternalError, missing rows DataLossError. add() may be called from
    several threads (one per download stream).
    """

    def __init__(self, batch, tokens, heads, dim, with_lse,
                 wire=_tensors.FP32):
        self.shape = (batch, tokens, heads, dim)
        self.with_lse = with_lse
        self.wire = wire
        self._lock = threading.Lock()
        self._wire_dtype = _tensors.WIRE_NUMPY_DTYPE[wire]
        # Every row is checked to arrive, so none needs a value before.
        self.wire_output = np.empty(self.shape, dtype=self._wire_dtype)
        self._prefaulted = threading.Event()
        if self.wire_output.nbytes >= PREFAULT_MIN_BYTES:
            threading.Thread(target=self._prefault, name="ringattn-prefault",
                             daemon=True).start()
        else:
            self._prefaulted.set()
        self.lse = (np.full((batch, heads, tokens), -np.inf, dtype=np.float32)
                    if with_lse else None)
        self._received = np.zeros((batch, tokens), dtype=bool)
        self.bytes_received = 0

    @property
    def total_bytes(self):
        return output_bytes(self.shape, self.with_lse, self.wire)

    def _prefault(self):
        # A write per page; numpy lets go of the GIL for it.
        flat = self.wire_output.reshape(-1)
        flat[::PAGE_BYTES // flat.itemsize] = 0
        self._prefaulted.set()

    def add(self, chunk):
        """Places one OutputChunk; returns the bytes it carried.

        Its rows are checked and claimed under a lock and copied outside it,
        so that download streams copy in parallel.
        """
        # Each read of a bytes field copies it: read each once.
        data, lse = chunk.data, chunk.lse
        b, begin, count = chunk.batch, chunk.token_offset, chunk.token_count
        batch, tokens, heads, dim = self.shape
        where = f"output rows [{begin}, {begin + count}) of batch entry {b}"
        if not (0 <= b < batch and 0 <= begin and count >= 1
                and begin + count <= tokens):
            raise InternalError(
                f"server sent {where}, outside the output [{batch}, {tokens}, "
                f"{heads}, {dim}]")
        expected = count * heads * dim * _tensors.WIRE_ITEMSIZE[self.wire]
        if len(data) != expected:
            raise InternalError(
                f"server sent {len(data)} bytes for {where}, expected "
                f"{expected}")
        expected_lse = count * heads * 4 if self.with_lse else 0
        if len(lse) != expected_lse:
            raise InternalError(
                f"server sent {len(lse)} LSE bytes for {where}, expected "
                f"{expected_lse}")
        with self._lock:
            if self._received[b, begin:begin + count].any():
                raise InternalError(f"server sent {where} twice")
            self._received[b, begin:begin + count] = True
            self.bytes_received += len(data) + len(lse)
        self._prefaulted.wait()  # its zeros must not land on output
        self.wire_output[b, begin:begin + count] = np.frombuffer(
            data, dtype=self._wire_dtype).reshape(count, heads, dim)
        if self.with_lse:
            self.lse[b, :, begin:begin + count] = np.frombuffer(
                lse, dtype="<f4").reshape(heads, count)
        return len(data) + len(lse)

    def check_complete(self):
        missing = np.argwhere(~self._received)
        if len(missing):
            b, t = (int(i) for i in missing[0])
            raise DataLossError(
                f"the response ended with {len(missing)} output rows missing, "
                f"the first token {t} of batch entry {b}")

    def output_as(self, reference):
        """O as the same kind as `reference` (see _tensors.output_like)."""
        return _tensors.output_like(self.wire_output, self.wire, reference)
