"""A run whose devices keep failing with errors stops, naming the count and the last error; failures the server
decides (offline devices, a lost leaf's, silent real devices) never stop it. The rule alone, then the assessor on
exact time with scripted leaves (NVFlare-job free, as ``tests/scheduling/test_exact_assessor.py``)."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import pytest
from nvflare.apis.event_type import EventType
from nvflare.edge.assessor import Assessment
from nvflare.edge.mud import PropKey, StateUpdateReport

from aggregation.global_model import GlobalModel
from common.delays import DELAY_PRESETS
from common.packed_maps import unpacked_map
from common.protocol import (
    DEVICE_RANGES,
    DEVICE_UPDATES,
    SELECTION_SUMS,
    SELECTION_VERSIONS,
    DeviceUpdate,
    SelectionSum,
)
from scheduling.event_reference import make_schedule, reference_trace
from scheduling.exact_assessor import ExactTimeAssessor
from scheduling.failure_streak import FailureStreak
from tests.fakes.engine import EventEngine, child_reports
from tests.scheduling.test_exact_assessor import LEAVES, MEAN, ZeroPersistor, run_scripted


def test_only_device_errors_in_a_row_from_enough_devices_stop_a_run():
    streak = FailureStreak(3)
    for device in ("a", "b"):
        streak.note(device, counted=False, error="RuntimeError: boom")
    streak.note("c", counted=False, error="")  # offline, silent or its leaf lost: the server's decision
    assert streak.failed == 2 and not streak.reason(pool_size=10)
    streak.note("c", counted=True, error="")  # one update that counts ends the streak
    assert streak.failed == 0
    for _ in range(5):  # one broken device reselected at once, again and again (the wall clock)
        streak.note("a", counted=False, error="RuntimeError: boom")
    assert streak.failed == 5 and not streak.reason(pool_size=10), "one device is not the fleet"
    streak.note("b", counted=False, error="RuntimeError: boom")
    assert not streak.reason(pool_size=10)
    streak.note("c", counted=False, error="ValueError: the last one")
    reason = streak.reason(pool_size=10)
    assert "7 device updates in a row" in reason and "from 3 devices" in reason
    assert "--max-consecutive-failures 3" in reason and reason.endswith("device c: ValueError: the last one")
    small = FailureStreak(3)  # a pool of 2 devices: both failing is every device failing
    for device in ("a", "b", "a"):
        small.note(device, counted=False, error="E")
    assert small.reason(pool_size=2) and not small.reason(pool_size=3)
    never = FailureStreak(0)
    for i in range(1000):
        never.note(str(i), counted=False, error="E")
    assert not never.reason(pool_size=1000)


def report(assessor, engine, leaf: str, **entries):
    """One report of ``leaf`` with ``entries`` (protocol keys -> values); the server's reply."""
    shareable = StateUpdateReport(0, 0, None, None).to_shareable()
    for key, value in entries.items():
        shareable[key] = value
    return child_reports(assessor, engine, leaf, shareable)


