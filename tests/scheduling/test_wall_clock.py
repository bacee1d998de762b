"""With real devices the server runs on the wall clock: it starts once one selection's worth of devices has
registered (at any leaf), tells every leaf the whole selection, applies updates in the order they arrive, and
counts failed a device that reports a failed task or never reports, refilling its slot, so the run completes.
NVFlare-job free: the assessor, a real model manager and a persistor on a stand-in engine; leaves report through
the assessor's NVFlare interface as NVFlare's routing proxy would spread devices over them."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from nvflare.apis.event_type import EventType
from nvflare.edge.assessor import Assessment
from nvflare.edge.mud import PropKey, StateUpdateReport

from aggregation.global_model import GlobalModel
from common.device_timeout import FIRST_DEVICE_TIMEOUT
from common.packed_maps import unpacked_map
from common.protocol import DEVICE_RANGES, DEVICE_UPDATES, SELECTION_VERSIONS, DeviceUpdate
from scheduling.applier import UpdateApplier
from scheduling.exact_assessor import ExactTimeAssessor
from tests.fakes.engine import EventEngine, child_reports
from tests.scheduling.test_exact_assessor import MEAN, ZeroPersistor

LEAVES = ("C11", "C12")


def sync(assessor, engine, leaf: str, updates=(), ranges=None):
    """One report of ``leaf`` (as a leaf executor sends it) and the server's reply."""
    report = StateUpdateReport(0, 0, None, None).to_shareable()
    if ranges:
        report[DEVICE_RANGES] = ranges
    report[DEVICE_UPDATES] = [u.to_dict() for u in updates]
    return child_reports(assessor, engine, leaf, report)


@pytest.mark.parametrize("b, hole", [(2, 1), (4, 4)], ids=["fedbuff", "fedavg"])
def test_real_devices_are_applied_as_they_arrive_and_failed_or_silent_ones_never_stall_the_run(tmp_path, b, hole):
    manager = GlobalModel(MEAN)
    assessor = ExactTimeAssessor(
        "persistor",
        "global_model",
        num_leaves=2,
        selection_size=4,
        updates_per_version=b,
        min_hole_to_fill=hole,
        max_model_version=6,
        seed=3,
        results_dir=str(tmp_path),
        real_devices=True,
        device_timeout=0.4,
        max_consecutive_failures=2,  # the silent device's timeouts, however many in a row, are not errors
    )
    engine = EventEngine({"persistor": ZeroPersistor(), "global_model": manager, "wf_assessor": assessor})
    engine.fire_event(EventType.START_RUN, engine.new_context())
    # NVFlare's HTTP client registers its devices as one range, at whichever leaf the proxy sent it to
    sync(assessor, engine, "C11", ranges={"phones": [3, "C11"]})
    assert manager.current_version == 0, "started before one selection's worth of devices had registered"
    sync(assessor, engine, "C11", ranges={"tablets": [3, "C11"]})
    assert manager.current_version == 1

    sent: list[str] = []  # counted updates, in the order the devices sent them
    sizes: list[int] = []  # and their bytes
    handled: set[tuple[str, int]] = set()
    silent = failing = None
    started = time.time()
    while assessor.assess(engine.new_context()) != Assessment.WORKFLOW_DONE:
        assert time.time() - started < 30, "the run stalled"
        replies = [sync(assessor, engine, leaf) for leaf in LEAVES]
        selections = [unpacked_map(r.get(PropKey.DEVICE_SELECTION)) or {} for r in replies]
        assert selections[0] == selections[1], "each leaf must hear the whole selection"
        versions = unpacked_map(replies[0].get(SELECTION_VERSIONS)) or {}
        for device, sid in sorted(selections[0].items()):
            if (device, sid) in handled:
                continue
            silent = silent or device  # the first device selected never reports
            failing = failing or (device if device != silent else None)  # the next fails its first task
            if device == silent:
                continue
            handled.add((device, sid))
            count = 0 if device == failing and failing not in sent and (failing, "failed") not in handled else 1
            if count == 0:
                handled.add((failing, "failed"))
            diff = {"w": np.full(3, len(sent) + 1, np.float32)} if count else None
            # the proxy routes each device to one leaf by its id: here by its last digit
            leaf = LEAVES[int(device[-1]) % 2]
            error = "" if count else "the device reported status ERROR"  # as the leaf words it
            size = 1000 + 8 * len(sent) if count else 0  # the bytes it sent, as its leaf measured them
            sync(
                assessor,
                engine,
                leaf,
                [DeviceUpdate(device, sid, versions[sid], diff, count, error=error, upload_bytes=size)],
            )
            if count:
                sent.append(device)
                sizes.append(size)
            break  # one device finishes at a time, 50 ms apart: the silent one's timeout passes mid-run
        time.sleep(0.05)
    engine.fire_event(EventType.END_RUN, engine.new_context())

    assert assessor.outcome["status"] == "completed", assessor.outcome
    trace = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    counted = [r["device"] for r in trace if not r.get("failed")]
    assert counted == sent[: len(counted)], "updates must be applied in the order they arrived"
    # each real device's bytes, as its leaf measured them, in its line and in the fleet's bytes_up (metrics.json)
    assert [r["upload_bytes"] for r in trace if not r.get("failed")] == sizes[: len(counted)]
    assert assessor.schedule.fleet()["bytes_up"] == sum(sizes[: len(counted)])
    assert [r["arrival"] for r in trace] == sorted(r["arrival"] for r in trace), "wall-clock arrivals"
    failed = [r for r in trace if r.get("failed")]
    assert failing in {r["device"] for r in failed}, "a failed task counts failed"
    timed_out = [r for r in failed if r["device"] == silent]
    assert timed_out and timed_out[0]["arrival"] >= 0.4, "a silent device fails once its timeout has passed"
    assert {r["version"] for r in trace} <= set(range(2, 7)) and manager.current_version == 6
    for r in trace:  # staleness keeps its meaning: versions made between the base version and the arrival
        assert r["tau"] == r["version"] - 1 - r["base_version"]


