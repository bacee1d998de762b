"""The noise differential privacy needs for a target epsilon over the planned run, and the run's privacy in one line
(``docs/privacy.md``).

``resolve_privacy`` runs when the driver (or ``jobs.api.make_config``) has validated a config, before anything
starts: it needs ``dp-accounting`` and builds the model (a model whose predictions use BatchNorm's statistics is
refused: they would leave the devices unclipped), computes the noise multiplier from ``--dp-target-epsilon`` for
the compositions the run will make, and refuses a target that cannot be met. The compositions are the versions
``--max-model-version`` makes, or, when the time budget (``--max-sim-time``) or the accounting needs the schedule
itself (participation, local DP), what the ``--dry-run`` planner's trace says: the same schedule the run follows
(``jobs.run.schedule_plan``, ``scheduling.timeline``).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections import Counter

from common.choices import ConfigError
from common.privacy_accounting import check_installed, epsilon, noise_for_epsilon
from jobs.config import JobConfig
from jobs.privacy import check_count_noise, check_model
from jobs.run.schedule_plan import schedule_for
from scheduling.timeline import run_timeline


def resolve_privacy(cfg: JobConfig) -> JobConfig:
    """``cfg`` with its noise multiplier computed from its target epsilon (when given alone); ``ConfigError`` for
    a missing library, a model with BatchNorm statistics, or a target the planned run cannot meet."""
    p = cfg.privacy
    if not p.on:
        return cfg
    check_installed()
    check_model(cfg.training.model)
    if p.dp_target_epsilon is None:
        return cfg
    compositions = planned_compositions(cfg)
    q = planned_sampling_probability(cfg)
    if p.dp_noise_multiplier is None:
        found = noise_for_epsilon(p.dp_accountant, q, compositions, p.dp_delta, p.dp_target_epsilon)
        z = (
            found * 2 if p.local else found
        )  # local: the device's noise over C, twice the accountant's (sensitivity 2 C)
        z = math.ceil(z * 1e6) / 1e6  # rounded up: never below the calibrated noise
        cfg = dataclasses.replace(cfg, privacy=dataclasses.replace(p, dp_noise_multiplier=z))
        p = cfg.privacy
    spent = epsilon(p.dp_accountant, accounted_multiplier(cfg), q, compositions, p.dp_delta)
    if spent > p.dp_target_epsilon * (1 + 1e-9):
        fix = (
            "a resumed run keeps its noise: resume it without a longer --max-model-version / --max-sim-time"
            if cfg.run.resume
            else "raise the noise, or leave one of them out"
        )
        raise ConfigError(
            f"--dp-noise-multiplier {p.dp_noise_multiplier} spends epsilon {spent:.4g} over the planned "
            f"{compositions} compositions, above --dp-target-epsilon {p.dp_target_epsilon}: {fix}"
        )
    if p.dp_adaptive_clipping:
        check_count_noise(cfg, p.dp_noise_multiplier)
    return cfg


def accounted_multiplier(cfg: JobConfig) -> float:
    """The noise multiplier the accountant takes: central, the query's; local, half a device's (sensitivity 2 C)."""
    z = cfg.privacy.dp_noise_multiplier
    return z / 2 if cfg.privacy.local else z


def planned_sampling_probability(cfg: JobConfig) -> float:
    p, f = cfg.privacy, cfg.federation
    if p.central and p.dp_sampling == "poisson":
        return min(1.0, f.num_updates_for_model / (f.num_leaf_nodes * f.devices_per_leaf))
    return 1.0


_PLANNED: dict[str, int] = {}  # a config's planned compositions (the notes ask again after resolve_privacy)


def planned_compositions(cfg: JobConfig) -> int:
    """The compositions the run will make (see the module docstring)."""
    key = cfg.to_dict()
    key["privacy"] = {k: v for k, v in key["privacy"].items() if k not in ("dp_noise_multiplier", "dp_target_epsilon")}
    key = json.dumps(key, sort_keys=True, default=str)
    if key not in _PLANNED:
        _PLANNED[key] = _plan(cfg)
    return _PLANNED[key]


def _plan(cfg: JobConfig) -> int:
    p, f = cfg.privacy, cfg.federation
    poisson = p.central and p.dp_sampling == "poisson"
    if poisson and f.max_sim_time is None:
        return f.max_model_version - 1
    schedule = schedule_for(cfg)
    timeline = run_timeline(schedule, len(schedule.pool))
    if poisson:
        return timeline.versions - 1
    counted = [r for r in timeline.trace if not r.get("failed")]
    if p.local:  # every update a device sent
        per_device = Counter(r["device"] for r in counted)
    else:  # the versions made that each device went into
        per_device = Counter(
            d for d, _ in {(r["device"], r["version"]) for r in counted if r["version"] <= timeline.versions}
        )
    return max(per_device.values(), default=0)


def privacy_notes(cfg: JobConfig) -> tuple[str, ...]:
    """The run's privacy in one line, for the start of the run."""
    p = cfg.privacy
    if not p.on:
        return ()
    q = planned_sampling_probability(cfg)
    where = "the server adds noise to each aggregate" if p.central else "each device adds noise to its own update"
    clip = f"adaptive from {p.dp_clip_norm:g}" if p.dp_adaptive_clipping else f"{p.dp_clip_norm:g}"
    line = (
        f"differential privacy ({p.dp}): updates clipped to L2 norm {clip}, {where} with noise multiplier "
        f"{p.dp_noise_multiplier:g}; accountant {p.dp_accountant}, sampling probability {q:.4g}, delta {p.dp_delta:g}"
    )
    if p.dp_target_epsilon is not None:
        line += f" (for epsilon {p.dp_target_epsilon:g} over the planned {planned_compositions(cfg)} compositions)"
    if p.dp_delta * cfg.federation.num_leaf_nodes * cfg.federation.devices_per_leaf > 1:
        line += "; delta is above 1 / devices, weaker than customary"
    return (line,)
