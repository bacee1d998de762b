"""Model weights and diffs as they travel between leaves and the server: one blob per dict, not one numpy array
per tensor, carried by NVFlare's serialiser beside its message rather than inside it.

FOBS serialises each numpy array of a message on its own (``np.save`` into the message, a header ``np.load``
parses back with ``ast.literal_eval``): a cost per tensor per side that exceeds a device's training at near-zero
work (PERFORMANCE_OPTIMIZATION.md, "The figures behind rules in the code"). ``pack`` puts a whole ``{name: array}`` dict into one buffer
(one copy of each array) with the names, dtypes and shapes beside it, as one string; ``unpack`` gives the arrays back as views of
one writable copy, or of the received bytes themselves.

The buffer travels as an NVFlare ``Datum`` (FOBS's own way to carry large values): FOBS writes it as a section of
its own after the message body instead of copying it into msgpack's buffer, and the receiver gets it back as one
``bytes`` object, without a second copy out of the message body. With hundreds of diffs in a leaf's report
(asynchronous runs) those two copies were most of the CPU each update cost the leaf's and the server's
serialiser. The bits are the arrays' own: nothing is converted.

The arrays of a blob come back as a ``PackedArrays``: a plain ``{name: array}`` dict to whoever reads it, which
also keeps its blob, its layout and, when every array is float32, the whole blob as one float32 vector
(``flat``). A sum of hundreds of diffs, or a new version made from one, is then one numpy call over the vector
instead of one per tensor, with the same bits (elementwise float32 arithmetic is the same whatever the slicing).
"""

from __future__ import annotations

import json
import math

import numpy as np
from nvflare.fuel.utils.fobs.datum import Datum

PACKED = "edgesim_packed"  # the key that marks a packed dict


class PackedArrays(dict):
    """``{name: array}``, every array a view of one blob (``views``). Beyond the dict:

    Attributes:
        layout: the blob's layout text (``layout_text``), the same for two dicts whose names, dtypes and shapes
            are the same, in the same order.
        flat: the whole blob as one 1-D float32 array when every array is float32 (each array a slice of it, in
            order), else None.
        blob: the buffer the arrays view.

    A copy or a pickle of it is a plain dict (what it holds is the arrays)."""

    __slots__ = ("layout", "flat", "blob")

    def __reduce__(self):
        return dict, (dict(self),)


def flat_of(*weights) -> np.ndarray | None:
    """The flat float32 vector of the first of ``weights`` when every one is a ``PackedArrays`` with one, all of
    the same layout (then their flat vectors line up, slice for slice); else None."""
    first = weights[0]
    if not isinstance(first, PackedArrays) or first.flat is None:
        return None
    for other in weights[1:]:
        if not isinstance(other, PackedArrays) or other.flat is None or other.layout != first.layout:
            return None
    return first.flat


def fresh_like(weights: PackedArrays) -> PackedArrays:
    """New arrays of ``weights``'s layout, views of a new writable blob (its contents to be written)."""
    return views({LAYOUT: weights.layout}, bytearray(_plan({LAYOUT: weights.layout}).nbytes))


def slices_of(weights: PackedArrays, names) -> list[slice]:
    """Where the arrays ``names`` lie in ``weights.flat``, adjacent ones merged into one slice, in order."""
    out: list[slice] = []
    offset = 0
    for name, _dtype, shape in layout({LAYOUT: weights.layout}):
        count = math.prod(shape)
        if name in names:
            if out and out[-1].stop == offset:
                out[-1] = slice(out[-1].start, offset + count)
            else:
                out.append(slice(offset, offset + count))
        offset += count
    return out


def pack(weights: dict[str, np.ndarray]) -> dict:
    """``{name: array}`` as one blob (see the module docstring)."""
    arrays, layout, plan = _arrays_and_plan(weights)
    buffer = bytearray(plan.nbytes)
    _fill(buffer, arrays, plan)
    return {PACKED: 1, LAYOUT: layout, "data": Datum.blob_datum(buffer)}


def pack_into(weights: dict[str, np.ndarray], allocate) -> tuple[str, object] | None:
    """``pack``'s blob written into a buffer ``allocate(nbytes)`` gives (a slot of shared memory,
    ``common.shared_ring``): (its layout, that buffer); None, with nothing written, when ``allocate`` gives None."""
    arrays, layout, plan = _arrays_and_plan(weights)
    buffer = allocate(plan.nbytes)
    if buffer is None:
        return None
    _fill(buffer, arrays, plan)
    return layout, buffer


def pack_blob_into(packed: dict, allocate) -> tuple[str, object] | None:
    """A packed dict's blob copied as it is into a buffer ``allocate(nbytes)`` gives: (its layout, that buffer);
    None when ``allocate`` gives None."""
    blob = packed_bytes(packed)
    buffer = allocate(len(blob))
    if buffer is None:
        return None
    memoryview(buffer)[:] = blob
    return packed[LAYOUT], buffer


def _arrays_and_plan(weights: dict[str, np.ndarray]) -> tuple[list[np.ndarray], str, _Plan]:
    arrays = [np.asarray(v) for v in weights.values()]
    layout = layout_text(tuple(weights), tuple(a.dtype.str for a in arrays), tuple(a.shape for a in arrays))
    return arrays, layout, _plan({LAYOUT: layout})


