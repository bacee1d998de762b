"""A distribution of bandwidths: each device's uplink and downlink drawn once from the run's seed and its id, so the
event reference, the dry-run planner and the schedule time the same device's transfers alike, the arrival order
follows from the drawn links, and the same seed repeats the trace."""

from __future__ import annotations

import math

import numpy as np
import pytest

from common.bandwidth import device_bandwidth, parse_bandwidth
from common.choices import ConfigError
from common.compression import parse_compress
from common.delays import DelayConfig, DeviceDelays
from common.seeds import stable_seed
from scheduling.event_reference import make_schedule, reference_trace
from scheduling.timeline import run_timeline

VALUES = 62050  # cifar10_convnet's update
UPLOAD = parse_compress("topk:0.01").encoded_bytes(VALUES)
LEAVES = {"site-1": 40, "site-2": 40}


def links(uplink, downlink=0.0, **fields) -> DelayConfig:
    return DelayConfig(
        upload_bytes=UPLOAD,
        download_bytes=4 * VALUES,
        uplink_bandwidth=uplink,
        downlink_bandwidth=downlink,
        **fields,
    )


def trace(config: DelayConfig, seed: int = 3, **kw) -> list[dict]:
    return reference_trace(make_schedule(config, seed, LEAVES, 10, 1, 1, max_model_version=12, **kw))


def test_a_distribution_is_parsed_into_one_spelling():
    assert parse_bandwidth("--uplink-kbps", "500") == 500.0  # one number stays a float: the config it always was
    assert parse_bandwidth("--uplink-kbps", " LogNormal:500:1 ") == "lognormal:500.0:1.0"
    assert parse_bandwidth("--uplink-kbps", "uniform:100:1000") == "uniform:100.0:1000.0"
    assert parse_bandwidth("--uplink-kbps", "200,1000") == "200.0,1000.0"
    assert DelayConfig.from_dict(links("lognormal:500:1").to_dict()).uplink_bandwidth == "lognormal:500.0:1.0"


@pytest.mark.parametrize(
    "value, message",
    [
        ("0", "must be > 0"),
        ("-3", "must be > 0"),
        ("nan", "not a finite number"),
        ("fast", "'fast' is not a number"),
        ("lognormal:500", "lognormal takes two numbers"),
        ("lognormal:0:1", "median must be > 0"),
        ("lognormal:500:-1", "sigma >= 0"),
        ("uniform:1000:100", "0 < LOW <= HIGH"),
        ("uniform:0:100", "0 < LOW <= HIGH"),
        ("gamma:1:2", "unknown distribution 'gamma'"),
        ("100,0", "every bandwidth in kbit/s must be > 0"),
        ("100,,200", "'' is not a number"),
    ],
)
def test_a_bad_bandwidth_is_refused_naming_the_forms(value, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")) as refused:
        parse_bandwidth("--uplink-kbps", value)
    assert "\n" not in str(refused.value)


def test_each_device_draws_its_own_bandwidth_from_the_seed():
    devices = [f"site-1#{i}" for i in range(4000)]
    draws = np.array([device_bandwidth("lognormal:500.0:1.0", 7, d, "up") for d in devices])
    again = np.array([device_bandwidth("lognormal:500.0:1.0", 7, d, "up") for d in reversed(devices)])[::-1]
    assert np.array_equal(draws, again)  # a pure function of seed and device: any order, any process
    assert not np.array_equal(draws, [device_bandwidth("lognormal:500.0:1.0", 8, d, "up") for d in devices])
    assert not np.array_equal(draws, [device_bandwidth("lognormal:500.0:1.0", 7, d, "down") for d in devices])
    assert np.median(draws) == pytest.approx(500, rel=0.06)  # the median given, and the log's spread
    assert np.std(np.log(draws)) == pytest.approx(1.0, rel=0.05)
    flat = np.array([device_bandwidth("uniform:100.0:300.0", 7, d, "up") for d in devices])
    assert flat.min() >= 100 and flat.max() <= 300 and np.mean(flat) == pytest.approx(200, rel=0.03)
    picks = {device_bandwidth("200.0,1000.0", 7, d, "up") for d in devices}
    assert picks == {200.0, 1000.0}
    # seeded by SHA-256 of (link, seed, device), never by hash() of a string: the documented draw
    rng = np.random.default_rng(stable_seed("bandwidth", "up", 7, "site-1#5"))
    assert draws[5] == 500 * math.exp(rng.standard_normal())


def test_a_transfer_takes_its_bytes_over_the_devices_own_link():
    model = DeviceDelays(links("uniform:100:1000", "lognormal:2000:0.5"), seed=3)
    for device in ("site-1#0", "site-2#7"):
        up = device_bandwidth("uniform:100.0:1000.0", 3, device, "up")
        down = device_bandwidth("lognormal:2000.0:0.5", 3, device, "down")
        for task in (0, 5):  # drawn once per device: every task of it takes the same link
            d = model.durations(device, task)
            assert d.upload == UPLOAD * 8 / (up * 1000)
            assert d.download == 4 * VALUES * 8 / (down * 1000)


def test_the_arrival_order_follows_from_the_drawn_uplinks():
    """With no training or download time, a device's update arrives its bytes over its own uplink after its
    selection: the first selection's updates arrive fastest link first, at exactly those times."""
    setting = "lognormal:300:1"
    records = trace(links(setting))
    schedule = make_schedule(links(setting), 3, LEAVES, 10, 1, 1, max_model_version=12)
    first = [d.device for d in schedule.start()]
    upload = {d: UPLOAD * 8 / (device_bandwidth("lognormal:300.0:1.0", 3, d, "up") * 1000) for d in first}
    expected = sorted(first, key=lambda d: upload[d])
    arrived = [r for r in records if r["device"] in upload and r["base_version"] == 1]
    assert [r["device"] for r in arrived] == expected[: len(arrived)] and len(arrived) >= 3
    for r in arrived:
        assert r["arrival"] == pytest.approx(upload[r["device"]], abs=1e-9)
    assert [r["device"] for r in records] != [r["device"] for r in trace(links(300.0))]  # not the median for all


def test_the_planner_and_the_reference_agree_and_the_seed_repeats():
    config = links("uniform:100:1000", "200,5000", speed_means=(1.0, 2.0), speed_distribution="exponential")
    records = trace(config)
    schedule = make_schedule(config, 3, LEAVES, 10, 1, 1, max_model_version=12)
    assert run_timeline(schedule, 12).trace == records  # the dry-run planner: the same per-device links
    assert trace(config) == records  # the same seed: the same trace
    assert trace(config, seed=4) != records
    assert records and all(r["upload_bytes"] == UPLOAD for r in records if not r.get("failed"))


def test_a_bandwidth_of_one_value_times_as_it_did():
    """One number is every device's link, as before distributions existed: the same durations, bit for bit."""
    model = DeviceDelays(links(250.0, 4000.0, speed_means=(1.0,), speed_stds=(0.2,)), seed=5)
    d = model.durations("site-2#3", 2)
    assert d.upload == UPLOAD * 8 / (250.0 * 1000) and d.download == 4 * VALUES * 8 / (4000.0 * 1000)
    assert links(250.0).to_dict()["uplink_bandwidth"] == 250.0
