"""Assembles the NVFlare edge job of a ``JobConfig``: which component goes where, by id. Nothing else.

The job is NVFlare's ``EdgeJob`` with the edge workflow (``ScatterAndGatherForEdge``) and these components, each
built by its factory in ``jobs.run.components``:

server   persistor (the seeded initial model), the global model driving the method's strategy (``jobs.methods``), the exact-time
         assessor (``scheduling``: selection and the order updates are applied in), the result components
         (``evaluation``)
clients  edge task receiver, leaf executor (``simulation.leaf_executor``), task processor, and the widget that
         runs the leaf's device simulator (none with ``--devices real``: the leaves wait for real devices, and
         the task processor only describes the training the leaf hands each device)

``--simulator stock`` is NVFlare's own path end to end (its BuffModelManager with Python-list weights, device manager,
assessor, leaf executor with summing aggregators and a 1 s sync, device simulator): the baseline the benchmarks
compare with. It keeps our result components, so both paths are measured alike.
"""

from __future__ import annotations

import importlib.util
import os
import sysconfig

from nvflare.app_common.widgets.metrics_artifact_writer import MetricsArtifactWriter
from nvflare.app_opt.pt.job_config.model import PTModel
from nvflare.edge.aggregators.model_update_dxo_factory import ModelUpdateDXOAggrFactory
from nvflare.edge.assessors.buff_device_manager import BuffDeviceManager
from nvflare.edge.assessors.buff_model_manager import BuffModelManager
from nvflare.edge.assessors.model_update import ModelUpdateAssessor
from nvflare.edge.controllers.sage import ScatterAndGatherForEdge
from nvflare.edge.executors.edge_model_executor import EdgeModelExecutor
from nvflare.edge.tools.edge_job import EdgeJob
from nvflare.edge.widgets.etr import EdgeTaskReceiver
from nvflare.recipe.spec import Recipe

from common.job_files import SHIPPED_PACKAGES, TARGETS, ship_package, ship_packages
from common.protocol import GLOBAL_MODEL_ALIAS
from jobs.config import JobConfig
from jobs.nvflare_private import INLINE_ARRAYS
from jobs.pack_check import pack_refusal
from jobs.run.components import (
    make_assessor,
    make_global_model,
    make_leaf_runner,
    make_pack_assessor,
    make_pack_result_components,
    make_result_components,
    make_task_processor,
    run_component_id,
    run_options,
)
from jobs.run.plan import RunPlan
from processors.models import initial_model_config
from simulation.leaf_executor import EdgeSimExecutor

TASK_NAME = "train"
PROCESSOR_ID = "task_processor"
STOCK_UPDATE_INTERVAL = 1.0  # NVFlare's EdgeJob default
STOCK_MODEL_VERSIONS = 3  # NVFlare's ModelManagerConfig default: model versions a leaf keeps aggregators for


def user_modules(cfg: JobConfig) -> list[str]:
    """Top-level modules of the user's code the job names by import path (``--model pkg.mod:Class``, ``--dataset
    pkg.mod:function``, ``--method pkg.mod:Name`` and its strategy, a benchmark's trainer) that are neither this project's nor installed
    (site-packages, the standard library)."""
    method = cfg.method_spec
    paths = [
        cfg.training.model,
        cfg.data.dataset,
        cfg.method,
        method.strategy_path,
        method.objective_path,
        method.rule_path,
    ]
    paths.append(cfg.engine.trainer)
    tops = {p.partition(":")[0].split(".")[0] for p in paths if ":" in p and not p.endswith(".npz")}
    installed = {os.path.realpath(sysconfig.get_path(k)) for k in ("purelib", "platlib", "stdlib", "platstdlib")}
    found = []
    for top in sorted(tops - set(SHIPPED_PACKAGES)):
        spec = importlib.util.find_spec(top)
        origin = spec.origin if spec and spec.origin else None
        if origin is None or any(os.path.realpath(origin).startswith(root + os.sep) for root in installed):
            continue
        found.append(top)
    return found


def ship_user_code(job: EdgeJob, cfg: JobConfig) -> None:
    """Put the user's own modules (``user_modules``) into the job's ``custom/`` folder, as ``ship_packages`` does
    for this project's: a model or data function defined in the user's script (or package) then imports on every
    site."""
    for top in user_modules(cfg):
        spec = importlib.util.find_spec(top)
        if spec.submodule_search_locations:  # a package: every .py file below it
            ship_package(job, os.path.dirname(spec.origin), top)
        else:
            for target in TARGETS:
                job.add_file_to(spec.origin, target)


