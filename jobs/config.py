"""A job's whole configuration: one frozen part per concern, each validating itself, assembled in ``JobConfig``.

The parts match the command line's flag groups; each lives with the layer that uses it:

==========================  ================================  ===========================================
part                        class                             used by
==========================  ================================  ===========================================
data                        ``processors.data.config``        task processor, evaluator
federation                  ``FederationConfig`` (here)       server components (selection, aggregation)
local training              ``processors.training_config``    task processor, planner, evaluator
engine                      ``jobs.engine_config``             planner, device simulator
heterogeneity (delays)      ``common.delays``                 the simulated-time schedule, device simulator
run/output                  ``jobs.run_config``               driver, results
method settings             the method's own dataclass        its server strategy (FedRevive: ``fedrevive.config``)
differential privacy        ``common.privacy``                devices (clipping), server (noise), accountant
communication               ``common.compression``            devices (compressor), the schedule (bytes)
==========================  ================================  ===========================================

Each part documents its fields once, in its ``Attributes:`` docstring: that text, in that order, is also the
help of their flags (``common.config_flags``), so it is written for users; a field whose default is ``None`` says
what it becomes in a trailing ``(default: ...)``.

``JobConfig`` checks what spans parts (a selection larger than the pool, a batch larger than a device's data, a
method the engine cannot run) and is written whole into ``metrics.json`` (``to_dict``). It derives nothing: the
build step (``jobs.build``) makes the one config a run uses, with every derived value (the ``auto`` model, the
results folder, the privacy plan) computed there once, and marks it ``resolved``; the driver runs only such a
config.

Constructing a config reads no file and builds no model: each part checks its own values only. What needs the files
and models a config names (the startup kit, trace files, a user's model class, whether the vectorised engine can
run the model) is checked by ``JobConfig.validate()``, a stage of the build; it raises the same one-line
``ConfigError``.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from common.choices import ConfigError, check_choice, check_positive
from common.compression import CompressionConfig
from common.delays import DelayConfig
from common.privacy import PrivacyConfig
from jobs.compression import transfer_delays
from jobs.engine_config import EngineConfig
from jobs.methods import Method, method_of
from jobs.run_config import RunConfig
from processors.data.config import DataConfig
from processors.training_config import TrainingConfig

LeafLossPolicy = Literal["stop", "continue"]


@dataclass(frozen=True)
class FederationConfig:
    """Attributes:
    num_leaf_nodes: leaf clients (NVFlare simulator clients in ``sim``).
    devices_per_leaf: simulated devices on each leaf.
    device_selection_size: devices training at once (concurrency, K).
    num_updates_for_model: device updates buffered per new global model (B) (default: the selection size).
    min_hole_to_fill: finished devices before new ones are selected (default: the selection size).
    global_lr: server learning rate applied to the mean update.
    max_model_version: the last global model version (1 is the initial model).
    max_sim_time: simulated-time budget: no update arriving later is applied (default: none).
    device_reuse: a device may be selected again once its update arrived (off: each device at most once).
    device_wait_timeout: seconds the server waits for every leaf's devices before it stops the job.
    leaf_timeout: seconds a leaf may stay silent before the server counts it lost (default: derived from the sync
        interval and the report size, printed at the start).
    on_leaf_loss: ``stop``: end the run naming the lost leaf (``metrics.json`` keeps what was made); ``continue``:
        go on with the living leaves, the lost leaf's in-flight devices counted as failed (fits asynchronous
        methods).
    max_consecutive_failures: stop the run (``outcome`` ``stopped``, naming the last device error) once this many
        device updates in a row failed with an error, from as many different devices (or every device, in a
        smaller pool), none counting since: it cannot make progress. Only a device's own error counts (its
        training raised; a real device reported an error or a result that does not fit), not going offline
        (``--availability``), silence past ``--device-timeout`` or a lost leaf. 100 in a row is beyond any
        healthy fleet (even one whose devices each fail 8 times in 10, about 1 in 5e9 per update) yet quick to
        reach when every device fails; 0: never stop.
    """

    num_leaf_nodes: int = 2
    devices_per_leaf: int = 100
    device_selection_size: int = 100
    num_updates_for_model: int | None = None
    min_hole_to_fill: int | None = None
    device_reuse: bool = True
    global_lr: float = 1.0
    max_model_version: int = 10
    max_sim_time: float | None = None
    device_wait_timeout: float = 120.0
    leaf_timeout: float | None = None
    on_leaf_loss: LeafLossPolicy = "stop"
    max_consecutive_failures: int = 100

    def __post_init__(self) -> None:
        if self.num_updates_for_model is None:
            object.__setattr__(self, "num_updates_for_model", self.device_selection_size)
        if self.min_hole_to_fill is None:
            object.__setattr__(self, "min_hole_to_fill", self.device_selection_size)
        check_positive(
            {
                "--num-leaf-nodes": self.num_leaf_nodes,
                "--devices-per-leaf": self.devices_per_leaf,
                "--device-selection-size": self.device_selection_size,
                "--num-updates-for-model": self.num_updates_for_model,
                "--min-hole-to-fill": self.min_hole_to_fill,
            }
        )
        check_positive(
            {"--global-lr": self.global_lr, "--device-wait-timeout": self.device_wait_timeout}, integer=False
        )
        if self.max_sim_time is not None and not self.max_sim_time > 0:
            raise ConfigError(f"--max-sim-time {self.max_sim_time}: must be > 0 (simulated seconds)")
        if self.leaf_timeout is not None and not self.leaf_timeout > 0:
            raise ConfigError(f"--leaf-timeout {self.leaf_timeout}: must be > 0 seconds (or leave it out)")
        check_choice("--on-leaf-loss", self.on_leaf_loss, LeafLossPolicy)
        if self.max_consecutive_failures < 0:
            raise ConfigError(
                f"--max-consecutive-failures {self.max_consecutive_failures}: failed updates in a row, >= 1 (or 0: "
                "never stop)"
            )
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

    @property
    def devices_per_leaf_per_round(self) -> int:
        """Devices a leaf trains at once: the selection spread over the leaves."""
        return math.ceil(self.device_selection_size / self.num_leaf_nodes)

    @property
    def synchronous(self) -> bool:
        """Every selected device's update goes into the next model and nobody is selected before it exists."""
        return self.num_updates_for_model == self.min_hole_to_fill == self.device_selection_size

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class JobConfig:
    """One run: the method and one part per concern (see the module docstring).

    Attributes:
        method: a built-in method's name (``fedavg``, ``fedbuff``, ``fedrevive``) or a ``jobs.methods.Method``
            subclass's import path ``package.module:Name``.
        method_settings: the method's own settings (an instance of its ``settings`` dataclass; ``None``: its
            defaults, or it has none).
    """

    method: str = "fedavg"
    data: DataConfig = field(default_factory=DataConfig)
    federation: FederationConfig = field(default_factory=FederationConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    delays: DelayConfig = field(default_factory=DelayConfig)
    run: RunConfig = field(default_factory=RunConfig)
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)
    compression: CompressionConfig = field(default_factory=CompressionConfig)
    method_settings: Any = None
    # set by the build step only (``jobs.build``); a copy (``dataclasses.replace``) is a new, unresolved config
    _resolved: bool = field(default=False, init=False, repr=False, compare=False)
    _planned: Any = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        method = method_of(self.method)
        if self.method_settings is None:
            object.__setattr__(self, "method_settings", method.settings_from({}))
        elif method.settings is None or not isinstance(self.method_settings, method.settings):
            raise ConfigError(
                f"method_settings {type(self.method_settings).__name__}: --method {self.method} takes "
                f"{method.settings.__name__ if method.settings else 'no settings'}"
            )
        if self.data.subset_size < self.training.local_batch_size:
            raise ConfigError(
                f"--subset-size {self.data.subset_size} is smaller than --local-batch-size "
                f"{self.training.local_batch_size}; raise --subset-size or lower the batch size"
            )
        method.check(self)
        if self.delays.availability != "always" and self.engine.time_scale > 0:
            raise ConfigError(
                f"--availability {self.delays.availability} needs exact time: leave out --time-scale / --real-delays "
                "(a real-time run cannot take a device offline mid-task)"
            )
        self._check_real_devices()

    def validate(self) -> JobConfig:
        """Check what needs the files and models the config names, before anything starts: the parts' own
        (``RunConfig``, ``TrainingConfig``, ``DelayConfig``: the startup kit, the model's import, the trace files),
        and whether ``--engine vectorized`` can run the model. Returns the config ready to run: with a capacity
        trace, its task's samples and the model's bytes filled in where not given (measured speeds need them). A
        stage of the build step (``jobs.build``). ``ConfigError`` naming the fix otherwise; validating twice gives
        the same config."""
        try:
            return self._validated()
        except ConfigError:
            raise
        except (TypeError, ValueError) as ex:  # a user's model that cannot be built as the devices build it
            raise ConfigError(str(ex)) from ex

    def _validated(self) -> JobConfig:
        from processors.models import build_model
        from processors.training_vectorized import NotVectorizable, check_vectorizable

        self.run.validate()
        self.data.validate()
        self.training.validate()
        self.delays.validate()
        self.engine.validate()
        cfg = self
        if self.training.local_epochs and not self.delays.task_samples:
            # the reference task a drawn training time is for: the nominal device's epochs (common.delays)
            cfg = replace(self, delays=replace(self.delays, task_samples=self.training.work(self.data.subset_size)))
        if cfg.delays.capacity_file and not (cfg.delays.task_samples and cfg.delays.model_bytes):
            # measured speeds need the work: samples per task, and the model's float32 bytes each way
            samples = self.training.local_iters * min(self.training.local_batch_size, self.data.subset_size)
            size = 4 * sum(t.numel() for t in build_model(self.training.model).state_dict().values())
            derived = replace(
                cfg.delays,
                task_samples=cfg.delays.task_samples or samples,
                model_bytes=cfg.delays.model_bytes or size,
            )
            cfg = replace(cfg, delays=derived)
        cfg = transfer_delays(cfg)  # compression or a bandwidth: the bytes each transfer carries, for the schedule
        if self.engine.engine == "vectorized":
            try:
                check_vectorizable(build_model(self.training.model))
            except NotVectorizable as ex:
                raise ConfigError(str(ex)) from ex
        return cfg

    def _check_real_devices(self) -> None:
        """``--devices real`` needs a deployment and the wall clock: nothing simulated may shape its time."""
        if self.engine.devices != "real":
            return
        if self.run.env == "sim" and not self.run.export_only:
            raise ConfigError(
                "--devices real needs devices that reach the leaves: use --env poc or --env prod (with "
                "python -m jobs.deploy up --proxy), or leave out --devices for simulated ones"
            )
        if self.run.dry_run:
            raise ConfigError("--dry-run plans simulated time: leave out --devices real")
        if self.federation.max_sim_time is not None:
            raise ConfigError("--max-sim-time budgets simulated time: leave it out with --devices real")
        if self.delays.availability != "always" or self.delays.capacity_file:
            raise ConfigError(
                "--devices real: real devices bring their own availability and speed; leave out --availability "
                "and --capacity-file"
            )

    @property
    def resolved(self) -> bool:
        """Made by the build step (``jobs.build``): validated, every derived value computed; what the driver runs."""
        return self._resolved

    @property
    def planned_timeline(self) -> Any:
        """The dry-run planner's timeline the build computed for this run (``scheduling.timeline.Timeline``: a
        dry run whose privacy was planned), so ``--dry-run`` writes it without planning it again; else None."""
        return self._planned

    def mark_resolved(self, planned: Any = None) -> JobConfig:
        """The build step's last act (``jobs.build``, nowhere else): mark this config resolved."""
        object.__setattr__(self, "_resolved", True)
        object.__setattr__(self, "_planned", planned)
        return self

    @property
    def method_spec(self) -> Method:
        """The method object ``method`` names (``jobs.methods``)."""
        return method_of(self.method)

    @property
    def spec(self):
        """What to load: the data part with this run's seed."""
        return self.data.spec(self.run.seed)

    @property
    def output_dir(self) -> str:
        return os.path.abspath(os.path.expanduser(self.run.output)) if self.run.output else ""

    def to_dict(self) -> dict:
        """Every part's fields as plain values, in one pass (``dataclasses.asdict``); the delay model's own
        ``DelayConfig.to_dict`` (it leaves out the transfer fields that are not set)."""
        d = {"method": self.method} | {name: asdict(getattr(self, name)) for name in PARTS}
        d["delays"] = self.delays.to_dict()
        d["method_settings"] = asdict(self.method_settings) if self.method_settings is not None else None
        return d

    @classmethod
    def from_dict(cls, d: dict) -> JobConfig:
        """The config a ``to_dict`` wrote (e.g. the ``config`` of a run's ``metrics.json``)."""
        d = {"privacy": {}, "compression": {}} | d  # a run recorded before either existed ran without it
        parts = {name: PARTS[name].from_dict(d[name]) if name == "delays" else PARTS[name](**d[name]) for name in PARTS}
        settings = d.get("method_settings", d.get("fedrevive"))  # "fedrevive": written before the method API
        method = method_of(d["method"])
        return cls(method=d["method"], **parts, method_settings=method.settings_from_record(settings or {}))


