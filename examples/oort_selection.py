"""Oort (Lai et al., OSDI 2021, "Oort: Efficient Federated Learning via Guided Participant Selection") as a
method of one's own, in one file: FedBuff whose devices are selected by Oort's training selector, as FedScale's
``oort`` module (``thirdparty/oort/oort.py``, ``_training_selector``) defines it, on exact asynchronous time.

What each part is, in FedScale's terms (read from their code, written anew here):

* **Statistical utility** (the arm's reward): ``samples x sqrt(loss_squared)`` from the device's last applied
  update, where ``loss_squared`` is the mean squared per-sample loss of its last batch and ``samples`` what it
  trained on (FedScale's client reports ``sqrt(loss_squared) x trained_size``). Devices report both
  (``needs``); the arm's time stamp is the model version its update was applied at.
* **Exploitation score** of an explored device: its reward clipped at the ``clip_bound`` quantile and normalised
  to the explored devices' range, plus the staleness incentive ``sqrt(0.1 ln(version) / time_stamp)`` (a device
  not heard of for longer scores higher).
* **Duration penalty**: the preferred duration is the ``round_threshold`` percentile of the known durations
  (selection to applied update, simulated seconds); a slower device's score is multiplied by
  ``(preferred / duration) ** round_penalty``. The **pacer** widens the threshold by ``pacer_delta`` when the
  exploited utility of the last ``pacer_step`` rounds stays within 10% of the ``pacer_step`` before (and narrows
  it when it changes more than 5x).
* **Exploration vs exploitation**: a share ``exploration`` of the slots (decaying by ``exploration_decay`` per
  round down to ``exploration_min``) goes to never-explored devices, drawn among the ``sample_window`` x best by
  their initial reward; the rest is drawn among the top exploited devices (every one scoring above
  ``cut_off_util`` x the cut-off score, and at least 10x as many as needed) with probability proportional to
  their score. ``blacklist_rounds`` (-1: off) excludes devices selected more often than that.

Where asynchronous time differs from FedScale's rounds, and how it is bridged:

* a **round** is a model version: the exploration decay and the pacer step once per new version;
* a selection often fills **one slot** (FedBuff refills each freed slot): FedScale's ``int(m x exploration)``
  would then never explore, so the exploration share is rounded stochastically (its expectation is
  ``m x exploration``), from the schedule's seeded generator;
* slots the exploration share cannot fill (no unexplored device left) go to exploitation, so K devices stay in
  flight (FedScale leaves them empty);
* a never-explored device's initial reward is 1 (the devices' shards are equal) and it has no duration yet, so no
  penalty: FedScale registers each client's data size and an estimated duration.

    PYTHONPATH=examples python jobs/pt_job_fedrevive.py --method oort_selection:Oort ...
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from common.protocol import LOSS_SQUARED, SAMPLES
from jobs.methods import FedBuff
from scheduling.selection import Candidate, SelectionPolicy


@dataclass(frozen=True)
class OortSettings:
    """Oort's training selector (defaults: FedScale's).

    Attributes:
        exploration_factor: the initial share of slots for never-explored devices, in [0, 1].
        exploration_decay: the exploration share's factor per round (model version).
        exploration_min: the exploration share's floor.
        round_threshold: the percentile of known durations that is the preferred duration (100: no penalty).
        round_penalty: the exponent of the duration penalty.
        clip_bound: the quantile at which rewards are clipped.
        cut_off_util: exploitation draws among devices scoring at least this share of the cut-off score.
        sample_window: exploration draws among this many times the slots' best unexplored devices.
        pacer_step: rounds per pacer window.
        pacer_delta: how far the pacer moves the round threshold.
        blacklist_rounds: devices selected more often than this are no longer selected (-1: never excluded).
        blacklist_max_len: at most this share of the explored devices is excluded.
    """

    exploration_factor: float = 0.9
    exploration_decay: float = 0.98
    exploration_min: float = 0.3
    round_threshold: float = 30.0
    round_penalty: float = 2.0
    clip_bound: float = 0.9
    cut_off_util: float = 0.05
    sample_window: float = 5.0
    pacer_step: int = 20
    pacer_delta: float = 5.0
    blacklist_rounds: int = -1
    blacklist_max_len: float = 0.3

    def __post_init__(self) -> None:
        for name in ("exploration_factor", "exploration_decay", "exploration_min", "clip_bound", "cut_off_util"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"--oort-{name.replace('_', '-')} {getattr(self, name)}: must be in [0, 1]")
        if not 0 < self.round_threshold <= 100:
            raise ValueError(f"--oort-round-threshold {self.round_threshold}: must be in (0, 100]")
        if self.pacer_step < 1 or self.sample_window < 1:
            raise ValueError("--oort-pacer-step and --oort-sample-window must be >= 1")


def _norm(values: list[float], clip_bound: float, thres: float) -> tuple[float, float, float]:
    """(min, range, clip value) of ``values``, as FedScale normalises rewards."""
    v = sorted(values)
    clip = v[min(int(len(v) * clip_bound), len(v) - 1)]
    low = v[0] * 0.999
    return low, max(v[-1] - low, thres), clip


class OortSelector(SelectionPolicy):
    """Oort's training selector over the idle online devices (see the module docstring)."""

    needs = (LOSS_SQUARED, SAMPLES)

    def __init__(self, **settings):
        self.s = OortSettings(**settings)
        self.exploration = self.s.exploration_factor
        self.round_threshold = self.s.round_threshold
        self.round = 0  # the last model version paced
        self.arms: dict[str, list[float]] = {}  # device -> [reward, duration, time stamp, times selected]
        self.exploit_util: list[float] = []  # per round: the mean reward of the devices exploited in it
        self.picked_explore: list[str] = []
        self.picked_exploit: list[str] = []

    # -- feedback: what was applied, as the candidates carry it ----------------------------------------------------
    def _feedback(self, c: Candidate) -> None:
        if c.last_version is None or LOSS_SQUARED not in c.reports:
            return
        reward = c.reports.get(SAMPLES, 1.0) * math.sqrt(max(c.reports[LOSS_SQUARED], 0.0))
        self.arms[c.device] = [reward, c.last_duration or 0.0, float(c.last_version), float(c.times_selected)]

    def _pace(self, version: int) -> None:
        """Once per round: decay exploration, and move the preferred-duration threshold by the exploited utility."""
        self.round = version
        self.exploration = max(self.exploration * self.s.exploration_decay, self.s.exploration_min)
        done = [self.arms[d][0] for d in self.picked_exploit if d in self.arms]
        self.exploit_util.append(sum(done) / (len(done) + 1e-4))
        self.picked_explore, self.picked_exploit = [], []
        step = self.s.pacer_step
        if len(self.exploit_util) >= 2 * step and len(self.exploit_util) % step == 0:
            before, last = sum(self.exploit_util[-2 * step : -step]), sum(self.exploit_util[-step:])
            if abs(last - before) <= before * 0.1:  # utility went flat: accept slower devices
                self.round_threshold = min(100.0, self.round_threshold + self.s.pacer_delta)
            elif abs(last - before) >= before * 5:
                self.round_threshold = max(self.s.pacer_delta, self.round_threshold - self.s.pacer_delta)

    # -- selection ------------------------------------------------------------------------------------------------
    def select(
        self, candidates: list[Candidate], count: int, version: int, now: float, rng: np.random.Generator
    ) -> list[str]:
        for c in candidates:
            self._feedback(c)
        if version > self.round:
            self._pace(version)
        blacklist = self._blacklist()
        explored = [c.device for c in candidates if c.device in self.arms and c.device not in blacklist]
        unexplored = [c.device for c in candidates if c.device not in self.arms]

        preferred = math.inf
        if self.round_threshold < 100 and self.arms:
            durations = sorted(a[1] for a in self.arms.values())
            preferred = durations[min(int(len(durations) * self.round_threshold / 100), len(durations) - 1)]

        scores = self.scores(explored, version, preferred)

        share = count * self.exploration  # stochastic rounding: one-slot selections explore too (docstring)
        explore_len = min(int(share) + int(rng.random() < share - int(share)), len(unexplored))
        exploit = self._draw_exploit(scores, min(count - explore_len, len(explored)), rng)
        explore_len = min(len(unexplored), count - len(exploit))
        explore = self._draw_explore(unexplored, explore_len, rng)
        if len(exploit) + len(explore) < count:  # nothing left to explore: keep K in flight (docstring)
            rest = {d: v for d, v in scores.items() if d not in exploit}
            exploit += self._draw_exploit(rest, min(count - len(exploit) - len(explore), len(rest)), rng)
        self.picked_explore += explore
        self.picked_exploit += exploit
        return explore + exploit

    def scores(self, explored: list[str], version: int, preferred: float) -> dict[str, float]:
        """Each explored device's exploitation score at ``version`` (``preferred``: the preferred duration)."""
        if not explored:
            return {}
        low, span, clip = _norm([self.arms[d][0] for d in explored], self.s.clip_bound, 1e-4)
        out = {}
        for d in explored:
            reward, duration, stamp, _ = self.arms[d]
            score = (min(reward, clip) - low) / span + math.sqrt(0.1 * math.log(max(version, 1)) / max(stamp, 1))
            if duration > preferred:  # slower than preferred: penalised
                score *= (preferred / max(1e-4, duration)) ** self.s.round_penalty
            out[d] = abs(score)
        return out

    def _draw_exploit(self, scores: dict[str, float], n: int, rng: np.random.Generator) -> list[str]:
        """``n`` devices among the top scorers, with probability proportional to their score."""
        if n <= 0:
            return []
        ranked = sorted(scores, key=lambda d: (-scores[d], d))
        cut_off = scores[ranked[min(n, len(ranked) - 1)]] * self.s.cut_off_util
        pool: list[str] = []
        for d in ranked:
            if scores[d] < cut_off and len(pool) > 10 * n:
                break
            pool.append(d)
        weights = np.asarray([scores[d] for d in pool], dtype=np.float64) + 1e-12  # a zero score may still be drawn
        p = weights / weights.sum()
        return [pool[int(i)] for i in rng.choice(len(pool), size=n, replace=False, p=p)]

    def _draw_explore(self, unexplored: list[str], n: int, rng: np.random.Generator) -> list[str]:
        """``n`` never-explored devices, drawn among the ``sample_window`` x ``n`` best by initial reward (all
        equal here: a seeded shuffle decides the window)."""
        if n <= 0:
            return []
        window = [unexplored[int(i)] for i in rng.permutation(len(unexplored))][: int(self.s.sample_window * n)]
        return [window[int(i)] for i in rng.choice(len(window), size=n, replace=False)]

    def _blacklist(self) -> set[str]:
        if self.s.blacklist_rounds < 0:
            return set()
        over = sorted(
            (d for d, a in self.arms.items() if a[3] > self.s.blacklist_rounds), key=lambda d: (-self.arms[d][3], d)
        )
        return set(over[: int(self.s.blacklist_max_len * len(self.arms))])

    # -- checkpoints ----------------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        keys = ("exploration", "round_threshold", "round", "arms", "exploit_util", "picked_explore", "picked_exploit")
        return {k: getattr(self, k) for k in keys}

    def load_state_dict(self, state: dict) -> None:
        for k, v in state.items():
            setattr(self, k, v)


class Oort(FedBuff):
    """FedBuff whose devices are selected by Oort's training selector."""

    name = ""  # a user's method is named by its import path
    selection = OortSelector
    settings = OortSettings
    flag_prefix = "oort"

    def selection_args(self, cfg) -> dict:
        return asdict(cfg.method_settings)
