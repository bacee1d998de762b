"""Which training samples a simulated device holds: Dirichlet non-IID or IID, drawn per device.

Each device's subset depends only on the run seed, the device's key and the dataset labels, so the same
device gets the same data in every process and every run, without any shared state between leaves.
Seeds come from SHA-256, never from Python's per-process salted ``hash()``.
"""

from __future__ import annotations

import functools

import numpy as np

from common.seeds import stable_seed


@functools.lru_cache(maxsize=8)
def _class_pools(labels_bytes: bytes, num_classes: int) -> tuple[np.ndarray, ...]:
    labels = np.frombuffer(labels_bytes, dtype=np.int64)
    return tuple(np.flatnonzero(labels == c) for c in range(num_classes))


def device_indices(
    labels: np.ndarray,
    device_key: str,
    subset_size: int,
    dirichlet_alpha: float | None,
    seed: int,
    num_classes: int = 10,
) -> np.ndarray:
    """Indices into the training set for one device.

    dirichlet_alpha None (or <= 0) means IID: a uniform sample without replacement. Otherwise class
    proportions are drawn from Dirichlet(alpha) and samples drawn from each class's pool.
    """
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
