"""Builds the NVFlare edge recipe for a ``JobConfig``: NVFlare's ``EdgeFedBuffRecipe`` with our device side.

We compose NVFlare's recipe rather than fork it: its server workflow, device manager and leaf aggregation stay
as they are; we swap the model manager for one that keeps numpy weights (see ``aggregation``), add our
evaluator, and install our task processor and device runner on every leaf instead of the stock ones.
"""

from __future__ import annotations

from nvflare.edge.tools.edge_fed_buff_recipe import DeviceManagerConfig, EdgeFedBuffRecipe, ModelManagerConfig
from nvflare.edge.tools.edge_job import EdgeJob

from aggregation.device_manager import FreshSelectionDeviceManager
from aggregation.numpy_model_manager import NumpyBuffModelManager
from aggregation.retaining_updater import RetainingEdgeModelExecutor
from evaluation.global_evaluator import GlobalModelEvaluator
from jobs.config import JobConfig
from processors.models import model_class_path
from processors.task_processor import FedAvgTaskProcessor
from simulation.planner import WorkerPlan
from simulation.runner import FastDeviceRunner, StockDeviceRunner

SERVER = "server"


def replace_component(job: EdgeJob, target: str, comp_id: str, component) -> None:
    """Swap a component the NVFlare recipe already configured (FedJob has no public API for this)."""
    app = job._deploy_map[target]  # noqa: SLF001
    old = app.app_config.components[comp_id]
    app.app_config.components[comp_id] = component
    app.app_config.handlers = [component if h is old else h for h in app.app_config.handlers]
    # FedApp.add_component skips an object whose id() it has seen (nvflare/job_config/api.py). Once `old` is
    # freed its address, hence its id, can be reused by the next component we add, which NVFlare would then
    # silently drop (it happened to our evaluator in ~15% of exports): forget the old id, record the new one.
    app._oid_to_cid.pop(id(old), None)  # noqa: SLF001
    app._oid_to_cid[id(component)] = comp_id  # noqa: SLF001


class RetainingEdgeJob(EdgeJob):
    """NVFlare's edge job whose leaves keep device updates they have not sent yet (see ``retaining_updater``),
    and sync with the server every ``update_interval`` seconds instead of NVFlare's fixed 1 s: that interval
    (plus up to 0.5 s of jitter) is how long finished results wait before the server can react to them."""

    def __init__(self, name: str, edge_method: str, update_interval: float = 1.0):
        super().__init__(name=name, edge_method=edge_method)
        self.update_interval = update_interval

    def configure_server(self, assessor, num_rounds=1, task_name="train", assess_interval=0.5, update_interval=1.0):
        interval = self.update_interval
        super().configure_server(assessor, num_rounds, task_name, min(assess_interval, interval), interval)

    def _configure_executor(self, aggr_factory_id, max_model_versions, update_timeout):
        return RetainingEdgeModelExecutor(aggr_factory_id, max_model_versions, update_timeout)


class EdgeSimRecipe(EdgeFedBuffRecipe):
    def __init__(self, cfg: JobConfig, plan: WorkerPlan, run_info: dict, results_dir: str):
        self.cfg, self.plan, self.run_info, self.results_dir = cfg, plan, run_info, results_dir
        super().__init__(
            job_name=cfg.job_name,
            model={"class_path": model_class_path(cfg.model), "args": {"init_seed": cfg.seed}},
            model_manager_config=ModelManagerConfig(
                max_num_active_model_versions=cfg.max_num_active_model_versions or None,
                max_model_version=cfg.max_model_version,
                update_timeout=cfg.update_timeout,
                num_updates_for_model=cfg.num_updates_for_model,
                max_model_history=cfg.max_model_history,
                global_lr=cfg.global_lr,
            ),
            device_manager_config=DeviceManagerConfig(
                device_selection_size=cfg.device_selection_size,
                min_hole_to_fill=cfg.min_hole_to_fill,
                device_reuse=cfg.device_reuse,
            ),
            device_wait_timeout=cfg.device_wait_timeout,
        )

    def create_job(self) -> EdgeJob:
        return RetainingEdgeJob(self.job_name, self.method_name, update_interval=self.cfg.update_interval)

    def make_model_manager(self):
        """The server's model manager; method-specific recipes override this."""
        c = self.model_manager_config
        return NumpyBuffModelManager(
            num_updates_for_model=c.num_updates_for_model,
            max_model_history=c.max_model_history,
            global_lr=c.global_lr,
            staleness_weight=c.staleness_weight,
        )

    def make_task_processor(self) -> FedAvgTaskProcessor:
        cfg = self.cfg
        return FedAvgTaskProcessor(
            dataset=cfg.dataset_spec.to_dict(),
            model=cfg.model,
            subset_size=cfg.subset_size,
            dirichlet_alpha=cfg.dirichlet_alpha,
            seed=cfg.seed,
            local_iters=cfg.local_iters,
            local_batch_size=cfg.local_batch_size,
            local_lr=cfg.local_lr,
            optimizer=cfg.optimizer,
            compute_device=cfg.compute_device,
            speed=cfg.speed.to_dict() if cfg.simulator == "stock" else None,
            sleep_delays=cfg.simulator == "stock" and cfg.speed.enabled,
            wire_format=cfg.wire_format,
            torch_threads=self.plan.torch_threads,
            profile=cfg.profile,
            leaves_per_gpu=self.plan.leaves_per_gpu,
        )

    def _configure_job(self, job: EdgeJob) -> None:
        super()._configure_job(job)
        cfg = self.cfg
        if cfg.wire_format == "numpy":  # "lists" keeps NVFlare's own manager, which sends Python lists
            replace_component(job, SERVER, "model_manager", self.make_model_manager())
        d = self.device_manager_config
        replace_component(
            job,
            SERVER,
            "device_manager",
            FreshSelectionDeviceManager(d.device_selection_size, d.min_hole_to_fill, d.device_reuse, seed=cfg.seed),
        )
        evaluator_id = job.to_server(
            GlobalModelEvaluator(
                model=cfg.model,
                dataset=cfg.dataset_spec.to_dict(),
                eval_frequency=cfg.eval_frequency,
                compute_device=cfg.compute_device,
                results_dir=self.results_dir,
                max_model_version=cfg.max_model_version,
                updates_per_version=cfg.num_updates_for_model,
                run_info=self.run_info,
            ),
            id="edgesim_evaluator",
        )
        if evaluator_id != "edgesim_evaluator":  # never build a job that would write no metrics.json
            raise RuntimeError(f"NVFlare registered the evaluator as {evaluator_id!r}, not 'edgesim_evaluator'")
        processor_id = job.to_clients(self.make_task_processor(), id="task_processor")
        if cfg.simulator == "stock":
            runner = StockDeviceRunner(processor_id, cfg.job_timeout, cfg.devices_per_leaf, self.plan.num_workers)
        else:
            runner = FastDeviceRunner(
                processor_id,
                job_timeout=cfg.job_timeout,
                num_devices=cfg.devices_per_leaf,
                num_workers=self.plan.num_workers,
                speed=cfg.speed.to_dict(),
                time_scale=cfg.time_scale,
                results_dir=self.results_dir,
                group_size=self.plan.group_size if self.plan.engine == "vectorized" else 1,
            )
        job.to_clients(runner, id="device_runner")
