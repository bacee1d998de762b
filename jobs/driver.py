"""Runs one job: validate -> check data -> plan workers -> build recipe -> run on the chosen env -> results."""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
import sys
import time

import torch

from common.choices import ConfigError
from common.profiles import get_profile
from jobs.config import JobConfig
from jobs.process_guard import Interrupts, no_orphans
from jobs.recipe import EdgeSimRecipe
from jobs.results import finalize, format_summary
from processors.data.sources import DatasetError, load_dataset
from processors.device import resolve_device
from processors.models import build_model
from simulation.planner import (
    HardwareProfile,
    WorkerPlan,
    estimate_worker_bytes,
    plan_engine,
    plan_workers,
    probe_hardware,
)


def environment_info(device: torch.device, hardware: HardwareProfile) -> dict:
    import nvflare

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "nvflare": nvflare.__version__,
        "platform": platform.platform(),
        "compute_device": str(device),
        "cpu_cores": hardware.cpu_cores,
        "gpus": [g.name for g in hardware.gpus],
    }


def plan_for(cfg: JobConfig, hardware: HardwareProfile, device: torch.device) -> WorkerPlan:
    """Each leaf's workers, threads and training engine (``simulation.planner``) for this machine."""
    model = build_model(cfg.training.model)
    per_worker = estimate_worker_bytes(model, cfg.training.local_batch_size, cfg.training.optimizer)
    leaves_on_host = cfg.federation.num_leaf_nodes if cfg.run.env in ("sim", "poc") else 1
    plan = plan_workers(
        hardware,
        devices_per_leaf=cfg.federation.devices_per_leaf_per_round,
        per_worker_bytes=per_worker,
        leaves_on_host=leaves_on_host,
        use_gpu=device.type == "cuda",
        requested=cfg.engine.num_workers,
        profile=cfg.engine.profile,
    )
    if cfg.engine.simulator == "stock":
        return plan
    has_buffers = any(True for _ in model.buffers())
    return plan_engine(plan, cfg.engine.engine, has_buffers, cfg.engine.group_size)


def make_env(cfg: JobConfig):
    run, leaves = cfg.run, cfg.federation.num_leaf_nodes
    if run.env == "sim":
        from nvflare.recipe.sim_env import SimEnv

        return SimEnv(
            num_clients=leaves,
            num_threads=leaves,  # fewer threads than clients leaves some leaves never running
            workspace_root=os.path.join(os.path.expanduser(run.workspace), "simulation"),
        )
    if run.env == "poc":
        from nvflare.recipe.poc_env import PocEnv

        return PocEnv(num_clients=leaves)
    from nvflare.recipe.prod_env import ProdEnv

    return ProdEnv(startup_kit_location=os.path.expanduser(run.startup_kit), username=run.username)


def prepare(cfg: JobConfig) -> tuple[WorkerPlan, dict, torch.device]:
    """Everything that can fail fast, before any NVFlare process starts."""
    device = resolve_device(cfg.training.compute_device)
    load_dataset(cfg.spec)  # missing / malformed data fails here, with the fix in the message
    hardware = probe_hardware()
    plan = plan_for(cfg, hardware, device)
    run_info = {
        "config": cfg.to_dict(),
        "environment": environment_info(device, hardware),
        "planner": plan.to_dict(),
        "profile": get_profile(cfg.engine.profile).to_dict(),
    }
    return plan, run_info, device


def run(cfg: JobConfig) -> int:
    """Run (or export) the job a config describes; returns a process exit code."""
    try:
        plan, run_info, device = prepare(cfg)
    except (ConfigError, DatasetError, ValueError) as ex:
        print(f"error: {ex}", file=sys.stderr)
        return 2
    run_cfg, leaves = cfg.run, cfg.federation.num_leaf_nodes
    print(f"[edgesim] {cfg.method} on {device}, env {run_cfg.env}, simulator {cfg.engine.simulator}, seed {run_cfg.seed}")
    print(plan.describe())
    print(plan.reasoning())
    print(get_profile(cfg.engine.profile).describe())

    if run_cfg.export_only:
        # an exported job writes its results inside the app's run folder, unless --output names a place
        output = os.path.abspath(run_cfg.output) if run_cfg.output else ""
        EdgeSimRecipe(cfg, plan, run_info, results_dir=output).export(job_dir=run_cfg.export_only)
        job_dir = os.path.join(run_cfg.export_only, run_cfg.job_name)
        print(f"[edgesim] exported to {job_dir}; run it with: nvflare simulator {job_dir} -w WORKSPACE -n {leaves} -t {leaves}")
        return 0

    results_dir = cfg.output_dir if run_cfg.env in ("sim", "poc") else ""
    if results_dir:
        shutil.rmtree(results_dir, ignore_errors=True)
        os.makedirs(results_dir)
        print(f"[edgesim] results go to {results_dir}")
    recipe = EdgeSimRecipe(cfg, plan, run_info, results_dir=results_dir)
    env = make_env(cfg)
    started = time.time()
    interrupts = Interrupts()
    try:
        # sim: the job's processes are ours to stop. poc: its services are meant to outlive this command
        # (stop them with `nvflare poc stop`); prod: nothing runs here.
        with no_orphans() if run_cfg.env == "sim" else contextlib.nullcontext(interrupts) as interrupts:
            job_run = recipe.run(env)
    except BaseException:
        if interrupts.signum is None:
            raise
        print("[edgesim] interrupted; every process of the job was stopped", file=sys.stderr)
        if results_dir and os.path.exists(os.path.join(results_dir, "metrics.json")):
            summary = finalize(results_dir, time.time() - started)
            print(format_summary(summary, results_dir))
            print(f"[edgesim] partial results (versions finished before the interrupt) kept in {results_dir}")
        return interrupts.exit_code
    if run_cfg.env != "sim":
        print(f"[edgesim] submitted job {job_run.get_job_id()}; waiting for it to finish")
        result = job_run.get_result(timeout=0.0)
        print(f"[edgesim] job result: {result}")
        if not results_dir:
            print("[edgesim] metrics.json, global_model.pt and tensorboard/ are in the server's run folder of the job")
            return 0
    summary = finalize(results_dir, time.time() - started)
    print(format_summary(summary, results_dir))
    return 0
