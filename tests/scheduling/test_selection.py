"""Client selection as a plug-in (``scheduling.selection``): the schedule asks the method's policy whom to select,
with what had been applied by then; the run repeats from its seed and continues exactly from a checkpoint; the
example policies (``examples/power_of_choice.py``, ``examples/oort_selection.py``) choose as their papers say on
hand-made candidates; a policy that reads training reports is refused by ``--dry-run``."""

from __future__ import annotations

import collections
import os
import sys

import numpy as np
import pytest

from common.choices import ConfigError
from common.delays import DELAY_PRESETS
from common.protocol import LOSS, LOSS_SQUARED, SAMPLES
from jobs.methods import FedBuff
from scheduling.event_reference import make_schedule, reference_trace
from scheduling.selection import Candidate, SelectionPolicy
from tests.conftest import REPO

sys.path.insert(0, os.path.join(REPO, "examples"))
from oort_selection import OortSelector  # noqa: E402
from power_of_choice import HighestLoss  # noqa: E402


class FastestFirst(SelectionPolicy):
    """Reads no report: the devices whose last task was quickest, never-tried ones first (ties: by the rng)."""

    def select(self, candidates, count, version, now, rng):
        order = rng.permutation(len(candidates))
        ranked = sorted(order, key=lambda i: candidates[i].last_duration or 0.0)
        return [candidates[i].device for i in ranked[:count]]


class Fastest(FedBuff):
    """A method whose policy reads no training report: ``--dry-run`` runs it."""

    name = ""
    selection = FastestFirst


