"""The run's schedule alone, from its config: what ``--dry-run`` runs, what differential privacy plans its
compositions from, and the reference a real run's ``events.jsonl`` must equal (``scheduling.event_reference``)."""

from __future__ import annotations

from jobs.config import JobConfig
from scheduling.event_reference import make_schedule
from scheduling.schedule import ExactSchedule
from scheduling.selection import make_policy


def schedule_for(cfg: JobConfig) -> ExactSchedule:
    """The run's schedule alone, not started: what ``--dry-run`` runs, and the reference a real run's
    ``events.jsonl`` must equal (``scheduling.event_reference``). Its leaves are named as the run's will be:
    SimEnv's ``site-1, site-2, ..``, or with ``--env prod`` the deployment's (``C11, C12, ..``, from its kit)."""
    # imported here, not with this module: both import torch, which jobs.cli (it imports this module) needs only
    # once a flag's value is accepted; --help and a refused flag answer without it
    from jobs.run.components import device_offsets, leaf_names
    from processors.local_work import device_work

    f = cfg.federation
    leaves = dict.fromkeys(leaf_names(cfg), f.devices_per_leaf)
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
        make_policy(cfg.method_spec.selection_path, cfg.method_spec.selection_args(cfg)),
        device_work(
            cfg.data.to_dict(), cfg.training.to_dict(), cfg.run.seed, device_offsets(cfg)
        ),  # None: --local-iters
        cfg.privacy.central,  # differential privacy: each device at most once per version
    )
