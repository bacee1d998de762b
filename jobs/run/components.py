"""One factory per job component: every caller (the recipe, the tuner, the benchmarks) builds it here.

Each factory takes the ``JobConfig`` (and what the driver decided: the worker plan, the results folder) and gives
the component the config parts it needs, as the plain values NVFlare writes into the job's config files.
"""

from __future__ import annotations

import os

from common.delays import DelayConfig
from common.result_files import DEVICE_STATE, ERROR_FEEDBACK
from evaluation.evaluator import GlobalModelEvaluator
from evaluation.leaf_log_writer import LeafLogWriter
from evaluation.model_saver import GlobalModelSaver
from evaluation.progress import ProgressReporter
from evaluation.run_recorder import RunRecorder
from evaluation.system_monitor import SystemMonitorComponent
from evaluation.tensorboard_writer import TensorBoardWriter
from jobs.admin_kit import project_leaves
from jobs.config import JobConfig
from jobs.engine_config import trainer_class
from jobs.run.plan import plan_request
from jobs.run.timeouts import Timeouts
from jobs.tracking.choice import trackers_of
from processors.data.partition import range_offsets
from processors.task_processor import TrainingTaskProcessor
from scheduling.exact_assessor import ExactTimeAssessor
from scheduling.pack_assessor import PackAssessor
from simulation.leaf_runner import FastDeviceRunner, StockDeviceRunner
from simulation.planner import WorkerPlan

MONITOR_ID = "edgesim_monitor"


def make_task_processor(
    cfg: JobConfig, plan: WorkerPlan | None, torch_threads: int | None = None
) -> TrainingTaskProcessor:
    """The device-side trainer; ``torch_threads`` overrides the plan's (0: leave torch's default). Without a plan
    (a deployment) the leaf sets its threads from its own plan at start. Its class is ``--trainer``'s (a
    benchmark's), else ``TrainingTaskProcessor``."""
    stock = cfg.engine.simulator == "stock"
    if torch_threads is None:
        torch_threads = plan.torch_threads if plan is not None else 0
    return trainer_class(cfg.engine.trainer)(
        data=cfg.data.to_dict(),
        training=cfg.training.to_dict(),
        seed=cfg.run.seed,
        profile=cfg.engine.profile,
        torch_threads=torch_threads,
        leaves_per_gpu=plan.leaves_per_gpu if plan is not None else 1,
        stock_delays=cfg.delays.to_dict() if stock else None,
        objective=cfg.method_spec.objective_path,
        objective_args=cfg.method_spec.objective_args(cfg),
        reports=cfg.method_spec.reports(cfg),
        weighting=cfg.method_spec.weighting,
        **rule_settings(cfg),
        **({"device_offsets": offsets} if (offsets := device_offsets(cfg)) else {}),  # else: the config's bytes
        **({"privacy": cfg.privacy.device_settings()} if cfg.privacy.on else {}),  # likewise
        **compression_settings(cfg),  # likewise
    )


def compression_settings(cfg: JobConfig) -> dict:
    """The devices' compressor and, with error feedback, where their residuals are kept: as a training rule's
    state (``rule_settings``), in the results folder's ``error_feedback/``. Nothing without compression."""
    settings = cfg.compression.device_settings()
    if settings is None:
        return {}
    if settings["error_feedback"]:
        state = rule_state(cfg)
        if state["dir"]:  # beside the rule's device_state/, so the checkpoint's selection floor is the same file
            state["dir"] = os.path.join(os.path.dirname(state["dir"]), ERROR_FEEDBACK)
        settings["state"] = state
    return {"compression": settings}


def leaf_names(cfg: JobConfig) -> list[str]:
    """The run's leaves, named as they will be: SimEnv's ``site-1, site-2, ..``, or with ``--env prod`` the
    deployment's (``C11, C12, ..``, from its kit)."""
    f = cfg.federation
    names = project_leaves(cfg.run.startup_kit) if cfg.run.env == "prod" else None
    return names or [f"site-{i + 1}" for i in range(f.num_leaf_nodes)]


def device_offsets(cfg: JobConfig) -> dict[str, int] | None:
    """With ``--partition natural``, each leaf's first global device index (the pool's numbering), which the
    device-to-user map is a function of (``processors.data.partition.range_offsets``); None otherwise."""
    return leaf_layout(cfg)[1]


