"""Device-side training: the diff is trained minus received (parameters and BatchNorm statistics), on the chosen
device."""

import numpy as np
import pytest
import torch
import torch.nn as nn

from processors.device import resolve_device
from processors.models import build_model
from processors.training import TrainingConfig, batch_schedule, train_local
from tests.conftest import make_processor


def test_diff_equals_trained_minus_received(small_data):
    net = build_model("cifar10_convnet")
    received = {k: v.detach().clone() for k, v in net.state_dict().items()}
    x, y = small_data.x_train[:100], small_data.y_train[:100]
    diff = train_local(net, received, x, y, TrainingConfig(local_iters=3), torch.Generator().manual_seed(0))
    for name, p in net.named_parameters():
        np.testing.assert_allclose(diff[name], (p.detach() - received[name]).numpy(), rtol=0, atol=0)
        assert diff[name].dtype == np.float32
    assert any(np.abs(d).max() > 0 for d in diff.values())


def test_received_weights_are_not_modified_by_training(small_data):
    net = build_model("cifar10_convnet")
    received = {k: v.detach().clone() for k, v in net.state_dict().items()}
    before = {k: v.clone() for k, v in received.items()}
    train_local(
        net,
        received,
        small_data.x_train[:64],
        small_data.y_train[:64],
        TrainingConfig(local_iters=2),
        torch.Generator().manual_seed(0),
    )
    assert all(torch.equal(before[k], received[k]) for k in before)


def test_global_weights_on_another_device_are_refused(small_data):
    net = build_model("cifar10_convnet")
    received = {k: v.detach().to("meta") for k, v in net.state_dict().items()}
    with pytest.raises(ValueError, match="is on meta"):
        train_local(
            net, received, small_data.x_train[:64], small_data.y_train[:64], TrainingConfig(), torch.Generator()
        )


def _bn_net() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4 * 30 * 30, 10))


def test_batchnorm_statistics_diff_is_trained_minus_received_and_starts_from_the_global_statistics(small_data):
    net = _bn_net()
    received = {k: v.detach().clone() for k, v in net.state_dict().items()}
    received["1.running_mean"] = torch.full((4,), 5.0)  # the global model's statistics, not the net's own
    received["1.running_var"] = torch.full((4,), 3.0)
    diff = train_local(
        net,
        received,
        small_data.x_train[:64],
        small_data.y_train[:64],
        TrainingConfig(local_iters=2),
        torch.Generator().manual_seed(0),
    )
    assert "1.num_batches_tracked" not in diff  # a counter, not a statistic
    for name in ("1.running_mean", "1.running_var"):
        trained = net.get_buffer(name)
        np.testing.assert_array_equal(diff[name], (trained - received[name]).numpy())
        assert np.abs(diff[name]).max() > 0
    # two momentum-0.1 updates from 5.0 keep 0.81 of it: the device started from the received statistics
    assert float(net.get_buffer("1.running_mean").min()) > 0.81 * 5.0 - 1.0


def test_global_weights_without_batchnorm_statistics_are_refused_naming_the_fix(small_data):
    net = _bn_net()
    params_only = {k: v.detach().clone() for k, v in net.named_parameters()}
    with pytest.raises(ValueError, match="lack 1.running_mean.*whole state_dict"):
        train_local(
            net,
            params_only,
            small_data.x_train[:64],
            small_data.y_train[:64],
            TrainingConfig(local_iters=1),
            torch.Generator(),
        )


def test_batch_schedule_runs_exactly_local_iters_and_covers_samples_each_epoch():
    cfg = TrainingConfig(local_iters=7, local_batch_size=32)
    batches = batch_schedule(100, cfg, torch.Generator().manual_seed(0))
    assert len(batches) == 7 and all(len(b) == 32 for b in batches)
    assert len(set(torch.cat(batches[:3]).tolist())) == 96  # no repeats within an epoch


def test_explicit_cuda_without_cuda_is_an_error_not_a_cpu_fallback(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="asked for CUDA"):
        resolve_device("cuda")
    assert resolve_device("auto").type == "cpu"


def test_cuda_resolves_with_its_index_as_torch_memory_calls_need(monkeypatch):
    """A bare ``cuda`` made ``set_per_process_memory_fraction`` raise and ``cuda`` != ``cuda:0`` fail the engine's
    device check on the first GPU run (an H200): every device failed."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    for name, index in (("cuda", 0), ("cuda:0", 0), ("cuda:1", 1), ("auto", 0)):
        device = resolve_device(name)
        assert device == torch.device("cuda", index) and device.index == index, name


def test_full_float32_turns_tf32_off_in_convolutions_and_matrix_products():
    from processors.device import full_float32

    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    try:  # cuBLAS's flag is a property of torch's backend module: set and restored by hand
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = True
        full_float32()
        assert torch.backends.cudnn.allow_tf32 is False and torch.backends.cuda.matmul.allow_tf32 is False
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def test_processor_trains_on_the_device_it_is_given(small_data, monkeypatch):
    seen = []
    import processors.task_processor as tp

    real = tp.train_local

    def spy(net, params, x, y, *args):
        seen.append({next(net.parameters()).device.type, x.device.type, next(iter(params.values())).device.type})
        return real(net, params, x, y, *args)

    monkeypatch.setattr(tp, "train_local", spy)
    proc = make_processor(local_iters=2)
    weights = {k: v.numpy() for k, v in build_model("cifar10_convnet").state_dict().items()}
    diff = proc.train("site-1#0", weights, version=1)
    assert seen == [{"cpu"}]
    assert set(diff) == set(weights)


def test_failed_device_report_is_a_zero_weight_diff_that_leaves_the_mean_unchanged():
    from nvflare.apis.dxo import DXO, DataKind, from_dict
    from nvflare.apis.fl_context import FLContext
    from nvflare.edge.aggregators.model_update_dxo import ModelUpdateDXOAggregator
    from nvflare.edge.web.models.task_response import TaskResponse

    from common.protocol import DEVICE_ERROR_META, MAX_ERROR_CHARS
    from processors.models import build_model

    weights = {k: v.numpy() for k, v in build_model("cifar10_convnet").state_dict().items()}
    task = TaskResponse("OK", "job", 0, "t", "train", DXO(DataKind.WEIGHTS, weights).to_dict(), {})
    proc = make_processor(synthetic_size=500)
    failed = from_dict(proc.failed_result("site-1#3", task, "RuntimeError: " + "x" * 1000))
    assert failed.data["count"] == 0 and failed.data["dict"].keys() == weights.keys()
    error = failed.get_meta_prop(DEVICE_ERROR_META)  # why it failed, cut short: results stay small
    assert error.startswith("RuntimeError: xxx") and len(error) == MAX_ERROR_CHARS
    assert all(not v.any() for v in failed.data["dict"].values())

    aggregator = ModelUpdateDXOAggregator()
    real = {k: np.ones_like(v) for k, v in weights.items()}
    aggregator.accept(DXO(DataKind.WEIGHT_DIFF, {"dict": real}).to_shareable(), FLContext())
    aggregator.accept(failed.to_shareable(), FLContext())
    # the server divides the summed diffs by the summed counts: the failed device adds nothing to either
    assert aggregator.count == 1
    assert all(np.array_equal(aggregator.dict[k], real[k]) for k in weights)