def test_the_derived_device_timeout_starts_at_its_default_then_follows_the_slowest_task():
    applier = UpdateApplier(None, None, None, None, time_scale=1.0, device_timeout=0.0)
    assert applier.timeout() == FIRST_DEVICE_TIMEOUT
    applier.slowest = FIRST_DEVICE_TIMEOUT  # a slow fleet: three times its slowest task
    assert applier.timeout() == 3 * FIRST_DEVICE_TIMEOUT
    applier.slowest = 1.0  # a fast fleet: never below the default (a device may still be downloading)
    assert applier.timeout() == FIRST_DEVICE_TIMEOUT
    assert UpdateApplier(None, None, None, None, time_scale=1.0, device_timeout=7.5).timeout() == 7.5


def test_a_real_devices_bytes_travel_with_its_update_and_survive_a_checkpoint():
    from common.delays import DelayConfig
    from common.protocol import SelectionSum
    from scheduling.event_reference import make_schedule

    diff = {"w": np.ones(2, np.float32)}
    sent = DeviceUpdate("d#1", 3, 2, diff, upload_bytes=77)
    assert DeviceUpdate.from_dict(sent.to_dict()).upload_bytes == 77
    assert "upload_bytes" not in DeviceUpdate("d#1", 3, 2, diff).to_dict()  # a simulated device's: as before
    group = SelectionSum.from_dict(SelectionSum.of([sent, DeviceUpdate("d#2", 3, 2, diff, upload_bytes=5)]).to_dict())
    assert {u.device: u.upload_bytes for u in group.device_updates()} == {"d#1": 77, "d#2": 5}  # synchronous sums

    schedule = make_schedule(DelayConfig(), 3, {"site-1": 4}, 2, 1, 1)
    first = schedule.start()[0].device
    arrival, _ = schedule.apply(first, at=1.0, sent=50)
    assert arrival.trace_record()["upload_bytes"] == 50 and schedule.fleet()["bytes_up"] == 50
    resumed = make_schedule(DelayConfig(), 3, {"site-1": 4}, 2, 1, 1)
    resumed.load_state_dict(schedule.state_dict())
    assert resumed.fleet()["bytes_up"] == 50  # a resumed run goes on counting from there
    assert "bytes_up" not in make_schedule(DelayConfig(), 3, {"site-1": 4}, 2, 1, 1).fleet()  # nothing sent