class LossFromReports(HighestLoss):
    """Power of choice over every idle device, to check that only applied reports are seen."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def sample_size(self, count, idle):
        return None

    def select(self, candidates, count, version, now, rng):
        picked = super().select(candidates, count, version, now, rng)
        self.calls.append((candidates, picked))
        return picked


def fresh(policy=None, versions=25):
    leaves = {"site-1": 15, "site-2": 15}
    return make_schedule(DELAY_PRESETS["paper"], 3, leaves, 10, 2, 1, max_model_version=versions, policy=policy)


def loss_of(device: str) -> dict:
    """A made-up report: a loss that is a function of the device alone."""
    return {LOSS: np.float32(int(device.rpartition("#")[2]) % 7)}


def run_with_reports(s, steps=None):
    trace = []
    while not s.done and (steps is None or len(trace) < steps):
        device = s.next_due().device
        trace.append(s.apply(device, reports=loss_of(device))[0].trace_record())
    return trace


def test_the_uniform_default_is_todays_trace_and_a_policy_changes_it_reproducibly():
    assert reference_trace(fresh()) == reference_trace(fresh(policy=None))
    fastest = reference_trace(fresh(FastestFirst()))
    assert fastest == reference_trace(fresh(FastestFirst()))  # a function of the seed and the policy
    assert fastest != reference_trace(fresh())


def test_a_policy_sees_what_was_applied_and_a_checkpoint_continues_exactly():
    whole = fresh(LossFromReports())
    whole.start()
    full = run_with_reports(whole)
    s = fresh(LossFromReports())
    s.start()
    head = run_with_reports(s, 12)
    assert s.knowledge.reports  # the applied updates' reports, for the policy
    assert all(r == {LOSS: float(loss_of(d)[LOSS])} for d, r in s.knowledge.reports.items())
    resumed = fresh(LossFromReports())
    resumed.load_state_dict(s.state_dict())
    assert head + run_with_reports(resumed) == full
    # each pick had the highest loss applied so far among the candidates offered (unknown counts as highest)
    for candidates, picked in whole.policy.calls:
        known = {c.device: c.reports.get(LOSS, np.inf) for c in candidates}
        left = [known[d] for d in known if d not in picked]
        assert all(known[d] >= max(left, default=-1) for d in picked)
    assert any(c.reports for candidates, _ in whole.policy.calls for c in candidates)


def test_a_policy_returning_devices_it_was_not_offered_is_refused():
    class Rogue(SelectionPolicy):
        def select(self, candidates, count, version, now, rng):
            return ["elsewhere#0"]

    with pytest.raises(ValueError, match="among its candidates"):
        fresh(Rogue()).start()


def test_power_of_choice_takes_the_highest_last_losses_of_d_uniform_candidates():
    policy = HighestLoss(choices=2.0)
    assert policy.sample_size(3, 100) == 6 and policy.sample_size(3, 4) == 4
    candidates = [
        Candidate("a", {LOSS: 1.0}),
        Candidate("b", {LOSS: 5.0}),
        Candidate("c", {LOSS: 3.0}),
        Candidate("d"),  # never trained: explored first
    ]
    rng = np.random.default_rng(0)
    assert policy.select(candidates, 2, 4, 0.0, rng) == ["d", "b"]
    assert policy.select(candidates, 3, 4, 0.0, rng) == ["d", "b", "c"]
    assert HighestLoss.needs == (LOSS,)


def oort_candidates() -> list[Candidate]:
    """Three explored devices (utility from their reports) and two never explored."""
    return [
        Candidate("fast-useful", {LOSS_SQUARED: 4.0, SAMPLES: 100.0}, 1, 1.0, 5),
        Candidate("slow-useful", {LOSS_SQUARED: 4.0, SAMPLES: 100.0}, 1, 50.0, 5),
        Candidate("fast-useless", {LOSS_SQUARED: 0.01, SAMPLES: 100.0}, 1, 1.0, 5),
        Candidate("new-1"),
        Candidate("new-2"),
    ]


def test_oort_exploits_useful_fast_devices_and_penalises_slow_ones():
    oort = OortSelector(exploration_factor=0.0, exploration_min=0.0, round_threshold=50.0)
    rng = np.random.default_rng(1)
    picks = collections.Counter(oort.select(oort_candidates(), 1, 6, 10.0, rng)[0] for _ in range(300))
    assert set(picks) <= {"fast-useful", "slow-useful", "fast-useless"}  # no exploration
    # utility sqrt(4) x 100 = 200 vs sqrt(0.01) x 100 = 10; the slow one is 50x slower than the preferred duration
    assert picks["fast-useful"] > 0.8 * 300 and picks["fast-useful"] > 10 * picks["slow-useful"]
    scores = oort.scores(["fast-useful", "slow-useful", "fast-useless"], 6, 1.0)
    assert scores["slow-useful"] == pytest.approx(scores["fast-useful"] / 50**2)
    assert scores["fast-useful"] > scores["fast-useless"]


def test_oort_staleness_incentive_favours_devices_not_heard_of_for_longer():
    oort = OortSelector()
    oort.arms = {"recent": [100.0, 1.0, 9.0, 1.0], "stale": [100.0, 1.0, 2.0, 1.0], "low": [1.0, 1.0, 9.0, 1.0]}
    scores = oort.scores(["recent", "stale", "low"], 10, np.inf)
    assert scores["stale"] - scores["recent"] == pytest.approx(
        np.sqrt(0.1 * np.log(10) / 2) - np.sqrt(0.1 * np.log(10) / 9)
    )


def test_oort_explores_new_devices_by_its_exploration_share_and_its_state_round_trips():
    oort = OortSelector(exploration_factor=1.0, exploration_decay=1.0, exploration_min=1.0)
    rng = np.random.default_rng(2)
    assert set(oort.select(oort_candidates(), 2, 2, 0.0, rng)) == {"new-1", "new-2"}
    # more slots than new devices: the rest is exploited, so K devices stay in flight
    picked = oort.select(oort_candidates(), 3, 2, 0.0, rng)
    assert len(picked) == 3 and {"new-1", "new-2"} <= set(picked)
    copy = OortSelector(exploration_factor=1.0, exploration_decay=1.0, exploration_min=1.0)
    copy.load_state_dict(oort.state_dict())
    a, b = np.random.default_rng(5), np.random.default_rng(5)
    assert oort.select(oort_candidates(), 2, 3, 0.0, a) == copy.select(oort_candidates(), 2, 3, 0.0, b)


def test_dry_run_refuses_a_policy_that_reads_training_reports_and_runs_one_that_does_not():
    from jobs.api import make_config
    from jobs.run.schedule_plan import schedule_for

    with pytest.raises(ConfigError, match="--dry-run trains nothing"):
        make_config(method="power_of_choice:PowerOfChoice", dry_run=True).validate()

    cfg = make_config(method=Fastest, dry_run=True, delays="paper", max_model_version=8)
    cfg.validate()
    trace = reference_trace(schedule_for(cfg))
    assert trace == reference_trace(schedule_for(cfg)) and len({r["version"] for r in trace}) >= 7
    uniform = make_config(method="fedbuff", dry_run=True, delays="paper", max_model_version=8)
    assert trace != reference_trace(schedule_for(uniform))
