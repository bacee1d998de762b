"""Data statistics (BatchNorm running statistics, statistic trackers) reach the server: a device reports how its
data moved them, the server's model evaluates and distils with them.

The central check runs the job's own pieces on ResNet-18: the task processor trains one device, the server's
model manager makes the next version from its update, and the server's evaluator scores that version. Its
accuracy and loss must equal the trained device model's own, because both hold the same weights and statistics.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn
from nvflare.apis.event_type import EventType
from nvflare.apis.fl_component import FLComponent

from aggregation.global_model import GlobalModel
from common.protocol import DeviceUpdate
from evaluation.evaluator import GlobalModelEvaluator, load_into
from evaluation.events import VERSION_EVALUATED, VERSION_RECORD
from fedrevive.feature_stats import FeatureStats
from processors.data.config import DataConfig
from processors.data.sources import load_dataset
from processors.models import initial_model, statistic_names
from processors.training import evaluate, worker_model
from tests.conftest import make_processor
from tests.fakes.engine import EventEngine

SYNTHETIC_SIZE = 1000  # 200 test images: ResNet-18 evaluates them four times
DATA = DataConfig(synthetic_size=SYNTHETIC_SIZE, subset_size=350).to_dict()
TINY = f"{__name__}:TinyBatchNormNet"
FEDREVIVE = "aggregation.fedrevive_strategy:FedReviveStrategy"
MEAN = "aggregation.buffered_mean:BufferedMean"


class TinyBatchNormNet(nn.Module):
    """Conv, BatchNorm, pooling, linear: the smallest model with data statistics."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.linear = nn.Linear(4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(torch.relu(self.bn(self.conv(x))).mean(dim=(2, 3)))


class EvaluationListener(FLComponent):
    def __init__(self):
        super().__init__()
        self.records: dict[int, dict] = {}

    def handle_event(self, event_type: str, fl_ctx) -> None:
        if event_type == VERSION_EVALUATED:
            record = fl_ctx.get_prop(VERSION_RECORD)
            self.records[record["version"]] = record


def _numpy_state(model: nn.Module) -> dict[str, np.ndarray]:
    return {k: v.detach().cpu().numpy().copy() for k, v in model.state_dict().items()}


@pytest.mark.slow  # ResNet-18 trained and evaluated four times on 2 cores: most of the fast subset's time
def test_server_model_accuracy_equals_the_device_model_accuracy_on_the_same_weights_and_statistics(monkeypatch):
    import processors.compute_context as cc

    monkeypatch.setattr(cc, "_global_params", {})  # the per-process weights cache: this test's model is its own
    initial = _numpy_state(initial_model("resnet18_bn", 0))
    processor = make_processor(
        synthetic_size=SYNTHETIC_SIZE, model="resnet18_bn", local_iters=5, local_batch_size=32, local_lr=1e-3
    )
    diff = processor.train("site-1#0", initial, version=1)
    device_model = worker_model("resnet18_bn", torch.device("cpu"))  # the trained model, as the device holds it
    data = load_dataset(DataConfig(**DATA).spec(0))
    device_scores = evaluate(device_model, data.x_test, data.y_test, prepare=data.prepare)

    manager = GlobalModel(MEAN, strategy_args={"global_lr": 1.0}, model="resnet18_bn")
    listener = EvaluationListener()
    engine = EventEngine(
        {
            "model_manager": manager,
            "listener": listener,
            "evaluator": GlobalModelEvaluator("resnet18_bn", DATA, compute_device="cpu", max_model_version=2),
        }
    )
    ctx = engine.new_context()
    engine.fire_event(EventType.START_RUN, ctx)
    manager.start(initial, 1, ctx)
    manager.add_update(DeviceUpdate("site-1#0", 1, 1, diff), 0, ctx)
    manager.make_version(2, 1.0, ctx)
    engine.fire_event(EventType.END_RUN, ctx)  # waits for the queued evaluations

    server = manager.current_weights
    for name, value in device_model.state_dict().items():
        if value.is_floating_point():
            np.testing.assert_allclose(server[name], value.numpy(), rtol=1e-5, atol=1e-6, err_msg=name)
    # the mean cross-entropy too, not only the accuracy: five steps leave the model near chance, where two models'
    # accuracies can be equal by coincidence and their losses are not. The record rounds it to 5 decimals, and the
    # evaluator's thread count may move its last bits: 1e-5.
    assert listener.records[2]["accuracy"] == round(device_scores.accuracy, 5)
    assert listener.records[2]["loss"] == pytest.approx(device_scores.loss, abs=1e-5)
    # the failure this guards against: the same weights with default statistics (mean 0, variance 1)
    default_stats = server | {k: initial[k] for k in statistic_names(device_model)}
    net = load_into(initial_model("resnet18_bn", 0), default_stats)
    assert evaluate(net, data.x_test, data.y_test, prepare=data.prepare).loss != pytest.approx(
        device_scores.loss, abs=1e-3
    )


