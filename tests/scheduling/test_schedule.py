"""Exact simulated time: the schedule's semantics on hand-computed examples, and the reference trace's invariants."""

from __future__ import annotations

import collections
from dataclasses import dataclass

import pytest

from common.availability import Availability
from common.delays import DELAY_PRESETS, DelayConfig
from scheduling.device_pool import DevicePool
from scheduling.event_reference import make_schedule, reference_trace
from scheduling.schedule import ExactSchedule


@dataclass(frozen=True)
class Total:
    total: float


class FixedDelays:
    """Durations from a table: (device, task number) -> total seconds."""

    def __init__(self, table: dict[tuple[str, int], float]):
        self.table = table
        self.availability = Availability("always", seed=0)
        self.config = DelayConfig()

    def durations(self, device: str, n: int) -> Total:
        return Total(self.table[(device, n)])


def schedule(devices, table, k, b, hole, **kw) -> ExactSchedule:
    pool = DevicePool(seed=0)
    for d in devices:
        pool.register(d, "leaf")
    return ExactSchedule(pool, FixedDelays(table), k, b, hole, **kw)


def run(s: ExactSchedule) -> list[tuple]:
    s.start()
    out = []
    while not s.done:
        a, _ = s.apply(s.next_due().device)
        out.append((a.device, a.base_version, a.arrival, a.tau, a.version, a.made_version))
    return out


def test_one_update_per_version_in_arrival_order_with_replacements_at_the_arrival_time():
    # 3 devices, all in flight (K = 3), B = 1: every arrival makes a version and its device is reselected at once
    table = {("a", 0): 5, ("b", 0): 3, ("c", 0): 9, ("b", 1): 1, ("b", 2): 10, ("a", 1): 2, ("a", 2): 20}
    s = schedule("abc", table, k=3, b=1, hole=1, max_model_version=6)
    assert run(s) == [
        ("b", 1, 3, 0, 2, True),  # b reselected at t=3 to train version 2, arrives at 4
        ("b", 2, 4, 0, 3, True),  # reselected at t=4 (version 3), arrives at 14
        ("a", 1, 5, 2, 4, True),  # a trained version 1; versions 2 and 3 were made meanwhile: tau 2
        ("a", 4, 7, 0, 5, True),  # reselected at t=5, 2 s
        ("c", 1, 9, 4, 6, True),  # the last version: nothing more is applied or selected
    ]
    assert s.version == 6 and s.done


def test_a_synchronous_round_with_a_failed_device_averages_the_others_when_its_last_device_lands():
    table = {(d, n): t for d, ts in {"a": (5, 1, 1), "b": (3, 2, 1), "c": (9, 3, 1)}.items() for n, t in enumerate(ts)}
    s = schedule("abc", table, k=3, b=3, hole=3, max_model_version=3)
    s.start()
    assert s.apply("b", counted=False)[0].made_version is False
    assert s.apply("a")[0].made_version is False
    arrival, selected = s.apply("c")
    assert arrival.made_version and s.version == 2 and arrival.arrival == 9
    assert sorted(d.device for d in selected) == ["a", "b", "c"] and {d.base_version for d in selected} == {2}
    for device in "abc":  # a round in which every device fails makes no version and selects again
        arrival, selected = s.apply(device, counted=False)
    assert s.version == 2 and not arrival.made_version and len(selected) == 3


def test_a_version_is_made_from_exactly_b_updates_at_the_bth_arrival():
    table = {
        (d, n): t for d, times in {"a": [1, 4, 9], "b": [2, 2, 9], "c": [6, 9, 9]}.items() for n, t in enumerate(times)
    }
    s = schedule("abc", table, k=3, b=2, hole=1, max_model_version=3)
    assert run(s) == [
        ("a", 1, 1, 0, 2, False),  # first of a pair: version 2 will hold it; a reselected to train version 1
        ("b", 1, 2, 0, 2, True),  # the second: version 2 made at t=2; b reselected to train version 2
        ("b", 2, 4, 0, 3, False),  # b's second task (from t=2, 2 s)
        ("a", 1, 5, 1, 3, True),  # a's second task (from t=1, 4 s) trained version 1, version 2 exists: tau 1
    ]


def test_synchronous_rounds_wait_for_the_slowest_device_and_reselect_everyone_at_its_arrival():
    table = {("a", 0): 4, ("b", 0): 7, ("c", 0): 2, ("a", 1): 1, ("b", 1): 1, ("c", 1): 5}
    s = schedule("abc", table, k=3, b=3, hole=3, max_model_version=3)
    events = run(s)
    assert [e[:3] for e in events] == [("c", 1, 2), ("a", 1, 4), ("b", 1, 7), ("a", 2, 8), ("b", 2, 8), ("c", 2, 12)]
    assert [e[4:] for e in events] == [(2, False), (2, False), (2, True), (3, False), (3, False), (3, True)]
    assert all(e[3] == 0 for e in events)  # synchronous: never stale


def test_ties_are_broken_by_device_id():
    table = {(d, n): 1.0 for d in "cab" for n in range(3)}
    s = schedule("cab", table, k=3, b=1, hole=3, max_model_version=4)
    assert [e[0] for e in run(s)][:3] == ["a", "b", "c"]


