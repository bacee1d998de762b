"""The table of FL methods: what each one changes in a job, in one place.

FedAvg, FedBuff and FedRevive share the device side (local training is the same); they differ in the server's
strategy (``aggregation.strategy``), in their leaf aggregation (``leaf_sums``), in their presets, in whether they are synchronous, and
in whether NVFlare's stock path (which sums updates on the leaves) can run them as a baseline. Every other module
asks this table instead of testing method names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from common.choices import ConfigError

if TYPE_CHECKING:
    from jobs.config import FederationConfig, JobConfig
    from simulation.config import EngineConfig

MethodName = Literal["fedavg", "fedbuff", "fedrevive"]


def global_model(cfg: JobConfig, results_dir: str, strategy: str, strategy_args: dict):
    """The server's global model, its versions made by ``strategy`` (``aggregation.strategy``)."""
    from aggregation.global_model import GlobalModel

    return GlobalModel(
        strategy=strategy,
        strategy_args=strategy_args,
        model=cfg.training.model,
        seed=cfg.run.seed,
        compute_device=cfg.training.compute_device,
        results_dir=results_dir,
    )


def buffered_mean(cfg: JobConfig, results_dir: str):
    """FedAvg / FedBuff on the server: the mean of the buffered updates, times the server learning rate."""
    return global_model(
        cfg, results_dir, "aggregation.buffered_mean:BufferedMean", {"global_lr": cfg.federation.global_lr}
    )


def fedrevive_strategy(cfg: JobConfig, results_dir: str):
    """FedRevive on the server: each update revived by data-free distillation before it is buffered."""
    return global_model(
        cfg,
        results_dir,
        "aggregation.fedrevive_strategy:FedReviveStrategy",
        {"global_lr": cfg.federation.global_lr, "fedrevive": cfg.fedrevive.to_dict()},
    )


@dataclass(frozen=True)
class MethodSpec:
    """Attributes:
    name: the ``--method`` value.
    synchronous: every selected device's update goes into the next model (updates = min hole = selection).
    model_manager: builds the server's global model, with the method's strategy (``aggregation.strategy``), from
        the job config and the results folder.
    presets: federation values of the FedRevive paper's reference runs (concurrency 100), applied by
        ``jobs/pt_job_fedrevive.py`` to whatever is not given as a flag (FedAvg's buffer and min hole follow the
        selection, whatever it is).
    distills: the method runs FedRevive's server-side distillation (its ``--fr-*`` settings apply).
    stock_baseline: NVFlare's stock path (``--simulator stock``) can run it, for the benchmarks' comparisons.
    """

    name: MethodName
    synchronous: bool
    model_manager: Callable
    presets: dict = field(default_factory=dict)
    distills: bool = False
    stock_baseline: bool = False

    def leaf_sums(self, cfg: JobConfig) -> bool:
        """Leaf aggregation: ``True``, a leaf sends one sum per selection (every device of a synchronous
        selection goes into the same version); ``False``, each device's own update (asynchronous runs, and
        FedRevive, which revives each update on its own)."""
        return cfg.federation.synchronous and not self.distills

    def check(self, federation: FederationConfig, engine: EngineConfig) -> None:
        """Refuse a configuration this method cannot run, naming the fix."""
        if self.synchronous and not federation.synchronous:
            raise ConfigError(
                f"{self.name} is synchronous and waits for every selected device: leave --num-updates-for-model "
                "and --min-hole-to-fill at the selection size, or use --method fedbuff for buffered asynchronous FL"
            )
        if engine.simulator == "stock" and not self.stock_baseline:
            raise ConfigError(
                f"--simulator stock is NVFlare's own path, a baseline for synchronous FedAvg; --method {self.name} "
                "needs our server (each device's update, applied on exact simulated time): use --simulator fast"
            )


METHODS: dict[str, MethodSpec] = {
    "fedavg": MethodSpec(
        "fedavg",
        True,
        buffered_mean,
        presets={"device_selection_size": 100, "global_lr": 1.4},  # updates and min hole: the selection
        stock_baseline=True,
    ),
    "fedbuff": MethodSpec(
        "fedbuff",
        False,
        buffered_mean,
        presets={"device_selection_size": 100, "num_updates_for_model": 2, "min_hole_to_fill": 1, "global_lr": 0.05},
    ),
    "fedrevive": MethodSpec(
        "fedrevive",
        False,
        fedrevive_strategy,
        presets={"device_selection_size": 100, "num_updates_for_model": 1, "min_hole_to_fill": 1, "global_lr": 0.10},
        distills=True,
    ),
}