def _update(device: str, base_version: int, diff: dict) -> DeviceUpdate:
    return DeviceUpdate(device, 1, base_version, {k: np.asarray(v, np.float32) for k, v in diff.items()})


def _stats_diff(weights: dict, mean: float, var: float) -> dict:
    """A diff that moves parameters by 1 and the statistics to (mean, var)."""
    return {
        k: (
            np.float32(mean) - v
            if k == "bn.running_mean"
            else np.float32(var) - v
            if k == "bn.running_var"
            else np.ones_like(v)
        )
        for k, v in weights.items()
        if k != "bn.num_batches_tracked"
    }


def test_statistics_are_the_mean_of_the_devices_own_not_a_scaled_step_and_stale_bases_count():
    engine = EventEngine({})
    ctx = engine.new_context()
    manager = GlobalModel(MEAN, strategy_args={"global_lr": 0.5}, model=TINY)
    assert manager.statistics == {"bn.running_mean", "bn.running_var"}
    v1 = _numpy_state(TinyBatchNormNet())
    manager.start(v1, 1, ctx)
    manager.add_update(_update("d#0", 1, _stats_diff(v1, 2.0, 4.0)), 0, ctx)
    manager.make_version(2, 1.0, ctx)
    v2 = manager.current_weights
    np.testing.assert_array_equal(v2["bn.running_var"], np.full(4, 4.0, np.float32))  # not 1 + 0.5 x 3
    np.testing.assert_array_equal(v2["conv.weight"], v1["conv.weight"] + np.float32(0.5))
    # a stale device (trained version 1) and a fresh one (version 2): each counts with its own statistics
    manager.add_update(_update("d#1", 1, _stats_diff(v1, 1.0, 0.5)), 1, ctx)
    manager.add_update(_update("d#2", 2, _stats_diff(v2, 3.0, 1.5)), 0, ctx)
    manager.make_version(3, 2.0, ctx)
    np.testing.assert_array_equal(manager.current_weights["bn.running_mean"], np.full(4, 2.0, np.float32))
    np.testing.assert_array_equal(manager.current_weights["bn.running_var"], np.full(4, 1.0, np.float32))
    # adding the stale device's step (0.5 - 1 = -0.5) to version 2's variance would have given 3.5, and a
    # larger gap a negative variance; the mean of variances stays positive


class PlainNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 10)


def test_a_model_without_statistics_aggregates_every_weight_as_a_step():
    assert GlobalModel(MEAN, model=f"{__name__}:PlainNet").statistics == frozenset()
    convnet = GlobalModel(MEAN, model="cifar10_convnet")
    assert convnet.statistics == {f"track{i}.running_{s}" for i in (1, 2) for s in ("mean", "var")}


@pytest.mark.parametrize("engine", ["per-device", "vectorized"])
def test_convnet_devices_report_their_trackers_statistics_of_real_data(engine):
    initial = _numpy_state(initial_model("cifar10_convnet", 0))
    processor = make_processor(local_iters=5)
    if engine == "per-device":
        diff = processor.train("site-1#0", initial, version=7)
    else:
        diff = processor.train_group(["site-1#0", "site-1#1"], initial, version=7)[0]
    for name in ("track1", "track2"):
        trained_var = initial[f"{name}.running_var"] + diff[f"{name}.running_var"]
        assert np.abs(diff[f"{name}.running_mean"]).max() > 1e-3 and (trained_var > 0).all()


def test_fedrevive_teachers_carry_their_clients_statistics_as_feature_targets(tmp_path):
    estimate = {"fedrevive": {"class_proportions": "estimate"}}  # this update brings no label histogram
    manager = GlobalModel(FEDREVIVE, estimate, model=TINY, compute_device="cpu", results_dir=str(tmp_path))
    engine = EventEngine({"model_manager": manager})
    ctx = engine.new_context()
    engine.fire_event(EventType.START_RUN, ctx)
    v1 = _numpy_state(TinyBatchNormNet())
    manager.start(v1, 1, ctx)
    manager.add_update(_update("d#0", 1, _stats_diff(v1, 2.0, 4.0)), 0, ctx)
    (teacher,) = list(manager.server_strategy.distiller.teachers)
    assert torch.equal(teacher.model.bn.running_mean, torch.full((4,), 2.0))
    assert torch.equal(teacher.model.bn.running_var, torch.full((4,), 4.0))
    with FeatureStats(teacher.model) as stats:
        teacher.model(torch.randn(2, 3, 32, 32))
    target_mean, target_var = stats.references()["bn"]
    assert torch.equal(target_mean, torch.full((4,), 2.0)) and torch.equal(target_var, torch.full((4,), 4.0))


@pytest.mark.parametrize("model", ["resnet18", "resnet18_bn", "cifar10_convnet", TINY])
def test_statistic_names_are_the_floating_point_buffers(model):
    from processors.models import build_model

    net = build_model(model)
    names = statistic_names(net)
    assert names and all(n.endswith(("running_mean", "running_var")) for n in names)
    assert not any(n.endswith("num_batches_tracked") for n in names)
