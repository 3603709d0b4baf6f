"""The wire form of tensors: TensorChunk messages out, OutputChunk messages in.

Internal, and free of gRPC calls so that it can be tested alone. A tensor
[B, N, H, D] goes out batch entry by batch entry as runs of whole token rows of
at most `chunk_bytes` wire bytes (one row per chunk where a single row is
larger); output rows come back in OutputChunks and are assembled in place.
"""

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


def tensor_chunks(pb, name, x, wire, chunk_bytes=DEFAULT_CHUNK_BYTES,
                  on_bytes=None):
    """TensorChunk messages of 4-D `x` as tensor `name` (pb.Q, pb.K or pb.V).

    Converts one chunk at a time; calls on_bytes(n) after building each chunk.
    """
    batch, tokens, heads, dim = _tensors.shape_of(x)
    row_bytes = heads * dim * _tensors.WIRE_ITEMSIZE[wire]
    for b, begin, count in chunk_ranges(batch, tokens, row_bytes, chunk_bytes):
        data = _tensors.rows_to_wire(x, b, begin, begin + count, wire)
        yield pb.TensorChunk(tensor=name, batch=b, token_offset=begin,
                             token_count=count, data=data)
        if on_bytes is not None:
            on_bytes(len(data))


class OutputAssembler:
    """Collects OutputChunks into O [B, N, H, D] and LSE [B, H, N] (float32).

    Checks that every token row arrives exactly once with data of the right
    size; a violation raises InternalError, missing rows DataLossError. Not
    thread-safe.
    """

    def __init__(self, batch, tokens, heads, dim, with_lse):
        self.shape = (batch, tokens, heads, dim)
        self.with_lse = with_lse
        self.output = np.zeros(self.shape, dtype=np.float32)
        self.lse = (np.full((batch, heads, tokens), -np.inf, dtype=np.float32)
                    if with_lse else None)
        self._received = np.zeros((batch, tokens), dtype=bool)
        self.bytes_received = 0

    @property
    def total_bytes(self):
        batch, tokens, heads, dim = self.shape
        per_row = heads * dim * 4 + (heads * 4 if self.with_lse else 0)
        return batch * tokens * per_row

    def add(self, chunk):
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
        expected = count * heads * dim * 4
        if len(chunk.data) != expected:
            raise InternalError(
                f"server sent {len(chunk.data)} bytes for {where}, expected "
                f"{expected}")
        expected_lse = count * heads * 4 if self.with_lse else 0
        if len(chunk.lse) != expected_lse:
            raise InternalError(
                f"server sent {len(chunk.lse)} LSE bytes for {where}, expected "
                f"{expected_lse}")
        self.output[b, begin:begin + count] = np.frombuffer(
            chunk.data, dtype="<f4").reshape(count, heads, dim)
        if self.with_lse:
            self.lse[b, :, begin:begin + count] = np.frombuffer(
                chunk.lse, dtype="<f4").reshape(heads, count)
        self._received[b, begin:begin + count] = True
        self.bytes_received += len(chunk.data) + len(chunk.lse)

    def check_complete(self):
        missing = np.argwhere(~self._received)
        if len(missing):
            b, t = (int(i) for i in missing[0])
            raise DataLossError(
                f"the response ended with {len(missing)} output rows missing, "
                f"the first token {t} of batch entry {b}")
