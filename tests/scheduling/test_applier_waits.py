"""Who waits for the applier is woken when what it waits for happens, not at its time limit: a leaf's reply waiting
for the applier to settle (every update that can be applied now has been), and a checkpoint, on the applier's own
thread, waiting for every released device to report. A real schedule (paper delays, FedBuff), a real model manager
and a trace, on a stand-in engine."""

from __future__ import annotations

import threading
import time

import numpy as np
from nvflare.apis.event_type import EventType

from aggregation.global_model import GlobalModel
from common.delays import DELAY_PRESETS
from common.jsonio import JsonlWriter
from common.protocol import DeviceUpdate
from scheduling.applier import UpdateApplier
from scheduling.event_reference import make_schedule
from tests.fakes.engine import EventEngine
from tests.scheduling.test_exact_assessor import MEAN

LEAVES = {"site-1": 100, "site-2": 100}


def running_applier(tmp_path, thread: bool = True) -> tuple[UpdateApplier, GlobalModel]:
    """An applier on its thread; or (``thread=False``) one whose devices are all released and nobody applies."""
    model = GlobalModel(MEAN, {"global_lr": 0.5})
    engine = EventEngine({"model": model})
    ctx = engine.new_context()
    engine.fire_event(EventType.START_RUN, ctx)
    schedule = make_schedule(DELAY_PRESETS["paper"], 1, LEAVES, 200, 2, 1, max_model_version=10**6)
    model.start({"w": np.zeros(3, np.float32)}, 1, ctx)
    schedule.start()
    events = JsonlWriter(str(tmp_path / "events.jsonl"))
    if not thread:  # the wall clock's rule releases every selected device at once
        applier = UpdateApplier(schedule, model, events, engine.new_context, time_scale=1.0)
        applier.republish()
        return applier, model
    applier = UpdateApplier(schedule, model, events, engine.new_context)
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


def test_a_checkpoint_waiting_for_released_devices_wakes_with_the_last_report(tmp_path):
    # A checkpoint waits on the applier's own thread, so no applier goes idle to wake it: each arrival must. Five
    # tries, as a poll (every 0.5 s) can return soon after the last report by chance; five in a row cannot.
    late = []
    for i in range(5):
        (tmp_path / str(i)).mkdir()
        applier, _model = running_applier(tmp_path / str(i), thread=False)
        assert applier.schedule.in_flight and applier.releases == 1
        done: dict = {}
        waiter = threading.Thread(
            target=lambda a=applier, d=done: d.update(released=a.wait_released(30.0), at=time.monotonic())
        )
        waiter.start()
        time.sleep(0.05)  # it waits: nothing has reported yet
        assert not done
        deliver_all_in_flight(applier)
        last = time.monotonic()
        waiter.join(10)
        assert done["released"] is True
        late.append(done["at"] - last)
    assert sum(late) < 0.4, f"woken {late} s after the last report: by its poll, not by the reports"
