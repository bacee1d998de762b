"""FedAvg's and FedBuff's server sum packed diffs as one float32 vector and write each version straight into its
blob (``BufferedMean`` on ``PackedArrays``): the versions must be the per-tensor path's, bit for bit, with data
statistics between the parameters, counts above 1, a buffer resumed from a checkpoint, and a diff that did not
travel packed."""

from __future__ import annotations

import pickle

import numpy as np

from aggregation.buffered_mean import BufferedMean
from aggregation.strategy import ServerContext
from aggregation.version_store import VersionStore
from common.packed_weights import PackedArrays, pack, unpack, views

SHAPES = {"conv.w": (6, 3, 5), "conv.b": (6,), "t.mean": (6,), "t.var": (6,), "fc.w": (10, 20), "fc.b": (10,)}
STATISTICS = frozenset({"t.mean", "t.var"})


class History:
    """The versions a strategy reads, kept plain or packed."""

    def __init__(self, packed: bool):
        self.packed, self.versions = packed, {}

    def put(self, version: int, weights: dict) -> None:
        self.versions[version] = views(pack(weights)) if self.packed else {k: v.copy() for k, v in weights.items()}

    @property
    def current_version(self) -> int:
        return max(self.versions)

    @property
    def current_weights(self) -> dict:
        return self.versions[self.current_version]

    def weights_of(self, version: int) -> dict:
        return self.versions[version]


def _random(rng: np.random.Generator, scale: float) -> dict[str, np.ndarray]:
    # magnitudes spread over many binades, so a different order of float32 operations would show in the bits
    return {
        k: (scale * rng.standard_normal(s) * 10.0 ** rng.integers(-4, 3, s)).astype(np.float32)
        for k, s in SHAPES.items()
    }


def _run(packed: bool, resume_at: int | None = None) -> list[bytes]:
    rng = np.random.default_rng(7)
    strategy = BufferedMean(global_lr=0.05)
    strategy.setup(ServerContext("m", STATISTICS, 0, "cpu", ""))
    history = History(packed)
    history.put(1, _random(rng, 1.0))
    made = []
    for step in range(12):
        diff = _random(rng, 1e-2)
        count = 1 + step % 3
        if packed and step != 5:  # one diff as a plain dict: the sum goes on per tensor, the bits the same
            diff = unpack(pack(diff), writable=False)
        base = max(1, history.current_version - step % 2)
        strategy.buffer(diff, count, base, history)
        if resume_at == step:  # a checkpoint's buffer comes back as a plain dict
            state = pickle.loads(pickle.dumps(strategy.state_dict()))
            assert type(state["sum"]) is dict
            strategy = BufferedMean(global_lr=0.05)
            strategy.setup(ServerContext("m", STATISTICS, 0, "cpu", ""))
            strategy.load_state_dict(state)
        if step % 2:
            new = strategy.make_version(history, 0.0)
            made.append(b"".join(np.ascontiguousarray(new[k]).tobytes() for k in SHAPES))
            history.put(history.current_version + 1, new)
    return made


def test_packed_diffs_make_the_per_tensor_versions_bit_for_bit():
    plain = _run(packed=False)
    assert _run(packed=True) == plain
    assert _run(packed=True, resume_at=2) == plain
    assert _run(packed=False, resume_at=2) == plain


def test_a_version_written_into_a_fresh_blob_is_kept_without_a_copy():
    store = VersionStore(1e9)
    first = store.put(1, _random(np.random.default_rng(1), 1.0))
    assert isinstance(first, PackedArrays) and first.flat is not None
    strategy = BufferedMean(global_lr=1.0)
    strategy.setup(ServerContext("m", STATISTICS, 0, "cpu", ""))
    history = History(packed=True)
    history.versions[1] = first
    strategy.buffer(unpack(pack(_random(np.random.default_rng(2), 1e-2)), writable=False), 1, 1, history)
    new = strategy.make_version(history, 0.0)
    kept = store.put(2, new)
    assert kept is new
    assert bytes(store.packed(2)["data"].value) == bytes(new.blob)
