"""Client selection as a method's plug-in: a ``SelectionPolicy`` picks whom the schedule selects.

Without a policy the schedule samples uniformly among idle, online devices (``scheduling.device_pool``): today's
traces, bit for bit. A method may supply a policy (``jobs.methods.Method.selection``); at every selection the
schedule (``scheduling.schedule.ExactSchedule``) then gathers the candidates and asks the policy whom to take:

* the candidates are the idle devices online at that moment: every one of them (``sample_size`` returns
  ``None``), or a uniform sample of them drawn by the pool (power-of-choice's d candidates, at any pool size);
* each comes with what the run knows of it (``Candidate``): the scalar reports of its last applied update (its
  last loss, ...), how many times it was selected, how long its last task took (selection to arrival, simulated
  seconds) and, with a FedScale capacity trace, its speed;
* the policy returns up to ``count`` of them (fewer leaves the slots free until the next selection).

Exact time holds because the policy sees only what the server had *applied* when it selects: the schedule's
``DeviceKnowledge`` is fed by ``ExactSchedule.apply`` with the update being applied (before the replacements are
selected, at that update's arrival time), in the schedule's order, never by a report that merely reached the
server early. So the event order is a function of the seed, the policy and the training results. Those are a
function of the seed and of how the leaves group their devices for training (``simulation.fast_simulator``: the
engine and the group size, which ``--engine``, ``--num-workers`` and ``--group-size`` set and a leaf otherwise
plans from its machine): another grouping sums in another order, the reports' last float bits differ, and a
near-tie between two devices may then resolve the other way. Give those flags to repeat a run of a
report-reading policy on another machine; the uniform default and policies that read no report do not depend on
them. Randomness comes only from the ``numpy.random.Generator`` the schedule hands the policy (seeded,
checkpointed).

Checkpoints: ``ExactSchedule.state_dict`` holds the knowledge, the generator and the policy's own
``state_dict``, so ``--resume`` continues exactly. A policy whose ``needs`` names training reports cannot run in
``--dry-run`` (no training: the job refuses in one line); one that reads only durations and counts can.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from common.imports import import_object


@dataclass(frozen=True)
class Candidate:
    """An idle, online device and what the run knows of it.

    Attributes:
        device: its id.
        reports: the scalar reports of its last applied update (``common.protocol``: ``loss``, ``loss_squared``,
            ``steps``, ``samples``), by name; empty until one was applied (or without reports).
        times_selected: how many times it was selected before (its tasks so far).
        last_duration: simulated seconds from its last selection to its last applied update (None: none yet).
        last_version: the model version current when its last update was applied (None: none yet).
        speed: training samples per simulated second from the run's capacity trace (None: no trace given).
    """

    device: str
    reports: dict[str, float] = field(default_factory=dict)
    times_selected: int = 0
    last_duration: float | None = None
    last_version: int | None = None
    speed: float | None = None


class SelectionPolicy:
    """Whom the schedule selects (see the module docstring). Subclass and implement ``select``; constructor
    keyword arguments come from ``Method.selection_args``.

    Attributes:
        needs: the device reports it reads (``common.protocol`` names); devices send them, and a policy that
            needs any cannot run in ``--dry-run``.
    """

    needs: tuple[str, ...] = ()

    def sample_size(self, count: int, idle: int) -> int | None:
        """How many idle online candidates the pool draws uniformly for ``count`` slots (``idle``: idle devices);
        ``None``: every idle online device (a scan of the pool at each selection)."""
        return None

    def select(
        self, candidates: list[Candidate], count: int, version: int, now: float, rng: np.random.Generator
    ) -> list[str]:
        """Up to ``count`` of the ``candidates`` (in device-id order) to select now: ``version`` is the model
        they will train, ``now`` the simulated time; draw any randomness from ``rng`` only."""
        raise NotImplementedError

    def state_dict(self) -> dict:
        """The policy's own state, for checkpoints (numbers, strings, lists, dicts)."""
        return {}

    def load_state_dict(self, state: dict) -> None:  # noqa: B027 - no state by default
        """Continue from ``state_dict()``'s result."""


def make_policy(path: str, args: dict | None = None) -> SelectionPolicy | None:
    """The policy an import path ``package.module:Class`` names, built with ``args``; ``None`` for ""."""
    if not path:
        return None
    made = import_object(path, "selection")(**(args or {}))
    if not isinstance(made, SelectionPolicy):
        raise ValueError(f"selection {path!r}: {type(made).__name__} is not a scheduling.selection.SelectionPolicy")
    return made


class DeviceKnowledge:
    """What the run knows of each device that has had an update applied: the scalar reports of its last one, its
    last duration and the version then. Kept only for devices that trained (none for idle ones never selected)."""

    def __init__(self) -> None:
        self.reports: dict[str, dict[str, float]] = {}
        self.durations: dict[str, float] = {}
        self.versions: dict[str, int] = {}

    def applied(self, device: str, reports: dict | None, duration: float, version: int) -> None:
        """An update of ``device`` was applied (``reports``: its reports by name, None for a failed device)."""
        self.durations[device] = float(duration)
        self.versions[device] = int(version)
        scalars = {k: float(np.asarray(v).reshape(())) for k, v in (reports or {}).items() if np.size(v) == 1}
        if scalars:
            self.reports[device] = scalars

    def candidates(self, devices: Iterable[str], task_counts: dict[str, int], speed_of) -> list[Candidate]:
        """``devices`` as candidates, in device-id order (``speed_of``: device -> speed or None)."""
        return [
            Candidate(
                d,
                dict(self.reports.get(d, {})),
                task_counts.get(d, 0),
                self.durations.get(d),
                self.versions.get(d),
                speed_of(d),
            )
            for d in sorted(devices)
        ]

    def state_dict(self) -> dict:
        return {"reports": self.reports, "durations": self.durations, "versions": self.versions}

    def load_state_dict(self, state: dict) -> None:
        self.reports = {d: dict(r) for d, r in state["reports"].items()}
        self.durations = dict(state["durations"])
        self.versions = {d: int(v) for d, v in state["versions"].items()}