def leaf_layout(cfg: JobConfig) -> tuple[dict[str, int], dict[str, int] | None]:
    """The run's leaves (``leaf_names``) with their devices each, and the devices' offsets (``device_offsets``),
    together: what the schedule is laid out on."""
    f = cfg.federation
    names = leaf_names(cfg)
    offsets = range_offsets(names, f.devices_per_leaf) if cfg.data.partition == "natural" else None
    return dict.fromkeys(names, f.devices_per_leaf), offsets


def schedule_work(cfg: JobConfig) -> dict:
    """What the server's schedule needs to time each device by its own work (``--local-epochs``)."""
    work = {"data": cfg.data.to_dict(), "training": cfg.training.to_dict()}
    offsets = device_offsets(cfg)
    return work | {"offsets": offsets} if offsets else work


def rule_settings(cfg: JobConfig) -> dict:
    """The method's training rule and where its devices' state is kept: the results folder's ``device_state/`` on
    SimEnv (``--resume`` reuses it; written through when the run checkpoints, pruned by the checkpoints' selection
    floor), else each leaf's working folder (not written through: a resume does not find it there). Nothing for a
    method without a rule, so its job config keeps its bytes."""
    method = cfg.method_spec
    if not method.rule_path:
        return {}
    return {"rule": method.rule_path, "rule_args": method.rule_args(cfg), "device_state": rule_state(cfg)}


def rule_state(cfg: JobConfig) -> dict:
    """Where per-device state is kept (``processors.device_state.DeviceStateStore``'s settings): see
    ``rule_settings``."""
    folder = cfg.run.resume or cfg.run.output
    sim = cfg.run.env == "sim" and folder
    return {
        "dir": os.path.join(os.path.abspath(os.path.expanduser(folder)), DEVICE_STATE) if sim else "",
        "memory_mb": cfg.engine.device_state_memory_mb,
        "durable": bool(sim) and cfg.run.checkpoint_every != -1,
        "fresh": not cfg.run.resume,
    }


def make_leaf_runner(
    cfg: JobConfig, plan: WorkerPlan | None, processor_id: str, run_processor_ids: list[str] | None = None
):
    """The widget that starts each leaf's device simulator: ours (each leaf plans its own workers at start), or
    NVFlare's stock one (the baseline, with the driver's worker count). ``run_processor_ids``: in a pack, the task
    processor of each run after the first."""
    e = cfg.engine
    if e.simulator == "stock":
        return StockDeviceRunner(processor_id, e.job_timeout, cfg.federation.devices_per_leaf, plan.num_workers)
    return FastDeviceRunner(
        processor_id,
        plan_request=plan_request(cfg).to_dict(),
        job_timeout=e.job_timeout,
        num_devices=cfg.federation.devices_per_leaf,
        delays=cfg.delays.to_dict(),
        seed=cfg.run.seed,
        time_scale=e.time_scale,
        **({"run_processor_ids": run_processor_ids} if run_processor_ids else {}),  # else: the config's bytes
    )


def make_global_model(cfg: JobConfig, results_dir: str):
    """The server's global model, its versions made by the method's strategy (``jobs.methods``)."""
    from aggregation.global_model import GlobalModel

    method = cfg.method_spec
    return GlobalModel(
        strategy=method.strategy_path,
        strategy_args=method.strategy_args(cfg),
        model=cfg.training.model,
        seed=cfg.run.seed,
        compute_device=cfg.training.compute_device,
        results_dir=results_dir,
        version_memory_mb=cfg.engine.version_memory_mb,
        **({"privacy": server_privacy(cfg)} if cfg.privacy.on else {}),  # else: the config's bytes
        bulk=cfg.engine.bulk,
    )


def server_privacy(cfg: JobConfig) -> dict:
    """The server's differential privacy (``aggregation.server_privacy.ServerPrivacy``'s arguments but the seed)."""
    f = cfg.federation
    return {
        "settings": cfg.privacy.to_dict(),
        "pool_size": f.num_leaf_nodes * f.devices_per_leaf,
        "updates_per_version": f.num_updates_for_model,
    }


