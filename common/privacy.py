"""User-level differential privacy: the run's settings (``PrivacyConfig``, the ``--dp-*`` flags) and the names its
parts share.

Three processes take part (``docs/privacy.md`` gives the mechanism, the accounting and what the guarantee covers):

* the device (``processors.privatize``, run by the task processor in both engines and on real devices) clips its
  update to the L2 norm of the version it trained, and with local DP adds its own Gaussian noise;
* the server (``aggregation.server_privacy``) adds Gaussian noise to every aggregate (central DP), adapts the clip
  norm (Andrew et al. 2021) and counts what the accountant needs;
* the accountant (``common.privacy_accounting``, Google's ``dp-accounting``) turns those counts into epsilon.

This module holds what all three read: the settings and the names of the values that travel with versions and
updates. It imports nothing heavier than the standard library.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

from common.choices import ConfigError, check_choice

PrivacyMode = Literal["off", "central", "local"]
Accountant = Literal["rdp", "pld"]
Sampling = Literal["poisson", "participation"]

# down, with each version (``DEVICE_EXTRA_PREFIX`` + this): the L2 norm its devices clip their update to
CLIP_NORM = "dp_clip_norm"
# up, in a device's diff (central DP): 1.0 when its update was within the clip norm (not clipped), else 0.0; the
# server sums them for the fraction clipped and, with adaptive clipping, adds noise to the sum (Andrew et al.)
UNCLIPPED = "dp_unclipped"
MECHANISM = "gaussian"


@dataclass(frozen=True)
class PrivacyConfig:
    """Attributes:
    dp: ``off``; ``central``: every device clips its update to ``--dp-clip-norm``, the server adds Gaussian noise
        of standard deviation noise multiplier x clip norm to every aggregate (a version's B updates); ``local``:
        every device clips and adds that noise to its own update before it leaves the device (docs/privacy.md).
    dp_clip_norm: the L2 norm C each device's update (its parameters' diff) is clipped to; with
        ``--dp-adaptive-clipping`` the initial one.
    dp_noise_multiplier: the noise's standard deviation over the clip norm (default: computed from
        ``--dp-target-epsilon`` for the planned run).
    dp_target_epsilon: the epsilon the planned run may spend at ``--dp-delta``: the noise multiplier is computed
        for the versions ``--max-model-version`` makes, or ``--max-sim-time`` allows (the ``--dry-run`` planner);
        with ``--dp-noise-multiplier`` too, a run that would spend more is refused (default: none).
    dp_delta: the delta of the (epsilon, delta) guarantee; at most 1 / (devices in the pool) is customary.
    dp_accountant: ``rdp`` (Renyi DP, milliseconds per version) or ``pld`` (privacy loss distributions, tighter,
        about a second per recorded version), both Google's ``dp-accounting``.
    dp_sampling: how central DP counts a device's participation: ``poisson``, amplification by sampling with
        probability B / devices per version, every version a composition (the usual approximation of a cohort,
        as pfl-research and TFF); ``participation``, no amplification, as many compositions as the versions the
        device contributed to most (exact for a seeded, public schedule).
    dp_adaptive_clipping: adapt the clip norm towards the ``--dp-target-quantile`` of the updates' norms from a
        noised count of unclipped updates (Andrew et al. 2021, central DP only).
    dp_target_quantile: the fraction of updates adaptive clipping leaves unclipped.
    dp_clip_learning_rate: the step of adaptive clipping's geometric update, ``C <- C exp(-lr (unclipped -
        quantile))``.
    dp_count_noise: the standard deviation of the noise on the count of unclipped updates, as a fraction of the
        updates in an aggregate (Andrew et al.'s m / 20: 0.05); adaptive clipping needs it above noise multiplier
        / (2 B).
    """

    dp: PrivacyMode = "off"
    dp_clip_norm: float = 1.0
    dp_noise_multiplier: float | None = None
    dp_target_epsilon: float | None = None
    dp_delta: float = 1e-5
    dp_accountant: Accountant = "rdp"
    dp_sampling: Sampling = "poisson"
    dp_adaptive_clipping: bool = False
    dp_target_quantile: float = 0.5
    dp_clip_learning_rate: float = 0.2
    dp_count_noise: float = 0.05

    def __post_init__(self) -> None:
        check_choice("--dp", self.dp, PrivacyMode)
        check_choice("--dp-accountant", self.dp_accountant, Accountant)
        check_choice("--dp-sampling", self.dp_sampling, Sampling)
        if self.dp == "off":
            given = [
                flag
                for flag, value in (
                    ("--dp-noise-multiplier", self.dp_noise_multiplier),
                    ("--dp-target-epsilon", self.dp_target_epsilon),
                    ("--dp-adaptive-clipping", self.dp_adaptive_clipping or None),
                )
                if value is not None
            ]
            if given:
                raise ConfigError(f"{given[0]} needs differential privacy: add --dp central or --dp local")
            return
        if not self.dp_clip_norm > 0:
            raise ConfigError(f"--dp-clip-norm {self.dp_clip_norm}: the L2 clip norm must be > 0")
        if not 0 < self.dp_delta < 1:
            raise ConfigError(f"--dp-delta {self.dp_delta}: must be in (0, 1), e.g. 1e-5 (at most 1 / devices)")
        if self.dp_noise_multiplier is None and self.dp_target_epsilon is None:
            raise ConfigError(
                f"--dp {self.dp} needs its noise: give --dp-noise-multiplier SIGMA, or --dp-target-epsilon EPS to "
                "have it computed for the planned run"
            )
        if self.dp_noise_multiplier is not None and not self.dp_noise_multiplier > 0:
            raise ConfigError(f"--dp-noise-multiplier {self.dp_noise_multiplier}: must be > 0 (no noise, no privacy)")
        if self.dp_target_epsilon is not None and not self.dp_target_epsilon > 0:
            raise ConfigError(f"--dp-target-epsilon {self.dp_target_epsilon}: must be > 0")
        if self.dp_adaptive_clipping and self.dp == "local":
            raise ConfigError(
                "--dp-adaptive-clipping adapts the clip norm from a count of unclipped updates the server noises; "
                "with --dp local the server may see nothing un-noised: leave it out (fixed --dp-clip-norm)"
            )
        if not 0 < self.dp_target_quantile < 1:
            raise ConfigError(f"--dp-target-quantile {self.dp_target_quantile}: must be in (0, 1)")
        if not self.dp_clip_learning_rate > 0:
            raise ConfigError(f"--dp-clip-learning-rate {self.dp_clip_learning_rate}: must be > 0")
        if not self.dp_count_noise > 0:
            raise ConfigError(f"--dp-count-noise {self.dp_count_noise}: must be > 0")

    @property
    def on(self) -> bool:
        return self.dp != "off"

    @property
    def central(self) -> bool:
        return self.dp == "central"

    @property
    def local(self) -> bool:
        return self.dp == "local"

    def device_settings(self) -> dict | None:
        """What a device needs (``processors.privatize``): the mode and, with local DP, its noise multiplier;
        ``None`` without DP (the task processor's config keeps its bytes). The clip norm comes with each version."""
        if not self.on:
            return None
        out = {"dp": self.dp}
        if self.local:
            out["noise_multiplier"] = self.dp_noise_multiplier
        return out

    def to_dict(self) -> dict:
        return asdict(self)
