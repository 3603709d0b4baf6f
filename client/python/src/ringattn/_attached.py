"""The attached streams of one call: more connections each way.

Internal. An Attend, Query or context upload call whose header asks for
upload_streams or download_streams > 1 gets a ticket in its initial
metadata. Each attached
upload stream presents it and then carries a share of the request's chunks
(SharedChunks); each attached download stream presents it and reads output
chunks into the call's OutputAssembler, in no order across streams. Every
attached stream goes over a channel (so a connection) of its own, so that
framing and parsing run on as many threads at each hop.
"""

import threading

import grpc

from .errors import InternalError, RingattnError
from .v1 import attention_pb2 as pb

REQUEST_ID_KEY = "ringattn-request-id"
TOKEN_KEY = "ringattn-upload-token"


def ticket_from(metadata):
    """The UploadTicket of a call's initial metadata, or None."""
    values = dict(metadata or ())
    if REQUEST_ID_KEY not in values or TOKEN_KEY not in values:
        return None
    return pb.UploadTicket(request_id=values[REQUEST_ID_KEY],
                           token=values[TOKEN_KEY])


class AttachedStreams:
    """Opens uploads - 1 AttachUpload and downloads - 1 AttachDownload calls.

    methods[i] (_wire.TensorMethods) serves attached stream i + 1 (an upload
    and a download stream of one number share a channel). A failure noticed
    on this side (a chunk that cannot be made, output that does not fit) goes
    into `errors` and cancels the call through `cancel_call`; the
    server ends the call itself when an attached stream fails on its
    side.
    """

    def __init__(self, methods, ticket, chunks, uploads, downloads, assembler,
                 on_bytes, call_options, errors, cancel_call):
        self._errors = errors
        self._cancel_call = cancel_call
        self._uploads = [
            methods[i].AttachUpload.future(
                self._upload_requests(ticket, chunks, i + 1), **call_options)
            for i in range(uploads - 1)]
        self._downloads = []
        self._readers = []
        for i in range(downloads - 1):
            call = methods[i].AttachDownload(ticket, **call_options)
            reader = threading.Thread(
                target=self._read, args=(call, assembler, on_bytes),
                name=f"ringattn-download-{i + 1}", daemon=True)
            self._downloads.append(call)
            self._readers.append(reader)
            reader.start()

    def wait(self):
        """Waits until every attached stream has ended."""
        for upload in self._uploads:
            try:
                upload.exception()  # waits; the call reports failures
            except grpc.FutureCancelledError:
                pass
        for reader in self._readers:
            reader.join()

    def cancel(self):
        """Cancels the streams still open and waits for them to end."""
        for call in self._uploads + self._downloads:
            call.cancel()
        self.wait()

    def _fail(self, error):
        self._errors.append(error)
        self._cancel_call()

    def _upload_requests(self, ticket, chunks, index):
        yield pb.AttachUploadRequest(ticket=ticket)
        try:
            yield from chunks.stream(index, framed=True)
        except Exception as e:  # surfaces in the caller, not in gRPC's thread
            self._fail(e)
            raise

    def _read(self, call, assembler, on_bytes):
        try:
            for response in call:
                if response.WhichOneof("kind") != "output":
                    raise InternalError(
                        "an attached download stream sent "
                        f"{response.WhichOneof('kind')}, not output")
                on_bytes(assembler.add(response.output))
        except grpc.RpcError:
            pass  # the server fails the call with the reason
        except RingattnError as e:
            call.cancel()
            self._fail(e)
