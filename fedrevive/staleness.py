"""Staleness weighting: beta(tau) and the blend of a stale update with its distilled counterpart."""

from __future__ import annotations

import math

import numpy as np


def beta(tau: float, s_max: float) -> float:
    """Weight of the distilled update for an update of staleness ``tau``.

    A half cosine from 0 (fresh) to 1 (tau = 2 * s_max); beta(s_max) = 0.5. Clipped to [0, 1] because the
    cosine would come back down past 2 * s_max, and very stale updates must not regain trust.
    """
    if s_max <= 0:
        raise ValueError(f"s_max must be > 0, got {s_max}")
    value = 1.0 - 0.5 * (1.0 + math.cos(math.pi * float(tau) / (2.0 * s_max)))
    if tau >= 2.0 * s_max:
        value = 1.0
    return float(min(1.0, max(0.0, value)))


def blend_update(
    delta: dict[str, np.ndarray], delta_kd: dict[str, np.ndarray] | None, beta: float
) -> dict[str, np.ndarray]:
    """(1 - beta) * delta + beta * delta_kd, key by key.

    Keys absent from ``delta_kd`` (BatchNorm statistics, which distillation does not train: they are the
    client's, from its real data) keep the client's delta unchanged; with ``beta == 0`` or no ``delta_kd`` the
    result equals ``delta`` (as fresh copies).
    """
    if delta_kd is None or beta <= 0.0:
        return {k: np.array(v, copy=True) for k, v in delta.items()}
    out: dict[str, np.ndarray] = {}
    for key, value in delta.items():
        kd = delta_kd.get(key)
        if kd is None or not np.issubdtype(np.asarray(value).dtype, np.floating):
            out[key] = np.array(value, copy=True)
            continue
        mixed = (1.0 - beta) * value.astype(np.float32) + beta * kd.astype(np.float32)
        out[key] = mixed.astype(value.dtype, copy=False)
    return out
