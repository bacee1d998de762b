"""The delay model: the FedRevive paper's distributions, seeded per device and task, identical in any order."""

import numpy as np
import pytest

from common.choices import ConfigError
from common.delays import DELAY_PRESETS, DelayConfig, DeviceDelays


def test_durations_are_a_pure_function_of_seed_device_and_task_number():
    delays = DeviceDelays(DELAY_PRESETS["paper"], seed=3)
    first = [delays.durations(f"site-1#{i}", n) for i in range(5) for n in range(3)]
    again = DeviceDelays(DELAY_PRESETS["paper"], seed=3)
    second = [again.durations(f"site-1#{i}", n) for i in reversed(range(5)) for n in reversed(range(3))]
    assert first == list(reversed(second))
    assert DeviceDelays(DELAY_PRESETS["paper"], seed=4).durations("site-1#0", 0) != first[0]


def test_paper_preset_draws_the_papers_distributions():
    delays = DeviceDelays(DELAY_PRESETS["paper"], seed=0)
    devices = [f"site-{i % 2 + 1}#{i}" for i in range(4000)]
    traits = [delays.device_traits(d) for d in devices]
    classes = np.bincount([k for k, _ in traits], minlength=3) / len(devices)
    np.testing.assert_allclose(classes, [0.25, 0.5, 0.25], atol=0.03)
    uploads = {u for _, u in traits}
    assert uploads == {0.15, 0.25}
    tasks = [delays.durations(d, 0) for d in devices[:2000]]
    assert all(t.download == 0.1 for t in tasks)
    for d, t in zip(devices, tasks, strict=False):
        mean = delays.device_traits(d)[1]
        assert mean - 0.02 <= t.upload <= mean + 0.02
    # exponential training: the mean of the class means (1.3 for this mix), a coefficient of variation near 1
    train = np.array([t.train for t in tasks])
    assert train.mean() == pytest.approx(1.3, rel=0.08)
    assert train.std() / train.mean() == pytest.approx(1.0, abs=0.12)


def test_a_device_keeps_its_speed_class_across_tasks():
    delays = DeviceDelays(DelayConfig(speed_means=(1.0, 100.0), speed_stds=(0.0, 0.0)), seed=0)
    for device in ("site-1#0", "site-2#7"):
        assert len({delays.durations(device, n).train for n in range(10)}) == 1


def test_no_heterogeneity_takes_no_time():
    assert DeviceDelays(DelayConfig(), seed=0).durations("site-1#0", 5).total == 0.0


def test_presets_can_be_overridden_and_are_validated():
    shifted = DelayConfig.preset("paper-shifted", download_delay=0.5)
    assert shifted.download_delay == 0.5 and shifted.speed_means == (0.1,)
    with pytest.raises(ConfigError, match="--delays 'fast'"):
        DelayConfig.preset("fast")
    with pytest.raises(ConfigError, match="exponential times have no std"):
        DelayConfig(speed_means=(1.0,), speed_stds=(0.1,), speed_distribution="exponential")
