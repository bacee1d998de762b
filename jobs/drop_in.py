"""One call that moves an existing NVFlare edge recipe from NVFlare's device simulator onto ours.

    from nvflare.edge.tools.edge_fed_buff_recipe import EdgeFedBuffRecipe, SimulationConfig
    from jobs.drop_in import use_fast_simulator

    recipe = EdgeFedBuffRecipe(..., simulation_config=SimulationConfig(task_processor=MyProcessor(), num_devices=60))
    use_fast_simulator(recipe)                       # options: num_workers=..., update_interval=..., results_dir=...
    recipe.execute(SimEnv(num_clients=2, num_threads=2))

What changes: each leaf's ``TPORunner`` (NVFlare's ``Simulator``) becomes our ``FastDeviceRunner``
(``simulation.leaf_runner``), and NVFlare's stock leaf executor ``EdgeModelExecutor`` becomes the same executor
without its per-request payload rendering (``QuietEdgeModelExecutor``); the server gets one component more,
``LeafStartFixes``, without which NVFlare's simulator may start two leaves under one name or on a port taken
meanwhile (fixes 19 and 7 of ``docs/nvflare-upstream.md``). The user's task processor, model, server components and every other component stay
as they are, under the same ids. At each leaf's start the runner plans from that leaf's machine and applies the
plan to the user's processor: torch threads per leaf, at most ``num_workers`` devices training at once, a warning
if the processor starts DataLoader worker processes per task.

What stays the recipe's: the server's model and device managers decide when an update is applied, as the updates
arrive. Simulated device delays therefore need ``time_scale > 0`` (each result is held for its delays x
``time_scale`` wall seconds); exact simulated time is a property of this project's own jobs (``jobs/``), whose server
orders updates by simulated arrival.

A recipe whose simulation comes from the environment (``SimulationConfig`` in the env's extra properties) is
converted when the recipe processes that environment, at ``execute`` or ``export``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from nvflare.edge.controllers.sage import ScatterAndGatherForEdge
from nvflare.edge.executors.edge_model_executor import EdgeModelExecutor
from nvflare.edge.simulation.device_task_processor import DeviceTaskProcessor
from nvflare.edge.widgets.tpo_runner import TPORunner
from nvflare.job_config.api import FedJob
from nvflare.recipe.spec import Recipe

from common.choices import ConfigError
from common.delays import DelayConfig
from common.job_files import ship_packages
from common.nvflare_private import LeafStartFixes
from common.profiles import DEFAULT_PROFILE, ProfileName
from jobs.engine_config import EngineConfig, EngineName
from jobs.nvflare_private import client_app_config, recipe_job, server_app_config, set_sync_interval
from simulation.leaf_plan import PlanRequest
from simulation.leaf_runner import FastDeviceRunner
from simulation.nvflare_private import QuietEdgeModelExecutor
from simulation.trainer import GroupTrainer

RUNNER_ID = "tpo_runner"  # the id NVFlare's EdgeJob.configure_simulation gives its runner
LEAF_START_FIXES_ID = "edgesim_leaf_start_fixes"  # the server component installing fixes 7, 19 (common.nvflare_private)


@dataclass(frozen=True)
class DropInOptions:
    """What ``use_fast_simulator`` may change, each checked when the options are made.

    Attributes:
        num_workers: devices a leaf trains at once (None: planned at each leaf from its cores and devices; the
            recipe's ``SimulationConfig.num_workers`` is NVFlare's thread count, not a plan, and is not used).
        engine: ``per-device`` (or ``auto``: the same), or ``vectorized`` for a processor that is a
            ``GroupTrainer`` (``simulation.trainer``): devices of one selection trained in groups.
        group_size: devices per group with ``vectorized`` (None: planned).
        devices_per_round: devices a leaf trains per round, to plan from (None: the leaf's device count).
        delays: the delay model of the real-time mode (a ``DelayConfig``, its dict, or a preset name).
        seed: the seed of the delays.
        time_scale: 0: results are reported as soon as trained; S > 0: each is held for its delays x S seconds.
        update_interval: seconds between a leaf's syncs with its parent (None: the recipe's, NVFlare's 1.0 s).
        results_dir: a folder for each leaf's plan and per-device report lines (``leaf_<leaf>_plan.json``,
            ``leaf_<leaf>.jsonl``), on the leaf's own machine ("": none).
        profile: the utilisation profile the plan follows (``common.profiles``).
        quiet_executor: replace NVFlare's ``EdgeModelExecutor`` by the same executor without payload rendering.
        ship_code: put this project's packages in the job's ``custom/`` folder (a deployment's sites need them).
    """

    num_workers: int | None = None
    engine: EngineName = "auto"
    group_size: int | None = None
    devices_per_round: int | None = None
    delays: DelayConfig = field(default_factory=DelayConfig)
    seed: int = 0
    time_scale: float = 0.0
    update_interval: float | None = None
    results_dir: str = ""
    profile: ProfileName = DEFAULT_PROFILE
    quiet_executor: bool = True
    ship_code: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.delays, (DelayConfig, dict, str)):
            raise ConfigError(f"delays={self.delays!r}: give a DelayConfig, its dict or a preset name")
        object.__setattr__(self, "delays", DelayConfig.from_spec(self.delays))
        EngineConfig(
            engine=self.engine,
            num_workers=self.num_workers,
            group_size=self.group_size,
            profile=self.profile,
            time_scale=self.time_scale,
            update_interval=self.update_interval or 1.0,
        )  # built for its checks and their messages
        if self.devices_per_round is not None and self.devices_per_round < 1:
            raise ConfigError(f"devices_per_round={self.devices_per_round}: must be >= 1")
        if self.delays != DelayConfig() and self.time_scale == 0:
            raise ConfigError(
                "delays take effect only with time_scale > 0 here: the recipe's own server applies updates as they "
                "arrive; give time_scale (e.g. 0.01), or run this project's jobs for exact simulated time"
            )
        if self.results_dir:
            object.__setattr__(self, "results_dir", os.path.abspath(self.results_dir))


def use_fast_simulator(recipe_or_job: Recipe | FedJob, **options) -> Recipe | FedJob:
    """Replace the NVFlare device simulator of ``recipe_or_job`` (an ``EdgeFedBuffRecipe``, any recipe building an
    ``EdgeJob``, or the job itself) with ours; ``options`` are ``DropInOptions`` fields. Returns its argument,
    ready for ``execute(env)``. Raises ``ConfigError`` (a bad option) or ``ValueError`` (a job this cannot
    convert) at once, naming the fix."""
    opts = DropInOptions(**options)
    job = recipe_job(recipe_or_job) if isinstance(recipe_or_job, Recipe) else recipe_or_job
    if not isinstance(job, FedJob):
        raise ValueError(f"use_fast_simulator needs an NVFlare recipe or job, not {type(recipe_or_job).__name__}")
    if RUNNER_ID in client_app_config(job).components:
        _convert(job, opts)
    elif isinstance(recipe_or_job, Recipe):  # the simulation comes with the environment
        _convert_after_env(recipe_or_job, job, opts)
    else:
        raise ValueError(
            "the job has no device simulation to replace: configure one first "
            "(EdgeJob.configure_simulation(task_processor, ...), or SimulationConfig in the recipe)"
        )
    if opts.ship_code:
        ship_packages(job)
    return recipe_or_job


def _convert_after_env(recipe: Recipe, job: FedJob, opts: DropInOptions) -> None:
    process_env = recipe.process_env

    def process_env_then_convert(env) -> None:
        process_env(env)
        if RUNNER_ID not in client_app_config(job).components:
            raise ValueError(
                "neither the recipe nor the environment configures a device simulation: give the recipe a "
                "SimulationConfig(task_processor=...)"
            )
        if not isinstance(client_app_config(job).components[RUNNER_ID], FastDeviceRunner):
            _convert(job, opts)

    recipe.process_env = process_env_then_convert


def _convert(job: FedJob, opts: DropInOptions) -> None:
    clients = client_app_config(job)
    runner = clients.components[RUNNER_ID]
    if isinstance(runner, FastDeviceRunner):
        raise ValueError("use_fast_simulator was already applied to this job")
    if not isinstance(runner, TPORunner):
        raise ValueError(f"component {RUNNER_ID!r} is a {type(runner).__name__}, not NVFlare's TPORunner")
    processor = clients.components.get(runner.task_processor_id)
    if not isinstance(processor, DeviceTaskProcessor):
        raise ValueError(f"component {runner.task_processor_id!r} is not a DeviceTaskProcessor")
    if opts.engine == "vectorized" and not isinstance(processor, GroupTrainer):
        raise ConfigError(
            f"engine='vectorized' needs a processor that trains groups (simulation.trainer.GroupTrainer); "
            f"{type(processor).__name__} trains one device per call: leave engine at 'auto'"
        )
    request = PlanRequest(
        model=None,  # not ours: workers are bounded by cores and devices
        batch_size=0,
        optimizer="",
        devices_per_round=opts.devices_per_round or runner.num_devices,
        engine=opts.engine,
        num_workers=opts.num_workers,
        group_size=opts.group_size,
        profile=opts.profile,
    )
    fast = FastDeviceRunner(
        runner.task_processor_id,
        plan_request=request.to_dict(),
        job_timeout=runner.job_timeout,
        num_devices=runner.num_devices,
        delays=opts.delays.to_dict(),
        seed=opts.seed,
        time_scale=opts.time_scale,
        send_up=False,  # NVFlare's leaf updater would never take it
        leaf_log_dir=opts.results_dir,
    )
    _replace_component(clients, RUNNER_ID, runner, fast)
    servers = _server_app(job)
    if servers is not None:  # the leaves NVFlare's simulator starts: each its own name and a port of its own
        servers.components[LEAF_START_FIXES_ID] = LeafStartFixes()
    if opts.quiet_executor:
        for executor_def in clients.executors:
            if type(executor_def.executor) is EdgeModelExecutor:
                e = executor_def.executor
                executor_def.executor = QuietEdgeModelExecutor(
                    e.aggr_factory_id, e.max_model_versions, e.update_timeout
                )
    if opts.update_interval is not None:
        controllers = [
            w.controller for w in _server_workflows(job) if isinstance(w.controller, ScatterAndGatherForEdge)
        ]
        if not controllers:
            raise ValueError("update_interval: the job's server has no ScatterAndGatherForEdge workflow to set it on")
        for controller in controllers:
            set_sync_interval(controller, opts.update_interval)


def _replace_component(app_config, cid: str, old, new) -> None:
    app_config.components[cid] = new
    app_config.handlers = [new if h is old else h for h in app_config.handlers]


def _server_app(job: FedJob):
    try:
        return server_app_config(job)
    except ValueError:  # a clients-only job
        return None


def _server_workflows(job: FedJob) -> list:
    servers = _server_app(job)
    return [] if servers is None else list(servers.workflows)  # a clients-only job: nothing to set
