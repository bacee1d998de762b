"""The server's versions in shared memory: a version written into a fresh slot is kept without a copy, a leaf maps
the very bits the server keeps (from a slot, or from the file a spilled version went to), a version a leaf may
still view is never spilled and its memory outlives a discard until the leaf lets go, a slot the server itself
still reads is never reused, and the ring never grows past the cap."""

from __future__ import annotations

import gc
import os

import numpy as np

from aggregation.version_store import VersionStore
from common.packed_weights import LAYOUT, PACKED, unpack, views
from common.shared_ring import FILE_KIND, HANDLE, attach, map_file


def weights(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"w": rng.standard_normal((64, 16)).astype(np.float32), "b": rng.standard_normal(16).astype(np.float32)}


def as_bytes(arrays: dict) -> dict[str, bytes]:
    return {k: np.asarray(a).tobytes() for k, a in arrays.items()}


def mapped(store: VersionStore, handle: dict):
    """What a leaf makes of a handle: read-only views of the slot, or of the spill file."""
    blob = map_file(handle) if handle[HANDLE] == FILE_KIND else attach(store.ring().locator()).view(handle)
    return views({PACKED: 1, LAYOUT: handle["layout"]}, blob)


def one_slot_bytes() -> int:
    return 4096 * 2  # a version of 4,160 bytes takes two pages with its slot's header


def test_a_leaf_maps_the_bits_the_server_keeps_from_a_slot_or_from_a_spill_file(tmp_path):
    store = VersionStore(3 * one_slot_bytes(), lambda: str(tmp_path / "spilled"), shared=True)
    for v in range(1, 8):
        store.put(v, weights(v))
    assert store.ring().max_slots == 3 and store.ring().grown == 3  # never more memory than the cap
    kinds = {}
    for v in range(1, 8):
        handle = store.handle(v, "site-1")
        kinds[v] = handle[HANDLE]
        assert as_bytes(mapped(store, handle)) == as_bytes(weights(v))
        assert as_bytes(store.get(v)) == as_bytes(unpack(store.packed(v))) == as_bytes(weights(v))
    assert kinds == {1: "file", 2: "file", 3: "file", 4: "file", 5: "memfd", 6: "memfd", 7: "memfd"}
    assert all(os.stat(tmp_path / "spilled" / f"{v}.bin").st_mode & 0o777 == 0o600 for v in range(1, 5))


def test_a_version_written_into_a_fresh_slot_is_kept_without_a_copy():
    store = VersionStore(4 * one_slot_bytes(), shared=True)
    first = store.put(1, weights(1))
    new = store.fresh(first.layout)
    np.add(first.flat, 1.0, out=new.flat)  # a strategy writes the next version into it
    kept = store.put(2, new)
    assert kept is new and store.get(2) is new  # the same arrays: no copy was made to keep it
    assert as_bytes(mapped(store, store.handle(2, "site-1"))) == as_bytes({k: a + 1 for k, a in weights(1).items()})


def test_a_version_a_leaf_may_view_is_never_spilled_and_outlives_a_discard_until_the_leaf_lets_go(tmp_path):
    store = VersionStore(2 * one_slot_bytes(), lambda: str(tmp_path / "spilled"), shared=True)
    store.put(1, weights(1))
    handle = store.handle(1, "site-1")  # sent to site-1: leased to it
    for v in (2, 3, 4):
        store.put(v, weights(v))  # the ring's two slots are full: version 1 would go first, but site-1 may view it
    assert 1 in store._slots and 2 in store._disk
    view = mapped(store, handle)
    store.discard(1)  # no device trains it any more; site-1 has not said it let go
    for v in (5, 6):
        store.put(v, weights(v))
    assert as_bytes(view) == as_bytes(weights(1))  # its slot was not reused
    store.held("site-1", {6})  # site-1's next report: it holds version 6 only
    for v in (7, 8):
        store.put(v, weights(v))
    assert as_bytes(view) != as_bytes(weights(1))  # its slot went to a newer version once site-1 let go
    assert store.ring().grown == 2


def test_a_spilled_version_a_leaf_was_sent_keeps_its_file_until_the_leaf_lets_go(tmp_path):
    store = VersionStore(2 * one_slot_bytes(), lambda: str(tmp_path / "spilled"), shared=True)
    for v in range(1, 5):
        store.put(v, weights(v))
    handle = store.handle(1, "site-2")
    assert handle[HANDLE] == FILE_KIND
    store.discard(1)
    assert os.path.exists(handle["path"])  # site-2 may not have mapped it yet
    store.held("site-2", set())
    assert not os.path.exists(handle["path"])


def test_a_slot_the_server_still_reads_is_not_reused_after_its_version_goes():
    """The evaluator may still score a version the run forgot: its arrays keep their bits."""
    store = VersionStore(2 * one_slot_bytes(), shared=True)
    evaluating = store.put(1, weights(1))
    store.put(2, weights(2))
    store.discard(1)
    for v in range(3, 7):
        store.put(v, weights(v))
        store.discard(v - 1)
    assert as_bytes(evaluating) == as_bytes(weights(1))
    assert store.ring().grown == 2 and len(store) == 1  # the newest in a slot; version 1's still read here
    del evaluating
    gc.collect()
    store.put(7, weights(7))
    store.put(8, weights(8))
    assert store.ring().grown == 2 and 7 in store._slots and 8 in store._slots


def test_without_shared_memory_the_store_keeps_what_it_always_kept():
    store = VersionStore(3 * 4160, shared=False)
    for v in range(1, 6):
        store.put(v, weights(v))
    assert store.ring() is None and store.handle(5, "site-1") is None
    assert store.peak == (5, 3 * 4160, 2 * 4160)
