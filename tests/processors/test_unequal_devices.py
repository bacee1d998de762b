"""Unequal devices (``--local-epochs``): a device's local work, reports, weight in the mean and simulated time follow
the samples it holds (``processors.local_work``, ``common.delays``), and ``--local-iters`` keeps today's bits.

Today's partitions give every device ``--subset-size`` samples, so these tests give devices unequal sizes through
the one seam every size is read from: ``processors.data.partition.device_indices`` (the length of a device's index
array is its sample count, ``device_sample_count``)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from aggregation.buffered_mean import BufferedMean
from aggregation.strategy import ServerContext, Update
from common.choices import ConfigError
from common.delays import DELAY_PRESETS, DelayConfig, DeviceDelays
from common.protocol import DATA_SIZE, DEVICE_EXTRA_PREFIX, SAMPLES, STEPS, DeviceUpdate, SelectionSum
from common.seeds import stable_seed
from jobs.api import make_config
from jobs.methods import FedAvg, FedRevive
from jobs.run.schedule_plan import schedule_for
from processors.data import partition
from processors.local_work import device_work
from scheduling.event_reference import make_schedule, reference_trace
from simulation.leaf_executor import device_settings
from tests.conftest import make_processor

BATCH = 16


def size_of(device: str) -> int:
    """A long-tailed, seeded sample count per device (5 .. 64)."""
    return 5 + int(60 * (stable_seed("size", device) % 1000 / 1000) ** 3)


@pytest.fixture
def unequal(monkeypatch):
    """Devices hold ``size_of(device)`` samples (the first ones of the training set)."""

    def indices(labels, device_key, *args, **kwargs):
        return np.arange(size_of(device_key))

    monkeypatch.setattr(partition, "device_indices", indices)


# -- local work and reports --------------------------------------------------------------------------------------


def test_a_device_trains_its_epochs_over_its_own_samples_and_reports_them(unequal):
    proc = make_processor(synthetic_size=400, local_epochs=1, local_batch_size=BATCH)
    proc.reports = [STEPS, SAMPLES, DATA_SIZE]
    weights = {k: v.numpy() for k, v in _initial().items()}
    devices = ["site-1#0", "site-1#1", "site-1#2"]
    sizes = [size_of(d) for d in devices]
    assert len(set(sizes)) == 3
    grouped = proc.train_devices(devices, [weights] * 3, [1] * 3)  # the vectorised engine, one group
    for d, n, diff in zip(devices, sizes, grouped, strict=True):
        assert diff[DEVICE_EXTRA_PREFIX + STEPS] == math.ceil(n / BATCH)  # the tail batch kept
        assert diff[DEVICE_EXTRA_PREFIX + SAMPLES] == n
        assert diff[DEVICE_EXTRA_PREFIX + DATA_SIZE] == n
        alone = proc.train_devices([d], [weights], [1])[0]  # the per-device engine
        for k in alone:
            np.testing.assert_allclose(diff[k], alone[k], atol=1e-5)


def test_weighting_by_samples_sends_the_diff_times_the_devices_data_size(unequal):
    plain = make_processor(synthetic_size=400, local_epochs=1, local_batch_size=BATCH)
    weighted = make_processor(synthetic_size=400, local_epochs=1, local_batch_size=BATCH)
    weighted.weighting, weighted.reports = "samples", [DATA_SIZE]
    weights = {k: v.numpy() for k, v in _initial().items()}
    d = "site-2#5"
    want = plain.train_devices([d], [weights], [1])[0]
    got = weighted.train_devices([d], [weights], [1])[0]
    assert got.pop(DEVICE_EXTRA_PREFIX + DATA_SIZE) == size_of(d)
    for k in want:
        np.testing.assert_allclose(got[k], want[k] * size_of(d), rtol=1e-6)


def test_the_mean_weights_by_samples_or_uniformly_as_the_method_chooses():
    ups = [("a", 10, 1.0), ("b", 30, 3.0), ("c", 0, 0.0)]  # device, samples, its diff; c failed (count 0)

    def update(device, n, value, weighted):
        diff = {"w": np.full(2, value * (n if weighted else 1), np.float32)}
        reports = {DATA_SIZE: np.float32(n)} if n else {}
        return Update(device, 1, 1 if n else 0, diff, 0, 0.0, reports)

    history = _History({"w": np.zeros(2, np.float32)})
    uniform, by_samples = BufferedMean(), BufferedMean(weighting="samples")
    for strategy in (uniform, by_samples):
        strategy.setup(ServerContext("cifar10_convnet", frozenset(), 0, "cpu", ""))
    for device, n, value in ups:
        uniform.add_update(update(device, n, value, False), history)
        by_samples.add_update(update(device, n, value, True), history)
    np.testing.assert_allclose(uniform.make_version(history, 0.0)["w"], 2.0)  # (1 + 3) / 2 devices
    np.testing.assert_allclose(by_samples.make_version(history, 0.0)["w"], 2.5)  # (10 + 90) / 40 samples
    # a leaf's sum of a selection (a failed device first, without reports) carries the summed data sizes
    parts = [DeviceUpdate(d, 1, 1, update(d, n, v, True).diff | _report(n), 1 if n else 0) for d, n, v in ups]
    summed = SelectionSum.of([parts[2], parts[0], parts[1]])
    assert summed.diff[DEVICE_EXTRA_PREFIX + DATA_SIZE] == 40


class _History:
    def __init__(self, weights):
        self.current_version, self.current_weights = 1, weights

    def weights_of(self, version):
        return self.current_weights


def _report(n: int) -> dict:
    return {DEVICE_EXTRA_PREFIX + DATA_SIZE: np.float32(n)} if n else {}


# -- simulated time ----------------------------------------------------------------------------------------------


def test_training_time_scales_with_the_devices_work_and_is_unchanged_without_it(tmp_path):
    work = {"site-1#0": 50.0, "site-1#1": 200.0}.get
    preset = DELAY_PRESETS["paper"]
    ref = DelayConfig.from_spec("paper", task_samples=100)
    plain, scaled = DeviceDelays(preset, 3), DeviceDelays(ref, 3, work)
    for device, w in (("site-1#0", 50.0), ("site-1#1", 200.0)):
        for task in range(3):
            p, s = plain.durations(device, task), scaled.durations(device, task)
            assert s.train == pytest.approx(p.train * w / 100)  # the drawn time is the reference task's
            assert (s.download, s.upload) == (p.download, p.upload)
    capacity = tmp_path / "capacity.json"
    capacity.write_text('{"0": {"computation": 4.0, "communication": 1000.0}}')
    trace = DeviceDelays(DelayConfig(capacity_file=str(capacity), task_samples=100, model_bytes=1000), 0, work)
    assert trace.durations("site-1#1", 0).train == pytest.approx(200 * 4.0 / 1000)  # ms per sample x samples


def test_equal_work_keeps_the_reference_trace_bit_identical():
    """A work function that gives every device the reference task changes no event (the scaling is exact), and
    unequal work changes the trace by each device's training time only."""
    leaves = {"site-1": 6, "site-2": 6}
    ref = DelayConfig.from_spec("paper", task_samples=64)
    today = reference_trace(make_schedule(DELAY_PRESETS["paper"], 1, leaves, 4, 2, 1, max_model_version=8))
    same = reference_trace(make_schedule(ref, 1, leaves, 4, 2, 1, max_model_version=8, work=lambda d: 64.0))
    assert same == today
    unequal = reference_trace(
        make_schedule(ref, 1, leaves, 4, 2, 1, max_model_version=8, work=lambda d: float(2 * size_of(d)))
    )
    assert unequal != today