def add_workflow(job: EdgeJob, assessor_id: str, interval: float) -> None:
    """The server's workflow (NVFlare's edge scatter-and-gather, asking ``assessor_id``) and its metrics writer."""
    job.to_server(MetricsArtifactWriter(), id="metrics_artifact_writer")
    job.to_server(
        ScatterAndGatherForEdge(
            num_rounds=1,
            assessor_id=assessor_id,
            task_name=TASK_NAME,
            task_check_period=0.5,
            assess_interval=min(0.5, interval),
            update_interval=interval,
        ),
        id="sage",
    )


def add_result_components(job: EdgeJob, components: dict) -> None:
    """The result components on the server, each under its own id: a job never silently lacks one."""
    for comp_id, component in components.items():
        registered = job.to_server(component, id=comp_id)
        if registered != comp_id:
            raise RuntimeError(f"NVFlare registered {comp_id!r} as {registered!r}")


class EdgeSimRecipe(Recipe):
    """Args:
    cfg: the job's configuration.
    plan: what the driver decided (``jobs.run.plan.RunPlan``: workers, timeouts, the run's recorded info).
    results_dir: where the server writes results ("": the server app's run folder).
    """

    def __init__(self, cfg: JobConfig, plan: RunPlan, results_dir: str):
        self.cfg, self.plan = cfg, plan
        run_info = plan.run_info
        stock = cfg.engine.simulator == "stock"
        job = EdgeJob(name=cfg.run.job_name, edge_method="edge")
        persistor_id = self._add_persistor(job)
        assessor_id = (
            self._add_stock_server(job, persistor_id) if stock else self._add_server(job, persistor_id, results_dir)
        )
        interval = STOCK_UPDATE_INTERVAL if stock else cfg.engine.update_interval
        add_workflow(job, assessor_id, interval)
        add_result_components(job, make_result_components(cfg, run_info, results_dir))
        self._add_clients(job)
        if not stock:  # numpy arrays inline in each message (see INLINE_ARRAYS), on every site of the job
            job.to_server(dict(INLINE_ARRAYS))
            job.to_clients(dict(INLINE_ARRAYS))
        ship_packages(job)
        ship_user_code(job, cfg)
        super().__init__(job)

    def _add_persistor(self, job: EdgeJob) -> str:
        model = initial_model_config(self.cfg.training.model, self.cfg.run.seed)
        return job.to_server(PTModel(model=model), id="persistor")["persistor_id"]

    def _add_server(self, job: EdgeJob, persistor_id: str, results_dir: str) -> str:
        """Our server: the global model (the method's strategy) and the exact-time assessor."""
        global_model_id = job.to_server(make_global_model(self.cfg, results_dir), id=GLOBAL_MODEL_ALIAS)
        assessor = make_assessor(self.cfg, self.plan.timeouts, persistor_id, global_model_id, results_dir)
        return job.to_server(assessor, id="wf_assessor")

    def _add_stock_server(self, job: EdgeJob, persistor_id: str) -> str:
        """NVFlare's own model manager (Python-list weights), device manager and assessor: the baseline."""
        f = self.cfg.federation
        manager_id = job.to_server(
            BuffModelManager(f.num_updates_for_model, global_lr=f.global_lr), id=GLOBAL_MODEL_ALIAS
        )
        devices_id = job.to_server(
            BuffDeviceManager(
                f.device_selection_size, min_hole_to_fill=f.min_hole_to_fill, device_reuse=f.device_reuse
            ),
            id="device_manager",
        )
        assessor = ModelUpdateAssessor(
            persistor_id, manager_id, devices_id, f.max_model_version, device_wait_timeout=f.device_wait_timeout
        )
        return job.to_server(assessor, id="wf_assessor")

    def _add_clients(self, job: EdgeJob) -> None:
        cfg = self.cfg
        real = cfg.engine.devices == "real"
        job.to_clients(EdgeTaskReceiver(), id="edge_task_receiver")
        if cfg.engine.simulator == "stock":
            factory_id = job.to_clients(ModelUpdateDXOAggrFactory(), id="aggr_factory")
            executor = EdgeModelExecutor(factory_id, STOCK_MODEL_VERSIONS, self.plan.timeouts.update_timeout)
        elif real:  # each device's update goes up on its own: its selection's devices may report at any leaf
            executor = EdgeSimExecutor(
                self.plan.timeouts.update_timeout, False, real_devices=PROCESSOR_ID, bulk=cfg.engine.bulk
            )
        else:
            executor = EdgeSimExecutor(
                self.plan.timeouts.update_timeout, cfg.method_spec.leaf_sums(cfg), bulk=cfg.engine.bulk
            )
        job.to_clients(executor, id="executor", tasks=[TASK_NAME])
        # with real devices the processor only describes their training (what the leaf tells each device)
        processor_id = job.to_clients(make_task_processor(cfg, self.plan.workers), id=PROCESSOR_ID)
        if not real:
            job.to_clients(make_leaf_runner(cfg, self.plan.workers, processor_id), id="device_runner")


