"""The selection's maps as they travel down to leaves: one bytes blob of keys and one of values, not one msgpack
item per entry.

A reply to a leaf's sync carries, for every device of the leaf in flight, its selection id (NVFlare's
``DEVICE_SELECTION``), and each selection id's model version and release (``common.protocol``): with paper delays
and K = 2,000 about a thousand entries each, resent whenever the selection changed, which in an asynchronous run is
after every update. NVFlare's FOBS walks a message's dicts item by item in Python on both sides
(``Externalizer``/``Internalizer``), so those maps cost ~10 microseconds per entry per side: more than the rest of
the server's work per update. ``pack_map`` puts a map into three values (FOBS sees a dict of three);
``unpacked_map`` gives the same dict back (plain ``int`` values; ``str`` or ``int`` keys, as they were). A map
that cannot be packed (a key holding the separator, a value that is no integer) travels as it is, and
``unpacked_map`` takes either.
"""

from __future__ import annotations

import numpy as np

PACKED_MAP = "edgesim_packed_map"  # the key that marks a packed map
INTEGERS = (int, np.integer)
SEPARATOR = "\n"  # between string keys (device ids never hold one; a map whose keys do is sent as it is)


def pack_map(mapping: dict) -> dict:
    """``{str or int: int}`` as ``{PACKED_MAP: 1, "keys": ..., "values": ...}`` (see the module docstring)."""
    keys = list(mapping)
    if not all(isinstance(v, INTEGERS) for v in mapping.values()):
        return mapping
    try:
        values = np.fromiter(mapping.values(), dtype=np.int64, count=len(keys))
    except OverflowError:
        return mapping
    if all(type(k) is str for k in keys):
        text = SEPARATOR.join(keys)
        if text.count(SEPARATOR) != max(0, len(keys) - 1):
            return mapping
        packed_keys: bytes = text.encode()
        kind = "str"
    elif all(isinstance(k, INTEGERS) for k in keys):
        try:
            packed_keys = np.fromiter(keys, dtype=np.int64, count=len(keys)).tobytes()
        except OverflowError:
            return mapping
        kind = "int"
    else:
        return mapping
    return {PACKED_MAP: 1, "kind": kind, "count": len(keys), "keys": packed_keys, "values": values.tobytes()}


def unpacked_map(value: dict | None) -> dict | None:
    """The map ``pack_map`` packed (a plain dict, or None, stays as it is)."""
    if not isinstance(value, dict) or PACKED_MAP not in value:
        return value
    if not value["count"]:
        return {}
    if value["kind"] == "str":
        keys: list = value["keys"].decode().split(SEPARATOR)
    else:
        keys = np.frombuffer(value["keys"], dtype=np.int64).tolist()
    return dict(zip(keys, np.frombuffer(value["values"], dtype=np.int64).tolist(), strict=True))
