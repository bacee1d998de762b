"""The engine part of a job's configuration: how each leaf simulates its devices (read by the driver, which passes
its values to the leaves' and the server's components)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

from common.choices import ConfigError, check_choice, check_positive
from common.profiles import DEFAULT_PROFILE, ProfileName

SimulatorName = Literal["fast", "stock"]
EngineName = Literal["auto", "vectorized", "per-device"]
DevicesName = Literal["simulated", "real"]
BulkName = Literal["auto", "shm", "wire"]


@dataclass(frozen=True)
class EngineConfig:
    """Attributes:
    simulator: ``fast`` (our device simulator and server components) or ``stock`` (NVFlare's own simulator,
        model manager and Python-list weights, as in NVFlare's edge example: the baseline benchmarks compare to).
    engine: how a leaf trains its devices: ``vectorized`` (a group of devices in one batched step,
        ``torch.func.vmap``), ``per-device`` (one at a time), or ``auto``: vectorized unless the model has
        BatchNorm statistics or, on the CPU, costs over 100 MFLOP per training sample
        (``simulation.planner.CPU_GROUP_MAX_MFLOPS``).
    num_workers: device workers per leaf (its thread pool) (default: planned from the hardware).
    group_size: devices one worker trains together with the vectorized engine (default: planned).
    profile: utilisation profile (``common.profiles``): ``conservative`` (half the workers and groups, half the
        GPU memory, data on the CPU, cache emptied after every task), ``high`` (the planner's defaults),
        ``aggressive`` (90% of free GPU memory, tighter memory estimate); printed at the start.
    time_scale: 0: exact simulated time, nothing sleeps (``scheduling.schedule``). S > 0: a real-time mode for
        load-testing a deployment: each result is held for its delays x S wall seconds and the server applies
        updates as they arrive (simulated time = wall time / S).
    devices: ``simulated`` (each leaf runs our device simulator) or ``real``: leaves run no simulator and wait for
        devices (NVFlare's HTTP device client or a phone app, through NVFlare's routing proxy: ``python -m
        jobs.deploy up --proxy``); the server applies updates in the order they arrive, on the wall clock
        (``docs/real-devices.md``). Needs ``--env poc`` or ``prod``.
    device_timeout: with ``--devices real``, seconds a selected device may take before it counts as failed and
        its slot is refilled; 0: derived (``common.device_timeout.FIRST_DEVICE_TIMEOUT`` until a task is measured, then 3x the slowest
        task seen, at least that; printed at the start).
    trainer: the leaves' task processor by import path ``package.module:Class``, a subclass of
        ``processors.task_processor.TrainingTaskProcessor`` taking its arguments; "": that class itself. No flag:
        an option of ``jobs.api`` for benchmarks (``benchmarks/lib/null_training.py``: the protocol's ceiling).
    job_timeout: seconds a leaf's device simulator waits for the job to reach it (only that: not a limit on the
        job).
    update_interval: a leaf's heartbeat: the longest a leaf waits between syncs with its parent (it syncs at once
        when it has results the server waits for, or news; NVFlare's own leaves sync every 1.0 s).
    update_timeout: seconds a leaf waits for its parent to take an update (default: derived from the report size,
        printed at the start; ``jobs.run.timeouts.derive_timeouts``).
    device_state_memory_mb: with a method whose devices keep state across tasks (SCAFFOLD's control variates,
        ``processors.device_rule``), the MiB of it a leaf holds in memory; past it the least recently used
        devices' state goes to disk (``processors.device_state``, in the results folder's ``device_state/``).
    version_memory_mb: the MiB of model versions the server keeps in memory for the devices in flight (an
        asynchronous run keeps every version one of them trains: about a thousand at K = 2,000 with the paper's
        delays); past it the oldest go to disk in the server's run folder and are read back when a device needs
        one (``aggregation.version_store``; the results are the same).
    bulk: how the bulk arrays (device diffs up, model versions down) travel between the server and each leaf:
        ``auto``: through shared memory when the leaf proves at its start that it shares the server's machine and
        user, else NVFlare's wire (each leaf's choice is printed, and recorded in ``metrics.json``'s ``bulk``);
        ``shm``: the same, and a leaf that cannot stops the run; ``wire``: NVFlare's wire only. Messages stay
        NVFlare's either way, and the results are the same (``docs/deployment.md``, "Shared memory").
    """

    simulator: SimulatorName = "fast"
    engine: EngineName = "auto"
    num_workers: int | None = None
    group_size: int | None = None
    profile: ProfileName = DEFAULT_PROFILE
    time_scale: float = 0.0
    job_timeout: float = 120.0
    update_interval: float = 0.25
    update_timeout: float | None = None
    devices: DevicesName = "simulated"
    device_timeout: float = 0.0
    trainer: str = ""
    device_state_memory_mb: float = 256.0
    version_memory_mb: float = 256.0
    bulk: BulkName = "auto"

    def __post_init__(self) -> None:
        check_choice("--devices", self.devices, DevicesName)
        if not self.device_timeout >= 0:
            raise ConfigError(f"--device-timeout {self.device_timeout}: must be >= 0 (0: derived)")
        if self.devices == "real" and self.time_scale > 0:
            raise ConfigError("--devices real runs on the wall clock already: leave out --time-scale / --real-delays")
        if self.devices == "real" and self.simulator == "stock":
            raise ConfigError("--devices real needs --simulator fast (our server applies what real devices send)")
        check_choice("--simulator", self.simulator, SimulatorName)
        check_choice("--engine", self.engine, EngineName)
        check_choice("--bulk", self.bulk, BulkName)
        if self.simulator == "stock" and self.bulk == "shm":
            raise ConfigError(
                "--bulk shm needs --simulator fast (NVFlare's stock components send everything on its wire)"
            )
        check_choice("--profile", self.profile, ProfileName)
        if self.num_workers is not None:
            check_positive({"--num-workers": self.num_workers})
        if self.group_size is not None:
            check_positive({"--group-size": self.group_size})
        check_positive({"--job-timeout": self.job_timeout, "--update-interval": self.update_interval}, integer=False)
        if self.update_timeout is not None:
            check_positive({"--update-timeout": self.update_timeout}, integer=False)
        if not self.device_state_memory_mb >= 0:
            raise ConfigError(f"--device-state-memory-mb {self.device_state_memory_mb}: must be >= 0 (0: all on disk)")
        if not self.version_memory_mb >= 0:
            raise ConfigError(f"--version-memory-mb {self.version_memory_mb}: must be >= 0 (0: only the newest)")
        if not self.time_scale >= 0:
            raise ConfigError(f"--time-scale {self.time_scale}: must be >= 0 (0: exact simulated time)")
        if self.simulator == "stock" and self.time_scale > 0:
            raise ConfigError("--time-scale needs --simulator fast (the stock simulator sleeps the delays in full)")
        if self.simulator == "stock" and self.engine == "vectorized":
            raise ConfigError(
                "--engine vectorized needs --simulator fast (the stock simulator runs one device at a time)"
            )

    def validate(self) -> None:
        """Import the trainer it names, if any; ``ConfigError`` naming the fix."""
        if self.trainer:
            trainer_class(self.trainer)

    def to_dict(self) -> dict:
        return asdict(self)


def trainer_class(path: str) -> type:
    """The task processor class ``--trainer``'s import path names (``TrainingTaskProcessor`` for "")."""
    from common.imports import import_object
    from processors.task_processor import TrainingTaskProcessor

    if not path:
        return TrainingTaskProcessor
    try:
        cls = import_object(path, "trainer")
    except ValueError as ex:
        raise ConfigError(str(ex)) from ex
    if not (isinstance(cls, type) and issubclass(cls, TrainingTaskProcessor)):
        raise ConfigError(f"trainer {path!r}: give a subclass of processors.task_processor.TrainingTaskProcessor")
    return cls
