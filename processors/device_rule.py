"""The device-side training rule of an FL method: code that runs before, at every step of, and after a device's
local training, with state the device keeps across its tasks.

A method whose devices do more than add a loss term (``processors.objective.DeviceObjective``, the simple case)
gives a ``DeviceRule`` (``jobs.methods.Method.rule``). The engines keep batching, data, seeding and the optimiser;
the rule gets three hooks:

* ``before(received, extras, state)``: from the version's weights, the server's extras
  (``ServerStrategy.device_extras``) and the device's own state (``initial_state`` on its first task), the
  per-device values the other hooks read (``ctx``), e.g. SCAFFOLD's ``c - c_i``;
* ``step(params, grads, ctx)``: each local step's gradients, corrected, before the optimiser uses them;
* ``after(params, received, ctx)``: what the device reports beside its diff (named arrays, under
  ``common.protocol.DEVICE_EXTRA_PREFIX``, reaching the strategy as ``Update.reports``) and its new state.

The same code runs in both engines: called on one device's tensors by the per-device engine
(``processors.training.train_local``), and under ``torch.func.vmap`` on the devices' stacked tensors by the
vectorised one (``processors.training_vectorized.train_group``). So each hook must be a pure function of its
tensors: torch operations only, no in-place changes, no ``.item()``, no Python branches on tensor values; the
constants it needs (local steps, learning rate) come from its constructor (``Method.rule_args``).

State (``keeps_state``): the arrays ``after`` returns as the device's new state are kept per device across its
tasks, on the leaf (``processors.device_state.DeviceStateStore``: only for devices that have trained, spilled to
disk past a memory budget) or, on a real device, on the device itself (``processors.device_processor``).

``RuleRun`` is what the engines hold: one training call's rule with its devices' states in, their reports and
new states out.
"""

from __future__ import annotations

import os
import threading
from typing import ClassVar

import numpy as np
import torch
from torch.func import vmap

from common.finite import nonfinite_entry
from common.imports import import_object
from common.protocol import DEVICE_EXTRA_PREFIX
from processors.device_state import DeviceStateStore

Tensors = dict[str, torch.Tensor]
Arrays = dict[str, np.ndarray]
_store_lock = threading.Lock()  # module-level: NVFlare deep-copies a task processor (and a lock cannot be copied)


class DeviceRule:
    """A method's local training rule (see the module docstring). Subclass and override the hooks you need;
    constructor keyword arguments come from ``Method.rule_args``.

    Attributes:
        keeps_state: the device keeps the state ``after`` returns, and ``before`` gets it on its next task.
        reports: the names of the reports ``after`` returns (each a float32 array or scalar), or name prefixes
            ending in ``/`` (SCAFFOLD's ``delta_c/<parameter>``); a method whose rule reports gets each device's
            update on its own (``Method.leaf_sums``).
    """

    keeps_state: ClassVar[bool] = False
    reports: ClassVar[tuple[str, ...]] = ()

    def initial_state(self, received: Tensors, extras: Tensors) -> Tensors:
        """A device's state before its first task (one device's tensors; not under ``vmap``)."""
        return {}

    def before(self, received: Tensors, extras: Tensors, state: Tensors) -> Tensors:
        """The values ``step`` and ``after`` read for this task (``received``: the version's parameters)."""
        return {}

    def step(self, params: Tensors, grads: Tensors, ctx: Tensors) -> Tensors:
        """This step's gradients as the optimiser should use them (by parameter name)."""
        return grads

    def after(self, params: Tensors, received: Tensors, ctx: Tensors) -> tuple[Tensors, Tensors]:
        """(reports, new state) after the last step (``params``: the trained parameters)."""
        return {}, {}


def make_rule(path: str, args: dict | None = None) -> DeviceRule | None:
    """The rule an import path ``package.module:Class`` names, built with ``args``; ``None`` for ""."""
    if not path:
        return None
    made = import_object(path, "rule")(**(args or {}))
    if not isinstance(made, DeviceRule):
        raise ValueError(f"rule {path!r}: {type(made).__name__} is not a processors.device_rule.DeviceRule")
    return made


def _to_host(tensors: Tensors) -> Arrays:
    return {name: t.detach().to(torch.float32).cpu().numpy().copy() for name, t in tensors.items()}


