"""The vectorised engine (processors.training_vectorized.train_group) must give the same per-device diffs as K
separate per-device ``train_local`` calls; only floating-point summation order differs (grouped vs. plain
convolutions, masked-sum vs. mean loss), hence atol 1e-5.

Adam tests use the reference lr 3e-4: Adam divides by sqrt(v) + 1e-8, so a gradient element that is pure
cancellation noise (~1e-9) moves by up to ~lr per step whatever its sign, and summation-order noise there shows
up as a diff error of order lr (seen: 1.5e-5 at lr 3e-3 in 2 of 48,000 fc1 weights; ~1e-6 at lr 3e-4)."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest
import torch
import torch.nn as nn

from processors.data.sources import make_synthetic, normalize
from processors.models import MODEL_CLASSES, build_model
from processors.training import TrainingConfig, train_local, worker_model
from processors.training_vectorized import train_group
from tests.conftest import assert_trained_alike, make_processor, nudged_alone

MODEL = "cifar10_convnet"
CPU = torch.device("cpu")
ATOL = 1e-5


@pytest.fixture(scope="module")
def dataset():
    return make_synthetic(300, 100, seed=3)


@pytest.fixture(scope="module")
def global_params():
    torch.manual_seed(7)
    return {name: p.detach().clone() for name, p in build_model(MODEL).state_dict().items()}


def _device_data(dataset, sizes):
    out, start = [], 0
    for n in sizes:
        out.append((dataset.x_train[start : start + n], dataset.y_train[start : start + n]))
        start += n
    return out


def _generators(k, seed=11):
    return [torch.Generator().manual_seed(seed + i) for i in range(k)]


def _assert_matches_per_device(global_params, data, cfg, model_name=MODEL, atol=ATOL):
    model = worker_model(model_name, CPU)
    expected = [
        train_local(model, global_params, x, y, cfg, g) for (x, y), g in zip(data, _generators(len(data)), strict=True)
    ]
    got = train_group(model_name, global_params, data, cfg, _generators(len(data)), CPU)
    assert len(got) == len(expected)
    for want, have in zip(expected, got, strict=True):
        assert want.keys() == have.keys()
        for name in want:
            assert have[name].dtype == np.float32 and have[name].shape == want[name].shape
            np.testing.assert_allclose(have[name], want[name], rtol=0, atol=atol, err_msg=name)
        # the devices really trained, so the comparison is not vacuous
        assert max(float(np.abs(d).max()) for d in want.values()) > 20 * atol
    return expected


def test_sgd_momentum_group_equals_per_device_training_with_unequal_sample_counts(dataset, global_params):
    cfg = TrainingConfig(local_iters=6, local_batch_size=32, local_lr=0.05, optimizer="sgd", momentum=0.9)
    _assert_matches_per_device(global_params, _device_data(dataset, [40, 64, 100]), cfg)


def test_adam_group_equals_per_device_training_with_unequal_sample_counts(dataset, global_params):
    cfg = TrainingConfig(local_iters=6, local_batch_size=32, local_lr=3e-4, optimizer="adam")
    _assert_matches_per_device(global_params, _device_data(dataset, [40, 64, 100]), cfg)


def test_device_smaller_than_batch_is_padded_and_masked_to_its_own_mean_loss(dataset, global_params):
    # 12 samples -> batches of 12 for that device while the others use 32: the padding must not leak into it
    cfg = TrainingConfig(local_iters=4, local_batch_size=32, local_lr=3e-4, optimizer="adam")
    _assert_matches_per_device(global_params, _device_data(dataset, [12, 40, 100]), cfg)


def test_plain_sgd_without_momentum_matches_per_device_training(dataset, global_params):
    cfg = TrainingConfig(local_iters=3, local_batch_size=16, local_lr=0.05, optimizer="sgd")
    _assert_matches_per_device(global_params, _device_data(dataset, [20, 50]), cfg)


def test_generators_are_advanced_exactly_as_per_device_training_advances_them(dataset, global_params):
    cfg = TrainingConfig(local_iters=5, local_batch_size=32, optimizer="adam")
    data = _device_data(dataset, [40, 100])
    model = worker_model(MODEL, CPU)
    per_device = _generators(2)
    for (x, y), g in zip(data, per_device, strict=True):
        train_local(model, global_params, x, y, cfg, g)
    grouped = _generators(2)
    train_group(MODEL, global_params, data, cfg, grouped, CPU)
    for a, b in zip(per_device, grouped, strict=True):
        assert torch.equal(torch.randint(0, 2**30, (4,), generator=a), torch.randint(0, 2**30, (4,), generator=b))


def test_augmented_groups_equal_per_device_training_and_differ_from_plain_training(dataset, global_params):
    """Crops and flips come from each device's own generator after its schedule, in either engine."""
    cfg = TrainingConfig(local_iters=4, local_batch_size=16, local_lr=0.05, optimizer="sgd", augment=True)
    data = _device_data(dataset, [12, 40, 64])
    augmented = _assert_matches_per_device(global_params, data, cfg)
    plain = _assert_matches_per_device(global_params, data, TrainingConfig(**(cfg.to_dict() | {"augment": False})))
    assert all(not np.allclose(a["fc1.weight"], p["fc1.weight"]) for a, p in zip(augmented, plain, strict=True))


