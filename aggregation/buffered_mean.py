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
whatever order leaves reported in. Diffs and versions that travelled packed (``common.packed_weights.PackedArrays``,
one layout) are summed as one float32 vector, and the next version is written straight into the blob it is kept
and sent in: a few numpy calls per update instead of a few per tensor, the same elementwise float32 operations in
the same order, so the same bits. Synchronous FedAvg and asynchronous FedBuff differ only in B and the
selection (the schedule's business), not here.
"""

from __future__ import annotations

import numpy as np

from aggregation.strategy import ModelHistory, ServerStrategy, Update, Weights
from common.packed_weights import PackedArrays, flat_of, fresh_like, slices_of
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
        self._statistic_slices: dict[str, list[slice]] = {}  # layout -> where the statistics lie in its vector
        self._spare: PackedArrays | None = None  # the last version's sum, its buffer reused for the next one

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
        base = model.weights_of(base_version) if statistics else None
        if self._buffer_flat(diff, count, base):
            return
        if statistics:
            diff = {k: v + np.float32(count) * base[k] if k in statistics else v for k, v in diff.items()}
        if self._sum is None:
            self._sum = {k: v.copy() for k, v in diff.items()}
        else:
            for k, v in diff.items():
                self._sum[k] += v
        self._count += count

    def _stat_slices(self, arrays: PackedArrays) -> list[slice]:
        found = self._statistic_slices.get(arrays.layout)
        if found is None:
            found = self._statistic_slices[arrays.layout] = slices_of(arrays, self.context.statistics)
        return found

    def _buffer_flat(self, diff: Weights, count: float, base: Weights | None) -> bool:
        """``buffer``'s work on the flat vectors, when the diff, the sum so far and the base version (with
        statistics) share one packed layout; False (nothing done) otherwise."""
        if self._sum is None:
            d = flat_of(diff, base) if base is not None else flat_of(diff)
        else:
            d = flat_of(diff, self._sum, base) if base is not None else flat_of(diff, self._sum)
        if d is None:
            return False
        c = np.float32(count)
        stats = self._stat_slices(diff) if base is not None else []
        if self._sum is None:  # the first diff: a copy, statistics as the devices' own values
            spare, self._spare = self._spare, None  # no fresh pages for each version's sum
            self._sum = spare if spare is not None and spare.layout == diff.layout else fresh_like(diff)
            np.copyto(self._sum.flat, d)
            for s in stats:
                self._sum.flat[s] = d[s] + c * base.flat[s]
        elif not stats:
            self._sum.flat += d
        else:  # parameters between the statistics' slices, each slice as the per-tensor rule adds it
            total, start = self._sum.flat, 0
            for s in stats:
                total[start : s.start] += d[start : s.start]
                total[s] += d[s] + c * base.flat[s]
                start = s.stop
            total[start:] += d[start:]
        self._count += count
        return True

    def make_version(self, model: ModelHistory, sim_time: float) -> Weights:
        """current + global_lr * mean(buffer) (statistics: the buffer's mean); the buffer empties."""
        current = model.current_weights
        total = flat_of(self._sum, current) if self._sum is not None else None
        if total is not None and self._count > 0:  # into the new version's own blob: no copy of it to keep it
            fresh = getattr(model, "fresh_version", None)  # where the version will be kept (shared memory)
            new = fresh() if fresh is not None else fresh_like(current)
            np.multiply(total, np.float32(self.global_lr / self._count), out=new.flat)
            np.add(current.flat, new.flat, out=new.flat)  # current + scaled sum, as below (a + b == b + a)
            for s in self._stat_slices(current):
                np.divide(total[s], np.float32(self._count), out=new.flat[s])
            self._spare, self._sum, self._count = self._sum, None, 0
            return new
        new = {k: v.copy() for k, v in current.items()}
        if self._sum is not None and self._count > 0:
            scale = np.float32(self.global_lr / self._count)
            for k, v in self._sum.items():
                if k in self.context.statistics:
                    new[k] = v / np.float32(self._count)
                else:
                    new[k] += scale * v
        self._sum, self._count = None, 0
        return new

    def add_noise(self, noise: Weights, model: ModelHistory) -> None:
        """Central DP: the aggregate's noise joins the buffered sum of the parameters' diffs (the mean then divides
        the noised sum by the updates' count; ``aggregation.server_privacy``)."""
        for k, v in noise.items():
            self._sum[k] += v

    def state_dict(self) -> dict:
        # a copy: the sum's buffer is reused for a later version's sum (``_spare``)
        total = None if self._sum is None else {k: v.copy() for k, v in self._sum.items()}
        return {"sum": total, "count": self._count}

    def load_state_dict(self, state: dict) -> None:
        self._sum, self._count = state["sum"], state["count"]
