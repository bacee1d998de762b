"""The recipe for asynchronous methods: FedBuff (NVFlare's buffered aggregation) and FedRevive.

FedRevive differs from FedBuff in two components only: the server's model manager revives each update by
data-free distillation, and the leaves forward device updates individually instead of summing them.
"""

from __future__ import annotations

from nvflare.apis.job_def import ALL_SITES
from nvflare.edge.tools.edge_job import EdgeJob

from aggregation.fedrevive_model_manager import FedReviveModelManager
from aggregation.per_device_forwarding import PerDeviceForwardingAggrFactory
from jobs.recipe import EdgeSimRecipe, replace_component


class AsyncEdgeRecipe(EdgeSimRecipe):
    def make_model_manager(self):
        if self.cfg.method != "fedrevive":
            return super().make_model_manager()
        c, cfg = self.model_manager_config, self.cfg
        return FedReviveModelManager(
            num_updates_for_model=c.num_updates_for_model,
            max_model_history=c.max_model_history,
            global_lr=c.global_lr,
            model=cfg.model,
            fedrevive=cfg.fedrevive.to_dict(),
            compute_device=cfg.compute_device,
            seed=cfg.seed,
            results_dir=self.results_dir,
        )

    def _configure_job(self, job: EdgeJob) -> None:
        super()._configure_job(job)
        if self.cfg.method == "fedrevive":
            replace_component(job, ALL_SITES, "aggr_factory", PerDeviceForwardingAggrFactory())