class RuleRun:
    """One training call's use of a rule, for K devices (K = 1 in the per-device engine).

    Args:
        rule: the method's rule.
        states: each device's kept state (float32 arrays by name), ``None`` for a device without one yet.

    After training, ``reports[i]`` and ``new_states[i]`` hold device i's (float32 numpy arrays).
    """

    def __init__(self, rule: DeviceRule, states: list[Arrays | None]):
        self.rule = rule
        self.states = states
        self.ctx: Tensors = {}
        self.reports: list[Arrays] = []
        self.new_states: list[Arrays] = []

    def _state(self, i: int, received: Tensors, extras: Tensors, device: torch.device) -> Tensors:
        state = self.states[i]
        if state is None:
            return {n: t.detach() for n, t in self.rule.initial_state(received, extras).items()}
        return {n: torch.as_tensor(a).to(device) for n, a in state.items()}

    # -- the per-device engine: one device's tensors --------------------------------------------------------------

    def begin(self, received: Tensors, extras: Tensors) -> None:
        device = next(iter(received.values())).device
        self.ctx = self.rule.before(received, extras, self._state(0, received, extras, device))

    def correct(self, params: Tensors, grads: Tensors) -> Tensors:
        return self.rule.step(params, grads, self.ctx)

    def end(self, params: Tensors, received: Tensors) -> None:
        with torch.no_grad():
            reports, state = self.rule.after({n: p.detach() for n, p in params.items()}, received, self.ctx)
        self.reports, self.new_states = [_to_host(reports)], [_to_host(state)]

    # -- the vectorised engine: the devices' tensors stacked on a first dimension of K ----------------------------

    def begin_group(self, received: Tensors, extras: Tensors, shared: bool, k: int) -> None:
        """``received``/``extras``: one device's (``shared``: every device starts from them) or stacked ones."""
        device = next(iter(received.values())).device

        def one(tensors: Tensors, i: int) -> Tensors:
            return tensors if shared else {n: t[i] for n, t in tensors.items()}

        states = [self._state(i, one(received, i), one(extras, i), device) for i in range(k)]
        stacked = {n: torch.stack([s[n] for s in states]) for n in states[0]} if states[0] else {}
        if not stacked and shared:  # nothing differs between the devices: one call, expanded
            ctx = self.rule.before(received, extras, {})
            self.ctx = {n: t.unsqueeze(0).expand(k, *t.shape) for n, t in ctx.items()}
            return
        dims = None if shared else 0
        self.ctx = vmap(self.rule.before, in_dims=(dims, dims if extras else None, 0))(received, extras, stacked)

    def correct_group(self, params: Tensors, grads: Tensors) -> Tensors:
        return vmap(self.rule.step)(params, grads, self.ctx)

    def end_group(self, params: Tensors, received: Tensors, shared: bool) -> None:
        with torch.no_grad():
            reports, state = vmap(self.rule.after, in_dims=(0, None if shared else 0, 0))(params, received, self.ctx)
        reports, state = _to_host(reports), _to_host(state)
        k = next(iter(params.values())).shape[0]
        self.reports = [{n: a[i].copy() for n, a in reports.items()} for i in range(k)]
        self.new_states = [{n: a[i].copy() for n, a in state.items()} for i in range(k)]


class RuleHost:
    """A task processor's rule and the store of its devices' state (made on first use; none for a stateless
    rule or no rule).

    Args:
        path: the rule's import path ("": none); ``args``: its constructor's keyword arguments.
        device_state: the store's settings: ``dir`` ("": ``device_state/`` in the working folder), ``memory_mb``,
            ``durable`` (default off: only a run that checkpoints into the store's results folder needs it),
            ``fresh`` (``processors.device_state.DeviceStateStore``).
    """

    def __init__(self, path: str, args: dict, device_state: dict):
        self.rule = make_rule(path, args)
        self.settings = device_state
        self._store: DeviceStateStore | None = None

    def __deepcopy__(self, memo: dict) -> RuleHost:
        return self  # NVFlare deep-copies the processor per simulated device: the copies share one store

    def start(self, device_ids: list[str], selections: list[int | None]) -> RuleRun | None:
        """The rule for these devices' tasks, with the state each kept from its last task (``None``: no rule)."""
        if self.rule is None:
            return None
        store = self.store()
        return RuleRun(
            self.rule, [store.get(d, s) if store else None for d, s in zip(device_ids, selections, strict=True)]
        )

    def finish(
        self, run: RuleRun | None, device_ids: list[str], selections: list[int | None], diffs: list[dict]
    ) -> list[dict]:
        """The diffs with the rule's reports (under ``DEVICE_EXTRA_PREFIX``); each device's new state kept, unless
        it or the diff holds NaN or inf: that device is counted failed at its leaf (``common.finite``), and its
        next task starts from the state it had, not a poisoned one."""
        if run is None:
            return diffs
        store = self.store()
        for d, s, diff, reports, state in zip(device_ids, selections, diffs, run.reports, run.new_states, strict=True):
            diff.update({DEVICE_EXTRA_PREFIX + n: np.asarray(a, dtype=np.float32) for n, a in reports.items()})
            if store is not None and not nonfinite_entry(diff) and not nonfinite_entry(state):
                store.put(d, s, state)
        return diffs

    def store(self) -> DeviceStateStore | None:
        if self.rule is None or not self.rule.keeps_state:
            return None
        with _store_lock:
            if self._store is None:
                cfg = self.settings
                self._store = DeviceStateStore(
                    cfg.get("dir") or os.path.join(os.getcwd(), "device_state"),
                    int(float(cfg.get("memory_mb", 256.0)) * 2**20),
                    durable=bool(cfg.get("durable", False)),
                    fresh=bool(cfg.get("fresh", True)),
                )
        return self._store
