"""The messages that carry tensor bytes, framed and read without protobuf.

Internal. Going through protobuf, each chunk's bytes were copied three times
in Python (into the message, out of it when serialized or read, and into the
destination), all under the interpreter lock; a Python process then moved
about 1.5 GB/s each way whatever the number of streams. Here a request
carrying a chunk is framed straight from the tensor's memory (one copy), and
an output chunk's rows are read in place from the received message. What is
framed is byte for byte what protobuf would write; anything but an output
chunk is left to protobuf. The RPCs' multi-callables take these functions as
their serializers.
"""

from .v1 import attention_pb2 as pb

# Field numbers (attention.proto): every request message's `chunk` is 2;
# TensorChunk: tensor 1, batch 2, token_offset 3, token_count 4, data 5;
# AttendResponse.output 1; OutputChunk: batch 1, token_offset 2,
# token_count 3, data 4, lse 5.
_REQUEST_CHUNK_FIELD = 2
_VARINT, _FIXED64, _LEN, _FIXED32 = 0, 1, 2, 5


def _varint(value):
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _key(field, wire_type):
    return _varint(field << 3 | wire_type)


def framed_chunk_request(tensor, batch, token_offset, token_count, data):
    """A serialized request message (AttendRequest, QueryRequest,
    AttachUploadRequest or ContextUpload: all the same here) whose `chunk`
    is the TensorChunk of these fields; `data` is any contiguous buffer."""
    data = memoryview(data).cast("B")
    head = bytearray()
    for field, value in ((1, tensor), (2, batch), (3, token_offset),
                         (4, token_count)):
        if value:  # proto3 leaves zero scalars out
            head += _key(field, _VARINT) + _varint(value)
    if len(data):
        head += _key(5, _LEN) + _varint(len(data))
    inner = len(head) + len(data)
    return b"".join((_key(_REQUEST_CHUNK_FIELD, _LEN), _varint(inner),
                     bytes(head), data))


def serialize(message):
    """A request serializer: framed bytes as they are, messages by protobuf."""
    if isinstance(message, bytes):
        return message
    return message.SerializeToString()


class OutputChunkView:
    """An OutputChunk's fields, its data and LSE as views of the message."""

    __slots__ = ("batch", "token_offset", "token_count", "data", "lse")

    def __init__(self):
        self.batch = self.token_offset = self.token_count = 0
        self.data = self.lse = memoryview(b"")


class OutputResponse:
    """An AttendResponse that carries an output chunk, read in place."""

    __slots__ = ("output",)

    def __init__(self, output):
        self.output = output

    @staticmethod
    def WhichOneof(_):  # noqa: N802 (protobuf's name)
        return "output"


def _read_varint(buffer, at):
    value = shift = 0
    while True:
        if at >= len(buffer) or shift > 63:
            raise ValueError("truncated or overlong varint")
        byte = buffer[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7


def _fields(buffer):
    """(field, wire type, value or view) of each field of a message."""
    at = 0
    while at < len(buffer):
        key, at = _read_varint(buffer, at)
        field, wire_type = key >> 3, key & 7
        if wire_type == _VARINT:
            value, at = _read_varint(buffer, at)
        elif wire_type == _LEN:
            size, at = _read_varint(buffer, at)
            if at + size > len(buffer):
                raise ValueError("a field runs past the message")
            value, at = buffer[at:at + size], at + size
        elif wire_type in (_FIXED64, _FIXED32):
            at += 8 if wire_type == _FIXED64 else 4
            value = None
        else:
            raise ValueError(f"wire type {wire_type}")
        yield field, wire_type, value


_OUTPUT_FIELDS = {(1, _VARINT): "batch", (2, _VARINT): "token_offset",
                  (3, _VARINT): "token_count", (4, _LEN): "data",
                  (5, _LEN): "lse"}


def parse_attend_response(data):
    """A response deserializer: an output chunk read in place (OutputResponse),
    anything else (the summary) an AttendResponse from protobuf."""
    view = memoryview(data)
    try:
        fields = list(_fields(view))
        if len(fields) == 1 and fields[0][:2] == (1, _LEN):
            chunk = OutputChunkView()
            for field, wire_type, value in _fields(fields[0][2]):
                name = _OUTPUT_FIELDS.get((field, wire_type))
                if name is not None:
                    setattr(chunk, name, value)
            return OutputResponse(chunk)
    except ValueError:
        pass  # protobuf says what is wrong with it
    return pb.AttendResponse.FromString(data)


class TensorMethods:
    """The Attention RPCs that carry tensor bytes, on `channel`, with the
    serializers above (the generated stub's methods use protobuf's):
    .Attend, .Query, .QueryOnce, .AttachUpload, .AttachDownload,
    .CreateContext and .AppendContext."""

    _METHODS = (
        ("Attend", "stream_stream", parse_attend_response),
        ("Query", "stream_stream", parse_attend_response),
        ("QueryOnce", "unary_stream", parse_attend_response),
        ("AttachUpload", "stream_unary", pb.AttachUploadResponse.FromString),
        ("AttachDownload", "unary_stream", parse_attend_response),
        ("CreateContext", "stream_unary", pb.ContextInfo.FromString),
        ("AppendContext", "stream_unary", pb.ContextInfo.FromString),
    )

    def __init__(self, channel):
        service = pb.DESCRIPTOR.services_by_name["Attention"].full_name
        for name, kind, deserializer in self._METHODS:
            setattr(self, name, getattr(channel, kind)(
                f"/{service}/{name}", request_serializer=serialize,
                response_deserializer=deserializer))