class EdgeSimPackRecipe(Recipe):
    """Several runs in one NVFlare job (a pack, ``docs/packs.md``): on the server each run's persistor, global
    model and result components, ids suffixed by the run (``jobs.run.components.run_component_id``), each writing
    to its run's results folder, and one ``PackAssessor`` holding every run's server; on every leaf each run's task
    processor (its data, seed, method and rules), the leaf executor and the device simulator (the job's, from run
    0's settings). The runs must be able to share the job (``jobs.pack_check.pack_refusal``).

    Args:
    cfgs: each run's configuration, run 0 first.
    plans: each run's plan (``jobs.run.plan.prepare``); the job's workers are run 0's, its timeouts the run's with
        the largest reports (a buffered run's leaves send every device, a synchronous run's one sum a selection).
    results_dirs: each run's results folder.
    at_once: runs going at a time, in order; each later run joins the running job when one ends (0: all at once).
    """

    def __init__(self, cfgs: list[JobConfig], plans: list[RunPlan], results_dirs: list[str], at_once: int = 0):
        refusal = pack_refusal(cfgs)
        if refusal:
            raise ValueError(refusal)
        self.cfgs, self.plans = cfgs, plans
        self.cfg, self.plan = cfgs[0], plans[0]
        cfg, plan = self.cfg, self.plan
        job = EdgeJob(name=cfg.run.job_name, edge_method="edge")
        runs = []
        for run, (c, results_dir) in enumerate(zip(cfgs, results_dirs, strict=True)):
            model = PTModel(model=initial_model_config(c.training.model, c.run.seed))
            persistor_id = job.to_server(model, id=run_component_id("persistor", run))["persistor_id"]
            global_model_id = job.to_server(
                make_global_model(c, results_dir), id=run_component_id(GLOBAL_MODEL_ALIAS, run)
            )
            runs.append(run_options(c, persistor_id, global_model_id, results_dir))
        timeouts = max((p.timeouts for p in plans), key=lambda t: (t.update_timeout, t.leaf_timeout))
        assessor_id = job.to_server(make_pack_assessor(cfgs, timeouts, runs, at_once), id="wf_assessor")
        interval = cfg.engine.update_interval
        add_workflow(job, assessor_id, interval)
        infos = [p.run_info for p in plans]
        add_result_components(job, make_pack_result_components(cfgs, infos, results_dirs))
        job.to_clients(EdgeTaskReceiver(), id="edge_task_receiver")
        sums = [c.method_spec.leaf_sums(c) for c in cfgs]  # per run: FedAvg's leaves sum a selection, FedBuff's not
        # a leaf's diffs go up and every run's versions come down through shared memory (--bulk auto)
        executor = EdgeSimExecutor(timeouts.update_timeout, sums, bulk=cfg.engine.bulk)
        job.to_clients(executor, id="executor", tasks=[TASK_NAME])
        processor_id = job.to_clients(make_task_processor(cfg, plan.workers), id=PROCESSOR_ID)
        run_processors = [
            job.to_clients(make_task_processor(c, plan.workers), id=run_component_id(PROCESSOR_ID, run))
            for run, c in enumerate(cfgs[1:], start=1)
        ]
        job.to_clients(make_leaf_runner(cfg, plan.workers, processor_id, run_processors), id="device_runner")
        job.to_server(dict(INLINE_ARRAYS))
        job.to_clients(dict(INLINE_ARRAYS))
        ship_packages(job)
        for c in cfgs:
            ship_user_code(job, c)
        super().__init__(job)
