"""A per-machine cache of generated arrays: made once, then read by every process of every run.

A SimEnv run needs its dataset in the driver (the plan checks it), in the server (the evaluator's test split) and
in every leaf process. The synthetic source is seeded, so each of them drew the same images again: about 3 s of
CPU for the default 20,000 images and 6 s for 50,000, per process, on a 2-core machine where the processes start
together. Reading the arrays back from an uncompressed ``.npz`` takes a small fraction of that.

The file name holds every parameter that decides the arrays (and a format version, raised whenever the generator
changes its bits), so a cached file is only ever the same arrays again. Writers are safe against each other: each
writes a temporary file in the same folder and renames it into place (atomic on one file system), so a reader
sees a whole file or none. A cache that cannot be written (a read-only home) or read (a damaged file) is skipped:
the arrays are made in the process, as without a cache.
"""

from __future__ import annotations

import os
import tempfile
import zipfile
from collections.abc import Callable

import numpy as np

NO_CACHE_ENV = "EDGESIM_NO_DATA_CACHE"  # set (to anything but "" or "0") to make the arrays in every process


def cache_name(kind: str, version: int, key: dict[str, object]) -> str:
    """The file name of one set of arrays: the kind, the format version and every key item, in a fixed order
    (never ``hash()``: a string's hash changes from one process to the next)."""
    items = "-".join(f"{k}={key[k]!r}" for k in sorted(key))
    return f"{kind}-v{version}-{items}.npz".replace(os.sep, "_").replace("'", "")


def cached_arrays(
    folder: str, kind: str, version: int, key: dict[str, object], make: Callable[[], dict[str, np.ndarray]]
) -> dict[str, np.ndarray]:
    """The arrays ``make()`` returns, read from ``folder`` when an earlier process made them with the same
    ``kind``, ``version`` and ``key``; made (and stored for the next process) otherwise."""
    if os.environ.get(NO_CACHE_ENV, "") not in ("", "0"):
        return make()
    folder = os.path.expanduser(folder)
    path = os.path.join(folder, cache_name(kind, version, key))
    try:
        with np.load(path, allow_pickle=False) as npz:
            return {name: npz[name] for name in npz.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError):
        pass  # not there yet, or unreadable: make it
    arrays = make()
    try:
        os.makedirs(folder, exist_ok=True)
        fd, temp = tempfile.mkstemp(prefix=".partial-", suffix=".npz", dir=folder)
        try:
            with os.fdopen(fd, "wb") as f:
                np.savez(f, **arrays)
            os.replace(temp, path)
        except BaseException:
            os.unlink(temp)
            raise
    except OSError:
        pass  # no cache this time: the arrays are still right
    return arrays