def test_a_failed_device_frees_its_slot_but_does_not_count_towards_b():
    table = {("a", 0): 1, ("b", 0): 2, ("a", 1): 5, ("b", 1): 5}
    s = schedule("ab", table, k=2, b=1, hole=1, max_model_version=5)
    s.start()
    failed, selected = s.apply("a", counted=False)
    assert (failed.made_version, failed.version, s.version) == (False, 2, 1)
    assert [d.device for d in selected] == ["a"] and selected[0].base_version == 1
    ok, _ = s.apply(s.next_due().device)
    assert (ok.device, ok.made_version, s.version) == ("b", True, 2)


def test_the_time_budget_stops_before_the_first_later_arrival():
    table = {("a", n): 3.0 for n in range(10)}
    s = schedule("a", table, k=1, b=1, hole=1, max_sim_time=10.0)
    assert [e[2] for e in run(s)] == [3, 6, 9]


@pytest.mark.parametrize("method, b, hole", [("fedbuff", 2, 1), ("fedrevive", 1, 1), ("fedavg", 20, 20)])
def test_reference_trace_invariants_with_the_papers_delays(method, b, hole):
    s = make_schedule(
        DELAY_PRESETS["paper"],
        seed=5,
        leaves={"site-1": 30, "site-2": 30},
        selection_size=20,
        updates_per_version=b,
        min_hole_to_fill=hole,
        max_model_version=40,
    )
    trace = reference_trace(s)
    per_version = collections.Counter(r["version"] for r in trace)
    assert set(per_version.values()) == {b}, per_version  # exactly B updates in every version
    assert sorted(per_version) == list(range(2, 41))
    arrivals = [r["arrival"] for r in trace]
    assert arrivals == sorted(arrivals)
    assert all(r["tau"] == r["version"] - 1 - r["base_version"] for r in trace)
    if method == "fedavg":
        assert {r["tau"] for r in trace} == {0}
    else:
        assert max(r["tau"] for r in trace) > 1  # asynchronous: stale updates happen


def test_reference_trace_is_a_function_of_the_seed():
    def trace(seed):
        return reference_trace(
            make_schedule(DELAY_PRESETS["paper"], seed, {"site-1": 10, "site-2": 10}, 8, 1, 1, max_model_version=30)
        )

    assert trace(1) == trace(1)
    assert trace(1) != trace(2)


def test_a_checkpointed_schedule_continues_exactly_like_the_original():
    def fresh():
        return make_schedule(DELAY_PRESETS["paper"], 3, {"site-1": 15, "site-2": 15}, 10, 2, 1, max_model_version=25)

    full = reference_trace(fresh())
    s = fresh()
    s.start()
    head = []
    for _ in range(12):
        head.append(s.apply(s.next_due().device)[0].trace_record())
    resumed = fresh()
    resumed.load_state_dict(s.state_dict())
    tail = []
    while not resumed.done:
        tail.append(resumed.apply(resumed.next_due().device)[0].trace_record())
    assert head + tail == full


@pytest.mark.parametrize("b, hole", [(2, 1), (10, 10)])  # FedBuff, and a synchronous round (FedAvg)
def test_a_run_that_ended_at_its_last_version_resumed_with_a_larger_one_goes_on_as_if_never_capped(b, hole):
    """--resume with a larger --max-model-version: the devices the last arrival left unselected (the last version
    existed) are selected at once, from the same state, so the trace equals the uncapped run's."""

    def fresh(last: int):
        leaves = {"site-1": 15, "site-2": 15}
        return make_schedule(DELAY_PRESETS["paper"], 3, leaves, 10, b, hole, max_model_version=last)

    full = reference_trace(fresh(9))
    capped = fresh(4)
    head = reference_trace(capped)
    assert capped.version == 4 and capped.refill() == []  # capped: nothing to select
    extended = fresh(9)
    extended.load_state_dict(capped.state_dict())
    assert len(extended.refill()) >= hole and extended.refill() == []  # once
    tail = []
    while not extended.done:
        tail.append(extended.apply(extended.next_due().device)[0].trace_record())
    assert head + tail == full
    mid = fresh(9)  # a checkpoint mid-run has no hole open: nothing is selected
    mid.start()
    for _ in range(5):
        mid.apply(mid.next_due().device)
    assert mid.refill() == []


def test_with_one_update_per_version_no_device_goes_into_a_version_twice_and_a_checkpoint_keeps_the_hold():
    """Differential privacy's bound on a device's share of an aggregate: without the hold a fast device goes into
    the same version of 8 updates up to three times on a pool of 10 (the paper's delays)."""

    def schedule(hold: bool):
        return make_schedule(
            DELAY_PRESETS["paper"], 0, {"a": 5, "b": 5}, 8, 8, 1, max_model_version=60, one_update_per_version=hold
        )

    def most_per_version(trace):
        return max(collections.Counter((r["device"], r["version"]) for r in trace if not r.get("failed")).values())

    assert most_per_version(reference_trace(schedule(False))) > 1
    held = reference_trace(schedule(True))
    assert most_per_version(held) == 1 and max(r["version"] for r in held) == 60
    first = schedule(True)  # a checkpoint with devices held resumes into the same trace
    first.start()
    trace = []
    while len(trace) < 13:
        trace.append(first.apply(first.next_due().device)[0].trace_record())
    assert first.state_dict()["held"]
    again = schedule(True)
    again.load_state_dict(first.state_dict())
    while not again.done:
        trace.append(again.apply(again.next_due().device)[0].trace_record())
    assert trace == held
