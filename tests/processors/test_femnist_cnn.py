"""LEAF's FEMNIST CNN: LEAF's layers and shapes, trained on LEAF-format FEMNIST files by both engines to the same
diffs (one device at a time, and grouped under ``torch.func.vmap``), learning above chance at its preset (LEAF's
SGD at 0.004 on batches of 10), and the planner's choice of engine for it on the CPU."""

from __future__ import annotations

import pytest
import torch

from processors.data.config import DataConfig
from processors.data.sources import load_dataset
from processors.model_names import model_preset
from processors.models import build_model, initial_model
from processors.models.femnist_cnn import FemnistCNN
from processors.training import TrainingConfig, evaluate_accuracy, train_local
from tests.conftest import assert_both_engines_agree
from tests.fakes.user_formats import write_leaf_femnist


def test_the_femnist_cnn_has_leafs_layers_and_scores_62_classes():
    model = build_model("femnist_cnn")
    assert isinstance(model, FemnistCNN)
    # LEAF's models/femnist/cnn.py: 5 x 5 convolutions of 32 and 64 filters, padding "same", 2 x 2 pooling of
    # stride 2, a dense layer of 2048 units on the 7 x 7 x 64 features, 62 logits
    assert model.conv1.weight.shape == (32, 1, 5, 5) and model.conv2.weight.shape == (64, 32, 5, 5)
    assert model.conv1.padding == model.conv2.padding == (2, 2)
    assert model.fc1.weight.shape == (2048, 7 * 7 * 64) and model.fc2.weight.shape == (62, 2048)
    assert sum(p.numel() for p in model.parameters()) == 6_603_710
    assert model(torch.zeros(3, 1, 28, 28)).shape == (3, 62)
    a, b = initial_model("femnist_cnn", 4), initial_model("femnist_cnn", 4)
    assert all(torch.equal(p, q) for p, q in zip(a.state_dict().values(), b.state_dict().values(), strict=True))


@pytest.fixture(scope="module")
def leaf_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("leaf")
    write_leaf_femnist(root, users=12)
    return root


def test_both_engines_train_a_femnist_group_to_each_devices_own_diff(leaf_root):
    """The task processor's two paths on LEAF's FEMNIST (1 x 28 x 28, 62 classes): a group (the vectorised engine,
    convolutions and max-pooling under vmap) and each device alone give the same diffs, up to summation order."""
    data = DataConfig(dataset="femnist", data_root=str(leaf_root), subset_size=24)
    training = TrainingConfig(
        model="femnist_cnn", local_iters=3, local_batch_size=8, local_lr=0.05, optimizer="sgd", compute_device="cpu"
    )
    assert_both_engines_agree(data, training, ["site-1#0", "site-2#3"])


@pytest.mark.slow  # real training of a 6.6M-parameter CNN: seconds, not milliseconds
def test_the_femnist_cnn_learns_leaf_files_above_chance_at_its_preset(leaf_root):
    data = load_dataset(DataConfig(dataset="femnist", data_root=str(leaf_root)).spec(0))
    assert data.input_shape == (1, 28, 28) and data.num_classes == 62
    preset = model_preset("femnist_cnn")
    assert preset == {"optimizer": "sgd", "local_lr": 0.004, "local_batch_size": 10}
    model = initial_model("femnist_cnn", 0)
    start = {k: v.detach().clone() for k, v in model.state_dict().items()}
    before = evaluate_accuracy(model, data.x_test, data.y_test, prepare=data.prepare)
    cfg = TrainingConfig(model="femnist_cnn", local_iters=25, **preset)
    train_local(model, start, data.x_train, data.y_train, cfg, torch.Generator().manual_seed(0), prepare=data.prepare)
    after = evaluate_accuracy(model, data.x_test, data.y_test, prepare=data.prepare)
    # the files' 8 classes: chance is 0.125; seen 1.0 after these 25 steps
    assert after > 0.5 and after > before + 0.3, (before, after)


def test_auto_trains_it_one_device_at_a_time_on_the_cpu():
    """Its 102 MFLOP per training sample (mostly the second convolution and the 6.4M-weight dense layer) are over
    the planner's CPU limit for grouping, as for the other large models; a GPU groups it."""
    from simulation.planner import CPU_GROUP_MAX_MFLOPS, WorkerPlan, plan_engine, training_mflops

    mflops = training_mflops(build_model("femnist_cnn"), (1, 28, 28))
    assert mflops == pytest.approx(102.0, abs=1) and mflops > CPU_GROUP_MAX_MFLOPS
    cpu = WorkerPlan(2, "cpu", 16, 10**8, {}, "cpu", None)
    assert plan_engine(cpu, "auto", mflops_per_sample=mflops).engine == "per-device"
