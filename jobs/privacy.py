"""Differential privacy for a whole job (``docs/privacy.md``): what the parts of a config must agree on, and what
the build step derives for it once, before anything starts.

``check_privacy`` is one of the build's cross-checks (``jobs.build``; one line naming the fix; the method's own
refusals are its ``Method.check_privacy``). ``resolve_privacy`` is the build's last stage, once a config is
validated: it needs ``dp-accounting`` and builds the model (a model whose predictions use BatchNorm's statistics is
refused: they would leave the devices unclipped), has the privacy part compute the noise multiplier from
``--dp-target-epsilon`` for the compositions the run will make (``PrivacyConfig.planned``), refuses a target that cannot be met, and gives seeded noise its key. The
compositions are the versions the busiest device goes into (central) or the updates it sends (local), from the
``--dry-run`` planner's trace, in one call: the same schedule the run follows (``jobs.run.schedule_plan``'s
``planned_timeline``), composed without amplification. ``privacy_notes`` says the run's privacy in a few lines.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections import Counter

from common.choices import ConfigError
from common.privacy_accounting import check_installed, update_noise_multiplier
from jobs.config import HARMLESS, JobConfig
from jobs.run.schedule_plan import planned_timeline
from scheduling.timeline import Timeline


def check_privacy(cfg: JobConfig) -> None:
    """Refuse what differential privacy cannot run with, naming the fix (``ConfigError``)."""
    p = cfg.privacy
    if not p.on:
        return
    if cfg.engine.simulator == "stock":
        raise ConfigError(f"--dp {p.dp}: NVFlare's stock path clips and noises nothing: use --simulator fast")
    outside = "--devices real" if cfg.engine.devices == "real" else f"--env {cfg.run.env}"
    if p.dp_noise == "seeded" and (cfg.engine.devices == "real" or cfg.run.env != "sim"):
        raise ConfigError(
            f"--dp-noise seeded with {outside}: seeded noise is a function of the command, so anyone who knows it "
            "can subtract the noise; leave --dp-noise out (secure, the OS's entropy)"
        )
    if p.dp_target_epsilon is not None and p.dp_noise_multiplier is None and cfg.engine.devices == "real":
        raise ConfigError(
            "--dp-target-epsilon alone with real devices: their participation cannot be planned, so no noise can be "
            "computed for it; give --dp-noise-multiplier too (the target then stops the run before it is exceeded)"
        )
    if p.dp_adaptive_clipping and p.dp_noise_multiplier is not None:
        check_count_noise(cfg, p.dp_noise_multiplier)


def check_count_noise(cfg: JobConfig, noise_multiplier: float) -> None:
    """Adaptive clipping's count noise must leave the updates some budget (``update_noise_multiplier``)."""
    b = cfg.federation.num_updates_for_model
    try:
        update_noise_multiplier(noise_multiplier, cfg.privacy.dp_count_noise * b)
    except ValueError as ex:
        raise ConfigError(
            f"--dp-adaptive-clipping: {ex}; raise --dp-count-noise above {noise_multiplier / (2 * b):.4g} or "
            "--num-updates-for-model, or leave adaptive clipping out"
        ) from ex


def check_model(model: str) -> None:
    """Refuse a model whose predictions use data statistics (BatchNorm's running moments): under DP they stay the
    initial model's, which such a model cannot evaluate with."""
    from processors.models import build_model
    from processors.models.stat_tracker import untracked_buffers

    found = untracked_buffers(build_model(model))
    if found:
        raise ConfigError(
            f"differential privacy with --model {model}: its predictions use data statistics ({found[0]}, ...) "
            "that would leave the devices unclipped and un-noised; use a model without BatchNorm (cifar10_convnet, "
            "resnet18, char_lstm) or GroupNorm in your own"
        )


def resolve_privacy(cfg: JobConfig) -> tuple[JobConfig, Timeline | None]:
    """``cfg`` with its noise multiplier computed from its target epsilon (when given alone) and, with seeded noise,
    its noise key; and the planned run's timeline when one was computed (a target epsilon with simulated devices),
    so a dry run writes it without planning it again. ``ConfigError`` for a missing library, a model with BatchNorm
    statistics, or a target the planned run cannot meet. The build step's (``jobs.build``), once per run."""
    p = cfg.privacy
    if not p.on:
        return cfg, None
    check_installed()
    check_model(cfg.training.model)
    timeline = None
    # real devices: no plan; the server stops the run before a version exceeds the target
    if p.dp_target_epsilon is not None and cfg.engine.devices != "real":
        timeline = planned_timeline(cfg)  # the schedule the run follows, run by the dry-run planner
        p, spent = p.planned(participations(timeline))
        if spent > p.dp_target_epsilon * (1 + 1e-9):
            fix = (
                "a resumed run keeps its noise: resume it without a longer --max-model-version / --max-sim-time"
                if cfg.run.resume
                else "raise the noise, or leave one of them out"
            )
            raise ConfigError(
                f"--dp-noise-multiplier {p.dp_noise_multiplier} spends epsilon {spent:.4g} over the planned "
                f"{p.dp_planned_compositions} compositions, above --dp-target-epsilon {p.dp_target_epsilon}: {fix}"
            )
        cfg = dataclasses.replace(cfg, privacy=p)
    if p.dp_adaptive_clipping:
        check_count_noise(cfg, p.dp_noise_multiplier)
    key = noise_key(cfg) if p.dp_noise == "seeded" else None
    if key != p.dp_noise_key:
        cfg = dataclasses.replace(cfg, privacy=dataclasses.replace(p, dp_noise_key=key))
    return cfg, timeline


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


def participations(timeline: Timeline) -> dict[str, int]:
    """The busiest device's participations in the planner's trace (``timeline``), by mode: ``central``, the
    versions made that it went into; ``local``, the updates it sent (``PrivacyConfig.planned``)."""
    counted = [r for r in timeline.trace if not r.get("failed")]
    versions = Counter(
        d for d, _ in {(r["device"], r["version"]) for r in counted if r["version"] <= timeline.versions}
    )
    updates = Counter(r["device"] for r in counted)
    return {"central": max(versions.values(), default=0), "local": max(updates.values(), default=0)}


def planned_compositions(cfg: JobConfig) -> int:
    """The compositions the run will make: the busiest device's participations in its planned timeline."""
    return participations(planned_timeline(cfg))[cfg.privacy.dp]


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
