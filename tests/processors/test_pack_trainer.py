"""A pack's cross-run groups (``processors.pack_trainer``): devices of two runs (two seeds, one processor each, the
same version number holding different weights) trained in one vectorised call equal each run's devices trained in
a group of their own run, to the engine's stated tolerance (atol 1e-5 on a diff in float32,
tests/processors/test_mixed_settings.py: the engines differ only in summation order), and each run's devices start
from their own run's weights (the runs number their versions alike)."""

from __future__ import annotations

import numpy as np
import pytest

from processors.data.config import DataConfig
from processors.models import initial_model
from processors.pack_trainer import step_classes, train_runs
from processors.task_processor import TrainingTaskProcessor
from processors.training_config import TrainingConfig
from simulation.leaf_channels import DeviceTask, GatewayChannel

ATOL = 1e-5
VERSION = 2  # both runs' version 2, different weights
RUN0 = ["site-1#0", "site-1#1"]
RUN1 = ["site-1#0", "site-2#3"]


def processor(seed: int, lr: float = 0.05) -> TrainingTaskProcessor:
    return TrainingTaskProcessor(
        data=DataConfig(synthetic_size=500, subset_size=16).to_dict(),
        training=TrainingConfig(
            compute_device="cpu", local_iters=2, local_batch_size=8, optimizer="sgd", local_lr=lr
        ).to_dict(),
        seed=seed,
    )


@pytest.fixture(scope="module")
def weights():
    w0 = {k: v.numpy() for k, v in initial_model("cifar10_convnet", 0).state_dict().items()}
    w1 = {k: v.numpy() for k, v in initial_model("cifar10_convnet", 1).state_dict().items()}
    return w0, w1


def assert_close(got: list[dict], want: list[dict]) -> None:
    for g, w in zip(got, want, strict=True):
        assert sorted(g) == sorted(w)
        for name in w:
            np.testing.assert_allclose(g[name], w[name], rtol=0, atol=ATOL, err_msg=name)


def test_a_cross_run_groups_diffs_equal_each_runs_own_group_and_start_from_its_own_runs_weights(weights):
    w0, w1 = weights
    own0 = processor(3).train_group(RUN0, [w0, w0], [VERSION] * 2)
    own1 = processor(4).train_group(RUN1, [w1, w1], [VERSION] * 2)
    p0, p1 = processor(3), processor(4)
    cross = train_runs([(p0, RUN0, [w0, w0], [VERSION] * 2, None), (p1, RUN1, [w1, w1], [VERSION] * 2, None)])
    assert_close(cross[0], own0)
    assert_close(cross[1], own1)
    # not vacuous: run 1's devices from run 0's weights of the same version move otherwise
    from_w0 = processor(4).train_group(RUN1, [w0, w0], [VERSION] * 2)
    gap = max(float(np.abs(from_w0[0][k] - own1[0][k]).max()) for k in own1[0])
    assert gap > 1e-3


def test_runs_of_different_learning_rates_share_a_step_and_keep_their_own(weights):
    w0, w1 = weights
    p0, p1 = processor(3, lr=0.05), processor(4, lr=0.01)
    assert step_classes({0: p0, 1: p1}) == {0: 0, 1: 0}
    own1 = processor(4, lr=0.01).train_group(RUN1, [w1, w1], [VERSION] * 2)
    cross = train_runs([(p0, RUN0, [w0, w0], [VERSION] * 2, None), (p1, RUN1, [w1, w1], [VERSION] * 2, None)])
    assert_close(cross[1], own1)


def test_runs_of_different_batch_sizes_do_not_share_a_step():
    other = TrainingTaskProcessor(
        data=DataConfig(synthetic_size=500, subset_size=16).to_dict(),
        training=TrainingConfig(compute_device="cpu", local_iters=2, local_batch_size=4, optimizer="sgd").to_dict(),
        seed=5,
    )
    assert step_classes({0: processor(3), 1: processor(4), 2: other}) == {0: 0, 1: 0, 2: 2}


def test_the_channel_hands_each_task_its_own_runs_diff_in_task_order(weights):
    w0, w1 = weights
    p0, p1 = processor(3), processor(4)
    channel = GatewayChannel(None, p0, "site-1", 4, run_trainers={1: p1}, lock_step=True)
    assert channel.run_classes == {0: 0, 1: 0}
    tasks = [
        DeviceTask(RUN1[0], 7, VERSION, w1, release=1, run=1),
        DeviceTask(RUN0[0], 7, VERSION, w0, release=1, run=0),
        DeviceTask(RUN1[1], 8, VERSION, w1, release=1, run=1),
        DeviceTask(RUN0[1], 8, VERSION, w0, release=1, run=0),
    ]
    got = channel.train(tasks)
    own0 = processor(3).train_group(RUN0, [w0, w0], [VERSION] * 2)
    own1 = processor(4).train_group(RUN1, [w1, w1], [VERSION] * 2)
    assert_close(got, [own1[0], own0[0], own1[1], own0[1]])