def test_the_papers_resnet18_trains_in_the_vectorised_engine_as_per_device(dataset):
    """The FedRevive references' ResNet-18 (trackers, no BatchNorm): its trackers' per-device statistics too."""
    torch.manual_seed(5)
    params = {name: t.detach().clone() for name, t in build_model("resnet18").state_dict().items()}
    # SGD: Adam moves a pure-noise gradient element by ~lr whatever its sign (see the module docstring)
    cfg = TrainingConfig(model="resnet18", local_iters=2, local_batch_size=4, local_lr=0.05, optimizer="sgd")
    diffs = _assert_matches_per_device(params, _device_data(dataset, [4, 6]), cfg, "resnet18", atol=2e-5)
    assert "layer2.0.shortcut.1.running_var" in diffs[0]  # the shortcut's tracker, as in the references


def test_empty_group_returns_no_diffs(global_params):
    assert train_group(MODEL, global_params, [], TrainingConfig(), [], CPU) == []


class _BatchNormNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4, 10)

    def forward(self, x):
        return self.fc(self.bn(self.conv(x)).mean((2, 3)))


def test_model_with_batchnorm_buffers_raises_not_implemented_naming_per_device_engine(dataset, monkeypatch):
    monkeypatch.setitem(MODEL_CLASSES, "bn_test_net", _BatchNormNet)
    params = {name: p.detach() for name, p in _BatchNormNet().named_parameters()}
    with pytest.raises(NotImplementedError, match="per-device engine"):
        train_group("bn_test_net", params, _device_data(dataset, [40]), TrainingConfig(), _generators(1), CPU)


def test_task_processor_group_gives_each_device_the_diff_it_would_get_alone():
    proc = make_processor(synthetic_size=1000, subset_size=40, local_iters=3, local_batch_size=16)
    torch.manual_seed(2)  # fixed weights, not whatever ran before in the process
    weights = {k: v.numpy() for k, v in build_model(MODEL).state_dict().items()}
    devices = ["site-1#0", "site-1#1", "site-2#5"]
    grouped = proc.train_group(devices, weights, version=3)
    for device_id, diff in zip(devices, grouped, strict=True):
        # Adam in float32: equal up to summation order, or no further apart than rounding moves it on a draw that
        # rounding tips (assert_trained_alike says why)
        alone = proc.train(device_id, weights, version=3)
        assert_trained_alike(diff, alone, partial(nudged_alone, proc, device_id, weights, 3), rtol=0, atol=ATOL)


