"""ringattn.Client: the Python client of the ringattn attention service."""

import dataclasses
import os
import random
import sys
import threading
import time
from typing import Optional, Union

import grpc
import grpc.experimental
import numpy as np

from . import _attached, _chunking, _malloc, _spec, _tensors, _wire
from .errors import (InvalidArgumentError, RingattnError, UnavailableError,
                     from_rpc_error)
from .v1 import attention_pb2 as pb
from .v1 import attention_pb2_grpc as pb_grpc

# Output chunks are ~1 MiB; the limit leaves room for larger ones while bounding
# what a single message can make the client allocate (as the C++ client does).
_MAX_RECEIVE_MESSAGE_BYTES = 64 << 20
# Most attempts of one call (Client's max_attempts), and the waits between
# them: the first, doubled each time up to the longest, each jittered down to
# half (as the C++ client's).
MOST_ATTEMPTS = 5
_FIRST_RETRY_WAIT = 0.5
_LONGEST_RETRY_WAIT = 4.0
# A query uploading at most this much sends its chunks inside its header
# message (QueryHeader.chunks), on a QueryOnce call: the whole upload is one
# message.
_MOST_CARRIED_BYTES = 1 << 20
# Requests moving more than this many bytes show a progress bar (when stderr
# is a terminal, or with progress=True).
PROGRESS_THRESHOLD_BYTES = 8 << 20
# Streams each way of an Attend or Query call that moves at least
# AUTO_STREAMS_MIN_BYTES that way, unless the call says otherwise (as the C++
# client does); at most MOST_STREAMS.
AUTO_STREAMS = 4
AUTO_STREAMS_MIN_BYTES = 8 << 20
MOST_STREAMS = 64

_WIRE_TO_PROTO = {_tensors.FP32: pb.FP32, _tensors.FP16: pb.FP16,
                  _tensors.BF16: pb.BF16}


@dataclasses.dataclass(frozen=True)
class TLSConfig:
    """TLS settings of a Client: PEM bytes, or paths to PEM files.

    root_certificates: CA bundle to verify the server (None: system roots).
    private_key / certificate_chain: the client's key and certificate, for
    mutual TLS (both or neither).
    """

    root_certificates: Optional[Union[bytes, str]] = None
    private_key: Optional[Union[bytes, str]] = None
    certificate_chain: Optional[Union[bytes, str]] = None


def _pem(value):
    if value is None or isinstance(value, bytes):
        return value
    with open(os.fspath(value), "rb") as f:
        return f.read()


def _credentials(tls):
    """grpc.ChannelCredentials for `tls`, or None for a plaintext channel."""
    if tls is None or tls is False:
        return None
    if tls is True:
        return grpc.ssl_channel_credentials()
    if isinstance(tls, grpc.ChannelCredentials):
        return tls
    if isinstance(tls, dict):
        tls = TLSConfig(**tls)
    if isinstance(tls, TLSConfig):
        if (tls.private_key is None) != (tls.certificate_chain is None):
            raise ValueError("TLS private_key and certificate_chain go together")
        return grpc.ssl_channel_credentials(
            root_certificates=_pem(tls.root_certificates),
            private_key=_pem(tls.private_key),
            certificate_chain=_pem(tls.certificate_chain))
    raise TypeError("tls must be None, True, a ringattn.TLSConfig, a dict of "
                    "its fields or grpc.ChannelCredentials, got "
                    f"{type(tls).__name__}")


class _Progress:
    """A tqdm byte counter over a request's upload and download, or nothing."""

    def __init__(self, enabled, total_bytes):
        self._bar = None
        if not enabled:
            return
        from tqdm import tqdm
        self._bar = tqdm(total=total_bytes, unit="B", unit_scale=True,
                         unit_divisor=1024, desc="upload", leave=False,
                         file=sys.stderr)
        self._lock = threading.Lock()

    def update(self, n):
        if self._bar is not None:
            with self._lock:
                self._bar.update(n)

    def phase(self, name):
        if self._bar is not None:
            with self._lock:
                self._bar.set_description(name, refresh=True)

    def close(self):
        if self._bar is not None:
            self._bar.close()