# the fields a resumed run may change (``jobs.resume``): how it runs, how long, where it writes; nothing of its
# result before its end. Seeded DP noise is keyed by every other field (``jobs.privacy.noise_key``).
HARMLESS = {
    ("federation", "max_model_version"),
    ("federation", "max_sim_time"),
    ("federation", "device_wait_timeout"),
    ("federation", "leaf_timeout"),
    ("federation", "on_leaf_loss"),
    ("federation", "max_consecutive_failures"),
    ("engine", "num_workers"),
    ("engine", "update_interval"),
    ("engine", "update_timeout"),
    ("engine", "job_timeout"),
    ("engine", "profile"),
    ("engine", "device_state_memory_mb"),
    ("engine", "version_memory_mb"),
    ("engine", "bulk"),
    ("run", "eval_frequency"),
    ("run", "eval_backlog"),
    ("run", "workspace"),
    ("run", "checkpoint_every"),
    ("run", "output"),
    ("run", "resume"),
    ("run", "export_only"),
    ("run", "env"),
    ("run", "startup_kit"),
    ("run", "username"),
    ("run", "tracking"),  # where the curves go; the tracker runs a resume continues are in the checkpoint
    ("run", "tracking_uri"),
    ("run", "tracking_parent"),
}

PARTS = {
    "data": DataConfig,
    "federation": FederationConfig,
    "training": TrainingConfig,
    "engine": EngineConfig,
    "delays": DelayConfig,
    "run": RunConfig,
    "privacy": PrivacyConfig,
    "compression": CompressionConfig,
}
