"""The one interface between a leaf's device simulator and the leaf's executor, inside the leaf process.

Simulated devices need not talk to their leaf the way real ones do (an edge request per device for its selection,
its task and its result, each an event through every component of the leaf). A leaf executor that implements
``LeafGateway`` (ours, ``simulation.leaf_executor.EdgeSimExecutor``) lets the simulator on the same leaf:

* register its devices once, as a range (``register_devices``);
* take the tasks of every newly selected device of the leaf at once, with the model weights they train, as soon
  as the leaf learns of them (``take_work`` blocks until the leaf's state changes, not on a polling interval);
* report a whole group's results in one call (``report``), after which the leaf sends them up at once.

Real devices, and a leaf executor that is not ours (``use_fast_simulator`` keeps NVFlare's), still use NVFlare's
edge requests (``simulation.leaf_channels.EdgeRequestChannel``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

FIND_GATEWAY = "edgesim.find_leaf_gateway"  # event the leaf's runner fires; the gateway answers in GATEWAY_PROP
GATEWAY_PROP = "edgesim.leaf_gateway"


@dataclass(frozen=True)
class GatewayTask:
    """A selected device's task: train ``version`` for selection ``selection_id``; ``release``: the server's
    release it came in (``scheduling.applier``: the devices it hands out together; None: unknown); ``run``: its run
    in a pack (0: a standalone job's)."""

    device: str
    selection_id: int
    version: int
    release: int | None = None
    run: int = 0


@dataclass(frozen=True)
class LeafWork:
    """What ``take_work`` hands the simulator.

    Attributes:
        stamp: the leaf's state counter when the work was taken (pass it back to wait for the next change).
        tasks: this leaf's newly selected devices (each handed out once), in device-id order.
        models: model version -> its weights, for every version in ``tasks`` of run 0 (a standalone job's).
        run_models: a pack's later runs: run -> model version -> its weights, for their tasks.
        complete: in a pack's lock-step (``take_work``'s ``runs``), the highest release whose tasks of every run are
            all known here, taken before ``tasks`` (``VersionedUpdater.releases_complete``); None otherwise.
    """

    stamp: int
    tasks: list[GatewayTask] = field(default_factory=list)
    models: dict[int, dict[str, np.ndarray]] = field(default_factory=dict)
    run_models: dict[int, dict[int, dict[str, np.ndarray]]] = field(default_factory=dict)
    complete: int | None = None

    def weights(self, task: GatewayTask) -> dict[str, np.ndarray]:
        """The weights ``task`` trains from (its run's version)."""
        return self.run_models[task.run][task.version] if task.run else self.models[task.version]


@dataclass
class DeviceResult:
    """One device's result: ``diff`` (trained - received) of ``version``; ``count`` 0 for a failed device, with
    its last ``error`` (one short line); ``run``: its run in a pack (0: a standalone job's)."""

    device: str
    selection_id: int
    version: int
    diff: dict[str, np.ndarray]
    count: int = 1
    error: str = ""
    run: int = 0


@runtime_checkable
class LeafGateway(Protocol):
    def register_devices(self, prefix: str, count: int, timeout: float) -> bool:
        """Register the leaf's simulated devices ``<prefix>#0`` .. ``<prefix>#<count - 1>`` with the server, once
        the leaf has the job's task (waiting up to ``timeout`` seconds for it); False if it never came."""
        ...

    def take_work(self, prefix: str, stamp: int, timeout: float, runs: int = 0) -> LeafWork:
        """Wait until the leaf's state differs from ``stamp`` (or ``timeout`` seconds pass), then hand out the tasks
        of the devices of ``prefix`` selected and not handed out yet (possibly none); ``runs``: a pack's runs, in
        lock-step (the work's ``complete``), 0 otherwise."""
        ...

    def report(self, results: list[DeviceResult]) -> None:
        """Take a group's results for the parent and send them up: at once if the server waits for one of them,
        else within a short window, so more results share the message."""
        ...