def _show_progress(progress, total_bytes):
    if progress is not None:
        return bool(progress)
    try:
        tty = sys.stderr.isatty()
    except (AttributeError, ValueError):
        tty = False
    return tty and total_bytes > PROGRESS_THRESHOLD_BYTES


class Client:
    """A connection to a ringattn coordinator.

    Client("host:port") opens a gRPC channel (plaintext unless `tls` is given;
    `token` is sent as "authorization: Bearer TOKEN" on every call). Calls may
    come from several threads at once; `last_summary` is per thread. Close it
    with close() or use it as a context manager. The first Client raises
    glibc's malloc mmap and trim thresholds for the process (64 / 256 MiB), so
    that message buffers are not faulted in afresh for every chunk
    (RINGATTN_KEEP_MALLOC=0 or the MALLOC_*_THRESHOLD_ variables leave them).

    Errors: every call raises a ringattn.RingattnError subclass carrying the
    gRPC status `.code` and `.message` (InvalidArgumentError, also a
    ValueError, for bad input noticed by the client or the server).
    """

    def __init__(self, target, token=None, tls=None, *, timeout=None,
                 chunk_bytes=_chunking.DEFAULT_CHUNK_BYTES,
                 channel_options=(), max_attempts=1):
        """target: "host:port"; token: bearer token or None; tls: None/False
        (plaintext), True (system roots), a TLSConfig (or a dict of its
        fields) or grpc.ChannelCredentials; timeout: seconds per call (None:
        no deadline); chunk_bytes: largest tensor chunk sent (default 4 MiB).

        max_attempts, 1 to 5: attempts of an attend or query call that ends
        with UNAVAILABLE before any output came back (the coordinator's
        cluster not ready: a worker died and no replacement has joined yet; a
        worker failed during the call; the coordinator out of reach): it is
        sent again, whole, after a random wait of 0.25-0.5 s, then twice that
        each time, up to 4 s. Such a call changed nothing; a query with new
        rows goes again only when the coordinator said so (it took the rows
        back), never after a lost connection. Each attempt has its own
        timeout; context uploads are never retried.
        """
        if chunk_bytes < 1:
            raise ValueError(f"chunk_bytes must be >= 1, got {chunk_bytes}")
        if not 1 <= max_attempts <= MOST_ATTEMPTS:
            raise ValueError(f"max_attempts must be in [1, {MOST_ATTEMPTS}], "
                             f"got {max_attempts}")
        _malloc.keep_large_buffers()
        self.target = target
        self.timeout = timeout
        self.chunk_bytes = int(chunk_bytes)
        self._metadata = (
            (("authorization", f"Bearer {token}"),) if token is not None
            else ())
        self._options = [("grpc.max_receive_message_length",
                          _MAX_RECEIVE_MESSAGE_BYTES)] + list(channel_options)
        self._credentials = _credentials(tls)
        self.max_attempts = int(max_attempts)
        # Unary-stream calls (QueryOnce) read their responses on the calling
        # thread instead of handing each over from gRPC's.
        self._channel = self._open_channel(self._options + [
            (grpc.experimental.ChannelOptions.SingleThreadedUnaryStream, 1)])
        self._stub = pb_grpc.AttentionStub(self._channel)
        self._tensor_methods = _wire.TensorMethods(self._channel)
        # Channels of attached streams, opened when first needed.
        self._attached_lock = threading.Lock()
        self._attached_channels = []
        self._attached_methods = []
        self._local = threading.local()

    def _open_channel(self, options):
        if self._credentials is None:
            return grpc.insecure_channel(self.target, options=options)
        return grpc.secure_channel(self.target, self._credentials,
                                   options=options)

    def _methods_for_attached(self, count):
        """The RPCs of attached streams 1..count, each on a connection of its
        own (channels whose arguments differ do not share one)."""
        with self._attached_lock:
            while len(self._attached_channels) < count:
                index = len(self._attached_channels) + 1
                channel = self._open_channel(
                    self._options + [("ringattn.attached_stream", index)])
                self._attached_channels.append(channel)
                self._attached_methods.append(_wire.TensorMethods(channel))
            return self._attached_methods[:count]

    # -- lifetime -----------------------------------------------------------

    def close(self):
        """Closes the channels; calls in flight fail with CANCELLED."""
        self._channel.close()
        with self._attached_lock:
            for channel in self._attached_channels:
                channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def last_summary(self):
        """The Summary message of this thread's last attend/query, or None."""
        return getattr(self._local, "summary", None)

    # -- unary calls --------------------------------------------------------

    def _unary(self, method, request, timeout):
        try:
            return method(request, timeout=self._timeout(timeout),
                          metadata=self._metadata)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None

    def _timeout(self, timeout):
        return self.timeout if timeout is None else timeout

    def info(self, timeout=None):
        """The cluster's ClusterInfo message (world_size, ready, workers, ...)."""
        return self._unary(self._stub.GetClusterInfo,
                           pb.GetClusterInfoRequest(), timeout)

    def delete_context(self, name, timeout=None):
        """Deletes resident context `name`."""
        self._unary(self._stub.DeleteContext,
                    pb.DeleteContextRequest(name=name), timeout)

    def list_contexts(self, timeout=None):
        """The ContextInfo messages of every resident context."""
        return list(self._unary(self._stub.ListContexts,
                                pb.ListContextsRequest(), timeout).contexts)

    # -- attention ----------------------------------------------------------

    def attend(self, q, k, v, causal=False, scale=None, dilated=None,
               dilated_combine="lse", block_sparse=None, hilbert=None,
               return_lse=False, wire_dtype=None, *, output_dtype=None,
               upload_streams=None, download_streams=None, progress=None,
               strategy=None, timeout=None):
        """Exact attention of q over k, v on the cluster.

        q [B, Nq, Hq, D] or [Nq, Hq, D]; k, v [B, Nk, Hkv, D] or [Nk, Hkv, D]
        (same rank as q); Hq % Hkv == 0 (GQA/MQA). numpy arrays or CPU torch
        tensors of float32, float16, bfloat16 (torch, or ml_dtypes with numpy)
        or float64 (sent as float32); q, k and v share one dtype.

        causal: bottom-right aligned (query i sees key j iff j <= i + Nk - Nq).
        scale: default 1/sqrt(D). dilated: [(segment_length, dilation), ...]
        combined by dilated_combine "lse" or "head_groups". block_sparse: a
        ringattn.BlockSparse or a dict of its fields (`global_` or `global`).
        hilbert: (height, width) with height * width == N. wire_dtype: "fp32",
        "fp16" or "bf16" (default: the inputs' dtype; float64 goes as fp32).
        output_dtype: the dtype O travels back in, "fp32", "fp16" or "bf16"
        (default: q's dtype if it is float16/bfloat16, else fp32; the service
        accumulates in fp32 and rounds once). upload_streams,
        download_streams: how many gRPC streams, each on a connection of its
        own, carry the request's tensors and its output, in [1, 64] (None: 4
        for a direction moving at least 8 MiB, else 1); one stream moves
        about 1 GB/s. progress: True/False forces the tqdm bar on/off; None
        shows it for requests over 8 MiB when stderr is a terminal. strategy:
        None/"auto", "pass_kv", "pass_q" or "broadcast_q".

        Returns O of q's shape, the same kind as q (numpy or torch, on q's
        device): float16/bfloat16 if q is, float32 otherwise (holding the
        values of output_dtype). With return_lse, returns
        (O, LSE) with LSE float32 [B, Hq, Nq] ([Hq, Nq] for 3-D q), natural
        log, -inf where a row sees no key. The Summary is then in
        last_summary. Raises RingattnError (InvalidArgumentError for bad
        input) on failure.
        """
        q4, k4, v4, wire = self._check_qkv(q, k, v, wire_dtype)
        out = self._check_output_dtype(output_dtype, q)
        batch, nq, hq, dim = _tensors.shape_of(q4)
        _, nk, hkv, _ = _tensors.shape_of(k4)
        spec = self._spec(batch, nq, nk, hq, hkv, dim, causal, scale, dilated,
                          dilated_combine, block_sparse, hilbert, return_lse,
                          wire, out, strategy)
        tensors = [(pb.Q, q4), (pb.K, k4), (pb.V, v4)]
        streams = self._streams(spec, tensors, wire, out, upload_streams,
                                download_streams)
        # Made once the arguments are checked: a large one starts faulting
        # in its pages.
        return self._retrying(
            lambda: _chunking.OutputAssembler(batch, nq, hq, dim, return_lse,
                                              out),
            lambda output: self._stream_attention(
                self._tensor_methods.Attend, pb.AttendRequest(header=spec),
                tensors, wire, output, q, progress, timeout, streams))

    def query(self, name, q, causal=False, scale=None, dilated=None,
              dilated_combine="lse", block_sparse=None, hilbert=None,
              return_lse=False, wire_dtype=None, *, output_dtype=None,
              kv_heads=None, k_new=None, v_new=None, upload_streams=None,
              download_streams=None, progress=None, strategy=None,
              timeout=None):
        """Attention of q over resident context `name` (its K/V).

        Arguments and result as attend(); causal is a continuation of the
        context (bottom-right aligned). kv_heads: the context's K/V heads if
        the caller knows them (None: left to the server). k_new, v_new: K and
        V rows [B, n, Hkv, D] (or [n, Hkv, D], as q) appended to the context
        before the queries run, in the same call (a decode step in one round
        trip): the context grows by n tokens and the queries see them; if the
        call fails, the context is left as it was.
        """
        if (k_new is None) != (v_new is None):
            raise InvalidArgumentError(
                "k_new and v_new come together: give both or neither")
        appended = 0
        if k_new is None:
            q4, wire = self._check_q(q, wire_dtype)
            tensors = [(pb.Q, q4)]
        else:
            q4, k4, v4, wire = self._check_qkv(q, k_new, v_new, wire_dtype)
            _, appended, hkv, _ = _tensors.shape_of(k4)
            if kv_heads is not None and kv_heads != hkv:
                raise InvalidArgumentError(
                    f"kv_heads is {kv_heads} but k_new has {hkv} heads")
            kv_heads = hkv
            tensors = [(pb.Q, q4), (pb.K, k4), (pb.V, v4)]
        out = self._check_output_dtype(output_dtype, q)
        batch, nq, hq, dim = _tensors.shape_of(q4)
        spec = self._spec(batch, nq, 0, hq, kv_heads or 0, dim, causal, scale,
                          dilated, dilated_combine, block_sparse, hilbert,
                          return_lse, wire, out, strategy)
        streams = self._streams(spec, tensors, wire, out, upload_streams,
                                download_streams)
        return self._retrying(
            lambda: _chunking.OutputAssembler(batch, nq, hq, dim, return_lse,
                                              out),
            lambda output: self._stream_attention(
                self._tensor_methods.Query,
                pb.QueryRequest(header=pb.QueryHeader(
                    context=name, spec=spec, append_length=appended)),
                tensors, wire, output, q, progress, timeout, streams),
            appends=appended > 0)

    def _retrying(self, make_output, call, appends=False):
        """call(make_output()) up to max_attempts times while it raises
        UnavailableError before any output came back, waiting between
        attempts. A call that `appends` rows goes again only on the
        coordinator's word that it appended nothing (error.unchanged): a
        connection lost after the coordinator finished looks the same here."""
        wait = _FIRST_RETRY_WAIT
        for attempt in range(1, self.max_attempts + 1):
            output = make_output()
            try:
                return call(output)
            except UnavailableError as error:
                if (attempt == self.max_attempts or output.bytes_received or
                        (appends and not error.unchanged)):
                    raise
            # A wait between attempts, jittered so that clients refused
            # together do not come back together.
            time.sleep(wait * random.uniform(0.5, 1.0))
            wait = min(2 * wait, _LONGEST_RETRY_WAIT)

    # -- resident contexts --------------------------------------------------

    def create_context(self, name, k, v, wire_dtype=None, *,
                       upload_streams=None, progress=None, timeout=None):
        """Uploads k, v [B, N, Hkv, D] (or [N, Hkv, D]) as context `name`.

        upload_streams: as for attend(). Returns the server's ContextInfo
        message.
        """
        return self._upload_context(self._tensor_methods.CreateContext, name,
                                    k, v, wire_dtype, upload_streams, progress,
                                    timeout)

    def append_context(self, name, k, v, wire_dtype=None, *,
                       upload_streams=None, progress=None, timeout=None):
        """Appends k, v tokens to context `name`; returns its ContextInfo."""
        return self._upload_context(self._tensor_methods.AppendContext, name,
                                    k, v, wire_dtype, upload_streams, progress,
                                    timeout)

    # -- internals ----------------------------------------------------------

    @staticmethod
    def _check_output_dtype(output_dtype, q):
        name = _tensors.dtype_name(q, "q")
        return _tensors.parse_wire_dtype(
            output_dtype, name if name in (_tensors.FP16, _tensors.BF16)
            else _tensors.FP32, what="output_dtype")

    def _streams(self, spec, tensors, wire, out, upload_streams,
                 download_streams):
        """The (upload, download) streams of a call, written into its spec;
        `out` is the output's wire dtype."""
        shape = (spec.batch, spec.q_len, spec.q_heads, spec.head_dim)
        streams = (
            self._stream_count(upload_streams, "upload_streams",
                               _upload_bytes(tensors, wire)),
            self._stream_count(download_streams, "download_streams",
                               _chunking.output_bytes(shape, spec.return_lse,
                                                      out)))
        if max(streams) > 1:
            spec.upload_streams, spec.download_streams = streams
        return streams

    @staticmethod
    def _stream_count(value, what, nbytes):
        if value is None:
            return AUTO_STREAMS if nbytes >= AUTO_STREAMS_MIN_BYTES else 1
        if (isinstance(value, bool) or not isinstance(value, (int, np.integer))
                or not 1 <= value <= MOST_STREAMS):
            raise InvalidArgumentError(
                f"{what} must be an int in [1, {MOST_STREAMS}] or None "
                f"(automatic), got {value!r}")
        return int(value)

    @staticmethod
    def _check_q(q, wire_dtype):
        name = _tensors.dtype_name(q, "q")
        shape = _tensors.shape_of(q)
        if len(shape) not in (3, 4):
            raise InvalidArgumentError(
                f"q must be [B, N, H, D] or [N, H, D], got shape {shape}")
        return _tensors.as_4d(q), _tensors.parse_wire_dtype(wire_dtype, name)

    @staticmethod
    def _check_kv(k, v, wire_dtype):
        names = [_tensors.dtype_name(k, "k"), _tensors.dtype_name(v, "v")]
        k_shape, v_shape = _tensors.shape_of(k), _tensors.shape_of(v)
        if len(k_shape) not in (3, 4):
            raise InvalidArgumentError(
                f"k must be [B, N, H, D] or [N, H, D], got shape {k_shape}")
        if k_shape != v_shape:
            raise InvalidArgumentError(
                f"k and v must have the same shape, got {k_shape} and "
                f"{v_shape}")
        if names[0] != names[1]:
            raise InvalidArgumentError(
                f"k and v must have the same dtype, got {k.dtype} and "
                f"{v.dtype}")
        return (_tensors.as_4d(k), _tensors.as_4d(v),
                _tensors.parse_wire_dtype(wire_dtype, names[0]))

    def _check_qkv(self, q, k, v, wire_dtype):
        q4, wire = self._check_q(q, wire_dtype)
        k4, v4, _ = self._check_kv(k, v, wire_dtype)
        q_shape, k_shape = _tensors.shape_of(q), _tensors.shape_of(k)
        if len(q_shape) != len(k_shape):
            raise InvalidArgumentError(
                f"q, k and v must all have a batch dimension or none, got "
                f"shapes {q_shape} and {k_shape}")
        if _tensors.dtype_name(q, "q") != _tensors.dtype_name(k, "k"):
            raise InvalidArgumentError(
                f"q, k and v must have the same dtype, got {q.dtype} and "
                f"{k.dtype}")
        qs, ks = _tensors.shape_of(q4), _tensors.shape_of(k4)
        if qs[0] != ks[0]:
            raise InvalidArgumentError(
                f"q and k must have the same batch size, got shapes {q_shape} "
                f"and {k_shape}")
        if qs[3] != ks[3]:
            raise InvalidArgumentError(
                f"q and k must have the same head_dim, got shapes {q_shape} "
                f"and {k_shape}")
        return q4, k4, v4, wire

    @staticmethod
    def _spec(batch, nq, nk, hq, hkv, dim, causal, scale, dilated, combine,
              block_sparse, hilbert, return_lse, wire, out, strategy):
        spec = pb.AttentionSpec(
            batch=batch, q_len=nq, kv_len=nk, q_heads=hq, kv_heads=hkv,
            head_dim=dim, causal=bool(causal), return_lse=bool(return_lse),
            wire_dtype=_WIRE_TO_PROTO[wire])
        if out != _tensors.FP32:
            spec.output_dtype = _WIRE_TO_PROTO[out]
        if scale is not None:
            spec.scale = float(scale)
        for w, r in _spec.parse_dilated(dilated):
            spec.dilated.add(segment_length=w, dilation=r)
        if _spec.parse_combine(combine) == _spec.HEAD_GROUPS:
            spec.dilated_combine = pb.COMBINE_HEAD_GROUPS
        bs = _spec.parse_block_sparse(block_sparse)
        if bs is not None:
            spec.block_sparse.block_size = bs.block_size
            if bs.local is not None:
                spec.block_sparse.local_blocks = bs.local
            spec.block_sparse.global_blocks = bs.global_
            spec.block_sparse.dilated_blocks = bs.dilated
            spec.block_sparse.random_blocks = bs.random
            spec.block_sparse.seed = bs.seed
            spec.block_sparse.return_mask = bs.return_mask
            for i, j in bs.pairs:
                spec.block_sparse.pairs.add(query_block=i, key_block=j)
        grid = _spec.parse_hilbert(hilbert)
        if grid is not None:
            spec.hilbert.height, spec.hilbert.width = grid
        if strategy is not None:
            name = str(strategy).upper()
            names = {"AUTO": pb.STRATEGY_AUTO, "STRATEGY_AUTO": pb.STRATEGY_AUTO,
                     "PASS_KV": pb.PASS_KV, "PASS_Q": pb.PASS_Q,
                     "BROADCAST_Q": pb.BROADCAST_Q}
            if name not in names:
                raise InvalidArgumentError(
                    "strategy must be auto, pass_kv, pass_q or broadcast_q, "
                    f"got {strategy!r}")
            spec.strategy = names[name]
        return spec

    def _requests(self, header, chunks, bar, errors):
        """The request stream: the header, then `chunks` (serialized request
        messages each carrying one chunk)."""
        try:
            yield header
            yield from chunks
            bar.phase("compute")
        except Exception as e:  # surfaces in the caller, not in gRPC's thread
            errors.append(e)
            raise

    def _stream_attention(self, method, header, tensors, wire, assembler, q,
                          progress, timeout, streams=(1, 1)):
        upload = _upload_bytes(tensors, wire)
        bar = _Progress(_show_progress(progress, upload + assembler.total_bytes),
                        upload + assembler.total_bytes)
        chunks = _chunking.SharedChunks(
            tensors, wire,
            _chunking.split_chunk_bytes(upload, self.chunk_bytes), streams[0],
            bar.update)
        errors = []
        summary = None
        self._local.summary = None
        call_options = dict(timeout=self._timeout(timeout),
                            metadata=self._metadata)
        if isinstance(header, pb.QueryRequest) and (
                upload <= _MOST_CARRIED_BYTES and max(streams) == 1):
            # The whole query in one message, on a call without a request
            # stream (QueryOnce): a round trip cheaper than Query's.
            header.header.chunks.extend(chunks.stream(0))
            responses = self._tensor_methods.QueryOnce(header,
                                                       **call_options)
        else:
            responses = method(
                self._requests(header, chunks.stream(0, framed=True), bar,
                               errors), **call_options)
        attached = None
        try:
            attached = self._attach(responses, streams, chunks, assembler,
                                    bar, call_options, errors)
            for response in responses:
                kind = response.WhichOneof("kind")
                if kind == "output":
                    if summary is not None:
                        raise RingattnError(
                            "server sent output after the summary",
                            grpc.StatusCode.INTERNAL)
                    bar.phase("download")
                    bar.update(assembler.add(response.output))
                elif kind == "summary":
                    summary = response.summary
            if attached is not None:
                # The summary comes once the server has sent every attached
                # stream its share; their last chunks may still be in reading.
                attached.wait()
                if errors:
                    raise errors[0]
            assembler.check_complete()
            if summary is None:
                raise RingattnError("the response ended without a summary",
                                    grpc.StatusCode.DATA_LOSS)
        except grpc.RpcError as e:
            if errors:
                raise errors[0] from None
            raise from_rpc_error(e) from None
        finally:
            responses.cancel()  # no-op once the call has finished
            if attached is not None:
                attached.cancel()
            bar.close()
        self._local.summary = summary
        out = assembler.output_as(q)
        if len(_tensors.shape_of(q)) == 3:
            out = out[0]
        if not assembler.with_lse:
            return out
        lse = _tensors.like(assembler.lse, q)
        if len(_tensors.shape_of(q)) == 3:
            lse = lse[0]
        return out, lse

    def _attach(self, call, streams, chunks, assembler, bar, call_options,
                errors):
        """The attached streams of `call` for (upload, download) `streams`,
        once its initial metadata brought the ticket; None with one stream
        each way, or when the call failed first (it then says why)."""
        if max(streams) == 1:
            return None
        ticket = _attached.ticket_from(call.initial_metadata())
        if ticket is None:
            return None
        return _attached.AttachedStreams(
            self._methods_for_attached(max(streams) - 1), ticket, chunks,
            streams[0], streams[1], assembler, bar.update, call_options,
            errors, call.cancel)

    def _upload_context(self, method, name, k, v, wire_dtype, upload_streams,
                        progress, timeout):
        k4, v4, wire = self._check_kv(k, v, wire_dtype)
        batch, length, heads, dim = _tensors.shape_of(k4)
        tensors = [(pb.K, k4), (pb.V, v4)]
        upload = _upload_bytes(tensors, wire)
        streams = self._stream_count(upload_streams, "upload_streams", upload)
        header = pb.ContextUpload(header=pb.ContextHeader(
            name=name, batch=batch, kv_heads=heads, head_dim=dim,
            length=length, wire_dtype=_WIRE_TO_PROTO[wire],
            upload_streams=streams if streams > 1 else 0))
        bar = _Progress(_show_progress(progress, upload), upload)
        chunks = _chunking.SharedChunks(
            tensors, wire,
            _chunking.split_chunk_bytes(upload, self.chunk_bytes), streams,
            bar.update)
        errors = []
        call_options = dict(timeout=self._timeout(timeout),
                            metadata=self._metadata)
        call = method.future(
            self._requests(header, chunks.stream(0, framed=True), bar,
                           errors), **call_options)
        attached = None
        try:
            attached = self._attach(call, (streams, 1), chunks, None, bar,
                                    call_options, errors)
            info = call.result()
            if attached is not None:
                attached.wait()
            if errors:
                raise errors[0]
            return info
        except grpc.RpcError as e:
            if errors:
                raise errors[0] from None
            raise from_rpc_error(e) from None
        except grpc.FutureCancelledError:
            # Cancelled here, for a reason in `errors`.
            if errors:
                raise errors[0] from None
            raise RingattnError("the upload was cancelled",
                                grpc.StatusCode.CANCELLED) from None
        finally:
            call.cancel()  # no-op once the call has finished
            if attached is not None:
                attached.cancel()
            bar.close()


def _upload_bytes(tensors, wire):
    """Wire bytes of `tensors` ([(name, 4-D tensor), ...])."""
    return sum(int(np.prod(_tensors.shape_of(x)))
               for _, x in tensors) * _tensors.WIRE_ITEMSIZE[wire]