def make_assessor(
    cfg: JobConfig, timeouts: Timeouts, persistor_id: str, global_model_id: str, results_dir: str
) -> ExactTimeAssessor:
    """The server's schedule: selection, and applying updates in simulated arrival order (with real devices: in
    the order they arrive)."""
    f = cfg.federation
    real = cfg.engine.devices == "real"
    return ExactTimeAssessor(
        persistor_id,
        global_model_id,
        num_leaves=f.num_leaf_nodes,
        selection_size=f.device_selection_size,
        updates_per_version=f.num_updates_for_model,
        min_hole_to_fill=f.min_hole_to_fill,
        device_reuse=f.device_reuse,
        max_model_version=f.max_model_version,
        # real devices: no simulated delays; with --compress a version's bytes (bytes_down; uploads are measured)
        delays=DelayConfig(download_bytes=cfg.delays.download_bytes).to_dict() if real else cfg.delays.to_dict(),
        seed=cfg.run.seed,
        time_scale=cfg.engine.time_scale,
        device_wait_timeout=f.device_wait_timeout,
        max_sim_time=f.max_sim_time,
        leaf_timeout=timeouts.leaf_timeout,
        on_leaf_loss=f.on_leaf_loss,
        max_consecutive_failures=f.max_consecutive_failures,
        checkpoint_every=cfg.run.checkpoint_every,
        resume=bool(cfg.run.resume),
        results_dir=results_dir,
        real_devices=real,
        device_timeout=cfg.engine.device_timeout,
        selection=cfg.method_spec.selection_path,
        selection_args=cfg.method_spec.selection_args(cfg),
        # each device's time scales with its own samples (--local-epochs); None keeps today's schedule
        work=schedule_work(cfg) if cfg.training.local_epochs and not real else None,
        **({"one_update_per_version": True} if cfg.privacy.central else {}),  # else: the config's bytes
        bulk=cfg.engine.bulk,
    )


def diagnose_context(run_info: dict, cfg: JobConfig) -> dict:
    """What the low-GPU-use diagnosis needs about the run, from the driver's plan and environment."""
    planner = run_info.get("planner") or {}
    engine = planner.get("engine") or cfg.engine.engine
    return {
        "compute_device": (run_info.get("environment") or {}).get("compute_device") or cfg.training.compute_device,
        "engine": None if engine == "auto" else engine,  # "auto": we cannot tell which one ran
        "num_workers": planner.get("num_workers", cfg.engine.num_workers),
        "cpu_cores": (run_info.get("environment") or {}).get("cpu_cores"),
    }


def make_result_components(
    cfg: JobConfig, run_info: dict, results_dir: str, run: int | None = None, run_names: list[str] | None = None
) -> dict:
    """The server's result components by id (``evaluation``): evaluator, monitor, recorder, reporters, saver
    (TensorBoard's writer with ``--tracking tensorboard``; MLflow and W&B are the driver's: ``jobs.tracking``).
    ``run``: a pack's run they are for (``common.run_scope``); None: the job's one run. ``run_names``: a pack's
    runs' names, for the console's line when one begins inside the job or ends."""
    f = cfg.federation
    scope = {"run": run} if run is not None else {}  # a standalone job's config keeps its bytes
    components = {
        "edgesim_evaluator": GlobalModelEvaluator(
            model=cfg.training.model,
            data=cfg.data.to_dict(),
            seed=cfg.run.seed,
            compute_device=cfg.training.compute_device,
            eval_frequency=cfg.run.eval_frequency,
            max_model_version=f.max_model_version,
            backlog=cfg.run.eval_backlog,
            precision=cfg.training.precision,
            results_dir=results_dir,
            **scope,
        ),
        MONITOR_ID: SystemMonitorComponent(diagnose_context(run_info, cfg)),
        # a SimEnv run's driver draws the plot while NVFlare shuts down (jobs.run.results.PlotAhead); an exported
        # job, or one on a deployment, has its server draw it
        "edgesim_recorder": RunRecorder(
            results_dir,
            run_info,
            f.num_updates_for_model,
            monitor_id=MONITOR_ID,
            plot=cfg.run.env != "sim" or bool(cfg.run.export_only),
            **scope,
        ),
        "edgesim_progress": ProgressReporter(
            f.max_model_version, **scope, **({"run_names": run_names} if run_names else {})
        ),
        "edgesim_tensorboard": TensorBoardWriter(results_dir, **scope),
        "edgesim_model_saver": GlobalModelSaver(cfg.training.model, results_dir, **scope),
        "edgesim_leaf_log": LeafLogWriter(results_dir, resume=bool(cfg.run.resume), **scope),
    }
    if "tensorboard" not in trackers_of(cfg.run.tracking):
        del components["edgesim_tensorboard"]
    return components


