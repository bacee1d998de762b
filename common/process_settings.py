"""Process settings that make what a leaf or the server allocates per update cheaper: called once, when the
process has built what it keeps for the run (the leaf its simulator, the server its first selection).

* The objects made so far (torch's and NVFlare's modules, millions of them) are never garbage: they are frozen
  out of the collector (``gc.freeze``), so a full collection no longer walks them every few hundred updates; the
  collector, paused for the process's start-up in SimEnv (``common.startup_gc``), runs again.
* With glibc, buffers up to 32 MB (a diff's blob, a model, a message's chunks: hundreds of kB each, several per
  update) come from the heap, which is kept, instead of a fresh mapping each that is zero-filled page by page and
  unmapped when freed: about a third of a leaf's CPU per asynchronous update went to page faults.

Only the calling process is changed; the bits are untouched.
"""

from __future__ import annotations

import ctypes
import sys

from common import startup_gc

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)
LARGE_BUFFERS = 32 * 1024 * 1024  # glibc's largest mmap threshold on 64-bit systems


def settle_process() -> None:
    """Freeze the objects made so far out of the collector, and keep large buffers on the heap (see the module
    docstring)."""
    startup_gc.resume(freeze=True)
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL("libc.so.6")
            libc.mallopt(M_MMAP_THRESHOLD, LARGE_BUFFERS)
            libc.mallopt(M_TRIM_THRESHOLD, 4 * LARGE_BUFFERS)
        except (OSError, AttributeError):  # not glibc: its defaults stay
            pass
