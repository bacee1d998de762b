"""The device's part of differential privacy: clip its update, and with local DP noise it, before it leaves.

Both training engines clip with ``clip_update`` (the per-device engine on one device's tensors, the vectorised one
under ``torch.func.vmap`` on the devices' stacked tensors, ``clip_group``), on the compute device, before the diff
is copied out; a real device runs the same task processor, so the same code. What is clipped is the diff of the
model's parameters, as one vector (its L2 norm over every tensor). The diffs of the model's data statistics
(``processors.models.statistic_names``: statistic trackers' running moments) are set to zero: they would leave the
device unclipped and un-noised, so under DP the statistics stay the initial model's (models whose predictions
depend on them, BatchNorm's, are refused; ``docs/privacy.md``).

Central DP (``--dp central``): the device also reports whether its update was within the clip norm
(``common.privacy.UNCLIPPED``), for adaptive clipping's noised count. Local DP (``--dp local``): the device adds
Gaussian noise of standard deviation noise multiplier x clip norm to every clipped parameter (``noise_for``:
secure, from this process's own entropy; or, in simulation, seeded by the run's noise key, the device and the
version it trained, so either engine and a resumed run add the same noise); it reports nothing else.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
import torch
from torch.func import vmap

from common.dp_noise import GaussianNoise
from common.privacy import CLIP_NORM, UNCLIPPED
from common.protocol import DEVICE_EXTRA_PREFIX
from processors.models import build_model

Tensors = dict[str, torch.Tensor]


def clip_update(diff: Tensors, clip_norm: torch.Tensor) -> tuple[Tensors, torch.Tensor]:
    """``diff`` scaled down to L2 norm ``clip_norm`` (its norm over all its tensors) when it is longer, and its
    norm before. Pure tensor code: ``vmap`` runs it per device (``clip_group``)."""
    norm = torch.sqrt(sum((d * d).sum() for d in diff.values()))
    scale = torch.where(norm > clip_norm, clip_norm / norm, torch.ones_like(norm))
    return {name: d * scale for name, d in diff.items()}, norm


def clip_one(diff: Tensors, parameters: Sequence[str], clip_norm: float) -> tuple[Tensors, float]:
    """One device's diff (parameters and statistics) with its parameters clipped and its statistics zeroed; the
    parameters' norm before clipping."""
    part = {name: diff[name] for name in parameters}
    bound = torch.tensor(clip_norm, dtype=torch.float32, device=next(iter(part.values())).device)
    clipped, norm = clip_update(part, bound)
    return {name: clipped[name] if name in clipped else torch.zeros_like(d) for name, d in diff.items()}, float(norm)


def clip_group(stacked: Tensors, parameters: Sequence[str], clip_norms: Sequence[float]) -> tuple[Tensors, list]:
    """The devices' stacked diffs (``[K, ...]`` each) with each device's parameters clipped to its own norm, under
    ``vmap``, and its statistics zeroed; each device's parameter norm before clipping."""
    part = {name: stacked[name] for name in parameters}
    first = next(iter(part.values()))
    bounds = torch.tensor(list(clip_norms), dtype=torch.float32, device=first.device)
    clipped, norms = vmap(clip_update)(part, bounds)
    out = {name: clipped[name] if name in clipped else torch.zeros_like(d) for name, d in stacked.items()}
    return out, norms.tolist()


def clip_norm_for(params: dict, version: int) -> float:
    """The clip norm a version carries for its devices (``CLIP_NORM`` among its extras)."""
    value = params.get(DEVICE_EXTRA_PREFIX + CLIP_NORM)
    if value is None:
        raise ValueError(f"model version {version} carries no clip norm: its server runs without --dp")
    return float(value.reshape(-1)[0])


@functools.lru_cache(maxsize=8)
def parameter_names(model: str) -> tuple[str, ...]:
    """The names of a model's parameters, in order (what is clipped and noised; not its statistics)."""
    return tuple(name for name, _ in build_model(model).named_parameters())


def noise_for(settings: dict | None) -> GaussianNoise | None:
    """Local DP's noise source from the device's settings (``common.privacy.PrivacyConfig.device_settings``);
    None without local DP."""
    if not settings or settings["dp"] != "local":
        return None
    return GaussianNoise(settings.get("noise", "secure"), settings.get("noise_key"))


def local_noise(
    diff: dict[str, np.ndarray],
    parameters: Sequence[str],
    stddev: float,
    noise: GaussianNoise,
    device_id: str,
    version: int,
) -> dict[str, np.ndarray]:
    """``diff`` with Gaussian noise of standard deviation ``stddev`` added to each of its ``parameters`` (float32,
    drawn in the parameters' order; seeded: one draw per device and version)."""
    drawn = noise.arrays([np.shape(diff[n]) for n in parameters], stddev, "local", device_id, version)
    out = dict(diff)
    for name, values in zip(parameters, drawn, strict=True):
        out[name] = diff[name] + values
    return out


def privatized(
    diff: dict[str, np.ndarray],
    settings: dict,
    parameters: Sequence[str],
    clip_norm: float,
    norm: float,
    noise: GaussianNoise | None,
    device_id: str,
    version: int,
) -> dict[str, np.ndarray]:
    """A clipped diff as it leaves the device: with local DP noised (from ``noise``, ``noise_for``), with central
    DP with its ``UNCLIPPED`` bit (``settings``: ``common.privacy.PrivacyConfig.device_settings``)."""
    if settings["dp"] == "local":
        return local_noise(diff, parameters, settings["noise_multiplier"] * clip_norm, noise, device_id, version)
    return dict(diff) | {DEVICE_EXTRA_PREFIX + UNCLIPPED: np.asarray(np.float32(norm <= clip_norm))}