# -- a pack: several runs in one job (docs/packs.md) ---------------------------------------------------------------
# the result components each run has its own of (the monitor and the progress line are the job's)
PER_RUN_RESULTS = (
    "edgesim_evaluator",
    "edgesim_recorder",
    "edgesim_model_saver",
    "edgesim_leaf_log",
    "edgesim_tensorboard",
)


def run_component_id(name: str, run: int) -> str:
    """A pack's per-run component id: the standalone id suffixed by the run (``model_manager.r1``)."""
    return f"{name}.r{run}"


def run_options(cfg: JobConfig, persistor_id: str, global_model_id: str, results_dir: str) -> dict:
    """One run's server settings in a pack (``scheduling.run_server.RunOptions``' arguments but the leaf timeout,
    which is the job's): what ``make_assessor`` gives a standalone job's one run, for simulated devices."""
    f = cfg.federation
    return {
        "persistor_id": persistor_id,
        "global_model_id": global_model_id,
        "selection_size": f.device_selection_size,
        "updates_per_version": f.num_updates_for_model,
        "min_hole_to_fill": f.min_hole_to_fill,
        "device_reuse": f.device_reuse,
        "max_model_version": f.max_model_version,
        "delays": cfg.delays.to_dict(),
        "seed": cfg.run.seed,
        "time_scale": cfg.engine.time_scale,
        "max_sim_time": f.max_sim_time,
        "checkpoint_every": cfg.run.checkpoint_every,
        "resume": bool(cfg.run.resume),
        "results_dir": results_dir,
        "selection": cfg.method_spec.selection_path,
        "selection_args": cfg.method_spec.selection_args(cfg),
        "work": schedule_work(cfg) if cfg.training.local_epochs else None,
        "one_update_per_version": cfg.privacy.central,
        "max_consecutive_failures": f.max_consecutive_failures,
    }


def make_pack_assessor(cfgs: list[JobConfig], timeouts: Timeouts, runs: list[dict], at_once: int = 0) -> PackAssessor:
    """A pack's server (``scheduling.pack_assessor``): ``runs`` are each run's ``run_options``; the leaves and
    their watch and the policy when one is lost are the job's (every run of a pack has the same leaves and
    ``--on-leaf-loss``: ``jobs.pack_check.pack_refusal``);
    ``at_once``: runs going at a time, the others joining as runs end (0: all); ``--bulk`` is the job's too (one
    engine)."""
    f = cfgs[0].federation
    return PackAssessor(
        runs,
        num_leaves=f.num_leaf_nodes,
        device_wait_timeout=f.device_wait_timeout,
        leaf_timeout=timeouts.leaf_timeout,
        at_once=at_once,
        on_leaf_loss=f.on_leaf_loss,
        bulk=cfgs[0].engine.bulk,
    )


def make_pack_result_components(cfgs: list[JobConfig], run_infos: list[dict], results_dirs: list[str]) -> dict:
    """A pack's result components by id: each run's evaluator, recorder, model saver, leaf log and TensorBoard writer
    (``PER_RUN_RESULTS``, ids suffixed by the run, each writing to its run's results folder), and the job's
    monitor and progress line (run 0's settings)."""
    components: dict = {}
    names = [os.path.basename(d) for d in results_dirs]
    for run, (cfg, info, results_dir) in enumerate(zip(cfgs, run_infos, results_dirs, strict=True)):
        made = make_result_components(cfg, info, results_dir, run=run, run_names=None if run else names)
        for comp_id, component in made.items():
            if comp_id in PER_RUN_RESULTS:
                components[run_component_id(comp_id, run)] = component
            elif not run:
                components[comp_id] = component
    return components
