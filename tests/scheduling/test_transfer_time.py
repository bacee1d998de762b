"""Bytes that take time: with a bandwidth, an upload lasts its encoded bytes over the uplink, so a compressor that
sends fewer bytes changes the order updates arrive in, in the event reference (the trace a real run reproduces)
and in the dry-run planner alike."""

from __future__ import annotations

import math

import pytest

from common.compression import parse_compress
from common.delays import DelayConfig, DeviceDelays
from scheduling.event_reference import make_schedule, reference_trace
from scheduling.timeline import run_timeline

VALUES = 62050  # cifar10_convnet's update
LEAVES = {"site-1": 6, "site-2": 6}


def delays(compress: str, uplink: float = 200.0, downlink: float = 2000.0) -> DelayConfig:
    return DelayConfig(
        speed_means=(1.0, 2.0),
        speed_distribution="exponential",
        upload_delays=(0.1, 0.5),  # replaced by the bytes over the uplink
        upload_jitter=0.05,
        download_delay=0.3,
        upload_bytes=parse_compress(compress).encoded_bytes(VALUES),
        download_bytes=4 * VALUES,
        uplink_bandwidth=uplink,
        downlink_bandwidth=downlink,
    )


def trace(compress: str) -> list[dict]:
    return reference_trace(make_schedule(delays(compress), 3, LEAVES, 6, 3, 3, max_model_version=8))


def test_a_transfer_takes_its_bytes_over_the_link():
    config = delays("topk:0.01")
    d = DeviceDelays(config, seed=3).durations("site-1#2", 4)
    assert d.upload == pytest.approx(8 * math.ceil(0.01 * VALUES) * 8 / (200.0 * 1000))
    assert d.download == pytest.approx(4 * VALUES * 8 / (2000.0 * 1000))
    plain = DeviceDelays(DelayConfig(**{**config.__dict__, "uplink_bandwidth": 0.0}), seed=3).durations("site-1#2", 4)
    assert plain.train == d.train  # training time drawn as without a bandwidth


@pytest.mark.parametrize("compress", ["none", "qsgd:4", "topk:0.01"])
def test_every_counted_update_records_its_bytes(compress):
    expected = parse_compress(compress).encoded_bytes(VALUES)
    records = trace(compress)
    assert records and all(r["upload_bytes"] == expected for r in records if not r.get("failed"))


def test_fewer_bytes_change_the_arrival_order_as_the_time_model_says():
    full, sparse = trace("none"), trace("topk:0.01")
    order = [(r["device"], r["base_version"]) for r in full]
    assert order != [(r["device"], r["base_version"]) for r in sparse]
    assert sparse[-1]["arrival"] < full[-1]["arrival"]  # the same versions made sooner
    # the first arrival is the first selection's device whose download + training + upload is the shortest
    for compress, records in (("none", full), ("topk:0.01", sparse)):
        schedule = make_schedule(delays(compress), 3, LEAVES, 6, 3, 3, max_model_version=8)
        model = DeviceDelays(delays(compress), 3)
        first = min((model.durations(d.device, 0).total, d.device) for d in schedule.start())
        assert (records[0]["device"], records[0]["arrival"]) == (first[1], pytest.approx(first[0]))


def test_the_dry_run_planner_follows_the_same_rule():
    schedule = make_schedule(delays("topk:0.01"), 3, LEAVES, 6, 3, 3, max_model_version=8)
    assert run_timeline(schedule, 12).trace == trace("topk:0.01")


def test_without_bytes_the_trace_is_unchanged():
    plain = DelayConfig(speed_means=(1.0, 2.0), speed_distribution="exponential", upload_delays=(0.1, 0.5))
    records = reference_trace(make_schedule(plain, 3, LEAVES, 6, 3, 3, max_model_version=5))
    assert all("upload_bytes" not in r for r in records)
    assert "upload_bytes" not in plain.to_dict() and "uplink_bandwidth" not in plain.to_dict()
