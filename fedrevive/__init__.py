"""FedRevive core (pure PyTorch): staleness-weighted blending of stale client updates with server-side
data-free knowledge distillation (Askin et al., arXiv 2511.00655).

The names below load when first used, so ``fedrevive.config`` (part of every job's configuration) imports
without torch."""

from __future__ import annotations

import importlib

_WHERE = {
    "FedReviveConfig": "fedrevive.config",
    "FedReviveDistiller": "fedrevive.distill",
    "kd_step": "fedrevive.distill",
    "beta": "fedrevive.staleness",
    "blend_update": "fedrevive.staleness",
}
__all__ = ["FedReviveConfig", "FedReviveDistiller", "beta", "blend_update", "kd_step"]


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'fedrevive' has no attribute {name!r}")
