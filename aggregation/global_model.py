"""The server's global model: the versions a run still needs, made by the method's ``ServerStrategy``.

The exact-time assessor and its applier drive it (``scheduling``): ``start`` with the initial model (version 1),
``add_update`` for each applied update in the schedule's order, ``make_version`` when the schedule says a version
is due (after exactly B updates), ``retain`` with the versions devices in flight still train. The version numbers
are the schedule's (``scheduling.schedule.ExactSchedule.version``, the run's one version counter): this component
is told each one and refuses a number out of step, it never counts on its own. What goes into the
next version is the strategy's decision (``aggregation.strategy``); keeping versions, packing them for the leaves,
handing a synchronous selection's sum to the strategy once, checkpoints and announcing versions are this
component's.

In a synchronous run the leaves send one sum per selection (``common.protocol.SelectionSum``): the strategy gets
it once, as one ``Update`` of ``count`` devices, when its first device is applied (a fixed order, so the same bits
whatever order leaves reported in).

Version 1 is the initial model. Every version some in-flight device still trains, or the strategy still reads,
stays available: the assessor sends it to leaves that lack it. Weights are float32 numpy arrays (never Python
lists: NVFlare's debug f-strings would print them whole).

Each new version fires ``GLOBAL_WEIGHTS_UPDATED`` with NVFlare's ``AppConstants.GLOBAL_MODEL`` and
``CURRENT_ROUND`` (sticky, as NVFlare's components expect) and, not sticky, the run's own copy for the evaluator:
``NEW_VERSION``, ``NEW_WEIGHTS``, ``SIM_TIME`` (the simulated time it was made at), ``METHOD_STATUS`` (the
strategy's ``status``) and ``SERVER_WORK`` (the wall seconds the strategy has taken so far, ``ServerWork``). A
sticky value is one per engine: in a pack, another run's (``common.protocol``).

Differential privacy (``privacy``, ``aggregation.server_privacy``) happens here, the one place every method's
updates and versions pass: each version carries its clip norm to its devices, each applied update's unclipped bit
is split off before the strategy sees it, and with central DP the aggregate's Gaussian noise goes to the
strategy's ``add_noise`` just before it makes the version (``aggregation.strategy``); ``PRIVACY`` in the context
then carries the accountant's inputs.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import asdict, dataclass

import numpy as np
from nvflare.apis.event_type import EventType
from nvflare.apis.fl_component import FLComponent
from nvflare.apis.fl_constant import FLContextKey
from nvflare.apis.fl_context import FLContext
from nvflare.app_common.abstract.model import make_model_learnable
from nvflare.app_common.app_constant import AppConstants
from nvflare.app_common.app_event_type import AppEventType

from aggregation.server_privacy import ServerPrivacy
from aggregation.strategy import ServerContext, ServerStrategy, Update, Weights
from aggregation.version_store import VersionStore
from common.imports import import_object
from common.output import output_dir
from common.packed_weights import PackedArrays, pack
from common.privacy import CLIP_NORM, UNCLIPPED
from common.protocol import (
    DEVICE_EXTRA_PREFIX,
    METHOD_STATUS,
    NEW_VERSION,
    NEW_WEIGHTS,
    PRIVACY,
    SERVER_WORK,
    SIM_TIME,
    DeviceUpdate,
    SelectionSum,
)
from processors.models import build_model, statistic_names


def as_float32_arrays(weights: dict) -> Weights:
    """``weights`` with every array float32 (arrays that travelled packed and are all float32 as they are: their
    ``PackedArrays`` lets a strategy sum them as one vector)."""
    if isinstance(weights, PackedArrays) and weights.flat is not None:
        return weights
    return {k: np.asarray(v, dtype=np.float32) for k, v in weights.items()}


def make_strategy(strategy: str, strategy_args: dict | None = None) -> ServerStrategy:
    """The strategy an import path ``package.module:Class`` names, built with ``strategy_args``."""
    cls = import_object(strategy, "strategy")
    made = cls(**(strategy_args or {}))
    if not isinstance(made, ServerStrategy):
        raise ValueError(f"strategy {strategy!r}: {type(made).__name__} is not an aggregation.strategy.ServerStrategy")
    return made


@dataclass
class ServerWork:
    """The wall seconds the method's strategy took on the server, summed since this process started (a resumed
    run counts again from 0): what ``benchmarks/repro/paper_seed.py`` splits a run's time by. Timing only: it changes
    nothing a run computes.

    Attributes:
        updates: updates handed to the strategy (``add_update``).
        update_seconds: wall seconds in its ``add_update`` (FedRevive's synthesis and distillation included).
        versions: versions it made (``make_version``).
        version_seconds: wall seconds in its ``make_version`` (the aggregation).
    """

    updates: int = 0
    update_seconds: float = 0.0
    versions: int = 0
    version_seconds: float = 0.0

    def record(self) -> dict:
        """These figures, and the wall clock (epoch seconds) as the version is made: a version record's
        ``server``."""
        return asdict(self) | {"made_epoch": round(time.time(), 6)}


class GlobalModel(FLComponent):
    """Args:
    strategy: the method's ``ServerStrategy``, as an import path ``package.module:Class``.
    strategy_args: its constructor's keyword arguments.
    model: model name (``processors.models``), to know which weights are data statistics ("": none are).
    seed: the run's seed (``ServerContext.seed``).
    compute_device: the torch device the strategy may compute on.
    results_dir: the run's results folder ("": the server app's run folder).
    version_memory_mb: MiB of versions kept in memory; past it the oldest go to disk (``aggregation.version_store``).
    privacy: differential privacy's ``ServerPrivacy`` arguments but the seed (``settings``, ``pool_size``,
        ``updates_per_version``); None: off.
    bulk: ``auto`` or ``shm``: the versions in memory are kept in shared memory, for the leaves that map them
        (``common.bulk_parent``); ``wire``: in this process's memory only.
    """

    def __init__(
        self,
        strategy: str,
        strategy_args: dict | None = None,
        model: str = "",
        seed: int = 0,
        compute_device: str = "auto",
        results_dir: str = "",
        version_memory_mb: float = 256.0,
        privacy: dict | None = None,
        bulk: str = "auto",
    ):
        super().__init__()
        self.strategy = strategy  # NVFlare exports a component's arguments from its attributes of the same name
        self.strategy_args = strategy_args or {}
        self.server_strategy = make_strategy(strategy, self.strategy_args)
        self.model = model
        self.seed = seed
        self.compute_device = compute_device
        self.results_dir = results_dir
        self.version_memory_mb = version_memory_mb
        self.privacy = privacy
        self._privacy = ServerPrivacy(**privacy, seed=seed) if privacy else None
        self.bulk = bulk
        self._app_root = ""  # the server app's folder, once known (START_RUN): spilled versions go under it
        self.statistics: frozenset[str] = frozenset(statistic_names(build_model(model))) if model else frozenset()
        self._current = 0  # the version the schedule last made (0 before the start)
        self._versions = VersionStore(version_memory_mb * 2**20, self._spill_folder, shared=bulk != "wire")
        self._extras: dict[int, Weights] = {}  # the strategy's device_extras of each version that has any
        self._packed: dict[int, dict] = {}
        self._spared: set[int] = set()  # versions ``forget`` was told of that the strategy still needed
        self._groups: list = []  # the selection sums already given to the strategy since the last version
        self.work = ServerWork()
        self._set_up = False
        self.register_event_handler(EventType.START_RUN, lambda _event, fl_ctx: self._setup(fl_ctx))
        self.register_event_handler(EventType.END_RUN, self._log_retention)

    def _setup(self, fl_ctx: FLContext) -> None:
        if self._set_up:
            return
        # "": no folder (only a bare engine, as in unit tests, has neither a results folder nor an app root)
        has_folder = self.results_dir or fl_ctx.get_prop(FLContextKey.APP_ROOT)
        context = ServerContext(
            model=self.model,
            statistics=self.statistics,
            seed=self.seed,
            compute_device=self.compute_device,
            results_dir=output_dir(self.results_dir, fl_ctx) if has_folder else "",
        )
        self.server_strategy.setup(context)
        self._app_root = fl_ctx.get_prop(FLContextKey.APP_ROOT) or ""
        self._set_up = True

    def _spill_folder(self) -> str:
        """A new folder of this model's own in the server app's folder, for the versions it spills (the version
        store asks once, at its first spill): the runs of a pack share the app folder and number their versions
        alike, so a shared folder would mix their files and one run's end would remove the others'. "": none
        known (the store makes a temporary one)."""
        return tempfile.mkdtemp(prefix="spilled_versions-", dir=self._app_root) if self._app_root else ""

    @property
    def current_version(self) -> int:
        """The newest version, as numbered by the schedule (``start``, ``make_version``)."""
        return self._current

    @property
    def current_weights(self) -> Weights:
        return self._versions.get(self.current_version)

    def weights_of(self, version: int) -> Weights:
        return self._versions.get(version)

    def fresh_version(self) -> Weights:
        """New arrays of the current version's layout, where the next version will be kept (a slot of shared
        memory when leaves map versions): a strategy that writes its next version into them and returns them
        spares a copy of it (``BufferedMean``)."""
        return self._versions.fresh(self.current_weights.layout)

    def bulk_locator(self) -> dict | None:
        """The shared memory the versions are kept in, as a leaf maps it (``common.shared_ring``); None: none."""
        ring = self._versions.ring()
        return ring.locator() if ring is not None else None

    @property
    def bulk_error(self) -> str:
        """Why versions are not kept in shared memory although the run asks for it ("": they are, or it does not)."""
        return self._versions.ring_error

    def model_handle(self, version: int, child: str) -> dict | None:
        """A version as a child that maps the server's shared memory is sent it: a handle (``common.shared_ring``),
        the version leased to the child until it holds it no more (``held_by``); None: it travels packed (a version
        with the strategy's extras, or one kept outside the shared memory)."""
        if version in self._extras:
            return None
        return self._versions.handle(version, child)

    def held_by(self, child: str, versions: set[int]) -> None:
        """``child`` holds, or still views, ``versions`` and no other: the rest may be spilled or reused."""
        self._versions.held(child, versions)

    def model_packed(self, version: int) -> dict:
        """A version's weights as they travel to the leaves (``common.packed_weights``; packed once per version),
        with the strategy's extra state for devices, if any, under ``DEVICE_EXTRA_PREFIX``."""
        if version not in self._extras:  # the version's own blob, as it is kept
            return self._versions.packed(version)
        packed = self._packed.get(version)
        if packed is None:
            extras = {DEVICE_EXTRA_PREFIX + k: v for k, v in self._extras[version].items()}
            packed = self._packed[version] = pack(self._versions.get(version) | extras)
        return packed

    def start(self, initial: dict, version: int, fl_ctx: FLContext) -> None:
        """The initial model becomes ``version`` (the schedule's first, 1), at simulated time 0."""
        self._setup(fl_ctx)
        self._current = version
        self._versions.close()
        if self._privacy is not None:
            self._privacy.start(version)
        self.server_strategy.start(self._versions.put(version, as_float32_arrays(initial)))
        self._keep_extras()
        self._announce(0.0, fl_ctx)

    def add_update(self, update: DeviceUpdate, tau: int, fl_ctx: FLContext, sim_time: float = 0.0) -> None:
        """Hand one applied update to the strategy (``tau``: its staleness). A device whose diff came summed with
        its selection's (a synchronous run) hands over that sum once, when the first of them is applied."""
        if update.group is None:
            diff, count, base = update.diff, update.count, update.base_version
        elif not any(g is update.group for g in self._groups):
            self._groups.append(update.group)
            diff, count, base = update.group.diff, update.group.count, update.group.base_version
        else:
            diff = None  # its selection's sum went to the strategy already
        if self._privacy is not None:
            self._privacy.member(update.device)
        if diff is None:
            return
        n = len(DEVICE_EXTRA_PREFIX)
        # a packed diff's layout names its arrays: one without reports needs no walk over them
        plain = isinstance(diff, PackedArrays) and diff.layout and DEVICE_EXTRA_PREFIX not in diff.layout
        reports = {} if plain else {k[n:]: v for k, v in diff.items() if k.startswith(DEVICE_EXTRA_PREFIX)}
        if reports:
            diff = {k: v for k, v in diff.items() if not k.startswith(DEVICE_EXTRA_PREFIX)}
        if self._privacy is not None:
            diff = self._privacy.take(as_float32_arrays(diff), reports, count, base, self.statistics)
            reports.pop(UNCLIPPED, None)
        started = time.perf_counter()
        self.server_strategy.add_update(
            Update(update.device, base, count, as_float32_arrays(diff), tau, sim_time, as_float32_arrays(reports)),
            self,
        )
        self.work.updates += 1
        self.work.update_seconds += time.perf_counter() - started

    def make_version(self, version: int, sim_time: float, fl_ctx: FLContext) -> None:
        """The strategy's next version becomes the current one, numbered ``version`` by the schedule, and is
        announced. Raises ``ValueError`` for a number that is not the next one (the two would be out of step)."""
        if version != self._current + 1:
            raise ValueError(f"the schedule made version {version}, but the global model holds {self._current}")
        if self._privacy is not None:  # BudgetSpent: the version is not made, nothing of it released
            self._privacy.check_budget(version)
        started = time.perf_counter()
        if self._privacy is not None and self._privacy.cfg.central:
            noise = self._privacy.noise(version, self.current_weights, self.statistics)
            self.server_strategy.add_noise(noise, self)
        new = self.server_strategy.make_version(self, sim_time)
        self.work.versions += 1
        self.work.version_seconds += time.perf_counter() - started
        self._groups = []
        if self._privacy is not None:
            self._privacy.close(version)
        self._current = version
        self._versions.put(version, new)
        self._keep_extras()
        self._announce(sim_time, fl_ctx)

    def _keep_extras(self) -> None:
        extras = self.server_strategy.device_extras(self)
        if self._privacy is not None:  # the clip norm this version's devices clip to
            clip = np.array([self._privacy.clip_norm(self.current_version)], dtype=np.float32)
            extras = dict(extras) | {CLIP_NORM: clip}
        if extras:
            self._extras[self.current_version] = as_float32_arrays(extras)

    def state_dict(self) -> dict:
        """The versions kept, the current one, and the strategy's state (for a checkpoint)."""
        state = {
            "current_version": self.current_version,
            "versions": {v: self._versions.get(v) for v in self._versions},
            "groups": [g.to_dict() for g in self._groups],
        }
        if self._extras:
            state["device_extras"] = self._extras
        if self._privacy is not None:
            state["privacy"] = self._privacy.state_dict()
        return state | self.server_strategy.state_dict()

    def load_state_dict(self, state: dict, fl_ctx: FLContext | None = None) -> None:
        if fl_ctx is not None:
            self._setup(fl_ctx)
        self._current = state["current_version"]
        self._versions.close()
        for v, w in state["versions"].items():
            self._versions.put(int(v), w)
        self._extras = {int(v): w for v, w in state.get("device_extras", {}).items()}
        self._packed, self._spared = {}, set()
        self._groups = [SelectionSum.from_dict(g) for g in state["groups"]]
        if self._privacy is not None:
            self._privacy.load_state_dict(state["privacy"])
        self.server_strategy.load_state_dict(state)

    def retain(self, versions: set[int]) -> None:
        """Forget every version but these, the strategy's ``needed_versions()`` and the current one (at the start
        and after a resume; afterwards the applier tells ``forget`` what stopped being needed)."""
        self.forget(self._versions.keys() - versions)

    def forget(self, versions: set[int]) -> None:
        """Forget these versions (no device in flight trains them), except those the strategy still reads and the
        current one. A version spared for the strategy is looked at again on every later call."""
        dead = versions | self._spared if self._spared else versions
        if not dead:
            return
        needed = self.server_strategy.needed_versions()
        self._spared = dead & needed
        dead = dead - needed
        dead.discard(self.current_version)
        for v in dead:
            self._versions.discard(v)
            self._extras.pop(v, None)
            self._packed.pop(v, None)

    @property
    def peak_kept(self) -> tuple[int, int, int]:
        """The most versions kept at once, the most bytes of them in memory and the most spilled to disk."""
        return self._versions.peak

    def _log_retention(self, _event: str, fl_ctx: FLContext) -> None:
        count, memory, disk = self.peak_kept
        self.log_info(
            fl_ctx,
            f"versions kept: peak {count} ({memory / 2**20:.1f} MB in memory, at most {self.version_memory_mb:g} "
            f"MB; {disk / 2**20:.1f} MB spilled to disk at most)",
        )
        self._versions.close(spilled_only=True)  # the run's folder keeps no spilled version

    def status(self) -> str:
        """The method's word on where it stands, for the progress line ("": nothing to say)."""
        return self.server_strategy.status(self)

    def _announce(self, sim_time: float, fl_ctx: FLContext) -> None:
        weights = self.current_weights
        fl_ctx.set_prop(AppConstants.GLOBAL_MODEL, make_model_learnable(weights, {}), private=True, sticky=True)
        fl_ctx.set_prop(AppConstants.CURRENT_ROUND, self.current_version, private=True, sticky=True)
        # the run's own copy, not sticky: in a pack the sticky ones may be another run's (``common.protocol``)
        fl_ctx.set_prop(NEW_VERSION, self.current_version, private=True, sticky=False)
        fl_ctx.set_prop(NEW_WEIGHTS, weights, private=True, sticky=False)
        fl_ctx.set_prop(SIM_TIME, sim_time, private=True, sticky=False)
        fl_ctx.set_prop(METHOD_STATUS, self.status(), private=True, sticky=False)
        fl_ctx.set_prop(SERVER_WORK, self.work.record(), private=True, sticky=False)
        if self._privacy is not None:
            fl_ctx.set_prop(PRIVACY, self._privacy.inputs(self.current_version), private=True, sticky=False)
        self.fire_event(AppEventType.GLOBAL_WEIGHTS_UPDATED, fl_ctx)