def _fill(buffer, arrays: list[np.ndarray], plan: _Plan) -> None:
    """Each array copied once into ``buffer``, in C order whatever its layout (as tobytes() would)."""
    if not arrays:
        return
    raw = np.frombuffer(buffer, dtype=np.uint8, count=plan.nbytes)
    if plan.float32:
        np.concatenate([a.reshape(-1) for a in arrays], out=raw.view(np.float32))
    else:
        for a, (_, dt, shape, start, stop) in zip(arrays, plan.entries, strict=True):
            raw[start:stop].view(dt).reshape(shape)[...] = a


def blob_bytes(layout: str) -> int:
    """The size of the blob of a layout (``layout_text``)."""
    return _plan({LAYOUT: layout}).nbytes


class _Plan:
    """Where each array of a layout lies in its blob (bytes), parsed once per layout."""

    __slots__ = ("entries", "nbytes", "float32", "float32_entries")

    def __init__(self, parsed: list[tuple[str, np.dtype, tuple[int, ...]]]):
        self.entries, offset = [], 0
        for name, dt, shape in parsed:
            nbytes = math.prod(shape) * dt.itemsize
            self.entries.append((name, dt, shape, offset, offset + nbytes))
            offset += nbytes
        self.nbytes = offset
        self.float32 = all(dt == np.float32 for _, dt, _ in parsed)
        # the same in float32 elements, for slicing the blob's flat float32 vector
        self.float32_entries = (
            [(n, shape, a // 4, b // 4) for n, _, shape, a, b in self.entries] if self.float32 else []
        )


def _plan(packed: dict) -> _Plan:
    text = packed.get(LAYOUT)
    found = _PLANS.get(text) if text is not None else None
    if found is None:
        found = _Plan(layout(packed))
        if text is not None:
            if len(_PLANS) >= LAYOUTS_KEPT:
                _PLANS.clear()
            _PLANS[text] = found
    return found


def layout_text(names: tuple, dtypes: tuple, shapes: tuple) -> str:
    """The names, dtypes and shapes of a packed dict as one string: NVFlare's serialiser walks every list and
    dict of a message in Python, and hundreds of diffs a report carry the same layout (made once, then reused)."""
    key = (names, dtypes, shapes)
    text = _TEXTS.get(key)
    if text is None:
        if len(_TEXTS) >= LAYOUTS_KEPT:
            _TEXTS.clear()
        text = _TEXTS[key] = json.dumps([[n, d, list(s)] for n, d, s in zip(names, dtypes, shapes, strict=True)])
    return text


def layout(packed: dict) -> list[tuple[str, np.dtype, tuple[int, ...]]]:
    """(name, dtype, shape) of each array of a packed dict, in order."""
    if LAYOUT not in packed:  # packed before the layout was one string (a checkpoint an older run wrote)
        zipped = zip(packed["names"], packed["dtypes"], packed["shapes"], strict=True)
        return [(n, np.dtype(d), tuple(s)) for n, d, s in zipped]
    text = packed[LAYOUT]
    parsed = _LAYOUTS.get(text)
    if parsed is None:
        if len(_LAYOUTS) >= LAYOUTS_KEPT:
            _LAYOUTS.clear()
        parsed = _LAYOUTS[text] = [(n, np.dtype(d), tuple(s)) for n, d, s in json.loads(text)]
    return parsed


LAYOUT = "layout"
LAYOUTS_KEPT = 64  # distinct layouts remembered (a run has one or two: its model's, and with extras)
_TEXTS: dict[tuple, str] = {}
_LAYOUTS: dict[str, list] = {}
_PLANS: dict[str, _Plan] = {}


def is_packed(value) -> bool:
    return isinstance(value, dict) and PACKED in value


def packed_bytes(packed: dict) -> bytes | bytearray:
    """The blob of a packed dict (a ``Datum`` here and on the wire; plain bytes in an older sender's message)."""
    data = packed["data"]
    return data.value if isinstance(data, Datum) else data


def unpack(packed: dict, writable: bool = True) -> dict[str, np.ndarray]:
    """The ``{name: array}`` a ``pack`` made: arrays sharing one buffer, a writable copy, or (``writable`` False)
    read-only views of the received bytes themselves (a diff is only read: summed, blended)."""
    data = packed_bytes(packed)
    return views(packed, bytearray(data) if writable else memoryview(data).toreadonly())


def views(packed: dict, buffer=None) -> PackedArrays:
    """The arrays of a packed dict as views of ``buffer`` (default: its own blob; writable if that is a
    ``bytearray``, as ``pack`` makes it): no copy. The buffer is taken once and sliced (a ``np.frombuffer`` per
    array cost more than the rest of a received diff's handling)."""
    buffer = packed_bytes(packed) if buffer is None else buffer
    plan = _plan(packed)
    raw = np.frombuffer(buffer, dtype=np.uint8, count=plan.nbytes)
    out = PackedArrays()
    out.layout, out.blob, out.flat = packed.get(LAYOUT), buffer, None
    if plan.float32:
        flat = raw.view(np.float32)
        for name, shape, start, stop in plan.float32_entries:
            out[name] = flat[start:stop].reshape(shape)
        out.flat = flat if out.layout else None
    else:
        for name, dt, shape, start, stop in plan.entries:
            out[name] = raw[start:stop].view(dt).reshape(shape)
    return out


def packed_or_none(weights: dict | None) -> dict | None:
    """``weights`` packed (None stays None, a packed dict stays as it is)."""
    return weights if weights is None or is_packed(weights) else pack(weights)


def unpacked(value: dict | None, writable: bool = True) -> dict | None:
    """A diff or model as arrays, whether it travelled packed or as a plain dict."""
    return unpack(value, writable) if is_packed(value) else value
