"""The run's schedule alone, from its config: what ``--dry-run`` runs, what differential privacy plans its
compositions from, and the reference a real run's ``events.jsonl`` must equal (``scheduling.event_reference``)."""

from __future__ import annotations

from dataclasses import asdict

from jobs.config import JobConfig
from jobs.methods import method_of
from scheduling.event_reference import make_schedule
from scheduling.schedule import ExactSchedule
from scheduling.selection import make_policy


def schedule_for(cfg: JobConfig) -> ExactSchedule:
    """The run's schedule alone, not started: what ``--dry-run`` runs, and the reference a real run's
    ``events.jsonl`` must equal (``scheduling.event_reference``). Its leaves are named as the run's will be:
    SimEnv's ``site-1, site-2, ..``, or with ``--env prod`` the deployment's (``C11, C12, ..``, from its kit)."""
    # imported here, not with this module: both import torch, which jobs.cli (it imports this module) needs only
    # once a flag's value is accepted; --help and a refused flag answer without it
    from jobs.run.components import leaf_layout
    from processors.local_work import device_work

    f = cfg.federation
    leaves, offsets = leaf_layout(cfg)
    method = method_of(cfg.method)
    return make_schedule(
        cfg.delays,
        cfg.run.seed,
        leaves,
        f.device_selection_size,
        f.num_updates_for_model,
        f.min_hole_to_fill,
        f.device_reuse,
        f.max_model_version,
        f.max_sim_time,
        make_policy(method.selection_path, method.selection_args(cfg)),
        device_work(asdict(cfg.data), asdict(cfg.training), cfg.run.seed, offsets),  # None: --local-iters
        cfg.privacy.central,  # differential privacy: each device at most once per version
    )
