"""The server side of an FL method: what a method decides, and nothing else.

The exact-time machinery is the project's: which devices are selected, the order updates arrive in, when a
version is due (after exactly B updates), the trace, checkpoints, evaluation and results
(``scheduling.exact_assessor``, ``scheduling.applier``). It keeps every model version still needed, and announces
each new one (``aggregation.global_model.GlobalModel``). What it asks of a method is a ``ServerStrategy``:

1. ``setup(context)`` once per server process, before anything else (also before a resumed run loads its state);
2. ``start(initial)``: the initial model is version 1;
3. ``add_update(update, model)`` for each applied update, in the schedule's order, with its staleness ``tau``
   and simulated arrival time;
4. ``make_version(model, sim_time)`` when the schedule says a version is due: the strategy returns the weights of
   the next version (the buffer it kept since the last one is its own business);
5. ``needed_versions()``: versions it still reads (besides those devices in flight train, which are kept anyway);
6. ``state_dict()`` / ``load_state_dict(state)`` for checkpoints: a resumed run must continue bit for bit;
7. ``status(model)``: a few words for the progress line ("" for nothing);
8. ``device_extras(model)``, optional: float32 arrays sent to the devices with each new version, for the method's
   device hook (``processors.objective.DeviceObjective``), e.g. a control variate;
9. ``add_noise(noise, model)``, with central differential privacy only (``docs/privacy.md``): just before
   ``make_version``, the Gaussian noise of the aggregate (one array per parameter), to add to the sum of the
   updates taken since the last version, so that the version is a function of that noised sum alone. A strategy
   offers central DP when it defines ``add_noise`` in the class that defines its ``add_update`` and
   ``make_version``, or in a subclass of it (``offers_central_dp``): a subclass that changes how updates are
   combined must say how its noise goes in, or the run is refused.

Weights are ``dict[str, np.ndarray]`` of float32 (parameters and the model's data statistics, named in
``context.statistics``); a strategy never changes the arrays it is given (``model`` hands out the versions
themselves, diffs may be read-only views).

FedAvg and FedBuff are ``aggregation.buffered_mean.BufferedMean``; FedRevive is
``aggregation.fedrevive_strategy.FedReviveStrategy``. ``docs/bring-your-own.md`` shows a strategy of one's own.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

Weights = dict[str, np.ndarray]


@dataclass(frozen=True)
class ServerContext:
    """What a strategy may know of the run it serves.

    Attributes:
        model: the model's name or import path (``processors.models.build_model`` builds it).
        statistics: the names of the model's data statistics (BatchNorm running mean / variance, statistic
            trackers): estimates, not parameters, for a strategy to treat as such (``BufferedMean`` averages them).
        seed: the run's seed (for anything random a strategy does).
        compute_device: the torch device the server may compute on (``processors.device.resolve_device``).
        results_dir: the run's results folder, for a strategy's own logs.
    """

    model: str
    statistics: frozenset[str]
    seed: int
    compute_device: str
    results_dir: str


@dataclass(frozen=True)
class Update:
    """One applied update, as a strategy sees it.

    Attributes:
        device: the device id (``site-1#17``); for a leaf's sum of a synchronous selection, its first device.
        base_version: the model version the device trained.
        count: how many devices' diffs ``diff`` sums (1, or a synchronous selection's devices on one leaf).
        diff: the summed diff, trained minus received, of parameters and statistics (float32, do not modify).
        tau: staleness: versions made between ``base_version`` and this update's application.
        sim_time: the simulated time it arrived at.
        reports: what the device reported besides its diff, by name: the reports its method asks for
            (``Method.reports``; ``processors.reports``: its last loss, steps, label histogram, ...); for a leaf's
            sum of a synchronous selection, their sums.
    """

    device: str
    base_version: int
    count: int
    diff: Weights
    tau: int
    sim_time: float
    reports: Weights = field(default_factory=dict)


class ModelHistory(Protocol):
    """The versions a strategy may read: the current one, and every one still needed."""

    @property
    def current_version(self) -> int: ...

    @property
    def current_weights(self) -> Weights: ...

    def weights_of(self, version: int) -> Weights: ...


class ServerStrategy(ABC):
    """A method's server side (see the module docstring for when each method is called)."""

    context: ServerContext

    def setup(self, context: ServerContext) -> None:
        """Once per server process, before ``start`` or ``load_state_dict``."""
        self.context = context

    def start(self, initial: Weights) -> None:  # noqa: B027 - nothing to do by default
        """The run starts from ``initial`` (version 1)."""

    @abstractmethod
    def add_update(self, update: Update, model: ModelHistory) -> None:
        """Take one update, in the schedule's order."""

    @abstractmethod
    def make_version(self, model: ModelHistory, sim_time: float) -> Weights:
        """The next version's weights (new arrays; ``model.current_weights`` is the version before it)."""

    def needed_versions(self) -> set[int]:
        """Versions this strategy will still read through ``model.weights_of``."""
        return set()

    def state_dict(self) -> dict:
        """Everything a resumed run needs to continue exactly (picklable: numpy arrays, numbers, strings)."""
        return {}

    def load_state_dict(self, state: dict) -> None:  # noqa: B027 - no state by default
        """Continue from ``state_dict()``'s result (after ``setup``)."""

    def device_extras(self, model: ModelHistory) -> Weights:
        """Extra state for the devices that will train ``model.current_version`` (sent with its weights, handed to
        the method's ``DeviceObjective.loss`` as ``extras``); none by default."""
        return {}

    def status(self, model: ModelHistory) -> str:
        """A few words on where the method stands at ``model.current_version``, for the progress line ("": nothing to say)."""
        return ""

    def add_noise(self, noise: Weights, model: ModelHistory) -> None:
        """Central DP: add ``noise`` (float32, one array per parameter, not the statistics) to the sum of the
        updates taken since the last version; ``make_version`` follows (see the module docstring)."""
        raise NotImplementedError(f"{type(self).__name__} does not take central differential privacy's noise")


AGGREGATE_METHODS = ("add_update", "make_version", "device_extras", "buffer", "weight_of")
"""What a version (and what devices are sent with it) is made of: under central DP each must be defined where
``add_noise`` is, or above it (``BufferedMean``'s ``buffer`` and ``weight_of`` shape its sum; ``device_extras``
goes to every device beside the version)."""


def offers_central_dp(cls: type) -> bool:
    """Whether strategy class ``cls`` takes central DP's noise into everything its versions and their extras are
    made of: it defines ``add_noise`` where it defines each of ``AGGREGATE_METHODS`` it has, or below (see the
    module docstring). A subclass that changes any of them without its own ``add_noise`` is refused: its weights or
    extras could bypass the noised sum."""

    def owner(name: str) -> type:
        return next(k for k in cls.__mro__ if name in vars(k))

    noise = owner("add_noise")
    present = [n for n in AGGREGATE_METHODS if hasattr(cls, n)]
    return noise is not ServerStrategy and all(issubclass(noise, owner(n)) for n in present)
