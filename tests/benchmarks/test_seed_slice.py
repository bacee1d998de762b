"""The paper-seed instrument's arithmetic (``benchmarks.repro.seed_slice``): the whole seed's counts from its trace, the
slice's steady window, its phases and the extrapolated seed, on a slice written by hand."""

from __future__ import annotations

import pytest

from benchmarks.repro.seed_slice import Slice, estimate, phases, seed_counts, seed_phase_seconds, window


def test_the_seeds_counts_follow_the_methods_evaluation_and_fedrevives_rules():
    # updates going into versions 2..13, one each; the odd versions' updates are stale; one arrives past the budget
    events = [{"version": v, "tau": v % 2, "arrival": float(v)} for v in range(2, 14)]
    events.append({"version": 14, "tau": 1, "arrival": 99.0})
    assert seed_counts(events, 50.0, True, None) == {"updates": 12, "versions": 13, "evaluations": 13}
    revive = {"synth_every_versions": 2, "distill_from_version": 4, "kd_train_from_version": 8}
    counts = seed_counts(events, 50.0, False, revive)
    assert counts["evaluations"] == 2  # versions 1 and 10 (every 10, as the asynchronous runs are evaluated)
    # stale updates arrive at versions 3, 5, ..., 13: the model they meet is one version older (2, 4, ..., 12)
    assert counts["synthesis rounds"] == 5  # at 4, 6, 8, 10, 12 (even, from 4)
    assert counts["distillations"] == 3  # at 8, 10, 12


def _slice() -> Slice:
    """Versions 1..5, one update each from version 2 on, each evaluated; the server's figures grow by known
    amounts; one FedRevive line per update; leaves report two devices of one group at 10.5 and one alone at 12.5."""
    t0 = 1000.0
    records = []
    for v in range(1, 6):
        made = t0 + 5 + 2 * (v - 1)  # version 1 at 1005, then one every 2 s
        server = {
            "updates": v - 1,
            "update_seconds": 1.0 * (v - 1),
            "versions": v - 1,
            "version_seconds": 0.1 * (v - 1),
        }
        records.append(
            {
                "version": v,
                "accuracy": 0.1,
                "eval_seconds": 0.5,
                "epoch": made + 0.5,
                "server": server | {"made_epoch": made},
                "system": {"gpu_util_percent": 40.0 + v},
            }
        )
    events = [{"version": v, "tau": 1, "arrival": float(v)} for v in range(2, 6)]
    reports = [
        {"wall": t0 + 9.5, "group": 2, "train_seconds": 1.2, "ok": True},
        {"wall": t0 + 9.5, "group": 2, "train_seconds": 1.2, "ok": True},
        {"wall": t0 + 11.5, "group": 1, "train_seconds": 0.7, "ok": True},
        {"wall": t0 + 1.0, "group": 1, "train_seconds": 9.0, "ok": True},  # before the window
    ]
    revive = [{"version": v, "synth_seconds": 0.3, "distill_seconds": 0.4} for v in range(2, 6)]
    return Slice("fedrevive", {"versions": records}, events, reports, revive, started=t0, ended=t0 + 16.0)


def test_the_window_phases_and_estimate_of_a_slice_written_by_hand():
    s = _slice()
    w = window(s, steady_from=3)
    assert (w.first, w.last, w.seconds, w.updates, w.steady) == (3, 5, 4.0, 2, True)
    assert w.per_update == 2.0
    p = phases(s, w, samples_per_task=800)
    assert p.seconds["device training"] == pytest.approx(1.2 + 0.7)  # a group's call once, not per device
    assert p.counts["device training"] == 3 and p.samples == 2400
    assert p.seconds["synthesis"] == pytest.approx(0.6) and p.seconds["distillation"] == pytest.approx(0.8)
    assert p.seconds["server intake"] == pytest.approx(2.0 - 0.6 - 0.8)  # add_update less FedRevive's own work
    assert p.seconds["aggregation"] == pytest.approx(0.2)
    assert p.seconds["server waiting"] == pytest.approx(4.0 - 2.0 - 0.2)
    assert p.seconds["evaluation"] == pytest.approx(1.0) and p.counts["evaluation"] == 2
    assert p.gpu_busy == pytest.approx(44.5)
    counts = {"updates": 102, "versions": 103, "evaluations": 11, "synthesis rounds": 50, "distillations": 40}
    whole = seed_phase_seconds(p, counts)
    assert whole["distillation"] == pytest.approx(0.4 * 40) and whole["aggregation"] == pytest.approx(0.1 * 103)
    e = estimate(s, w, p, counts)
    assert e.start == pytest.approx(9.0)  # the job's start to version 3
    assert e.steady == pytest.approx((102 - 2) * 2.0)  # the updates after version 3 at 2 s each
    assert e.evaluating == pytest.approx((11 - 3) * 0.5)
    assert e.tail == pytest.approx(16.0 - 13.5 + 0.5)  # the last record to the exit, and its evaluation
    assert e.seconds == pytest.approx(9.0 + 200.0 + 3.0)


def test_a_slice_without_a_steady_stretch_falls_back_to_its_last_two_versions_and_says_so():
    s = _slice()
    w = window(s, steady_from=5)
    assert (w.first, w.last, w.steady) == (4, 5, False)
    s.metrics["versions"] = s.metrics["versions"][:1]
    assert window(s, steady_from=1) is None
