"""Intermediate feature statistics of a model, for DeepInversion-style statistics matching.

Forward hooks are attached only inside a ``with FeatureStats(model)`` block, so the model's forward pass and its
state are untouched; the hooks see every forward pass run inside the block and keep the last one's statistics.

Two modes, picked by the architecture:

* ``"statistics"`` (models that carry data statistics: ``BatchNorm2d`` as in ResNet-18, or ``StatTracker`` as in
  Cifar10ConvNet and the reference's models): a forward pre-hook on each such layer takes the per-channel mean /
  variance of the layer's *input* batch (a convolution's output, before the activation) and compares them with
  that layer's ``running_mean`` / ``running_var``. A teacher is its client's uploaded model, so these are the
  statistics of the client's real training data.
* ``"conv"`` (other models, e.g. a user's network without BatchNorm): a forward hook on each Conv2d takes the
  per-channel mean / variance of its *output*. Such models store no data statistics, so the reference has to be
  recorded by the same hooks from some batch (``record_reference``). Without data on the server we record it
  from Gaussian noise in normalised image space (the data's first two moments); matching it acts as a scale
  regulariser that keeps synthetic images in the activation range the model produces on data-scaled input,
  rather than as a true data prior. Without a reference the loss is 0.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from processors.models.stat_tracker import StatTracker
from processors.precision import widened

Stats = dict[str, tuple[torch.Tensor, torch.Tensor]]


STATISTIC_LAYERS = (nn.BatchNorm2d, StatTracker)


def has_statistics(model: nn.Module) -> bool:
    """Whether the model carries its training data's feature statistics (BatchNorm or statistic trackers)."""
    return any(isinstance(m, STATISTIC_LAYERS) for m in model.modules())


def channel_stats(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel mean and biased variance of an (N, C, H, W) batch, in float32 from bfloat16 activations
    (``--precision bf16``); a float32 or float64 batch is used as it is."""
    x = widened(x)
    mean = x.mean(dim=(0, 2, 3))
    var = x.var(dim=(0, 2, 3), unbiased=False)
    return mean, var


class FeatureStats:
    """Context manager that records per-layer channel statistics of the forward passes run inside it."""

    def __init__(self, model: nn.Module, reference: Stats | None = None):
        self.model = model
        self.mode = "statistics" if has_statistics(model) else "conv"
        self.reference = reference
        self.stats: Stats = {}
        self._handles: list[torch.utils.hooks.RemovableHandle] = []

    def __enter__(self) -> FeatureStats:
        for name, module in self.model.named_modules():
            if self.mode == "statistics" and isinstance(module, STATISTIC_LAYERS):
                self._handles.append(module.register_forward_pre_hook(self._input_hook(name)))
            elif self.mode == "conv" and isinstance(module, nn.Conv2d):
                self._handles.append(module.register_forward_hook(self._conv_hook(name)))
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _input_hook(self, name: str):
        def hook(module: nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
            self.stats[name] = channel_stats(inputs[0])

        return hook

    def _conv_hook(self, name: str):
        def hook(module: nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
            self.stats[name] = channel_stats(output)

        return hook

    def references(self) -> Stats:
        """The target statistics per hooked layer: its running statistics, or the recorded reference."""
        if self.mode == "statistics":
            modules = dict(self.model.named_modules())
            return {
                name: (modules[name].running_mean, modules[name].running_var)
                for name in self.stats
                if modules[name].running_mean is not None
            }
        return self.reference or {}

    def loss(self) -> torch.Tensor:
        """Sum over layers of ||mean - ref_mean||_2 + ||var - ref_var||_2 for the last forward pass."""
        refs = self.references()
        terms = [
            torch.linalg.vector_norm(mean - refs[name][0]) + torch.linalg.vector_norm(var - refs[name][1])
            for name, (mean, var) in self.stats.items()
            if name in refs
        ]
        if not terms:
            device = next(self.model.parameters()).device
            return torch.zeros((), device=device)
        return torch.stack(terms).sum()


@torch.no_grad()
def record_reference(model: nn.Module, x: torch.Tensor) -> Stats:
    """Per-layer statistics of ``model`` on batch ``x``, detached, to serve as a "conv"-mode reference."""
    with FeatureStats(model) as fs:
        model(x)
    return {name: (mean.detach().clone(), var.detach().clone()) for name, (mean, var) in fs.stats.items()}
