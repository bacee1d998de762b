"""Which training samples a simulated device holds: Dirichlet non-IID, IID, or one real user's. The partitions:

* ``device`` (the default; ``dirichlet`` is the same): drawn per device. Class counts are a multinomial draw from the device's Dirichlet
  proportions, and each class's samples a uniform draw from its pool; devices overlap at random.
* ``references``: the references' shards (R2 ``data._split_dirichlet``, as R1): counts are the Dirichlet
  proportions x the subset size, rounded (a positive remainder goes to a random class, a negative one comes off the
  largest count), and each class pool is shuffled once and dealt out in order, reshuffled when the next count no
  longer fits. So shards are disjoint until a pool runs out, and every image is used about equally often. The
  references deal one sequence over all clients; here each device range (a leaf's ``site-1#0``, ``site-1#1``, ...)
  deals its own, device ``#i`` getting shard ``i``, because a leaf process knows its own devices only.
* ``iid``: ``device`` with ``dirichlet_alpha`` 0, whatever it is set to: a uniform draw of ``subset_size`` samples.
* ``natural``: the device *is* one user of a dataset that knows its users (``processors.data.users``) and holds
  all of that user's training samples (``subset_size`` and ``dirichlet_alpha`` do not apply). Which user: the
  device's *global* index ``g`` (its place in the server's pool: leaves' ranges in name order, ``devices_per_leaf``
  each, so device ``PREFIX#i`` is ``offsets[PREFIX] + i``; ``range_offsets``) is user ``order[g mod U]``, where
  ``order`` is one permutation of the U users (sorted by name) seeded by the run seed alone. So the first U devices
  of the whole pool are U different users, whichever leaves they are on: a pool of at most U devices holds no user
  twice, and a larger pool holds every user on ``floor`` or ``ceil`` of P / U devices (P the pool). The job passes
  the offsets to every process that maps devices (the leaves' task processors, the server's and ``--dry-run``'s
  work function), computed from the run's leaf names and ``devices_per_leaf``. A device without an index (a real
  one), or of a leaf the offsets do not name (a recipe that passes none), is user ``stable_seed(seed, key) mod U``.
  The permutation is made once per process, on first use (O(U)); an idle device costs nothing.

Either way a device's subset depends only on the run seed, the device's key and the dataset labels (and, for
``natural``, the run's layout of leaves, fixed at its start), so the same device gets the same data in every process
and every run, without any state shared between leaves. Seeds come from
SHA-256, never from Python's per-process salted ``hash()``.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterable, Mapping

import numpy as np

from common.seeds import stable_seed
from processors.data.users import UserSplit

PARTITIONS = ("device", "references", "natural", "iid", "dirichlet")
NEEDS_USERS = ("natural",)  # the partitions that need a dataset with users


@functools.lru_cache(maxsize=8)
def _class_pools(labels_bytes: bytes, num_classes: int) -> tuple[np.ndarray, ...]:
    labels = np.frombuffer(labels_bytes, dtype=np.int64)
    return tuple(np.flatnonzero(labels == c) for c in range(num_classes))


def device_sample_count(
    labels: np.ndarray,
    device_key: str,
    subset_size: int,
    dirichlet_alpha: float | None,
    seed: int,
    num_classes: int = 10,
    partition: str = "device",
    users: UserSplit | None = None,
    offsets: Mapping[str, int] | None = None,
) -> int:
    """How many samples a device holds: the length of its index array (``device_indices``), the one source of
    truth for its local work with ``--local-epochs`` (``processors.local_work``) and its simulated time."""
    if partition == "natural" and users is not None:
        return users.train_size(natural_user(device_key, seed, users.count, offsets))  # a lazy user: its size only
    return len(device_indices(labels, device_key, subset_size, dirichlet_alpha, seed, num_classes, partition, users))


def device_indices(
    labels: np.ndarray,
    device_key: str,
    subset_size: int,
    dirichlet_alpha: float | None,
    seed: int,
    num_classes: int = 10,
    partition: str = "device",
    users: UserSplit | None = None,
    offsets: Mapping[str, int] | None = None,
) -> np.ndarray:
    """Indices into the training set for one device.

    dirichlet_alpha None (or <= 0) means IID: a uniform sample without replacement. Otherwise class
    proportions are drawn from Dirichlet(alpha) and samples drawn from each class's pool (``partition``: how, see
    the module docstring). ``natural`` takes the dataset's ``users`` instead (``offsets``: each leaf's first
    global device index, ``range_offsets``).
    """
    if partition == "natural":
        if users is None:
            raise ValueError("--partition natural needs a dataset with users (femnist, shakespeare, a TFF .h5, hf:)")
        return users.train_range(natural_user(device_key, seed, users.count, offsets))
    if partition == "iid":
        partition, dirichlet_alpha = "device", None
    elif partition == "dirichlet":
        partition = "device"
    if partition == "references" and dirichlet_alpha and dirichlet_alpha > 0:
        return references_indices(labels, device_key, subset_size, dirichlet_alpha, seed, num_classes)
    if partition not in PARTITIONS:
        raise ValueError(f"--partition {partition!r}: use {' or '.join(PARTITIONS)}")
    rng = np.random.default_rng(stable_seed("partition", seed, device_key))
    n = len(labels)
    if not dirichlet_alpha or dirichlet_alpha <= 0:
        return np.sort(rng.choice(n, size=min(subset_size, n), replace=False))
    pools = _class_pools(np.ascontiguousarray(labels, dtype=np.int64).tobytes(), num_classes)
    sizes = np.array([len(p) for p in pools], dtype=float)
    present = sizes > 0
    proportions = np.zeros(num_classes)
    proportions[present] = rng.dirichlet(np.full(present.sum(), dirichlet_alpha))
    counts = rng.multinomial(subset_size, proportions)
    chosen = [rng.choice(pools[c], size=k, replace=k > len(pools[c])) for c, k in enumerate(counts) if k > 0]
    return np.sort(np.concatenate(chosen))


class _Dealer:
    """One device range's shards, dealt in order from its shuffled class pools (R2's ``_split_dirichlet``)."""

    def __init__(self, pools: tuple[np.ndarray, ...], subset_size: int, alpha: float, seed: int):
        self.rng = np.random.default_rng(seed)
        self.pools = [self.rng.permutation(p) for p in pools]
        self.used = [0] * len(pools)
        self.present = np.array([len(p) > 0 for p in pools])
        self.subset_size = subset_size
        self.alpha = alpha
        self.shards: list[np.ndarray] = []
        self.lock = threading.Lock()  # a leaf's worker threads share it; the shards never depend on who asks first

    def shard(self, ordinal: int) -> np.ndarray:
        with self.lock:
            while len(self.shards) <= ordinal:
                self.shards.append(self._deal())
            return self.shards[ordinal]

    def _deal(self) -> np.ndarray:
        rng, n = self.rng, self.subset_size
        proportions = np.zeros(len(self.pools))
        # a class with no samples gets no share (the references' data has all ten)
        proportions[self.present] = rng.dirichlet(np.full(self.present.sum(), self.alpha))
        counts = np.round(proportions * n).astype(np.int64)
        remainder = n - int(counts.sum())
        if remainder > 0:  # the references add it to any class; here any class that has samples
            counts[rng.choice(np.flatnonzero(self.present))] += remainder
        while remainder < 0:
            counts[int(np.argmax(counts))] -= 1
            remainder += 1
        chosen = []
        for c, k in enumerate(counts):
            pool = self.pools[c]
            if k <= 0:
                continue
            if k > len(pool):  # a pool smaller than one count (tiny data): draw with replacement
                chosen.append(rng.choice(pool, size=k, replace=True))
                continue
            if self.used[c] + k > len(pool):  # this pool is dealt out: reshuffle and start over
                self.pools[c] = pool = rng.permutation(pool)
                self.used[c] = 0
            chosen.append(pool[self.used[c] : self.used[c] + k])
            self.used[c] += int(k)
        return np.concatenate(chosen)


@functools.lru_cache(maxsize=64)
def _dealer(labels_bytes: bytes, num_classes: int, stream: str, subset_size: int, alpha: float, seed: int) -> _Dealer:
    pools = _class_pools(labels_bytes, num_classes)
    return _Dealer(pools, subset_size, alpha, stable_seed("partition-references", seed, stream))


def references_indices(
    labels: np.ndarray, device_key: str, subset_size: int, dirichlet_alpha: float, seed: int, num_classes: int = 10
) -> np.ndarray:
    """The ``references`` partition's shard of ``device_key`` (module docstring): device ``PREFIX#i`` gets shard
    ``i`` of ``PREFIX``'s sequence; a device without an index (a real one) gets the first shard of its own."""
    prefix, _, index = device_key.rpartition("#")
    stream, ordinal = (prefix, int(index)) if prefix and index.isdigit() else (device_key, 0)
    labels_bytes = np.ascontiguousarray(labels, dtype=np.int64).tobytes()
    dealer = _dealer(labels_bytes, num_classes, stream, subset_size, float(dirichlet_alpha), seed)
    return np.sort(dealer.shard(ordinal))


def range_offsets(leaves: Iterable[str], devices_per_leaf: int) -> dict[str, int]:
    """Each leaf's first global device index, as the server's pool numbers devices
    (``scheduling.device_pool.DevicePool``: the leaves' ranges in name order, ``devices_per_leaf`` each)."""
    return {name: rank * devices_per_leaf for rank, name in enumerate(sorted(leaves))}


@functools.lru_cache(maxsize=16)
def _user_order(seed: int, num_users: int) -> np.ndarray:
    return np.random.default_rng(stable_seed("natural-partition", seed)).permutation(num_users)


def natural_user(device_key: str, seed: int, num_users: int, offsets: Mapping[str, int] | None = None) -> int:
    """The user (an index into the sorted user list) device ``device_key`` is, under ``--partition natural``
    (``offsets``: ``range_offsets`` of the run; the module docstring gives the map)."""
    if num_users <= 0:
        raise ValueError("--partition natural: the dataset has no users")
    prefix, _, index = device_key.rpartition("#")
    if offsets and prefix in offsets and index.isdigit():
        return int(_user_order(seed, num_users)[(offsets[prefix] + int(index)) % num_users])
    return stable_seed("natural-partition", seed, device_key) % num_users
