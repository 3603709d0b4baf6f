"""ringattn: Python client of the ringattn exact-attention service.

    import numpy as np, ringattn
    with ringattn.Client("127.0.0.1:50051") as client:
        o = client.attend(q, k, v, causal=True)

`ringattn.reference.attention` is a float64 numpy reference of the same
semantics, for checking results on small shapes.
"""

from . import reference
from ._spec import BlockSparse
from .client import PROGRESS_THRESHOLD_BYTES, Client, TLSConfig
from .errors import (AbortedError, AlreadyExistsError, CancelledError,
                     DataLossError, DeadlineExceededError,
                     FailedPreconditionError, InternalError,
                     InvalidArgumentError, NotFoundError, OutOfRangeError,
                     PermissionDeniedError, ResourceExhaustedError,
                     RingattnError, UnauthenticatedError, UnavailableError,
                     UnimplementedError, UnknownError)

__version__ = "0.1.0"

__all__ = [
    "Client", "TLSConfig", "BlockSparse", "reference", "RingattnError",
    "AbortedError", "AlreadyExistsError", "CancelledError", "DataLossError",
    "DeadlineExceededError", "FailedPreconditionError", "InternalError",
    "InvalidArgumentError", "NotFoundError", "OutOfRangeError",
    "PermissionDeniedError", "ResourceExhaustedError", "UnauthenticatedError",
    "UnavailableError", "UnimplementedError", "UnknownError",
    "PROGRESS_THRESHOLD_BYTES",
]