def _versions(global_params, count: int) -> list[dict[str, torch.Tensor]]:
    """``count`` model versions: the global weights moved apart, as the server's next versions would be."""
    out = [global_params]
    for v in range(1, count):
        g = torch.Generator().manual_seed(100 + v)
        out.append({k: t + 0.05 * torch.randn(t.shape, generator=g) for k, t in global_params.items()})
    return out


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_a_group_of_several_versions_gives_each_device_the_diff_it_gets_alone_from_its_own_version(
    dataset, global_params, optimizer
):
    """An asynchronous release: devices of three versions in one group, each starting from its own version."""
    settings = {"adam": {"local_lr": 3e-4}, "sgd": {"local_lr": 0.05, "momentum": 0.9}}[optimizer]
    cfg = TrainingConfig(local_iters=5, local_batch_size=32, optimizer=optimizer, **settings)
    versions = _versions(global_params, 3)
    of_device = [versions[v] for v in (0, 2, 1, 2)]
    data = _device_data(dataset, [40, 64, 12, 100])
    model = worker_model(MODEL, CPU)
    alone = [
        train_local(model, params, x, y, cfg, g)
        for params, (x, y), g in zip(of_device, data, _generators(len(data)), strict=True)
    ]
    mixed = train_group(MODEL, of_device, data, cfg, _generators(len(data)), CPU)
    from_first = train_group(MODEL, versions[0], data, cfg, _generators(len(data)), CPU)
    for i, (want, have) in enumerate(zip(alone, mixed, strict=True)):
        assert want.keys() == have.keys()
        for name in want:
            np.testing.assert_allclose(have[name], want[name], rtol=0, atol=ATOL, err_msg=f"device {i}: {name}")
    # not vacuous: a device of another version trains to another diff than it would from the first version
    assert not np.allclose(mixed[1]["fc1.weight"], from_first[1]["fc1.weight"], atol=20 * ATOL)


def test_a_group_handed_one_dict_per_device_of_one_version_is_the_broadcast_group_bit_for_bit(dataset, global_params):
    """A synchronous round's group is handed the same weights once per device: it takes the broadcast path."""
    cfg = TrainingConfig(local_iters=3, local_batch_size=32, optimizer="adam")
    data = _device_data(dataset, [40, 64, 100])
    broadcast = train_group(MODEL, global_params, data, cfg, _generators(3), CPU)
    per_device = train_group(MODEL, [global_params] * 3, data, cfg, _generators(3), CPU)
    for a, b in zip(broadcast, per_device, strict=True):
        for name in a:
            np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def test_task_processor_trains_a_release_of_several_versions_as_each_device_alone():
    """The leaf gateway's entry point: each device from the weights of its own version (its own generator too)."""
    proc = make_processor(synthetic_size=1000, subset_size=40, local_iters=3, local_batch_size=16)
    torch.manual_seed(1)
    first = {k: v.numpy() for k, v in build_model(MODEL).state_dict().items()}
    second = {k: v + np.float32(0.05) for k, v in first.items()}
    devices, versions = ["site-1#0", "site-1#1", "site-2#5"], [3, 4, 3]
    weights = [first if v == 3 else second for v in versions]
    grouped = proc.train_devices(devices, weights, versions)
    for device_id, w, v, diff in zip(devices, weights, versions, grouped, strict=True):
        alone = proc.train(device_id, w, version=v)
        for k in alone:
            # 3e-5: Adam divides by the root of tiny second moments, so summation-order noise in a near-zero gradient
            # grows to a few percent of one lr-sized step (2 of 10,080 elements here); a wrong version's weights
            # (0.05 apart) differ by orders of magnitude more, as the last line checks
            np.testing.assert_allclose(diff[k], alone[k], rtol=0, atol=3 * ATOL, err_msg=k)
    assert not np.allclose(grouped[1]["fc1.weight"], proc.train("site-1#1", first, version=3)["fc1.weight"])


# -- unequal devices (--local-epochs): step counts and tail batches differ within a group -------------------------


@pytest.mark.parametrize(
    "cfg",
    [
        TrainingConfig(local_epochs=1, local_batch_size=16),
        TrainingConfig(local_epochs=1, local_batch_size=16, optimizer="sgd", momentum=0.9, local_lr=0.05),
        TrainingConfig(local_epochs=1, local_batch_size=16, augment=True),
    ],
    ids=["adam", "sgd-momentum", "augment"],
)
def test_unequal_step_counts_match_each_device_alone(dataset, global_params, cfg):
    """Devices of 5, 16, 37 and 70 samples take 1, 1, 3 and 5 steps an epoch (tail batches kept): trained in one
    group, the devices that finish early are frozen, and each equals the device trained alone."""
    data = _device_data(dataset, [37, 5, 70, 16])
    assert [cfg.steps(len(y)) for _, y in data] == [cfg.local_epochs * s for s in (3, 1, 5, 1)]
    _assert_matches_per_device(global_params, data, cfg)