def test_dry_run_and_the_server_time_each_device_by_its_own_samples(unequal):
    options = dict(
        num_leaf_nodes=2, devices_per_leaf=6, device_selection_size=4, num_updates_for_model=2, min_hole_to_fill=1
    )
    cfg = make_config("fedbuff", local_epochs=2, local_batch_size=BATCH, subset_size=40, max_model_version=8, **options)
    assert cfg.delays.task_samples == 80  # the reference task: 2 epochs of the nominal 40 samples
    work = device_work(cfg.data.to_dict(), cfg.training.to_dict(), cfg.run.seed)
    assert work("site-1#3") == 2 * size_of("site-1#3")
    expected = make_schedule(
        cfg.delays, cfg.run.seed, {"site-1": 6, "site-2": 6}, 4, 2, 1, max_model_version=8, work=work
    )
    assert reference_trace(schedule_for(cfg)) == reference_trace(expected)  # --dry-run
    from jobs.run.components import make_assessor

    server = make_assessor(cfg, _Timeouts(), "p", "m", "")  # the server builds the same work from its config
    assert device_work(server.work["data"], server.work["training"], server.seed)("site-2#1") == work("site-2#1")
    iters = make_config("fedbuff", subset_size=40, max_model_version=8, **options)
    assert make_assessor(iters, _Timeouts(), "p", "m", "").work is None  # --local-iters: today's schedule


class _Timeouts:
    leaf_timeout = 60.0


def _initial() -> dict[str, torch.Tensor]:
    from processors.models import build_model

    torch.manual_seed(0)
    return {k: v.detach().clone() for k, v in build_model("cifar10_convnet").state_dict().items()}


class WeightedFedAvg(FedAvg):
    """FedAvg weighting each device by the samples it holds, as a user chooses it."""

    weighting = "samples"


def test_a_method_that_weights_by_samples_configures_devices_and_strategy():
    from jobs.run.components import make_task_processor

    cfg = make_config(WeightedFedAvg, local_epochs=1, subset_size=40)
    proc = make_task_processor(cfg, None, 0)
    assert proc.weighting == "samples" and DATA_SIZE in proc.reports
    assert cfg.method_spec.strategy_args(cfg)["weighting"] == "samples"
    assert device_settings(proc)["weighting"] == "samples"  # a real device weighs its diff alike
    plain = make_config("fedavg", subset_size=40)
    assert "weighting" not in plain.method_spec.strategy_args(plain)  # today's arguments, unchanged
    assert make_task_processor(plain, None, 0).weighting == "devices"
    assert "weighting" not in device_settings(make_task_processor(plain, None, 0))


class WeightedFedRevive(FedRevive):
    weighting = "samples"


class OddWeighting(FedAvg):
    weighting = "bytes"


def test_fedrevive_and_unknown_weightings_are_refused_naming_the_fix():
    with pytest.raises(ConfigError, match="leave weighting devices"):
        make_config(WeightedFedRevive)
    with pytest.raises(ConfigError, match="use devices, samples"):
        make_config(OddWeighting)
