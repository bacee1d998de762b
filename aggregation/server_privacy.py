"""The server's part of differential privacy: noise on every aggregate, the clip norm of every version, the counts
the accountant needs, and the budget (``docs/privacy.md``).

``aggregation.global_model.GlobalModel`` drives it, for every method: the clip norm of each version travels with
its weights (``common.privacy.CLIP_NORM``); each applied update passes ``take`` (its unclipped bit is split off,
and an update longer than its version's clip norm, from a device that did not clip, is clipped here too) and
``member``; before the strategy makes a version, ``check_budget`` refuses a version that would spend more than
``--dp-target-epsilon`` and ``noise`` is handed to the strategy's ``add_noise`` (central DP); after it, ``close``
counts the composition and, with adaptive clipping, moves the clip norm.

Central DP (``--dp central``): the aggregate of a version is the sum of its B clipped updates (a synchronous run:
its round's); a stale update was clipped to its own version's norm, so the aggregate's bound is the largest clip
norm among them, and the noise's standard deviation is the update noise multiplier times that bound, from
``common.dp_noise`` (secure, or seeded by the run's noise key and the version). Each device contributes to a
version at most once (``scheduling.schedule``). The accountant composes, without amplification, as many Gaussians
as the versions the busiest device went into, of multiplier sigma over the relation's sensitivity (2 C for
replace-one, C for zero-out).

Adaptive clipping (Andrew et al. 2021): the count of unclipped updates of an aggregate gets Gaussian noise of
standard deviation ``--dp-count-noise`` x B (same source), and the next version's clip norm is ``C exp(-lr
(noised fraction unclipped - target quantile))``; the updates' noise multiplier is raised so that the pair costs
one Gaussian of the accounted multiplier (``common.privacy_accounting.update_noise_multiplier``). Only the noised
fraction is published; the exact count never leaves this object.

Local DP (``--dp local``): devices noise their own updates; the server adds nothing, and counts the updates each
device sent: the compositions are the most any one device sent.
"""

from __future__ import annotations

import math

import numpy as np

from aggregation.strategy import Weights
from common.dp_noise import GaussianNoise
from common.privacy import MECHANISM, UNCLIPPED, BudgetSpent, PrivacyConfig
from common.privacy_accounting import Epsilons, update_noise_multiplier

OVER_CLIP = 1 + 1e-5  # an update longer than its clip norm by more than float32 rounding was not clipped


