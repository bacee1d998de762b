"""One configuration object per run: built once from flags, validated once before any process starts,
passed everywhere, and written whole into ``metrics.json``."""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field

from fedrevive.config import FedReviveConfig
from processors.data.sources import DatasetError, DatasetSpec
from simulation.clock import DeviceSpeedConfig
from simulation.profiles import DEFAULT_PROFILE, PROFILES


class ConfigError(ValueError):
    """A configuration NVFlare would hang on or misbehave with; the message names the fix."""


@dataclass
class JobConfig:
    method: str = "fedavg"  # fedavg | fedbuff | fedrevive
    job_name: str = ""
    # data
    dataset: str = "synthetic"
    data_root: str = "~/.cache/edgesim-flare/data"
    synthetic_size: int = 20000
    subset_size: int = 350
    dirichlet_alpha: float = 0.5  # <= 0 means IID
    # hierarchy and devices
    num_leaf_nodes: int = 2
    devices_per_leaf: int = 100
    device_selection_size: int = 100
    num_updates_for_model: int | None = None  # default: the selection size (synchronous)
    min_hole_to_fill: int | None = None  # default: the selection size (synchronous)
    max_num_active_model_versions: int = 3
    max_model_history: int | None = None
    device_reuse: bool = True
    global_lr: float = 1.0
    max_model_version: int = 10
    # local training
    model: str = "cifar10_convnet"
    local_iters: int = 25
    local_batch_size: int = 32
    local_lr: float = 3e-4
    optimizer: str = "adam"
    compute_device: str = "auto"
    # heterogeneity
    speed: DeviceSpeedConfig = field(default_factory=DeviceSpeedConfig)
    # FedRevive's server-side distillation (used by method fedrevive only)
    fedrevive: FedReviveConfig = field(default_factory=FedReviveConfig)
    # simulation engine
    simulator: str = "fast"  # fast | stock
    time_scale: float = 0.0  # 0: virtual clock; > 0: sleep sampled delays x this (1.0 = real time)
    wire_format: str = "numpy"  # numpy | lists (NVFlare's example format, for baselines)
    num_workers: int | None = None
    engine: str = "auto"  # auto | vectorized | per-device
    group_size: int | None = None  # devices one worker trains together (vectorized engine); None: planned
    profile: str = DEFAULT_PROFILE  # conservative | high | aggressive (simulation.profiles)
    job_timeout: float = 120.0
    device_wait_timeout: float = 120.0
    update_timeout: float = 10.0
    update_interval: float = 0.25  # seconds between a leaf's syncs with the server (NVFlare's default: 1.0)
    # evaluation and outputs
    eval_frequency: int = 1
    seed: int = 0
    env: str = "sim"  # sim | poc | prod
    startup_kit: str | None = None
    username: str | None = None
    workspace: str = "~/.cache/edgesim-flare/workspace"
    output: str | None = None
    export_only: str | None = None

    def __post_init__(self) -> None:
        if self.num_updates_for_model is None:
            self.num_updates_for_model = self.device_selection_size
        if self.min_hole_to_fill is None:
            self.min_hole_to_fill = self.device_selection_size
        if not self.job_name:
            self.job_name = f"edgesim_{self.method}"

    @property
    def dataset_spec(self) -> DatasetSpec:
        name = self.dataset if self.dataset in ("cifar10", "synthetic") else os.path.abspath(self.dataset)
        return DatasetSpec(name, os.path.expanduser(self.data_root), self.synthetic_size, self.seed)

    @property
    def devices_per_leaf_per_round(self) -> int:
        """Devices a leaf trains at once: the selection spread over the leaves."""
        return math.ceil(self.device_selection_size / self.num_leaf_nodes)

    @property
    def output_dir(self) -> str:
        return os.path.abspath(
            os.path.expanduser(self.output or os.path.join(self.workspace, "results", self.job_name))
        )

    def validate(self) -> None:
        """Refuse, before anything starts, every configuration NVFlare would hang on or reject late."""
        positive = {
            "--num-leaf-nodes": self.num_leaf_nodes,
            "--devices-per-leaf": self.devices_per_leaf,
            "--device-selection-size": self.device_selection_size,
            "--num-updates-for-model": self.num_updates_for_model,
            "--min-hole-to-fill": self.min_hole_to_fill,
            "--local-iters": self.local_iters,
            "--local-batch-size": self.local_batch_size,
            "--subset-size": self.subset_size,
            "--eval-frequency": self.eval_frequency,
            "--synthetic-size": self.synthetic_size,
        }
        for flag, value in positive.items():
            if value is None or value < 1:
                raise ConfigError(f"{flag} {value}: must be a positive integer")
        if not self.time_scale >= 0:
            raise ConfigError(f"--time-scale {self.time_scale}: must be >= 0 (0: virtual clock, 1: real time)")
        if self.time_scale > 0 and self.simulator == "stock":
            raise ConfigError("--time-scale needs --simulator fast (the stock simulator sleeps the delays in full)")
        if self.max_num_active_model_versions < 0:
            raise ConfigError("--max-num-active-model-versions must be >= 0 (0: keep every active version)")
        if self.group_size is not None and self.group_size < 1:
            raise ConfigError(f"--group-size {self.group_size}: must be >= 1 (or leave it out to plan it)")
        if self.engine not in ("auto", "vectorized", "per-device"):
            raise ConfigError(f"--engine {self.engine!r}: use auto, vectorized or per-device")
        if self.engine == "vectorized" and self.simulator == "stock":
            raise ConfigError("--engine vectorized needs --simulator fast (the stock simulator runs one device at a time)")
        if self.profile not in PROFILES:
            raise ConfigError(f"--profile {self.profile!r}: use {', '.join(PROFILES)} (default {DEFAULT_PROFILE})")
        if self.num_workers is not None and self.num_workers < 1:
            raise ConfigError(f"--num-workers {self.num_workers}: must be >= 1 (or leave it out to plan it)")
        for flag, value in {
            "--job-timeout": self.job_timeout,
            "--device-wait-timeout": self.device_wait_timeout,
            "--update-timeout": self.update_timeout,
            "--update-interval": self.update_interval,
            "--local-lr": self.local_lr,
            "--global-lr": self.global_lr,
        }.items():
            if not value > 0:
                raise ConfigError(f"{flag} {value}: must be > 0")
        if self.max_model_version < 2:
            raise ConfigError(
                f"--max-model-version {self.max_model_version}: must be >= 2 (version 1 is the initial model, "
                "so 2 is the first trained one)"
            )
        pool = self.num_leaf_nodes * self.devices_per_leaf
        if self.device_selection_size > pool:
            raise ConfigError(
                f"--device-selection-size {self.device_selection_size} is larger than the device pool "
                f"({self.num_leaf_nodes} leaves x {self.devices_per_leaf} devices = {pool}); NVFlare would wait "
                f"forever. Lower it to <= {pool} or raise --devices-per-leaf."
            )
        if self.num_updates_for_model > self.device_selection_size:
            raise ConfigError(
                f"--num-updates-for-model {self.num_updates_for_model} is larger than --device-selection-size "
                f"{self.device_selection_size}: the server would never collect enough updates. Lower it."
            )
        if self.min_hole_to_fill > self.device_selection_size:
            raise ConfigError(
                f"--min-hole-to-fill {self.min_hole_to_fill} must be <= --device-selection-size "
                f"{self.device_selection_size}"
            )
        if self.subset_size < self.local_batch_size:
            raise ConfigError(
                f"--subset-size {self.subset_size} is smaller than --local-batch-size {self.local_batch_size}; "
                "raise --subset-size or lower the batch size"
            )
        if self.method not in ("fedavg", "fedbuff", "fedrevive"):
            raise ConfigError(f"unknown method {self.method!r}")
        if self.simulator not in ("fast", "stock"):
            raise ConfigError(f"--simulator {self.simulator!r}: use fast or stock")
        if self.wire_format not in ("numpy", "lists"):
            raise ConfigError(f"--wire-format {self.wire_format!r}: use numpy or lists")
        if self.optimizer not in ("adam", "sgd"):
            raise ConfigError(f"--optimizer {self.optimizer!r}: use adam or sgd")
        if self.env not in ("sim", "poc", "prod"):
            raise ConfigError(f"--env {self.env!r}: use sim, poc or prod")
        if self.env == "prod" and not (self.startup_kit and self.username):
            raise ConfigError("--env prod needs --startup-kit DIR (the admin's startup kit) and --username NAME")
        if self.env == "prod" and not os.path.isdir(os.path.expanduser(self.startup_kit)):
            raise ConfigError(f"--startup-kit {self.startup_kit}: no such directory")
        try:
            _ = self.dataset_spec.kind  # raises for a name that is no known source
        except DatasetError as ex:
            raise ConfigError(str(ex)) from ex

    def to_dict(self) -> dict:
        d = asdict(self)
        d["speed"] = self.speed.to_dict()
        d["fedrevive"] = self.fedrevive.to_dict() if self.method == "fedrevive" else None
        return d
