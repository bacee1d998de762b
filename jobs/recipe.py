"""Assembles the NVFlare edge job of a ``JobConfig``: which component goes where, by id. Nothing else.

The job is NVFlare's ``EdgeJob`` with the edge workflow (``ScatterAndGatherForEdge`` driving a
``ModelUpdateAssessor``) and these components, each built by its factory in ``jobs.components``:

server   persistor (the seeded initial model), model manager (the method's, ``jobs.methods``), device manager
         (seeded selection), assessor, and the result components (``evaluation``)
clients  edge task receiver, leaf aggregator factory (summed or per-device, by method), leaf executor, task
         processor, and the widget that runs the leaf's device simulator

``--simulator stock`` swaps in NVFlare's own pieces where it has them (executor and 1 s sync, model manager with
Python-list weights, device simulator) to serve as the baseline the benchmarks compare with; it keeps our seeded
device manager, so both paths train the same devices, and our result components, so both are measured alike.
"""

from __future__ import annotations

from nvflare.app_common.widgets.metrics_artifact_writer import MetricsArtifactWriter
from nvflare.app_opt.pt.job_config.model import PTModel
from nvflare.edge.aggregators.model_update_dxo_factory import ModelUpdateDXOAggrFactory
from nvflare.edge.assessors.buff_model_manager import BuffModelManager
from nvflare.edge.assessors.model_update import ModelUpdateAssessor
from nvflare.edge.controllers.sage import ScatterAndGatherForEdge
from nvflare.edge.executors.edge_model_executor import EdgeModelExecutor
from nvflare.edge.tools.edge_job import EdgeJob
from nvflare.edge.widgets.etr import EdgeTaskReceiver
from nvflare.recipe.spec import Recipe

from aggregation.per_device_forwarding import PerDeviceForwardingAggrFactory
from aggregation.retaining_updater import RetainingEdgeModelExecutor
from jobs.components import (
    make_device_manager,
    make_leaf_runner,
    make_model_manager,
    make_result_components,
    make_task_processor,
)
from jobs.config import JobConfig
from jobs.methods import METHODS
from processors.models import model_class_path, model_init_args
from simulation.planner import WorkerPlan

TASK_NAME = "train"
STOCK_UPDATE_INTERVAL = 1.0  # NVFlare's EdgeJob default


class EdgeSimRecipe(Recipe):
    """Args:
    cfg: the job's configuration.
    plan: the worker plan (workers, threads, groups per leaf).
    run_info: what the driver knew before the run; recorded in ``metrics.json``.
    results_dir: where the server writes results ("": the server app's run folder).
    """

    def __init__(self, cfg: JobConfig, plan: WorkerPlan, run_info: dict, results_dir: str):
        self.cfg, self.plan = cfg, plan
        job = EdgeJob(name=cfg.run.job_name, edge_method="edge")
        self._add_server(job, run_info, results_dir)
        self._add_clients(job, results_dir)
        super().__init__(job)

    def _add_server(self, job: EdgeJob, run_info: dict, results_dir: str) -> None:
        cfg, f = self.cfg, self.cfg.federation
        stock = cfg.engine.simulator == "stock"
        model = {"path": model_class_path(cfg.training.model), "args": model_init_args(cfg.training.model, cfg.run.seed)}
        persistor_id = job.to_server(PTModel(model=model), id="persistor")["persistor_id"]
        manager = (
            BuffModelManager(num_updates_for_model=f.num_updates_for_model, global_lr=f.global_lr)
            if stock
            else make_model_manager(cfg, results_dir)
        )
        model_manager_id = job.to_server(manager, id="model_manager")
        device_manager_id = job.to_server(make_device_manager(cfg), id="device_manager")
        assessor_id = job.to_server(
            ModelUpdateAssessor(persistor_id, model_manager_id, device_manager_id, f.max_model_version,
                                device_wait_timeout=f.device_wait_timeout),
            id="wf_assessor",
        )  # fmt: skip
        job.to_server(MetricsArtifactWriter(), id="metrics_artifact_writer")
        interval = STOCK_UPDATE_INTERVAL if stock else cfg.engine.update_interval
        controller = ScatterAndGatherForEdge(
            num_rounds=1, assessor_id=assessor_id, task_name=TASK_NAME, task_check_period=0.5,
            assess_interval=min(0.5, interval), update_interval=interval,
        )  # fmt: skip
        job.to_server(controller, id="sage")
        for comp_id, component in make_result_components(cfg, run_info, results_dir).items():
            registered = job.to_server(component, id=comp_id)
            if registered != comp_id:  # never build a job that would silently lack a result component
                raise RuntimeError(f"NVFlare registered {comp_id!r} as {registered!r}")

    def _add_clients(self, job: EdgeJob, results_dir: str) -> None:
        cfg = self.cfg
        stock = cfg.engine.simulator == "stock"
        job.to_clients(EdgeTaskReceiver(), id="edge_task_receiver")
        per_device = METHODS[cfg.method].leaf_aggregation == "per-device"
        factory = PerDeviceForwardingAggrFactory() if per_device else ModelUpdateDXOAggrFactory()
        factory_id = job.to_clients(factory, id="aggr_factory")
        versions = cfg.federation.max_num_active_model_versions or None
        executor_cls = EdgeModelExecutor if stock else RetainingEdgeModelExecutor
        executor = executor_cls(factory_id, versions, cfg.engine.update_timeout)
        job.to_clients(executor, id="executor", tasks=[TASK_NAME])
        processor_id = job.to_clients(make_task_processor(cfg, self.plan), id="task_processor")
        job.to_clients(make_leaf_runner(cfg, self.plan, processor_id, results_dir), id="device_runner")
