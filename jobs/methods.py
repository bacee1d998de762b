"""The table of FL methods: what each one changes in a job, in one place.

FedAvg, FedBuff and FedRevive share the device side (local training is the same); they differ in the server's
model manager, in what the leaves send up, in their presets and in whether they are synchronous. Every other
module asks this table instead of testing method names.
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
LeafAggregation = Literal["summed", "per-device"]


def buffered_model_manager(cfg: JobConfig, results_dir: str):
    """FedAvg / FedBuff on the server: the mean of the buffered updates, times the server learning rate."""
    from aggregation.numpy_model_manager import NumpyBuffModelManager

    return NumpyBuffModelManager(num_updates_for_model=cfg.federation.num_updates_for_model,
                                 global_lr=cfg.federation.global_lr)  # fmt: skip


def fedrevive_model_manager(cfg: JobConfig, results_dir: str):
    """FedRevive on the server: each update revived by data-free distillation before it is buffered."""
    from aggregation.fedrevive_model_manager import FedReviveModelManager

    return FedReviveModelManager(
        num_updates_for_model=cfg.federation.num_updates_for_model,
        global_lr=cfg.federation.global_lr,
        model=cfg.training.model,
        fedrevive=cfg.fedrevive.to_dict(),
        compute_device=cfg.training.compute_device,
        seed=cfg.run.seed,
        results_dir=results_dir,
    )


@dataclass(frozen=True)
class MethodSpec:
    """Attributes:
    name: the ``--method`` value.
    synchronous: every selected device's update goes into the next model (updates = min hole = selection).
    leaf_aggregation: ``summed`` (a leaf sends the sum of its devices' diffs per model version) or
        ``per-device`` (each device's diff, with its id and base version: FedRevive needs them).
    model_manager: builds the server's model manager from the job config and the results folder.
    presets: federation values of the FedRevive paper's reference runs (concurrency 100), applied by
        ``jobs/pt_job_fedrevive.py`` to whatever is not given as a flag (FedAvg's buffer and min hole follow the
        selection, whatever it is).
    distills: the method runs FedRevive's server-side distillation (its ``--fr-*`` settings apply).
    """

    name: MethodName
    synchronous: bool
    leaf_aggregation: LeafAggregation
    model_manager: Callable
    presets: dict = field(default_factory=dict)
    distills: bool = False

    def check(self, federation: FederationConfig, engine: EngineConfig) -> None:
        """Refuse a configuration this method cannot run, naming the fix."""
        if self.synchronous and not federation.synchronous:
            raise ConfigError(
                f"{self.name} is synchronous and waits for every selected device: leave --num-updates-for-model "
                "and --min-hole-to-fill at the selection size, or use --method fedbuff for buffered asynchronous FL"
            )
        if engine.simulator == "stock" and self.leaf_aggregation != "summed":
            raise ConfigError(
                f"--method {self.name} needs each device's update on the server, which NVFlare's stock path (it "
                "sums them on the leaves) does not provide: use --simulator fast"
            )


METHODS: dict[str, MethodSpec] = {
    "fedavg": MethodSpec(
        "fedavg", True, "summed", buffered_model_manager,
        presets={"device_selection_size": 100, "global_lr": 1.4},  # updates and min hole: the selection
    ),
    "fedbuff": MethodSpec(
        "fedbuff", False, "summed", buffered_model_manager,
        presets={"device_selection_size": 100, "num_updates_for_model": 2, "min_hole_to_fill": 1, "global_lr": 0.05},
    ),
    "fedrevive": MethodSpec(
        "fedrevive", False, "per-device", fedrevive_model_manager,
        presets={"device_selection_size": 100, "num_updates_for_model": 1, "min_hole_to_fill": 1, "global_lr": 0.10},
        distills=True,
    ),
}  # fmt: skip
