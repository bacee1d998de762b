"""A leaf's reply waits for the applier to settle (every update that can be applied now has been), and is woken when
it has: after a burst of arrivals, not at its time limit. The applier's own thread runs here on a real schedule
(paper delays, FedBuff), a real model manager and a trace, on a stand-in engine."""

from __future__ import annotations

import time

import numpy as np
from nvflare.apis.event_type import EventType

from aggregation.global_model import GlobalModel
from common.delays import DELAY_PRESETS
from common.jsonio import JsonlWriter
from common.protocol import DeviceUpdate
from scheduling.applier import UpdateApplier
from simulation.event_reference import make_schedule
from tests.fakes.engine import EventEngine
from tests.scheduling.test_exact_assessor import MEAN

LEAVES = {"site-1": 100, "site-2": 100}


def running_applier(tmp_path) -> tuple[UpdateApplier, GlobalModel]:
    model = GlobalModel(MEAN, {"global_lr": 0.5})
    engine = EventEngine({"model": model})
    ctx = engine.new_context()
    engine.fire_event(EventType.START_RUN, ctx)
    schedule = make_schedule(DELAY_PRESETS["paper"], 1, LEAVES, 200, 2, 1, max_model_version=10**6)
    model.start({"w": np.zeros(3, np.float32)}, ctx)
    schedule.start()
    applier = UpdateApplier(schedule, model, JsonlWriter(str(tmp_path / "events.jsonl")), engine.new_context)
    applier.start()
    return applier, model


def deliver_all_in_flight(applier: UpdateApplier) -> int:
    """Every in-flight device reports at once, as a leaf's sync carrying many updates does."""
    with applier.lock:
        flights = list(applier.schedule.in_flight.values())
    for f in flights:
        diff = {"w": np.full(3, 0.01, np.float32)}
        assert applier.receive(DeviceUpdate(f.device, f.selection_id, f.base_version, diff)) == ""
    return len(flights)


def test_a_reply_waiting_for_a_burst_to_be_applied_is_woken_when_the_applier_settles(tmp_path):
    applier, model = running_applier(tmp_path)
    try:
        deadline = time.time() + 10
        while applier.releases == 0:  # the first selection, held until the server needs it, then released
            assert time.time() < deadline, "the applier never released the first selection"
            time.sleep(0.01)
        for _burst in range(3):
            applied_before = applier.applied
            delivered = deliver_all_in_flight(applier)
            started = time.monotonic()
            applier.wait_settled(30.0)
            waited = time.monotonic() - started
            assert waited < 10.0, f"the reply waited {waited:.1f} s: nobody woke it when the applier settled"
            with applier.lock:
                due = applier.schedule.next_due()
                assert due is None or due.device not in applier.received, "it returned before the applier settled"
            # applied up to the first device selected since that is due before the rest of the burst
            assert 0 < applier.applied - applied_before <= delivered
        assert model.current_version > 20
        assert applier.error == ""
    finally:
        applier.stop()
    # stopped: a reply that still waits returns at once
    started = time.monotonic()
    applier.wait_settled(30.0)
    assert time.monotonic() - started < 5.0