class ServerPrivacy:
    """Args:
    settings: ``common.privacy.PrivacyConfig.to_dict()``, its noise multiplier resolved.
    seed: the run's seed (not a source of noise: ``common.dp_noise``).
    pool_size: devices in the pool.
    updates_per_version: B, the updates in an aggregate (a synchronous run: its selection).
    """

    def __init__(self, settings: dict, seed: int, pool_size: int, updates_per_version: int):
        self.cfg = PrivacyConfig(**settings)
        if self.cfg.dp_noise_multiplier is None:
            raise ValueError("differential privacy needs its noise multiplier resolved (jobs.config's validate)")
        self.seed = seed
        self.pool_size = pool_size
        self.updates_per_version = updates_per_version
        self.source = GaussianNoise(self.cfg.dp_noise, self.cfg.dp_noise_key)
        self.epsilons = Epsilons(self.cfg.dp_accountant, self.cfg.accounted_multiplier(), 1.0, self.cfg.dp_delta)
        adaptive = self.cfg.dp_adaptive_clipping
        self.count_stddev = self.cfg.dp_count_noise * updates_per_version if adaptive else 0.0
        z = self.cfg.dp_noise_multiplier
        self.update_multiplier = update_noise_multiplier(z, self.count_stddev) if adaptive else z
        self.clip_norms: dict[int, float] = {}  # version -> the clip norm its devices clip to
        self.counts: dict[str, int] = {}  # device -> versions it went into (central) or updates it sent (local)
        self.server_clipped = 0  # updates the server had to clip (a device that did not)
        self._open = self._fresh()
        self._last: dict = {}  # the figures of the aggregate that made the current version
        self._noise_shapes: list[tuple[int, ...]] | None = None  # the parameters' shapes, once noised

    @staticmethod
    def _fresh() -> dict:
        return {"members": [], "bound": 0.0, "unclipped": 0.0, "updates": 0}

    def start(self, version: int) -> None:
        """The initial model: its devices clip to the initial clip norm."""
        self.clip_norms.setdefault(version, self.cfg.dp_clip_norm)

    def clip_norm(self, version: int) -> float:
        return self.clip_norms[version]

    def member(self, device: str) -> None:
        """A device's counted update was applied (each device of a leaf's sum too)."""
        if self.cfg.local:
            self.counts[device] = self.counts.get(device, 0) + 1
        else:
            self._open["members"].append(device)

    def take(self, diff: Weights, reports: dict, count: int, base_version: int, statistics: frozenset) -> Weights:
        """An update as the strategy gets it: its unclipped bits (``reports``, summed over a leaf's sum) counted
        and, for one device's update longer than its version's clip norm, clipped (its statistics zeroed)."""
        if self.cfg.local:
            return diff
        bound = self.clip_norms[base_version]
        agg = self._open
        agg["bound"] = max(agg["bound"], bound)
        agg["unclipped"] += float(np.sum(reports.get(UNCLIPPED, 0.0)))
        agg["updates"] += count
        if count != 1:
            return diff
        params = [k for k in diff if k not in statistics]
        norm = math.sqrt(sum(float(np.dot(diff[k].ravel(), diff[k].ravel())) for k in params))
        stray = any(np.any(diff[k]) for k in diff if k in statistics)
        if norm <= bound * OVER_CLIP and not stray:
            return diff
        self.server_clipped += 1
        scale = np.float32(min(1.0, bound / norm)) if norm > 0 else np.float32(1)
        return {k: np.zeros_like(v) if k in statistics else v * scale for k, v in diff.items()}

    def busiest_after(self) -> int:
        """The busiest device's compositions once the open aggregate is made into a version."""
        if self.cfg.local:
            return max(self.counts.values(), default=0)
        members = set(self._open["members"])
        busiest = max((self.counts.get(d, 0) + 1 for d in members), default=0)
        return max(busiest, max(self.counts.values(), default=0))

    def check_budget(self, version: int) -> None:
        """``BudgetSpent`` when making ``version`` from the open aggregate would spend more than
        ``--dp-target-epsilon`` (nothing is released: the run stops with the versions made so far)."""
        target = self.cfg.dp_target_epsilon
        if target is None:
            return
        spent = self.epsilons(self.busiest_after())
        if spent > target * (1 + 1e-9):
            raise BudgetSpent(
                f"version {version} would spend epsilon {spent:.4g} at delta {self.cfg.dp_delta:g}, above "
                f"--dp-target-epsilon {target:g} (its busiest device's {self.busiest_after()}th version): not made; "
                "the run stops with the versions made so far"
            )

    def noise(self, version: int, like: Weights, statistics: frozenset) -> Weights:
        """The Gaussian noise of the aggregate that makes ``version``: one float32 array per parameter of
        ``like`` (not its statistics), standard deviation update noise multiplier x the aggregate's bound."""
        names = [k for k in like if k not in statistics]
        stddev = self.update_multiplier * self._open["bound"]
        self._noise_shapes = [np.shape(like[k]) for k in names]
        drawn = self.source.arrays(self._noise_shapes, stddev, "server", version)
        return dict(zip(names, drawn, strict=True))

    def close(self, version: int) -> None:
        """``version`` was made from the open aggregate: count it, and set its clip norm (adaptive: moved)."""
        agg, self._open = self._open, self._fresh()
        previous = self.clip_norms[max(self.clip_norms)]
        if self.cfg.local:
            self.clip_norms[version] = previous
            self._last = {}
            return
        for device in set(agg["members"]):
            self.counts[device] = self.counts.get(device, 0) + 1
        updates = max(agg["updates"], 1)
        self._last = {}
        if self.cfg.dp_adaptive_clipping:
            noised = (agg["unclipped"] + self.source.scalar(self.count_stddev, "count", version)) / updates
            step = -self.cfg.dp_clip_learning_rate * (noised - self.cfg.dp_target_quantile)
            self.clip_norms[version] = previous * math.exp(step)
            self._last["noised_unclipped_fraction"] = round(noised, 6)
        else:
            self.clip_norms[version] = previous
        if self._noise_shapes is not None:  # the next version's noise, drawn while its devices train
            self.source.draw_ahead(self._noise_shapes, "server", version + 1)

    @property
    def compositions(self) -> int:
        """What the accountant composes: the most versions one device went into (central) or updates it sent
        (local), unamplified."""
        return max(self.counts.values(), default=0)

    def inputs(self, version: int) -> dict:
        """The accountant's inputs after ``version`` (``epsilon`` is the evaluator's, from these), and what the
        run shows beside them: the relation and its sensitivity, the noise's source, the busiest device's count,
        the clip norm ``version``'s devices clip to and, with adaptive clipping, the noised fraction unclipped.
        Nothing un-noised: the exact count of clipped updates and of updates the server clipped stay here."""
        c = self.cfg
        out = {
            "dp": c.dp,
            "mechanism": MECHANISM,
            "accountant": c.dp_accountant,
            # the noise's standard deviation over the sensitivity of one device's update (the relation's)
            "noise_multiplier": c.accounted_multiplier(),
            "sampling_probability": 1.0,
            "compositions": self.compositions,
            "busiest_device_participations": self.compositions,
            "delta": c.dp_delta,
            "neighbouring": c.dp_neighbouring,
            "sensitivity_clip_norms": c.sensitivity,
            "noise": c.dp_noise,
            "clip_norm": round(self.clip_norms[version], 9),
        }
        if c.central:
            out |= self._last
            if c.dp_adaptive_clipping:
                out["update_noise_multiplier"] = round(self.update_multiplier, 9)
                out["count_noise_stddev"] = self.count_stddev
        return out

    def state_dict(self) -> dict:
        return {
            "clip_norms": dict(self.clip_norms),
            "counts": dict(self.counts),
            "server_clipped": self.server_clipped,
            "open": {k: list(v) if k == "members" else v for k, v in self._open.items()},
            "last": dict(self._last),
        }

    def load_state_dict(self, state: dict) -> None:
        self.clip_norms = {int(v): c for v, c in state["clip_norms"].items()}
        self.counts = dict(state["counts"])
        self.server_clipped = state["server_clipped"]
        self._open = dict(state["open"], members=list(state["open"]["members"]))
        self._last = dict(state["last"])
