"""FedRevive's teachers in one batched forward pass instead of one after another.

The teacher buffer holds up to 8 client models of one architecture. Their weights and data statistics are stacked
(``torch.func.stack_module_state``) and one ``torch.func.vmap`` of ``functional_call`` runs all of them: the
convolutions of 8 teachers become one grouped call, so a synthesis step or a KD step launches one teacher pass
instead of eight (on a GPU, where each small convolution is bound by its launch, that is most of their cost).

What each teacher computes is unchanged, and so is every reference behaviour around it: the same logits, the same
feature statistics (the per-channel mean and biased variance of each statistic layer's input, against that
teacher's own running statistics, ``fedrevive.feature_stats``), summed over teachers in the buffer's order with
the same class weights, then stabilised as before (``fedrevive.stabilize``). Batched convolutions sum in another
order, so the results equal the loop's to rounding, not bit for bit: ``FedReviveConfig.batched_teachers`` decides
(``auto``: batched on CUDA only, so a CPU run keeps its bits). A model without data statistics (the feature
statistics' "conv" mode, with a reference recorded on noise) always runs the loop.
"""

from __future__ import annotations

import torch
import torch.nn as nn
from torch.func import functional_call, stack_module_state, vmap

from fedrevive.feature_stats import STATISTIC_LAYERS, channel_stats, has_statistics
from fedrevive.teachers import Teacher


def batches_teachers(setting: str, device: torch.device, model: nn.Module) -> bool:
    """Whether teachers of ``model``'s architecture run batched: ``on``, or ``auto`` on CUDA; never for a model
    without data statistics."""
    if not has_statistics(model):
        return False
    return setting == "on" or (setting == "auto" and device.type == "cuda")


class TeacherBatch:
    """The given teachers, stacked (a copy of their weights and statistics: build one per set of teachers)."""

    def __init__(self, teachers: list[Teacher]):
        models = [t.model for t in teachers]
        self.template = models[0]  # functional_call runs its code with each teacher's tensors
        self.params, self.buffers = stack_module_state(models)
        self.layers = {name: m for name, m in self.template.named_modules() if isinstance(m, STATISTIC_LAYERS)}

    def __len__(self) -> int:
        return next(iter(self.params.values())).shape[0]

    def logits_and_feature_loss(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Every teacher on the same ``images`` (N x C x H x W): logits (teachers x N x classes) and each teacher's
        feature-statistics mismatch (teachers,), as ``FeatureStats.loss`` gives it for one teacher."""
        stats: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

        def record(name: str):
            def hook(_module: nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
                stats[name] = channel_stats(inputs[0])

            return hook

        def one(params: dict, buffers: dict, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            stats.clear()
            logits = functional_call(self.template, (params, buffers), (x,))
            terms = [
                torch.linalg.vector_norm(mean - buffers[f"{name}.running_mean"])
                + torch.linalg.vector_norm(var - buffers[f"{name}.running_var"])
                for name, (mean, var) in stats.items()
                if f"{name}.running_mean" in buffers
            ]
            return logits, torch.stack(terms).sum() if terms else logits.new_zeros((), dtype=torch.float32)

        handles = [module.register_forward_pre_hook(record(name)) for name, module in self.layers.items()]
        try:
            return vmap(one, in_dims=(0, 0, None))(self.params, self.buffers, images)
        finally:
            for handle in handles:
                handle.remove()

    @torch.no_grad()
    def logits_each(self, images: torch.Tensor) -> torch.Tensor:
        """Teacher k on its own batch ``images[k]`` (teachers x N x C x H x W): logits, teachers x N x classes."""

        def one(params: dict, buffers: dict, x: torch.Tensor) -> torch.Tensor:
            return functional_call(self.template, (params, buffers), (x,))

        return vmap(one)(self.params, self.buffers, images)
