"""The server's global model: buffered device updates become the next version (FedAvg and FedBuff).

``global <- global + global_lr * mean(buffered diffs)``, as NVFlare's ``BuffModelManager`` and the FedRevive
reference (``add_update_to_params``) do, for the parameters. The model's data statistics (BatchNorm running mean /
variance, ``processors.models.statistic_names``) are estimates, not steps: the next version's are the mean of the
buffered devices' own statistics (each device's base version plus its diff), neither scaled by ``global_lr`` nor
added to the current ones. Adding stale statistic diffs to newer statistics could drive a variance below zero;
the mean of variances cannot. In a synchronous run with ``global_lr`` 1 both rules give the same numbers.

A version is made when the server's schedule says so (after exactly B updates, ``scheduling.exact_assessor``).
Diffs are added in the order the schedule applies them, into a float32 sum, so the same run gives the same bits
whatever order leaves reported in. In a synchronous run the leaves send one sum per selection
(``common.protocol.SelectionSum``), added when its first device is applied: again a fixed order.

Version 1 is the initial model. Every version some in-flight device still trains stays available
(``retain``): the assessor sends it to leaves that lack it, and FedRevive rebuilds client models from it. Weights
are float32 numpy arrays (never Python lists: NVFlare's debug f-strings would print them whole).

Each new version fires ``GLOBAL_WEIGHTS_UPDATED`` with ``AppConstants.GLOBAL_MODEL``, ``CURRENT_ROUND`` (the
version) and ``SIM_TIME`` (the simulated time it was made at) in the context, for the evaluator and recorder.
"""

from __future__ import annotations

import numpy as np
from nvflare.apis.fl_component import FLComponent
from nvflare.apis.fl_context import FLContext
from nvflare.app_common.abstract.model import make_model_learnable
from nvflare.app_common.app_constant import AppConstants
from nvflare.app_common.app_event_type import AppEventType

from common.packed_weights import pack
from common.protocol import METHOD_STATUS, SIM_TIME, DeviceUpdate, SelectionSum
from processors.models import build_model, statistic_names


def as_float32_arrays(weights: dict) -> dict[str, np.ndarray]:
    return {k: np.asarray(v, dtype=np.float32) for k, v in weights.items()}


class BufferedModelManager(FLComponent):
    """Args:
    global_lr: server learning rate applied to the mean of the buffered updates.
    model: model name (``processors.models``), to know which weights are data statistics ("": none are).
    """

    def __init__(self, global_lr: float = 1.0, model: str = ""):
        super().__init__()
        self.global_lr = global_lr
        self.model = model
        self.statistics: frozenset[str] = frozenset(statistic_names(build_model(model))) if model else frozenset()
        self.current_version = 0
        self._versions: dict[int, dict[str, np.ndarray]] = {}
        self._packed: dict[int, dict] = {}
        self._sum: dict[str, np.ndarray] | None = None
        self._count = 0
        self._groups: list = []  # the selection sums already in the buffer

    @property
    def current_weights(self) -> dict[str, np.ndarray]:
        return self._versions[self.current_version]

    def weights_of(self, version: int) -> dict[str, np.ndarray]:
        return self._versions[version]

    def model_packed(self, version: int) -> dict:
        """A version's weights as they travel to the leaves (``common.packed_weights``; packed once per version)."""
        packed = self._packed.get(version)
        if packed is None:
            packed = self._packed[version] = pack(self._versions[version])
        return packed

    def start(self, initial: dict, fl_ctx: FLContext) -> None:
        """The initial model becomes version 1 (at simulated time 0)."""
        self.current_version = 1
        self._versions = {1: as_float32_arrays(initial)}
        self._announce(0.0, fl_ctx)

    def add_update(self, update: DeviceUpdate, tau: int, fl_ctx: FLContext) -> None:
        """Buffer one device's diff (``tau``: its staleness, unused here). A device whose diff came summed with
        its selection's (a synchronous run) adds that sum once, when the first of them is applied."""
        if update.group is None:
            self._accumulate(as_float32_arrays(update.diff), update.count, update.base_version)
        elif not any(g is update.group for g in self._groups):
            self._groups.append(update.group)
            self._accumulate(as_float32_arrays(update.group.diff), update.group.count, update.group.base_version)

    def _accumulate(self, diff: dict[str, np.ndarray], count: int, base_version: int) -> None:
        """Add a diff (of ``count`` devices, summed, all trained from ``base_version``) to the buffer: parameters
        as diffs, statistics as the devices' own values (``count`` times the base plus the summed diffs)."""
        if self.statistics:
            base = self._versions[base_version]
            diff = {k: v + np.float32(count) * base[k] if k in self.statistics else v for k, v in diff.items()}
        if self._sum is None:
            self._sum = {k: v.copy() for k, v in diff.items()}
        else:
            for k, v in diff.items():
                self._sum[k] += v
        self._count += count

    def make_version(self, sim_time: float, fl_ctx: FLContext) -> None:
        """global + global_lr * mean(buffer) becomes the next version (statistics: the buffer's mean); the buffer
        empties."""
        new = {k: v.copy() for k, v in self.current_weights.items()}
        if self._sum is not None and self._count > 0:
            scale = np.float32(self.global_lr / self._count)
            for k, v in self._sum.items():
                if k in self.statistics:
                    new[k] = v / np.float32(self._count)
                else:
                    new[k] += scale * v
        self._sum, self._count, self._groups = None, 0, []
        self.current_version += 1
        self._versions[self.current_version] = new
        self._announce(sim_time, fl_ctx)

    def state_dict(self) -> dict:
        """The versions kept, the current one and the buffer of the next (for a checkpoint)."""
        return {
            "current_version": self.current_version,
            "versions": self._versions,
            "sum": self._sum,
            "count": self._count,
            "groups": [g.to_dict() for g in self._groups],
        }

    def load_state_dict(self, state: dict) -> None:
        self.current_version = state["current_version"]
        self._versions = {int(v): w for v, w in state["versions"].items()}
        self._packed = {}
        self._sum, self._count = state["sum"], state["count"]
        self._groups = [SelectionSum.from_dict(g) for g in state["groups"]]

    def retain(self, versions: set[int]) -> None:
        """Forget every version but these (and the current one)."""
        keep = set(versions) | {self.current_version}
        for v in [v for v in self._versions if v not in keep]:
            del self._versions[v]
            self._packed.pop(v, None)

    def status(self) -> str:
        """The method's word on where it stands, for the progress line ("": nothing to say)."""
        return ""

    def _announce(self, sim_time: float, fl_ctx: FLContext) -> None:
        fl_ctx.set_prop(
            AppConstants.GLOBAL_MODEL, make_model_learnable(self.current_weights, {}), private=True, sticky=True
        )
        fl_ctx.set_prop(AppConstants.CURRENT_ROUND, self.current_version, private=True, sticky=True)
        fl_ctx.set_prop(SIM_TIME, sim_time, private=True, sticky=True)
        fl_ctx.set_prop(METHOD_STATUS, self.status(), private=True, sticky=True)
        self.fire_event(AppEventType.GLOBAL_WEIGHTS_UPDATED, fl_ctx)
