"""The server's versions: kept once as their blob, the oldest spilled to disk past the cap and read back bit for
bit; and the versions forgotten one by one as the schedule says they stop being needed are exactly those the
full comparison would forget."""

from __future__ import annotations

import os

import numpy as np
import pytest

from aggregation.version_store import VersionStore
from common.delays import DELAY_PRESETS
from common.packed_weights import unpack
from scheduling.event_reference import make_schedule


def weights(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "w": rng.standard_normal((16, 8)).astype(np.float32),
        "b": rng.standard_normal(8).astype(np.float32),
        "n": np.array(seed, np.int64),
    }


def test_versions_past_the_cap_go_to_disk_and_come_back_bit_for_bit(tmp_path):
    one = sum(a.nbytes for a in weights(0).values())
    store = VersionStore(3.5 * one, lambda: str(tmp_path / "spilled"))
    for v in range(1, 11):
        kept = store.put(v, weights(v))
        assert kept["w"].tobytes() == weights(v)["w"].tobytes()
    assert store.peak == (10, 3 * one, 7 * one)  # never more than the cap in memory, the newest always there
    assert sorted(os.listdir(tmp_path / "spilled")) == sorted(f"{v}.bin" for v in range(1, 8))
    for v in range(1, 11):
        for source in (store.get(v), unpack(store.packed(v))):
            assert {k: a.tobytes() for k, a in source.items()} == {k: a.tobytes() for k, a in weights(v).items()}
    store.discard(2)
    assert 2 not in store and not os.path.exists(tmp_path / "spilled" / "2.bin")
    with pytest.raises(KeyError):
        store.get(2)
    store.close(spilled_only=True)
    assert sorted(store) == [8, 9, 10] and not os.path.exists(tmp_path / "spilled")


def test_a_cap_of_zero_keeps_only_the_newest_in_memory():
    store = VersionStore(0)
    for v in range(1, 4):
        store.put(v, weights(v))
    assert store.peak[1] == sum(a.nbytes for a in weights(0).values())
    assert store.get(1)["b"].tobytes() == weights(1)["b"].tobytes()
    store.close()
    assert len(store) == 0


def test_the_versions_told_unneeded_one_by_one_are_those_no_device_in_flight_trains():
    s = make_schedule(DELAY_PRESETS["paper"], 4, {"site-1": 40, "site-2": 40}, 30, 2, 1, max_model_version=120)
    s.start()
    kept = {1}
    while not s.done:
        _arrival, _selected = s.apply(s.next_due().device)
        kept |= {s.version}
        kept -= s.take_unneeded_versions()
        assert kept == s.needed_versions()  # the full comparison the server used to make after every update
    assert len(kept) > 5  # stale devices keep several versions alive: the test is not trivial
