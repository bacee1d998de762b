"""Conversions between numpy weight dicts (name -> array, parameters only or full state) and torch models."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn


def load_weights(model: nn.Module, weights: dict[str, np.ndarray]) -> nn.Module:
    """Copy ``weights`` into ``model`` in place; entries it lacks (e.g. buffers) keep the model's own values."""
    state = model.state_dict()
    unknown = sorted(set(weights) - set(state))
    if unknown:
        raise KeyError(f"weights hold names the model does not have: {unknown[:5]}")
    with torch.no_grad():
        for name, value in weights.items():
            target = state[name]
            target.copy_(torch.as_tensor(np.asarray(value)).to(device=target.device, dtype=target.dtype))
    return model


def parameter_delta(after: nn.Module, before: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """after - before, for the trainable parameters named in ``before`` (float32 numpy)."""
    out: dict[str, np.ndarray] = {}
    for name, param in after.named_parameters():
        if name in before:
            out[name] = param.detach().cpu().numpy().astype(np.float32) - before[name].astype(np.float32)
    return out


def frozen(model: nn.Module) -> nn.Module:
    """``model`` in eval mode, no parameter requiring a gradient (a teacher, or the global model as reference)."""
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model
