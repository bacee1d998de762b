"""The noise differential privacy needs for a target epsilon over the planned run, the seeded noise's key, and the
run's privacy in a few lines (``docs/privacy.md``).

``resolve_privacy`` runs when the driver (or ``jobs.api.make_config``) has validated a config, before anything
starts: it needs ``dp-accounting`` and builds the model (a model whose predictions use BatchNorm's statistics is
refused: they would leave the devices unclipped), computes the noise multiplier from ``--dp-target-epsilon`` for
the compositions the run will make, refuses a target that cannot be met, and gives seeded noise its key. The
compositions are the versions the busiest device goes into (central) or the updates it sends (local), from the
``--dry-run`` planner's trace: the same schedule the run follows (``jobs.run.schedule_plan``,
``scheduling.timeline``), composed without amplification.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections import Counter

from common.choices import ConfigError
from common.privacy_accounting import check_installed, epsilon, noise_for_epsilon
from jobs.config import HARMLESS, JobConfig
from jobs.privacy import check_count_noise, check_model
from jobs.run.schedule_plan import schedule_for
from scheduling.timeline import run_timeline


def resolve_privacy(cfg: JobConfig) -> JobConfig:
    """``cfg`` with its noise multiplier computed from its target epsilon (when given alone) and, with seeded noise,
    its noise key; ``ConfigError`` for a missing library, a model with BatchNorm statistics, or a target the
    planned run cannot meet."""
    p = cfg.privacy
    if not p.on:
        return cfg
    check_installed()
    check_model(cfg.training.model)
    if p.dp_target_epsilon is not None:
        cfg = _meet_target(cfg)
        p = cfg.privacy
    if p.dp_adaptive_clipping:
        check_count_noise(cfg, p.dp_noise_multiplier)
    key = noise_key(cfg) if p.dp_noise == "seeded" else None
    if key != p.dp_noise_key:
        cfg = dataclasses.replace(cfg, privacy=dataclasses.replace(p, dp_noise_key=key))
    return cfg


def _meet_target(cfg: JobConfig) -> JobConfig:
    p = cfg.privacy
    if cfg.engine.devices == "real":  # no plan: the server stops the run before a version exceeds the target
        return cfg
    compositions = planned_compositions(cfg)
    cfg = dataclasses.replace(cfg, privacy=dataclasses.replace(p, dp_planned_compositions=compositions))
    p = cfg.privacy
    if p.dp_noise_multiplier is None:
        found = noise_for_epsilon(p.dp_accountant, 1.0, compositions, p.dp_delta, p.dp_target_epsilon)
        z = math.ceil(found * p.sensitivity * 1e6) / 1e6  # sigma over C, rounded up: never below the calibrated
        cfg = dataclasses.replace(cfg, privacy=dataclasses.replace(p, dp_noise_multiplier=z))
        p = cfg.privacy
    spent = epsilon(p.dp_accountant, p.accounted_multiplier(), 1.0, compositions, p.dp_delta)
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
    return cfg


def noise_key(cfg: JobConfig) -> str:
    """Seeded noise's key: the digest of every field of the run but those a resume may change (``HARMLESS``) and
    the key itself, so runs that differ in anything else (seed, sigma, a sweep's flag) draw independent noise, and
    the same command, or its resumption, draws the same."""
    fields = cfg.to_dict()
    for part, name in HARMLESS:
        fields[part].pop(name, None)
    for derived in ("dp_noise_key", "dp_planned_compositions"):
        fields["privacy"].pop(derived, None)
    if not cfg.compression.on:  # a run without compression keys its noise as before the part existed
        fields.pop("compression", None)
    text = json.dumps(fields, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def planned_compositions(cfg: JobConfig) -> int:
    """The compositions the run will make: the planner's trace of its schedule, the busiest device's versions
    (central) or updates sent (local)."""
    schedule = schedule_for(cfg)
    timeline = run_timeline(schedule, len(schedule.pool))
    counted = [r for r in timeline.trace if not r.get("failed")]
    if cfg.privacy.local:  # every update a device sent
        per_device = Counter(r["device"] for r in counted)
    else:  # the versions made that each device went into
        per_device = Counter(
            d for d, _ in {(r["device"], r["version"]) for r in counted if r["version"] <= timeline.versions}
        )
    return max(per_device.values(), default=0)


def privacy_notes(cfg: JobConfig) -> tuple[str, ...]:
    """The run's privacy for the start of the run: the mechanism, the noise's source, and (central DP) where the
    checkpoint's un-noised updates live."""
    p = cfg.privacy
    if not p.on:
        return ()
    where = "the server adds noise to each aggregate" if p.central else "each device adds noise to its own update"
    clip = f"adaptive from {p.dp_clip_norm:g}" if p.dp_adaptive_clipping else f"{p.dp_clip_norm:g}"
    line = (
        f"differential privacy ({p.dp}): updates clipped to L2 norm {clip}, {where} with noise multiplier "
        f"{p.dp_noise_multiplier:g}; {p.dp_neighbouring} neighbouring (sensitivity {p.sensitivity:g} C), accountant "
        f"{p.dp_accountant}, the busiest device's participations unamplified, delta {p.dp_delta:g}"
    )
    if p.dp_target_epsilon is not None:
        line += f" (for epsilon {p.dp_target_epsilon:g} over the planned {p.dp_planned_compositions} compositions)"
    if p.dp_delta * cfg.federation.num_leaf_nodes * cfg.federation.devices_per_leaf > 1:
        line += "; delta is above 1 / devices, weaker than customary"
    notes = [line]
    if p.dp_noise == "seeded":
        notes.append(
            "seeded DP noise: drawn from this command's configuration and seed so the run repeats; it protects "
            "nothing outside this simulation (anyone with the command can subtract it): --dp-noise secure for that"
        )
    else:
        notes.append(
            "secure DP noise: drawn from the OS's entropy (ChaCha20), never recorded; the run will not repeat it"
        )
    if p.central and cfg.run.checkpoint_every != -1:
        notes.append(
            f"the checkpoint ({cfg.output_dir or 'the results folder'}/checkpoint) holds clipped, un-noised updates: "
            "it is the server's private state; keep it from everyone the guarantee protects against, and publish "
            "the results folder without it"
        )
    return tuple(notes)
