"""Seeded initial weights: the global model a run starts from depends on ``--seed`` only.

The server's persistor builds the initial model from its class path; without a seed each run (and each method
in a comparison) would start from different random weights.
"""

from __future__ import annotations

import torch
import torch.nn as nn


def reset_parameters_seeded(module: nn.Module, seed: int) -> None:
    """Re-initialise every submodule's parameters from ``seed``, without touching torch's global RNG state."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for m in module.modules():
            if m is not module and hasattr(m, "reset_parameters"):
                m.reset_parameters()
