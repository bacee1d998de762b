"""``--deployment``: a sweep's trials as jobs on one long-lived NVFlare deployment (``python -m jobs.deploy up``)
instead of a fresh SimEnv each.

Each trial is still the job's own command line, with ``--env prod --startup-kit KIT --username USER`` added: its
driver submits the job through the admin API and follows it (``jobs.run.remote``), and a SIGTERM (a pruned trial)
aborts the job on the deployment before the driver exits. The deployment's server, relays and leaves are started
once; each trial pays only its driver's start, the job's submission and NVFlare's job processes on the sites.

A deployment's results come home when its job ends, so while a trial runs its curve is read from the server's
progress lines its driver prints into the trial's log (``[edgesim] version 3 | accuracy 0.41 | ... | simulated
12.0 s``, polled every few seconds); ``metrics.json`` replaces them once it is home.
"""

from __future__ import annotations

import json
import os
import re

from jobs.admin_kit import check_leaf_count, check_server_answers, user_of
from jobs.sweep.spec import SpecError, SweepSpec

STATE_FILE = "deployment.json"  # what ``python -m jobs.deploy up`` writes in its folder (``admin_kit`` among it)
LINE = re.compile(
    r"\[edgesim\] version (\d+)(?:/\d+)? \| accuracy ([0-9.]+) \| ([0-9.]+) s since start \| simulated ([0-9.]+) s"
)


def admin_kit(path: str) -> str:
    """The admin's startup kit of ``path``: a ``jobs.deploy`` folder (its ``deployment.json``) or the kit itself."""
    path = os.path.abspath(os.path.expanduser(path))
    state = os.path.join(path, STATE_FILE)
    if os.path.isfile(state):
        with open(state) as f:
            return json.load(f)["admin_kit"]
    return path


def deployment_flags(path: str, spec: SweepSpec) -> dict:
    """The flags that send every trial to the deployment at ``path``; ``SpecError`` (exit 2, before any trial)
    when it is no deployment, does not answer, or has another number of leaves than the spec's trials."""
    kit = admin_kit(path)
    try:
        user = user_of(kit)
        check_server_answers(kit)
        check_leaf_count(kit, int(spec.base.get("num-leaf-nodes", 2)))
    except (ValueError, KeyError) as ex:
        raise SpecError(f"--deployment {path}: {ex}") from ex
    return {"env": "prod", "startup-kit": kit, "username": user}


def records_from_log(path: str) -> list[dict]:
    """A running trial's evaluated versions, from the progress lines in its log (version, accuracy, simulated
    seconds; the wall seconds since the run's start)."""
    try:
        with open(path, errors="replace") as f:
            text = f.read()
    except OSError:
        return []
    seen: dict[int, dict] = {}
    for m in LINE.finditer(text):
        version = int(m.group(1))
        seen[version] = {
            "version": version,
            "accuracy": float(m.group(2)),
            "wall_seconds": float(m.group(3)),
            "sim_seconds": float(m.group(4)),
        }
    return [seen[v] for v in sorted(seen)]
