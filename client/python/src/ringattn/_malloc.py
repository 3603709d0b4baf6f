"""glibc's malloc told to keep the memory of large message buffers.

Internal. Every chunk a request streams (up to 4 MiB) is made, copied into its
message and serialized, and on the way back parsed and copied out: several
buffers of that size are allocated and freed per chunk. With glibc's
defaults they come from fresh mappings, or from a heap top trimmed back after
each, so every page of every chunk is faulted in and cleared again: making and
serializing chunks ran at 0.3-0.6 GB/s a thread where it runs at 2.9-4.6 GB/s
with the memory kept (build VM, 2026-11-29). The service's own programs do the
same (core/large_buffers.h).
"""

import ctypes
import ctypes.util
import os
import threading

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# Allocations below this come from the heap; at most this much freed memory
# stays at a heap's top for reuse.
MMAP_THRESHOLD_BYTES = 64 << 20
TRIM_THRESHOLD_BYTES = 256 << 20

_lock = threading.Lock()
_done = None


def keep_large_buffers():
    """Raises glibc's mmap and trim thresholds, once per process.

    Returns whether they are raised: False off glibc, or where the
    environment sets RINGATTN_KEEP_MALLOC=0 or MALLOC_MMAP_THRESHOLD_ /
    MALLOC_TRIM_THRESHOLD_ (the caller's own tuning wins).
    """
    global _done
    with _lock:
        if _done is None:
            _done = _raise_thresholds()
        return _done


def _raise_thresholds():
    if os.environ.get("RINGATTN_KEEP_MALLOC") == "0":
        return False
    if ("MALLOC_MMAP_THRESHOLD_" in os.environ
            or "MALLOC_TRIM_THRESHOLD_" in os.environ):
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):
        return False  # not glibc
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return (mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1 and
            mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1)
