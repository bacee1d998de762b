"""When devices are online (``common.availability``) and what the schedule does with it: only online devices are
selected, one that goes offline before its update arrives fails then, and everything is a seeded function of
(seed, device, time)."""

from __future__ import annotations

import json
import math
import pickle

import numpy as np
import pytest

from common.availability import Availability, load_availability
from common.choices import ConfigError
from common.delays import DelayConfig, DeviceDelays
from scheduling.event_reference import make_schedule, reference_trace

DIURNAL = dict(availability="diurnal", availability_period=4.0, availability_online=0.5)


def consistent(model: Availability, device: str, times) -> None:
    """online_from, session_end and online agree at every probed moment."""
    for t in times:
        start = model.online_from(device, t)
        assert start >= t and model.online(device, start + 1e-9)
        end = model.session_end(device, start + 1e-9)
        probe = (start + end) / 2 if end != math.inf else start + 1.0
        assert end > start and model.online(device, probe)
        if end != math.inf:
            assert not model.online(device, end + 1e-9)


def test_the_diurnal_model_gives_each_device_one_session_a_day_at_its_own_hour():
    model = Availability("diurnal", seed=1, period=4.0, online=0.25)
    for device in ("site-1#0", "site-1#1", "site-2#5"):
        consistent(model, device, np.linspace(0, 12, 37))
        grid = np.linspace(0, 4, 4001)[:-1]
        assert np.mean([model.online(device, t) for t in grid]) == pytest.approx(0.25, abs=2e-3)
    devices = [f"site-1#{i}" for i in range(50)]
    session_starts = {model.online_from(d, model.session_end(d, model.online_from(d, 0.0))) for d in devices}
    assert len(session_starts) == 50  # the devices' hours differ
    assert Availability("diurnal", seed=1, period=4.0, online=0.25).online_from("site-1#3", 5.0) == model.online_from(
        "site-1#3", 5.0
    )


@pytest.fixture
def trace_file(tmp_path):
    trace = {
        0: {"active": [1.0, 6.0], "inactive": [3.0, 8.0], "finish_time": 10.0, "duration": 10.0},
        1: {"active": [0.0], "inactive": [10.0], "finish_time": 10.0},  # always online
        2: {"active": [0.0, 9.0], "inactive": [2.0, 10.0], "finish_time": 10.0},  # wraps into the next cycle
    }
    path = tmp_path / "availability.pkl"
    path.write_bytes(pickle.dumps(trace))
    (tmp_path / "availability.json").write_text(json.dumps({str(k): v for k, v in trace.items()}))
    return str(path)


def test_a_fedscale_trace_repeats_with_its_period_and_maps_devices_by_a_seeded_rule(trace_file):
    model = Availability(trace_file, seed=0)
    assert load_availability(trace_file) == load_availability(trace_file.replace(".pkl", ".json"))
    clients = {}
    for i in range(60):
        device = f"site-1#{i}"
        consistent(model, device, np.linspace(0, 30, 61))
        on = tuple(model.online(device, t) for t in (0.5, 2.0, 4.0, 7.0, 9.5, 12.0))
        clients.setdefault(on, device)
    assert len(clients) == 3  # every client of the trace is used
    wraps = next(d for on, d in clients.items() if on == (True, False, False, False, True, False))
    assert model.session_end(wraps, 9.5) == pytest.approx(12.0)  # 9 -> 10, then 0 -> 2 of the next cycle
    always = next(d for on, d in clients.items() if all(on))
    assert model.session_end(always, 3.0) == math.inf


def test_a_malformed_trace_is_refused_naming_the_fix(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"3": {"active": [5.0], "inactive": [4.0], "finish_time": 10.0}}))
    malformed, unknown = DelayConfig(availability=str(bad)), DelayConfig(availability="weekly")  # read no file
    with pytest.raises(ConfigError, match="ordered windows"):
        malformed.validate()
    with pytest.raises(ConfigError, match="use always, diurnal"):
        unknown.validate()
    with pytest.raises(ConfigError, match="ordered windows"):  # a model built from a dict, on a server or leaf
        DeviceDelays(DelayConfig.from_dict(malformed.to_dict()), 0)


def schedule(**delays):
    cfg = DelayConfig.preset("paper", **delays)
    return make_schedule(cfg, 7, {"site-1": 30, "site-2": 30}, 10, 2, 1, max_model_version=40)


def test_only_online_devices_are_selected_and_a_device_going_offline_first_fails_then():
    s = schedule(**DIURNAL)
    availability = s.delays.availability
    dispatched = s.start()
    failed = 0
    while not s.done:
        due = s.next_due()
        assert all(availability.online(d.device, d.selected_at) for d in dispatched)
        full = due.selected_at + s.delays.durations(due.device, due.task_number).total
        if due.drops:
            assert due.arrival < full and due.arrival == pytest.approx(
                availability.session_end(due.device, due.selected_at)
            )
        else:
            assert due.arrival == pytest.approx(full)
        arrival, dispatched = s.apply(due.device)
        assert arrival.counted == (not due.drops)
        failed += due.drops
    assert failed > 0 and s.version == 40


def test_availability_runs_repeat_resume_exactly_and_wait_for_devices_to_come_online():
    trace = reference_trace(schedule(**DIURNAL))
    assert trace == reference_trace(schedule(**DIURNAL))
    assert any(r.get("failed") for r in trace) and trace != reference_trace(schedule())
    arrivals = [r["arrival"] for r in trace]
    assert arrivals == sorted(arrivals)
    half = schedule(**DIURNAL)  # a checkpoint mid-run continues as the uninterrupted run
    half.start()
    for _ in range(25):
        half.apply(half.next_due().device)
    resumed = schedule(**DIURNAL)
    resumed.load_state_dict(json.loads(json.dumps(half.state_dict())))
    rest = []
    while not resumed.done:
        rest.append(resumed.apply(resumed.next_due().device)[0].trace_record())
    assert rest == trace[25:]
    # a short online share: at times nobody idle is online, and time moves on to the first one who comes online
    sparse = schedule(availability="diurnal", availability_period=40.0, availability_online=0.05)
    dispatched, waited = sparse.start(), 0
    while not sparse.done:
        arrival, dispatched = sparse.apply(sparse.next_due().device)
        waited += any(d.selected_at > arrival.arrival for d in dispatched)
        assert all(sparse.delays.availability.online(d.device, d.selected_at) for d in dispatched)
    assert waited > 0 and sparse.version == 40
