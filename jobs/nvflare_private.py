"""The driver's fixes to NVFlare 2.9 (fixes 2, 3 and 14 of ``docs/nvflare-upstream.md``): reaching into a built
job's apps to replace components, setting the leaves' sync interval on a built job, and the job config variable that
keeps arrays inline in each message. Checked by ``tests/simulation/test_nvflare_private.py`` and
``tests/simulation/test_nvflare_guard.py``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from nvflare.apis.job_def import ALL_SITES, SERVER_SITE_NAME

if TYPE_CHECKING:
    from nvflare.edge.controllers.sage import ScatterAndGatherForEdge
    from nvflare.job_config.api import FedJob
    from nvflare.recipe.spec import Recipe

NVFLARE_RELIED_ON = {  # bodies whose behaviour a fix depends on (the fix's number)
    "nvflare.fuel.utils.fobs.decomposers.via_downloader.ViaDownloaderDecomposer.decompose": "c5511a3d5c57e0ec",  # 14
}
INLINE_ARRAYS = {"np_download_chunk_size": 0}  # fix 14: the numpy decomposer's chunk size, as a job config variable
NVFLARE_PRIVATE_ATTRIBUTES = {
    "nvflare.job_config.api.FedJob": ("_deploy_map",),
    "nvflare.recipe.spec.Recipe": ("_job",),
    "nvflare.edge.controllers.sage.ScatterAndGatherForEdge": ("_update_interval", "_assess_interval"),
}


def recipe_job(recipe: Recipe) -> FedJob:
    """The job a recipe builds (and runs)."""
    return recipe._job  # noqa: SLF001 - fix 2


def _apps(job: FedJob) -> dict:
    return job._deploy_map  # noqa: SLF001 - fix 2


def client_app_config(job: FedJob):
    """The ``ClientAppConfig`` every client runs (``components``: id -> component; ``executors``)."""
    app = _apps(job).get(ALL_SITES)
    if app is None:
        raise ValueError(
            "the job has no app for all clients (@ALL): configure its clients and its device simulation "
            "first (EdgeJob.configure_client, EdgeJob.configure_simulation)"
        )
    return app.app_config


def server_app_config(job: FedJob):
    """The ``ServerAppConfig`` of the server (``components``; ``workflows``)."""
    app = _apps(job).get(SERVER_SITE_NAME)
    if app is None:
        raise ValueError("the job has no server app")
    return app.app_config


def set_sync_interval(controller: ScatterAndGatherForEdge, update_interval: float) -> None:
    """Leaves sync with their parents every ``update_interval`` seconds; the server assesses at least as often."""
    controller._update_interval = update_interval  # noqa: SLF001 - fix 3
    controller._assess_interval = min(controller._assess_interval, update_interval)  # noqa: SLF001
