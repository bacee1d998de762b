"""FedAvg and FedBuff on the server: the next version is the current one plus ``global_lr`` times the mean of the
updates buffered since the last version.

``global <- global + global_lr * mean(buffered diffs)``, as NVFlare's ``BuffModelManager`` and the FedRevive
reference (``add_update_to_params``) do, for the parameters. The model's data statistics (BatchNorm running mean /
variance, ``context.statistics``) are estimates, not steps: the next version's are the mean of the buffered
devices' own statistics (each device's base version plus its diff), neither scaled by ``global_lr`` nor added to
the current ones. Adding stale statistic diffs to newer statistics could drive a variance below zero; the mean of
variances cannot. In a synchronous run with ``global_lr`` 1 both rules give the same numbers.

Diffs are added in the order the schedule applies them, into a float32 sum, so the same run gives the same bits
whatever order leaves reported in. Synchronous FedAvg and asynchronous FedBuff differ only in B and the
selection (the schedule's business), not here.
"""

from __future__ import annotations

import numpy as np

from aggregation.strategy import ModelHistory, ServerStrategy, Update, Weights


class BufferedMean(ServerStrategy):
    """Args:
    global_lr: server learning rate applied to the mean of the buffered updates.
    """

    def __init__(self, global_lr: float = 1.0):
        self.global_lr = global_lr
        self._sum: Weights | None = None
        self._count = 0

    def add_update(self, update: Update, model: ModelHistory) -> None:
        self.buffer(update.diff, update.count, update.base_version, model)

    def buffer(self, diff: Weights, count: int, base_version: int, model: ModelHistory) -> None:
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
