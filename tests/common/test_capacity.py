"""Measured device speeds from a FedScale-format capacity trace (``common.capacity``, ``--capacity-file``): the
files FedScale ships (pickle) or JSON, each device mapped to a trace client by a seeded rule, durations from the
work a task does."""

from __future__ import annotations

import json
import pickle

import pytest

from common.capacity import device_capacity, load_capacities
from common.choices import ConfigError
from common.delays import DelayConfig, DeviceDelays
from jobs.api import make_config

TRACE = {i: {"computation": 5.0 + 10 * i, "communication": 1000.0 * (i + 1)} for i in range(5)}


@pytest.fixture
def trace_files(tmp_path):
    pkl, js = tmp_path / "capacity.pkl", tmp_path / "capacity.json"
    pkl.write_bytes(pickle.dumps(TRACE))  # as FedScale ships it: integer client ids
    js.write_text(json.dumps({str(k): v for k, v in TRACE.items()}))
    return str(pkl), str(js)


def test_a_devices_times_are_its_trace_clients_work_over_its_speeds(trace_files):
    pkl, js = trace_files
    cfg = DelayConfig(capacity_file=pkl, task_samples=32, model_bytes=250_000, capacity_cost=2.0)
    delays = DeviceDelays(cfg, seed=3)
    for device in ("site-1#0", "site-2#7"):
        ms, kbps = device_capacity(pkl, 3, device)
        d = delays.durations(device, 4)
        assert d.train == pytest.approx(32 * ms * 2.0 / 1000) and d.download == d.upload
        assert d.upload == pytest.approx(250_000 * 8 / (kbps * 1000))
        assert delays.durations(device, 9) == d  # measured speeds: the same every task
    assert load_capacities(pkl) == load_capacities(js)  # pickle and JSON, the same trace


def test_devices_take_trace_clients_by_a_seeded_rule_across_the_whole_trace(trace_files):
    pkl, _ = trace_files
    used = {device_capacity(pkl, 0, f"site-1#{i}") for i in range(200)}
    assert len(used) == 5  # a fleet larger than the trace uses every client
    assert [device_capacity(pkl, 0, f"site-1#{i}") for i in range(20)] == [
        device_capacity(pkl, 0, f"site-1#{i}") for i in range(20)
    ]
    assert any(device_capacity(pkl, 1, f"site-1#{i}") != device_capacity(pkl, 0, f"site-1#{i}") for i in range(20))


def test_a_bad_trace_or_a_second_delay_model_is_refused_naming_the_fix(tmp_path, trace_files):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"7": {"computation": 3.0}}))
    malformed, missing = DelayConfig(capacity_file=str(bad)), DelayConfig(capacity_file=str(tmp_path / "x.pkl"))
    with pytest.raises(ConfigError, match="client '7' is not"):
        malformed.validate()
    with pytest.raises(ConfigError, match="leave out --delays"):
        DelayConfig.preset("paper", capacity_file=trace_files[0])
    with pytest.raises(ConfigError, match="no such file"):
        missing.validate()
    with pytest.raises(ConfigError, match="no such file"):  # a model built from a dict, on a server or leaf
        DeviceDelays(DelayConfig.from_dict(missing.to_dict()), 0)


def test_the_jobs_give_the_trace_the_work_of_a_task_and_the_models_size(trace_files):
    cfg = make_config("fedbuff", capacity_file=trace_files[0], local_iters=3, local_batch_size=16, subset_size=40)
    assert cfg.delays.task_samples == 48
    assert cfg.delays.model_bytes == 4 * 62_050  # cifar10_convnet's weights and tracker statistics, float32
    assert cfg.validate() == cfg  # validating again changes nothing
