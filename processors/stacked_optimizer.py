"""The vectorised engine's optimiser: Adam or SGD (with or without momentum) on K devices' stacked parameters,
with ``torch._foreach_*`` ops, so one step costs the same number of launches whatever K is.

It is ``torch.optim.Adam`` / ``torch.optim.SGD`` (defaults: no weight decay, not amsgrad, no dampening or
Nesterov) applied to each device's slice, as the per-device engine (``processors.training.train_local``) runs
them. Each device may have its own learning rate (the devices of several runs in one group, docs/packs.md): the
step is then scaled by a per-device column instead of a scalar; one rate for every device keeps the scalar step
and its bits.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from processors.training_config import TrainingConfig

ADAM_BETAS = (0.9, 0.999)  # torch.optim.Adam defaults
ADAM_EPS = 1e-8


def learning_rates(lrs: Sequence[float] | None, default: float, k: int) -> tuple[float, torch.Tensor | None]:
    """The group's one learning rate, and a float64 column of each device's -lr when they differ (else None): one
    value for every device takes the scalar step, so its bits are those of a group of one setting."""
    if lrs is None:
        return default, None
    lrs = [float(lr) for lr in lrs]
    if len(lrs) != k:
        raise ValueError(f"{k} devices but {len(lrs)} learning rates")
    if not all(lr > 0 and np.isfinite(lr) for lr in lrs):
        raise ValueError(f"learning rates must be positive and finite, got {lrs}")
    if len(set(lrs)) == 1:
        return lrs[0], None
    return lrs[0], torch.tensor([-lr for lr in lrs], dtype=torch.float64)


class StackedOptimizer:
    """The optimiser of one ``train_group`` call (``cfg``'s optimizer and momentum; ``lrs``: each device's
    learning rate, None for ``cfg.local_lr``), on the stacked ``params`` ([K, ...] each), updated in place."""

    def __init__(self, cfg: TrainingConfig, params: list[torch.Tensor], lrs: Sequence[float] | None, k: int):
        if cfg.optimizer not in ("adam", "sgd"):
            raise ValueError(f"unknown optimizer {cfg.optimizer!r}; use adam or sgd")
        self.adam, self.momentum = cfg.optimizer == "adam", cfg.momentum
        self.lr, column = learning_rates(lrs, cfg.local_lr, k)
        self.exp_avg: list[torch.Tensor] = []  # Adam exp_avg / SGD momentum buffer
        self.exp_avg_sq: list[torch.Tensor] = []  # Adam exp_avg_sq
        if self.adam:
            self.exp_avg = [torch.zeros_like(p) for p in params]
            self.exp_avg_sq = [torch.zeros_like(p) for p in params]
        self.column = None  # each device's -lr (float64), and the shapes that scale its slice of every tensor
        if column is not None:
            self.column = column.to(params[0].device)
            self.shapes = [(k, *(1 for _ in p.shape[1:])) for p in params]
            self.neg_lrs = [self.column.to(params[0].dtype).view(shape) for shape in self.shapes]

    @property
    def state(self) -> list[torch.Tensor]:
        """Its per-device state tensors (what a frozen device must get back, ``processors.group_schedule``)."""
        return [*self.exp_avg, *self.exp_avg_sq]

    def step(self, params: list[torch.Tensor], grads: list[torch.Tensor], t: int) -> None:
        """Step ``t`` (from 0) of every device, from its gradients ``grads``."""
        if self.adam:
            self._adam(params, grads, t + 1)
            return
        if self.momentum != 0:
            if t == 0:
                self.exp_avg = [g.clone() for g in grads]
            else:
                torch._foreach_mul_(self.exp_avg, self.momentum)
                torch._foreach_add_(self.exp_avg, grads)
        direction = self.exp_avg if self.momentum != 0 else grads
        if self.column is None:
            torch._foreach_add_(params, direction, alpha=-self.lr)
        else:
            torch._foreach_addcmul_(params, direction, self.neg_lrs)

    def _adam(self, params: list[torch.Tensor], grads: list[torch.Tensor], step: int) -> None:
        """torch.optim.Adam's update. All devices take the same number of steps, so the bias corrections are shared
        scalars."""
        beta1, beta2 = ADAM_BETAS
        exp_avg, exp_avg_sq = self.exp_avg, self.exp_avg_sq
        torch._foreach_lerp_(exp_avg, grads, 1 - beta1)
        torch._foreach_mul_(exp_avg_sq, beta2)
        torch._foreach_addcmul_(exp_avg_sq, grads, grads, value=1 - beta2)
        bias_correction1 = 1 - beta1**step
        bias_correction2 = 1 - beta2**step
        denom = torch._foreach_sqrt(exp_avg_sq)
        torch._foreach_div_(denom, bias_correction2**0.5)
        torch._foreach_add_(denom, ADAM_EPS)
        if self.column is None:
            torch._foreach_addcdiv_(params, exp_avg, denom, value=-(self.lr / bias_correction1))
        else:  # (-lr_i / bias_correction1) * exp_avg / denom: each step size in float64, then rounded, as the
            steps = (self.column / bias_correction1).to(params[0].dtype)  # per-device optimiser rounds its scalar
            scaled = torch._foreach_mul(exp_avg, [steps.view(shape) for shape in self.shapes])
            torch._foreach_addcdiv_(params, scaled, denom)
