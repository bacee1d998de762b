"""The run's schedule alone, from its config: what ``--dry-run`` runs, what differential privacy plans its
compositions from, and the reference a real run's ``events.jsonl`` must equal (``scheduling.event_reference``).
``planned_timeline`` is the one call both make: the schedule built and run to its end by the dry-run planner."""

from __future__ import annotations

from dataclasses import asdict

from jobs.config import JobConfig
from jobs.methods import method_of
from scheduling.event_reference import make_schedule
from scheduling.schedule import ExactSchedule
from scheduling.timeline import Timeline, run_timeline


def planned_timeline(cfg: JobConfig) -> Timeline:
    """The run's planned timeline: its schedule (``schedule_for``) run to its end by the dry-run planner
    (``scheduling.timeline``), over the whole fleet."""
    return run_timeline(*_laid_out(cfg))


def schedule_for(cfg: JobConfig) -> ExactSchedule:
    """The run's schedule alone, not started (``_laid_out``)."""
    return _laid_out(cfg)[0]


def _laid_out(cfg: JobConfig) -> tuple[ExactSchedule, int]:
    """The run's schedule alone, not started: what ``--dry-run`` runs, and the reference a real run's
    ``events.jsonl`` must equal (``scheduling.event_reference``), and the devices of its fleet. Its leaves are
    named as the run's will be: SimEnv's ``site-1, site-2, ..``, or with ``--env prod`` the deployment's (``C11,
    C12, ..``, from its kit)."""
    # imported here, not with this module: both import torch, which jobs.cli (it imports this module) needs only
    # once a flag's value is accepted; --help and a refused flag answer without it
    from jobs.run.components import leaf_layout
    from processors.local_work import device_work

    f = cfg.federation
    leaves, offsets = leaf_layout(cfg)
    method = method_of(cfg.method)
    schedule = make_schedule(
        cfg.delays,
        cfg.run.seed,
        leaves,
        f.device_selection_size,
        f.num_updates_for_model,
        f.min_hole_to_fill,
        f.device_reuse,
        f.max_model_version,
        f.max_sim_time,
        method.selection_policy(cfg),
        device_work(asdict(cfg.data), asdict(cfg.training), cfg.run.seed, offsets),  # None: --local-iters
        cfg.privacy.central,  # differential privacy: each device at most once per version
    )
    return schedule, sum(leaves.values())
