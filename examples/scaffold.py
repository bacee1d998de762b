"""SCAFFOLD (Karimireddy et al. 2020, "SCAFFOLD: Stochastic Controlled Averaging for Federated Learning"), with
option II control variates: a method whose devices correct every local step and keep state across their tasks.

The server keeps the global control variate ``c``; device i keeps its own ``c_i`` (zero before its first task).
A selected device starts from the global model ``x`` and takes K steps of SGD with learning rate ``eta_l`` on its
corrected gradient

    y_i <- y_i - eta_l * (g_i(y_i) - c_i + c)

then sets ``c_i+ = c_i - c + (x - y_i) / (K * eta_l)`` (option II) and reports its diff ``y_i - x`` and
``delta c_i = c_i+ - c_i``. The server, after B updates, sets

    x <- x + eta_g * mean(y_i - x),    c <- c + (1 / N) * sum(delta c_i)

(N: every device of the run; ``|S| / N * mean`` in the paper). ``c`` travels with each version
(``ServerStrategy.device_extras``); ``c_i`` stays with its device (``processors.device_state`` on a simulated
leaf, the device itself when real). The device side is a ``DeviceRule`` (``processors.device_rule``), run by both
training engines. Plain SGD (``--optimizer sgd``, no momentum), as in the paper.

    PYTHONPATH=examples python jobs/pt_job_fedrevive.py --method scaffold:Scaffold --optimizer sgd --local-lr 0.05 ...
"""

from __future__ import annotations

import numpy as np

from aggregation.buffered_mean import BufferedMean
from aggregation.strategy import ModelHistory, Update, Weights
from common.choices import ConfigError
from common.result_files import DEVICE_STATE
from jobs.methods import FedAvg
from processors.device_rule import DeviceRule

C, C_I, DELTA_C = "c/", "c_i/", "delta_c/"


class ScaffoldRule(DeviceRule):
    """The device side: the step correction ``c - c_i`` and option II's new ``c_i`` (pure tensor code: it also
    runs under vmap)."""

    keeps_state = True
    reports = (DELTA_C,)  # one per parameter: delta_c/<name>

    def __init__(self, local_iters: int = 1, local_lr: float = 1.0):
        self.scale = 1.0 / (local_iters * local_lr)

    def initial_state(self, received, extras):
        return {C_I + n: received[n] * 0 for n in received}

    def before(self, received, extras, state):
        return {n: extras[C + n] - state[C_I + n] for n in received} | {C_I + n: state[C_I + n] for n in received}

    def step(self, params, grads, ctx):
        return {n: g + ctx[n] for n, g in grads.items()}

    def after(self, params, received, ctx):
        # c_i+ - c_i = -c + (x - y_i) / (K eta_l), where c = correction + c_i
        delta = {n: (received[n] - params[n]) * self.scale - ctx[n] - ctx[C_I + n] for n in params}
        return {DELTA_C + n: d for n, d in delta.items()}, {C_I + n: ctx[C_I + n] + d for n, d in delta.items()}


class ScaffoldStrategy(BufferedMean):
    """The server side: FedAvg's (or FedBuff's) mean of the diffs, and ``c`` moved by the reported delta c_i.

    Args:
        global_lr: eta_g, on the mean of the buffered diffs.
        num_devices: N, the run's devices.
    """

    def __init__(self, global_lr: float = 1.0, num_devices: int = 1):
        super().__init__(global_lr)
        self.num_devices = num_devices
        self.c: Weights = {}
        self._delta_c: Weights = {}

    def start(self, initial: Weights) -> None:
        self.c = {n: np.zeros_like(v) for n, v in initial.items() if n not in self.context.statistics}

    def add_update(self, update: Update, model: ModelHistory) -> None:
        super().add_update(update, model)
        for n in self.c:
            d = update.reports[DELTA_C + n]
            if n in self._delta_c:
                self._delta_c[n] += d
            else:
                self._delta_c[n] = d.copy()

    def make_version(self, model: ModelHistory, sim_time: float) -> Weights:
        new = super().make_version(model, sim_time)
        scale = np.float32(1.0 / self.num_devices)
        self.c = {n: v + scale * self._delta_c[n] if n in self._delta_c else v for n, v in self.c.items()}
        self._delta_c = {}
        return new

    def device_extras(self, model: ModelHistory) -> Weights:
        return {C + n: v for n, v in self.c.items()}

    def state_dict(self) -> dict:
        return super().state_dict() | {"c": self.c, "delta_c": self._delta_c}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.c, self._delta_c = state["c"], state["delta_c"]


class Scaffold(FedAvg):
    """Synchronous SCAFFOLD, as in the paper (eta_g 1 by default)."""

    name = ""  # a user's method is named by its import path
    strategy = ScaffoldStrategy
    rule = ScaffoldRule
    result_files = (DEVICE_STATE,)  # its devices' c_i (a new run in the same folder clears them)
    presets = {"device_selection_size": 100, "global_lr": 1.0}

    def strategy_args(self, cfg) -> dict:
        f = cfg.federation
        return super().strategy_args(cfg) | {"num_devices": f.num_leaf_nodes * f.devices_per_leaf}

    def rule_args(self, cfg) -> dict:
        return {"local_iters": cfg.training.local_iters, "local_lr": cfg.training.local_lr}

    def check(self, cfg) -> None:
        super().check(cfg)
        t = cfg.training
        if t.optimizer != "sgd" or t.momentum != 0:
            raise ConfigError(
                f"SCAFFOLD's control variates assume plain SGD steps: give --optimizer sgd (not {t.optimizer}"
                f"{', momentum ' + str(t.momentum) if t.momentum else ''})"
            )