def run_answering(tmp_path, b: int, hole: int, max_version: int, sums: bool, answer: Callable) -> tuple:
    """A run of the assessor on exact time with two scripted leaves that answer each newly selected device with
    ``answer(device, selection_id, version, n)`` (n: 1, 2, ... in order), as one sum per selection and leaf when
    ``sums`` (a synchronous leaf), else one update each; ``--max-consecutive-failures 10``. Returns the assessor
    and the global model once the run has ended."""
    manager = GlobalModel(MEAN)
    assessor = ExactTimeAssessor(
        "persistor",
        "global_model",
        num_leaves=2,
        selection_size=8,
        updates_per_version=b,
        min_hole_to_fill=hole,
        max_model_version=max_version,
        delays=DELAY_PRESETS["paper"].to_dict(),
        seed=4,
        results_dir=str(tmp_path),
        max_consecutive_failures=10,
    )
    engine = EventEngine({"persistor": ZeroPersistor(), "global_model": manager, "wf_assessor": assessor})
    engine.fire_event(EventType.START_RUN, engine.new_context())
    for leaf, count in LEAVES.items():
        report(assessor, engine, leaf, **{DEVICE_RANGES: {leaf: [count, leaf]}})
    reported: set[tuple[str, int]] = set()
    started = time.time()
    while assessor.assess(engine.new_context()) != Assessment.WORKFLOW_DONE:
        assert time.time() - started < 30, "the run must stop"
        for leaf in LEAVES:
            reply = report(assessor, engine, leaf)
            selection = unpacked_map(reply.get(PropKey.DEVICE_SELECTION)) or {}
            versions = unpacked_map(reply.get(SELECTION_VERSIONS)) or {}
            updates = []
            for device, sid in sorted(selection.items()):
                if (device, sid) not in reported:
                    reported.add((device, sid))
                    updates.append(answer(device, sid, versions[sid], len(reported)))
            if updates and sums:  # a synchronous leaf sends one sum per selection, each failed device's error in it
                for sid in sorted({u.selection_id for u in updates}):
                    mine = [u for u in updates if u.selection_id == sid]
                    total = SelectionSum.of(mine).to_dict()
                    assert set(total.get("errors", {})) == {u.device for u in mine if u.error}
                    report(assessor, engine, leaf, **{SELECTION_SUMS: [total]})
            elif updates:
                report(assessor, engine, leaf, **{DEVICE_UPDATES: [u.to_dict() for u in updates]})
        time.sleep(0.001)
    engine.fire_event(EventType.END_RUN, engine.new_context())
    return assessor, manager


@pytest.mark.parametrize("b, hole, sums", [(2, 1, False), (8, 8, True)], ids=["fedbuff", "fedavg-sums"])
def test_a_run_whose_every_device_fails_stops_naming_the_count_and_the_last_error(tmp_path, b, hole, sums):
    def failed(device: str, sid: int, version: int, n: int) -> DeviceUpdate:
        diff = {"w": np.zeros(3, np.float32)} if sums else None  # a sum holds the failed devices' zero diffs
        return DeviceUpdate(device, sid, version, diff, 0, error=f"RuntimeError: task {n}")

    assessor, _ = run_answering(tmp_path, b, hole, 25, sums, failed)
    outcome = assessor.outcome
    trace = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert outcome["status"] == "stopped" and outcome["version"] == 1, outcome
    assert all(r.get("failed") for r in trace) and len({r["device"] for r in trace}) >= 10
    # it stops at the update that completed the streak: on exact time the same one every run
    assert f"{len(trace)} device updates in a row failed with an error" in outcome["reason"], outcome
    assert "--max-consecutive-failures 10" in outcome["reason"]
    assert re.search(rf"the last, device {re.escape(trace[-1]['device'])}: RuntimeError: task \d+$", outcome["reason"])


def test_offline_devices_do_not_stop_a_run_however_many_drop_in_a_row(tmp_path):
    """A diurnal fleet whose sessions end mid-task: the reference trace has 7 drop-outs in a row, past the limit of
    5; every device that stays online reports, and the run completes with the reference trace."""
    delays = replace(DELAY_PRESETS["paper"], availability="diurnal", availability_period=5.0, availability_online=0.2)
    kw = dict(selection_size=8, updates_per_version=2, min_hole_to_fill=1, max_model_version=25)
    expected = reference_trace(make_schedule(delays, 4, LEAVES, **kw))
    longest = run = 0
    for r in expected:
        run = run + 1 if r.get("failed") else 0
        longest = max(longest, run)
    assert longest > 5, "the fleet must drop more devices in a row than the limit, or this checks nothing"
    run_scripted(tmp_path, kw | {"max_consecutive_failures": 5}, delays=delays)  # it asserts "completed"
    trace = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert trace == expected
