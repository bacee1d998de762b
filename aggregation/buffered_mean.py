"""FedAvg and FedBuff on the server: the next version is the current one plus ``global_lr`` times the mean of the
updates buffered since the last version.

``global <- global + global_lr * mean(buffered diffs)``, as NVFlare's ``BuffModelManager`` and the FedRevive
reference (``add_update_to_params``) do, for the parameters. The model's data statistics (BatchNorm running mean /
variance, ``context.statistics``) are estimates, not steps: the next version's are the mean of the buffered
devices' own statistics (each device's base version plus its diff), neither scaled by ``global_lr`` nor added to
the current ones. Adding stale statistic diffs to newer statistics could drive a variance below zero; the mean of
variances cannot. In a synchronous run with ``global_lr`` 1 both rules give the same numbers.

Weighting (``weighting``, the method's ``jobs.methods.Method.weighting``): ``devices`` (the default) gives every
update the weight of its ``count`` (1 per device, 0 for a failed one), FedBuff's and today's FedAvg's uniform mean;
``samples`` gives each device the weight of the samples it holds, FedAvg's ``n_k / n`` (McMahan et al.): the device
sends its diff already times its ``data_size`` (``processors.reports.weigh_by_samples``, so a leaf's sum of a
selection still sums weighted diffs), and the mean divides by the summed ``data_size`` reports.

Diffs are added in the order the schedule applies them, into a float32 sum, so the same run gives the same bits
whatever order leaves reported in. Synchronous FedAvg and asynchronous FedBuff differ only in B and the
selection (the schedule's business), not here.
"""

from __future__ import annotations

import numpy as np

from aggregation.strategy import ModelHistory, ServerStrategy, Update, Weights
from common.protocol import DATA_SIZE


class BufferedMean(ServerStrategy):
    """Args:
    global_lr: server learning rate applied to the mean of the buffered updates.
    weighting: ``devices`` or ``samples`` (see the module docstring).
    """

    def __init__(self, global_lr: float = 1.0, weighting: str = "devices"):
        if weighting not in ("devices", "samples"):
            raise ValueError(f"weighting {weighting!r}: use devices or samples")
        self.global_lr = global_lr
        self.weighting = weighting
        self._sum: Weights | None = None
        self._count = 0

    def add_update(self, update: Update, model: ModelHistory) -> None:
        self.buffer(update.diff, self.weight_of(update), update.base_version, model)

    def weight_of(self, update: Update) -> float:
        """The update's weight in the mean: its device count, or (weighting by samples) its devices' summed
        ``data_size`` (0 for a failed device, which reports none)."""
        if self.weighting == "devices":
            return update.count
        if not update.count:
            return 0
        if DATA_SIZE not in update.reports:
            raise ValueError(f"device {update.device}'s update lacks its {DATA_SIZE!r} report: weighting by samples")
        return float(update.reports[DATA_SIZE])

    def buffer(self, diff: Weights, count: float, base_version: int, model: ModelHistory) -> None:
        """Add a diff (of ``count`` devices, summed, all trained from ``base_version``) to the buffer: parameters
        as diffs, statistics as the devices' own values (``count`` times the base plus the summed diffs)."""
        statistics = self.context.statistics
        if statistics:
            base = model.weights_of(base_version)
            diff = {k: v + np.float32(count) * base[k] if k in statistics else v for k, v in diff.items()}
        if self._sum is None:
            self._sum = {k: v.copy() for k, v in diff.items()}
        else:
            for k, v in diff.items():
                self._sum[k] += v
        self._count += count

    def make_version(self, model: ModelHistory, sim_time: float) -> Weights:
        """current + global_lr * mean(buffer) (statistics: the buffer's mean); the buffer empties."""
        new = {k: v.copy() for k, v in model.current_weights.items()}
        if self._sum is not None and self._count > 0:
            scale = np.float32(self.global_lr / self._count)
            for k, v in self._sum.items():
                if k in self.context.statistics:
                    new[k] = v / np.float32(self._count)
                else:
                    new[k] += scale * v
        self._sum, self._count = None, 0
        return new

    def state_dict(self) -> dict:
        return {"sum": self._sum, "count": self._count}

    def load_state_dict(self, state: dict) -> None:
        self._sum, self._count = state["sum"], state["count"]
