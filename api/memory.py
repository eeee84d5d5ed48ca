"""How the server's process gives memory back to the system.

glibc's malloc serves a large block from its own mapping, returned to the
system when freed, but only while the block is over a threshold that it
raises each time such a block is freed: after a burst of large answers
(1 MiB pages of logs), later ones come from the heap, and the heap keeps
its pages when they are freed. The server would stay at its peak. Fixing
the threshold keeps every large answer in its own mapping, so memory the
read cache lets go of leaves the process.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

M_MMAP_THRESHOLD = -3  # glibc's malloc.h
LARGE_BLOCK_BYTES = 128 * 1024  # glibc's own starting threshold


def give_large_blocks_back() -> bool:
    """True if this libc took the setting (glibc); elsewhere, nothing changes."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    taken = bool(mallopt(M_MMAP_THRESHOLD, LARGE_BLOCK_BYTES))
    if not taken:
        log.debug("mallopt(M_MMAP_THRESHOLD) refused")
    return taken