def test_unequal_step_counts_report_each_device_last_step(dataset, global_params):
    """The last-step reports of a device that finished early come from its own last step, as train_local's."""
    cfg = TrainingConfig(local_epochs=1, local_batch_size=16)
    data = _device_data(dataset, [40, 10])
    model = worker_model(MODEL, CPU)
    alone = []
    for (x, y), g in zip(data, _generators(2), strict=True):
        alone.append({})
        train_local(model, global_params, x, y, cfg, g, last_step=alone[-1])
    grouped: list = []
    train_group(MODEL, global_params, data, cfg, _generators(2), CPU, last_step=grouped)
    for want, have in zip(alone, grouped, strict=True):
        assert want.keys() == have.keys()
        for name in want:
            assert float(have[name]) == pytest.approx(float(want[name]), abs=1e-5)


def test_a_finished_device_does_not_move(dataset, global_params):
    """Frozen means frozen: a one-step device's diff in a group whose other device trains 3 steps more is its own
    one-step diff (Adam's moments would otherwise keep moving it on zero gradients)."""
    cfg = TrainingConfig(local_epochs=1, local_batch_size=32)
    data = _device_data(dataset, [8, 100])
    one_step = train_local(worker_model(MODEL, CPU), global_params, *data[0], cfg, _generators(1)[0])
    got = train_group(MODEL, global_params, data, cfg, _generators(2), CPU)
    for name in one_step:
        np.testing.assert_allclose(got[0][name], one_step[name], atol=ATOL)


# -- float64: the engines' one difference, summation order, shrinks to rounding --------------------------------------

F64_CASES = {  # small batches: float64 convolutions are slow on the CPU
    "adam-padded-versions": (TrainingConfig(local_iters=3, local_batch_size=8, local_lr=3e-4), [5, 8, 12], True),
    "adam-unequal-steps": (TrainingConfig(local_epochs=1, local_batch_size=8), [3, 12, 20], False),
    "sgd-momentum-augment-unequal-steps": (
        TrainingConfig(local_epochs=1, local_batch_size=8, local_lr=0.05, optimizer="sgd", momentum=0.9, augment=True),
        [5, 20, 12],
        False,
    ),
}


@pytest.fixture
def float64_model():
    """The worker's model in float64 for one test (and back to float32 after it)."""
    model = worker_model(MODEL, CPU)
    yield model.double()
    model.float()


@pytest.mark.parametrize("case", list(F64_CASES))
def test_in_float64_a_group_gives_each_device_its_diff_alone_to_rounding(dataset, global_params, float64_model, case):
    """In float32 the engines' summation orders can decide a ReLU: a pre-activation within rounding of 0 (seen: 2e-8
    against a median of 0.035, one fc1 unit for one sample, in 1 of 300 weight draws) falls on one side in one
    engine and on the other in the other, and Adam, which moves each weight by about lr whatever the size of its
    gradient, turns that into diffs up to ~2 lr apart on that unit's weights (tests/common/test_profiles.py). In
    float64 both engines compute the same arithmetic with 1e-16 rounding (seen: at most 4e-16), so they must agree
    to 1e-10: every real difference (another batch or augmentation, learning rate, Adam constant, a padded sample
    in a loss, a finished device moving, another version's weights, trackers' statistics) is far above it."""
    cfg, sizes, versions = F64_CASES[case]
    start = {k: v.double() for k, v in global_params.items()}
    starts = [start if i % 2 == 0 or not versions else v for i, v in enumerate(_versions(start, len(sizes)))]
    data = _device_data(dataset, sizes)

    def prepare(x):
        return normalize(x).double()

    alone = [
        train_local(float64_model, s, x, y, cfg, g, prepare=prepare)
        for s, (x, y), g in zip(starts, data, _generators(len(data)), strict=True)
    ]
    group = train_group(MODEL, starts if versions else start, data, cfg, _generators(len(data)), CPU, prepare=prepare)
    for i, (want, have) in enumerate(zip(alone, group, strict=True)):
        assert want.keys() == have.keys()
        for name in want:
            assert have[name].dtype == np.float64
            np.testing.assert_allclose(have[name], want[name], rtol=0, atol=1e-10, err_msg=f"device {i}: {name}")
        assert np.abs(want["fc1.weight"]).max() > 1e-4  # trained: the comparison is not vacuous
