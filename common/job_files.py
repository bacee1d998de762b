"""Which of this project's packages a job carries to its sites, and how they are put in its ``custom/`` folder.

A deployment's sites have NVFlare and the third-party libraries installed, not this project: a job that names our
components (our own jobs, or a recipe after ``jobs.drop_in.use_fast_simulator``) ships every layer they import.
NVFlare copies only the modules of the classes a job names, so their imports would be missing otherwise.

Those packages are also the job's "app packages" (``FedJob.set_app_packages``): NVFlare then leaves them to us instead
of parsing the source of every module a component's module imports, recursively, to copy the same files again
(``FedJobConfig._get_custom_file``: a noticeable share of the driver's start, on every run).
"""

from __future__ import annotations

import os

from nvflare.apis.job_def import ALL_SITES, SERVER_SITE_NAME

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# every layer below jobs/ (ARCHITECTURE.md): what a job's components import at run time
SHIPPED_PACKAGES = ("common", "processors", "simulation", "fedrevive", "aggregation", "scheduling", "evaluation")


TARGETS = (SERVER_SITE_NAME, ALL_SITES)  # the server's app and every client's


def ship_package(job, root: str, name: str, targets: tuple[str, ...] = TARGETS) -> None:
    """Put every ``.py`` file below the package folder ``root`` into ``custom/name/...`` of each target app of
    ``job`` (an NVFlare ``FedJob``): the package then imports as ``name`` on every site."""
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        relative = os.path.normpath(os.path.join(name, os.path.relpath(folder, root)))
        for file in sorted(f for f in files if f.endswith(".py")):
            for target in targets:
                job.add_file_to(os.path.join(folder, file), target, dest_dir=relative)


def ship_packages(job, targets: tuple[str, ...] = TARGETS) -> None:
    """Put this project's packages into the ``custom/`` folder of each target app of ``job`` (an NVFlare
    ``FedJob``), and make them its app packages (see the module docstring)."""
    given = list(getattr(getattr(job, "job", None), "app_packages", None) or [])
    job.set_app_packages(given + [p for p in SHIPPED_PACKAGES if p not in given])
    for package in SHIPPED_PACKAGES:
        ship_package(job, os.path.join(REPO, package), package, targets)
