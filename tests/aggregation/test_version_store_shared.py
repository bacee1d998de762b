"""The server's versions where leaves map them: a version written into a fresh slot or file is kept without a copy,
a leaf maps the very bits the server keeps (from a slot, or, once the ring is full, from a file), a version a leaf
may still view keeps its slot or file after the run forgot it until the leaf lets go, a slot the server itself
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


def in_slot(store: VersionStore, version: int) -> bool:
    return store._shared._places[version].slot is not None


def test_a_leaf_maps_the_bits_the_server_keeps_from_a_slot_or_from_a_file(tmp_path):
    """The ring holds three; the versions made while it is full are written straight into files (none copied)."""
    store = VersionStore(3 * one_slot_bytes(), lambda: str(tmp_path / "spilled"), shared=True)
    for v in range(1, 8):
        store.put(v, weights(v))
    assert store.ring().max_slots == 3 and store.ring().grown == 3  # never more memory than the cap
    assert store.peak == (7, 3 * 4160, 4 * 4160)
    kinds = {}
    for v in range(1, 8):
        handle = store.handle(v, "site-1")
        kinds[v] = handle[HANDLE]
        assert as_bytes(mapped(store, handle)) == as_bytes(weights(v))
        assert as_bytes(store.get(v)) == as_bytes(unpack(store.packed(v))) == as_bytes(weights(v))
        if handle[HANDLE] == FILE_KIND:
            assert os.stat(handle["path"]).st_mode & 0o777 == 0o600
    assert kinds == {1: "memfd", 2: "memfd", 3: "memfd", 4: "file", 5: "file", 6: "file", 7: "file"}


def test_a_version_written_into_a_fresh_slot_or_file_is_kept_without_a_copy(tmp_path):
    store = VersionStore(2 * one_slot_bytes(), lambda: str(tmp_path / "spilled"), shared=True)
    first = store.put(1, weights(1))
    for v in (2, 3):  # a slot, then (the ring full) a file
        new = store.fresh(first.layout)
        np.add(first.flat, float(v), out=new.flat)  # a strategy writes the next version into it
        kept = store.put(v, new)
        assert kept is new and store.get(v) is new  # the same arrays: no copy was made to keep it
        expected = {k: a + np.float32(v) for k, a in weights(1).items()}
        assert as_bytes(mapped(store, store.handle(v, "site-1"))) == as_bytes(expected)
    assert in_slot(store, 2) and not in_slot(store, 3)


def test_a_version_a_leaf_may_view_keeps_its_slot_after_the_run_forgot_it_until_the_leaf_lets_go(tmp_path):
    store = VersionStore(2 * one_slot_bytes(), lambda: str(tmp_path / "spilled"), shared=True)
    store.put(1, weights(1))
    view = mapped(store, store.handle(1, "site-1"))  # sent to site-1: leased to it
    store.put(2, weights(2))
    store.discard(1)  # no device trains it any more; site-1 has not said it let go
    store.put(3, weights(3))
    assert not in_slot(store, 3)  # version 1's slot is not free
    assert as_bytes(view) == as_bytes(weights(1))
    store.held("site-1", {2})  # site-1's next report: it holds version 2 only
    store.put(4, weights(4))
    assert in_slot(store, 4) and as_bytes(view) != as_bytes(weights(1))  # the slot went to version 4
    assert store.ring().grown == 2


def test_a_file_a_leaf_was_sent_is_not_reused_until_the_leaf_lets_go_then_it_is(tmp_path):
    """Files are reused as slots are: a new one's pages would cost their faults again for every version."""
    store = VersionStore(2 * one_slot_bytes(), lambda: str(tmp_path / "spilled"), shared=True)
    for v in range(1, 4):
        store.put(v, weights(v))
    handle = store.handle(3, "site-2")
    assert handle[HANDLE] == FILE_KIND
    view = mapped(store, handle)
    store.discard(3)  # site-2 may still read it
    store.put(4, weights(4))
    fourth = store.handle(4, "site-1")["path"]
    assert fourth != handle["path"] and as_bytes(view) == as_bytes(weights(3))
    store.held("site-2", set())
    store.held("site-1", set())
    del view
    store.discard(4)
    store.put(5, weights(5))  # into a file already there
    assert store.handle(5, "site-1")["path"] in {handle["path"], fourth}
    assert len(os.listdir(tmp_path / "spilled")) == 2
    assert as_bytes(mapped(store, store.handle(5, "site-1"))) == as_bytes(weights(5))


def test_a_slot_the_server_still_reads_is_not_reused_after_its_version_goes(tmp_path):
    """The evaluator may still score a version the run forgot: its arrays keep their bits."""
    store = VersionStore(2 * one_slot_bytes(), lambda: str(tmp_path / "spilled"), shared=True)
    evaluating = store.put(1, weights(1))
    store.put(2, weights(2))
    store.discard(1)
    for v in range(3, 7):
        store.put(v, weights(v))
        store.discard(v - 1)
    assert as_bytes(evaluating) == as_bytes(weights(1))
    assert store.ring().grown == 2 and len(store) == 1  # the newest in a slot or a file; version 1's still read
    del evaluating
    gc.collect()
    store.put(7, weights(7))
    store.discard(6)
    store.put(8, weights(8))
    assert store.ring().grown == 2 and in_slot(store, 7) and in_slot(store, 8)


def test_without_shared_memory_the_store_keeps_what_it_always_kept():
    store = VersionStore(3 * 4160, shared=False)
    for v in range(1, 6):
        store.put(v, weights(v))
    assert store.ring() is None and store.handle(5, "site-1") is None
    assert store.peak == (5, 3 * 4160, 2 * 4160)
