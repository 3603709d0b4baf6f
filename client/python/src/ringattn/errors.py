"""Errors raised by the ringattn client.

Every failure of a call comes back as a RingattnError subclass carrying the gRPC
status `code` (a grpc.StatusCode) and the server's (or the client's) `message`.
Some subclasses also derive from the matching built-in exception, so that
`except ValueError` catches bad arguments whether the client or the server
noticed them.
"""

import grpc


# Trailing metadata of a call the coordinator ended with UNAVAILABLE having
# changed nothing (a query's new rows taken back).
UNCHANGED_KEY = "ringattn-unchanged"


class RingattnError(Exception):
    """A failed ringattn call: `.code` is a grpc.StatusCode, `.message` a string.

    `.unchanged`: the coordinator said the call changed nothing (it ended it
    with UNAVAILABLE and took any new rows back), so it may be sent again.
    """

    code = grpc.StatusCode.UNKNOWN
    unchanged = False

    def __init__(self, message, code=None):
        if code is not None:
            self.code = code
        self.message = str(message)
        super().__init__(self.message)

    def __str__(self):
        return f"{self.code.name}: {self.message}"


class CancelledError(RingattnError):
    code = grpc.StatusCode.CANCELLED


class UnknownError(RingattnError):
    code = grpc.StatusCode.UNKNOWN


class InvalidArgumentError(RingattnError, ValueError):
    """The request is malformed (bad shapes, dtypes or attention spec)."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class DeadlineExceededError(RingattnError, TimeoutError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class NotFoundError(RingattnError):
    code = grpc.StatusCode.NOT_FOUND


class AlreadyExistsError(RingattnError):
    code = grpc.StatusCode.ALREADY_EXISTS


class PermissionDeniedError(RingattnError):
    code = grpc.StatusCode.PERMISSION_DENIED


class ResourceExhaustedError(RingattnError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class FailedPreconditionError(RingattnError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class AbortedError(RingattnError):
    code = grpc.StatusCode.ABORTED


class OutOfRangeError(RingattnError):
    code = grpc.StatusCode.OUT_OF_RANGE


class UnimplementedError(RingattnError, NotImplementedError):
    code = grpc.StatusCode.UNIMPLEMENTED


class InternalError(RingattnError):
    code = grpc.StatusCode.INTERNAL


class UnavailableError(RingattnError, ConnectionError):
    code = grpc.StatusCode.UNAVAILABLE


class DataLossError(RingattnError):
    code = grpc.StatusCode.DATA_LOSS


class UnauthenticatedError(RingattnError):
    code = grpc.StatusCode.UNAUTHENTICATED


_BY_CODE = {
    cls.code: cls
    for cls in (CancelledError, UnknownError, InvalidArgumentError,
                DeadlineExceededError, NotFoundError, AlreadyExistsError,
                PermissionDeniedError, ResourceExhaustedError,
                FailedPreconditionError, AbortedError, OutOfRangeError,
                UnimplementedError, InternalError, UnavailableError,
                DataLossError, UnauthenticatedError)
}


def error_for(code, message):
    """The RingattnError subclass instance for a grpc.StatusCode and message."""
    return _BY_CODE.get(code, RingattnError)(message, code=code)


def from_rpc_error(error):
    """Converts a grpc.RpcError raised by a stub into a RingattnError."""
    code = error.code() if hasattr(error, "code") else None
    details = error.details() if hasattr(error, "details") else None
    if code is None:
        code = grpc.StatusCode.UNKNOWN
    converted = error_for(code, details or str(error))
    trailing = (error.trailing_metadata()
                if hasattr(error, "trailing_metadata") else None)
    converted.unchanged = any(key == UNCHANGED_KEY
                              for key, _ in (trailing or ()))
    return converted
