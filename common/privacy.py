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

import math
from dataclasses import asdict, dataclass, replace
from typing import Literal

from common.choices import ConfigError, check_choice

PrivacyMode = Literal["off", "central", "local"]
Accountant = Literal["rdp", "pld"]
Sampling = Literal["participation", "poisson"]
NoiseSource = Literal["secure", "seeded"]
Neighbouring = Literal["replace-one", "zero-out"]
SENSITIVITY = {"replace-one": 2.0, "zero-out": 1.0}  # a device's change to an aggregate, in clip norms

# down, with each version (``DEVICE_EXTRA_PREFIX`` + this): the L2 norm its devices clip their update to
CLIP_NORM = "dp_clip_norm"
# up, in a device's diff (central DP): 1.0 when its update was within the clip norm (not clipped), else 0.0; the
# server sums them for the fraction clipped and, with adaptive clipping, adds noise to the sum (Andrew et al.)
UNCLIPPED = "dp_unclipped"
MECHANISM = "gaussian"


class BudgetSpent(RuntimeError):
    """The next version would spend more than ``--dp-target-epsilon``: it is not made, and the run stops
    (``aggregation.server_privacy.ServerPrivacy.check_budget``; the applier ends the run with this reason)."""


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
    dp_noise: where the noise comes from: ``secure``, the OS's entropy through a cryptographically secure
        generator, never recorded (runs differ, a resumed run goes on with fresh entropy); ``seeded``, from the
        run's configuration and seed, so a run repeats bit for bit: simulation only, it protects nothing from
        anyone who knows the command (``common.dp_noise``; refused with real devices and --env poc/prod).
    dp_neighbouring: the neighbouring relation of the guarantee: ``replace-one``, one device's data replaced by
        any other (its clipped update moves by up to 2 C: the aggregate's size is fixed, a device's slot never
        empties); ``zero-out``, one device's update replaced by zeros (sensitivity C; Kairouz et al. 2021).
    dp_sampling: how the accountant counts a device's participation: ``participation``, no amplification, as
        many Gaussian compositions as the versions the busiest device went into (exact: counted from the
        schedule that ran, planned by the dry-run planner); ``poisson``, amplification by sampling, refused: no
        selection here samples devices independently from secret randomness.
    dp_adaptive_clipping: adapt the clip norm towards the ``--dp-target-quantile`` of the updates' norms from a
        noised count of unclipped updates (Andrew et al. 2021, central DP only).
    dp_target_quantile: the fraction of updates adaptive clipping leaves unclipped.
    dp_clip_learning_rate: the step of adaptive clipping's geometric update, ``C <- C exp(-lr (unclipped -
        quantile))``.
    dp_count_noise: the standard deviation of the noise on the count of unclipped updates, as a fraction of the
        updates in an aggregate (Andrew et al.'s m / 20: 0.05); adaptive clipping needs it above noise multiplier
        / (2 B).
    dp_noise_key: derived, no flag: the digest of the run's configuration that seeded noise is drawn from
        (``jobs.privacy.noise_key``; None with secure noise).
    dp_planned_compositions: derived, no flag: with a target epsilon, the busiest device's participations in the
        planned run (the dry-run planner's trace) that the noise was computed for.
    """

    dp: PrivacyMode = "off"
    dp_clip_norm: float = 1.0
    dp_noise_multiplier: float | None = None
    dp_target_epsilon: float | None = None
    dp_delta: float = 1e-5
    dp_accountant: Accountant = "rdp"
    dp_noise: NoiseSource = "secure"
    dp_neighbouring: Neighbouring = "replace-one"
    dp_sampling: Sampling = "participation"
    dp_adaptive_clipping: bool = False
    dp_target_quantile: float = 0.5
    dp_clip_learning_rate: float = 0.2
    dp_count_noise: float = 0.05
    dp_noise_key: str | None = None
    dp_planned_compositions: int | None = None

    def __post_init__(self) -> None:
        check_choice("--dp", self.dp, PrivacyMode)
        check_choice("--dp-accountant", self.dp_accountant, Accountant)
        check_choice("--dp-sampling", self.dp_sampling, Sampling)
        check_choice("--dp-noise", self.dp_noise, NoiseSource)
        check_choice("--dp-neighbouring", self.dp_neighbouring, Neighbouring)
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
        if self.dp_sampling == "poisson":
            raise ConfigError(
                "--dp-sampling poisson claims amplification by sampling, but no selection here samples devices "
                "independently from secret randomness (it follows the run's public seed and schedule, and FedBuff "
                "picks among idle devices, so fast devices join more versions): leave it out (participation, the "
                "busiest device's versions, unamplified)"
            )
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

    @property
    def sensitivity(self) -> float:
        """One device's largest change to an aggregate, in clip norms (``SENSITIVITY``, by the relation)."""
        return SENSITIVITY[self.dp_neighbouring]

    def accounted_multiplier(self, noise_multiplier: float | None = None) -> float:
        """The accountant's noise multiplier: the noise's standard deviation over the sensitivity, i.e. sigma
        (over C) divided by ``sensitivity`` (``noise_multiplier``: sigma, default this run's)."""
        z = self.dp_noise_multiplier if noise_multiplier is None else noise_multiplier
        return z / self.sensitivity

    def planned(self, busiest: dict[str, int]) -> tuple[PrivacyConfig, float]:
        """This part for a planned run, and the epsilon it spends: ``busiest``, the busiest device's participations
        by mode (``central``: the versions it goes into; ``local``: the updates it sends) gives the compositions;
        the noise multiplier is computed for ``dp_target_epsilon`` over them where not given (sigma over C, rounded
        up to 1e-6: never below the calibrated). Needs ``dp-accounting`` (``common.privacy_accounting``)."""
        from common.privacy_accounting import epsilon, noise_for_epsilon

        compositions = busiest[self.dp]
        z = self.dp_noise_multiplier
        if z is None:
            found = noise_for_epsilon(self.dp_accountant, 1.0, compositions, self.dp_delta, self.dp_target_epsilon)
            z = math.ceil(found * self.sensitivity * 1e6) / 1e6
        planned = replace(self, dp_planned_compositions=compositions, dp_noise_multiplier=z)
        return planned, epsilon(self.dp_accountant, planned.accounted_multiplier(), 1.0, compositions, self.dp_delta)

    def device_settings(self) -> dict | None:
        """What a device needs (``processors.privatize``): the mode and, with local DP, its noise multiplier and
        source (seeded: with its key); ``None`` without DP (the task processor's config keeps its bytes). The clip
        norm comes with each version."""
        if not self.on:
            return None
        out = {"dp": self.dp}
        if self.local:
            out |= {"noise_multiplier": self.dp_noise_multiplier, "noise": self.dp_noise}
            if self.dp_noise == "seeded":
                out["noise_key"] = self.dp_noise_key
        return out

    def to_dict(self) -> dict:
        return asdict(self)
