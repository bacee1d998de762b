"""Differential privacy for a whole job: what the parts of a config must agree on (``docs/privacy.md``).

``check_privacy`` runs when a ``JobConfig`` is built (one line naming the fix; the method's own refusals are its
``Method.check_privacy``); ``check_model`` and ``check_count_noise`` when the run is planned
(``jobs.run.privacy_plan``, which also computes the noise for a target epsilon over the planned run).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from common.choices import ConfigError
from common.privacy_accounting import update_noise_multiplier

if TYPE_CHECKING:
    from jobs.config import JobConfig


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
