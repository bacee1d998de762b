"""--local-epochs: a device's local work (steps, batches, samples) follows its own data size; --local-iters keeps
today's schedule."""

from __future__ import annotations

import pytest
import torch

from common.choices import ConfigError
from processors.training import TrainingConfig, batch_schedule


@pytest.mark.parametrize("n, steps", [(1, 2), (16, 2), (17, 4), (40, 6), (64, 8)])
def test_epochs_keep_the_tail_batch_and_cover_every_sample_each_epoch(n, steps):
    cfg = TrainingConfig(local_epochs=2, local_batch_size=16)
    schedule = batch_schedule(n, cfg, torch.Generator().manual_seed(0))
    assert len(schedule) == steps == cfg.steps(n)
    per_epoch = steps // 2
    for e in range(2):
        epoch = torch.cat(schedule[e * per_epoch : (e + 1) * per_epoch])
        assert sorted(epoch.tolist()) == list(range(n))  # each sample once per epoch, the tail included
    assert [len(b) for b in schedule[:per_epoch]] == [16] * (n // 16) + ([n % 16] if n % 16 else [])
    assert cfg.work(n) == 2 * n == sum(len(b) for b in schedule)


def test_local_iters_work_is_unchanged_whatever_the_device_holds():
    cfg = TrainingConfig(local_iters=5, local_batch_size=16)
    for n in (3, 16, 100):
        schedule = batch_schedule(n, cfg, torch.Generator().manual_seed(0))
        assert len(schedule) == cfg.steps(n) == 5
        assert cfg.work(n) == 5 * min(16, n) == sum(len(b) for b in schedule)


def test_one_unit_of_local_work_only():
    with pytest.raises(ConfigError, match="not both"):
        TrainingConfig(local_epochs=2, local_iters=10)
    with pytest.raises(ConfigError, match="--local-epochs"):
        TrainingConfig(local_epochs=-1)
    assert TrainingConfig(local_epochs=3).local_epochs == 3
