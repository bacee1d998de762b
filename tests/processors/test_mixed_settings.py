"""Devices of different local settings in one vectorised group (``train_group``'s ``lrs`` and
``objective_values``), and the split of devices whose settings cannot share a step (``processors.step_groups``).

Tolerances, as for every grouped-against-alone comparison (tests/processors/test_training_vectorized.py): in
float32 the engines differ only in summation order (grouped vs. plain convolutions, masked-sum vs. mean loss) and,
with per-device settings, in one rounding of the update (the step scaled by a per-device column instead of a
scalar, fused or not), so each device's diff equals its lone run to atol 1e-5; Adam runs at the reference lr
3e-4 or below, where that noise stays ~1e-6. In float64 the same arithmetic rounds at 1e-16, so the engines must
agree to 1e-10, far below any real difference: a device given another device's lr or mu moves by 1e-3 or more
here (each test checks that the settings really change the diffs, so the comparison is not vacuous)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from examples.fedprox import ProximalTerm
from processors.data.sources import make_synthetic, normalize
from processors.models import build_model
from processors.step_groups import DeviceSettings, step_groups
from processors.training import TrainingConfig, train_local, worker_model
from processors.training_vectorized import train_group

MODEL = "cifar10_convnet"
CPU = torch.device("cpu")
ATOL = 1e-5
PROX = "examples.fedprox:ProximalTerm"


@pytest.fixture(scope="module")
def dataset():
    return make_synthetic(300, 100, seed=3)


@pytest.fixture(scope="module")
def global_params():
    torch.manual_seed(7)
    return {name: p.detach().clone() for name, p in build_model(MODEL).state_dict().items()}


def _device_data(dataset, sizes, same=False):
    """Devices of ``sizes`` samples, each its own slice of the data (``same``: all the first slice)."""
    out, start = [], 0
    for n in sizes:
        out.append((dataset.x_train[start : start + n], dataset.y_train[start : start + n]))
        start += 0 if same else n
    return out


def _generators(k, seed=11, same=False):
    return [torch.Generator().manual_seed(seed + (0 if same else i)) for i in range(k)]


def _alone(global_params, data, cfg, lrs, mus=None, prepare=normalize, model=None, starts=None, same=False):
    """Each device trained by the per-device engine with its own lr (and FedProx mu), from its own start."""
    model = model or worker_model(MODEL, CPU)
    out = []
    for i, ((x, y), g) in enumerate(zip(data, _generators(len(data), same=same), strict=True)):
        objective = ProximalTerm(mus[i]) if mus is not None else None
        start = starts[i] if starts is not None else global_params
        out.append(
            train_local(model, start, x, y, replace(cfg, local_lr=lrs[i]), g, prepare=prepare, objective=objective)
        )
    return out


def _assert_equal_to(have_all, want_all, atol):
    for i, (want, have) in enumerate(zip(want_all, have_all, strict=True)):
        assert want.keys() == have.keys()
        for name in want:
            np.testing.assert_allclose(have[name], want[name], rtol=0, atol=atol, err_msg=f"device {i}: {name}")


def _max_gap(a, b):
    return max(float(np.abs(a[name] - b[name]).max()) for name in a)


CASES = {  # (config, learning rates): Adam at or below the reference lr, SGD with and without momentum
    "adam": (TrainingConfig(local_iters=4, local_batch_size=32), [3e-4, 1e-4, 2e-4, 3e-4]),
    "sgd": (TrainingConfig(local_iters=4, local_batch_size=32, optimizer="sgd"), [0.05, 0.01, 0.1, 0.02]),
    "sgd-momentum": (
        TrainingConfig(local_iters=4, local_batch_size=32, optimizer="sgd", momentum=0.9),
        [0.05, 0.01, 0.1, 0.02],
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_mixed_lr_group_gives_each_device_its_lone_run_with_its_own_lr(dataset, global_params, case):
    cfg, lrs = CASES[case]
    data = _device_data(dataset, [40, 64, 12, 100])  # 12: padded and masked
    grouped = train_group(MODEL, global_params, data, cfg, _generators(4), CPU, lrs=lrs)
    _assert_equal_to(grouped, _alone(global_params, data, cfg, lrs), ATOL)


@pytest.mark.parametrize("case", list(CASES))
def test_two_devices_of_the_same_data_and_different_lrs_differ_and_each_matches_its_lone_run(
    dataset, global_params, case
):
    """The per-device lr is not ignored: the same samples and batches, two lrs, two diffs, each its own."""
    cfg, lrs = CASES[case]
    lrs = lrs[:2]
    data = _device_data(dataset, [64, 64], same=True)
    grouped = train_group(MODEL, global_params, data, cfg, _generators(2, same=True), CPU, lrs=lrs)
    alone = _alone(global_params, data, cfg, lrs, same=True)
    _assert_equal_to(grouped, alone, ATOL)
    assert _max_gap(grouped[0], grouped[1]) > 100 * ATOL


def test_a_mixed_mu_group_gives_each_device_its_lone_fedprox_run(dataset, global_params):
    """FedProx's mu batched: devices of the same data, one lr, mu 0 (FedAvg), 0.5 and 5."""
    cfg = TrainingConfig(local_iters=6, local_batch_size=32, optimizer="sgd", local_lr=0.05)
    mus, lrs = [0.0, 0.5, 5.0], [0.05] * 3
    data = _device_data(dataset, [64] * 3, same=True)
    values = [{"mu": mu} for mu in mus]
    grouped = train_group(
        MODEL,
        global_params,
        data,
        cfg,
        _generators(3, same=True),
        CPU,
        objective=ProximalTerm(),
        objective_values=values,
    )
    _assert_equal_to(grouped, _alone(global_params, data, cfg, lrs, mus, same=True), ATOL)
    assert _max_gap(grouped[0], grouped[2]) > 100 * ATOL  # mu pulls the weights back: the term is applied per device


@pytest.fixture
def float64_model():
    """The worker's model in float64 for one test (and back to float32 after it)."""
    model = worker_model(MODEL, CPU)
    yield model.double()
    model.float()


F64_CASES = {  # small batches: float64 convolutions are slow on the CPU
    "adam-versions": (TrainingConfig(local_iters=3, local_batch_size=8), [3e-4, 1e-3, 1e-4], True),
    "sgd-momentum-unequal-steps": (
        TrainingConfig(local_epochs=1, local_batch_size=8, optimizer="sgd", momentum=0.9),
        [0.05, 0.01, 0.1],
        False,
    ),
}


@pytest.mark.parametrize("case", list(F64_CASES))
def test_in_float64_mixed_lrs_and_mus_equal_each_lone_run_to_rounding(dataset, global_params, float64_model, case):
    """Both settings mixed at once, with padded batches, unequal step counts (frozen devices) or several versions
    (each device from its own start weights: the batched-hook path): equal to 1e-10."""
    cfg, lrs, versions = F64_CASES[case]
    mus = [0.0, 2.0, 0.5]
    start = {k: v.double() for k, v in global_params.items()}
    g = torch.Generator().manual_seed(5)
    other = {k: v + 0.05 * torch.randn(v.shape, generator=g, dtype=v.dtype) for k, v in start.items()}
    starts = [start, other, start] if versions else [start] * 3
    data = _device_data(dataset, [5, 20, 12])

    def prepare(x):
        return normalize(x).double()

    alone = _alone(start, data, cfg, lrs, mus, prepare, float64_model, starts)
    grouped = train_group(
        MODEL,
        starts if versions else start,
        data,
        cfg,
        _generators(3),
        CPU,
        prepare=prepare,
        objective=ProximalTerm(),
        lrs=lrs,
        objective_values=[{"mu": mu} for mu in mus],
    )
    _assert_equal_to(grouped, alone, 1e-10)
    ignored = _alone(start, data, cfg, [lrs[0]] * 3, [mus[0]] * 3, prepare, float64_model, starts)
    assert _max_gap(alone[1], ignored[1]) > 1e-4 and _max_gap(alone[2], ignored[2]) > 1e-4  # the settings matter


def test_one_value_for_every_device_gives_the_one_setting_groups_bits(dataset, global_params):
    """``lrs`` and ``objective_values`` that do not differ take the scalar path: bit for bit a group whose config
    and objective carry those values (so a run packed with runs of its own settings keeps its bits)."""
    cfg = TrainingConfig(local_iters=3, local_batch_size=32)
    data = _device_data(dataset, [40, 64, 100])
    plain = train_group(
        MODEL, global_params, data, replace(cfg, local_lr=1e-4), _generators(3), CPU, objective=ProximalTerm(0.3)
    )
    given = train_group(
        MODEL,
        global_params,
        data,
        cfg,
        _generators(3),
        CPU,
        objective=ProximalTerm(0.01),
        lrs=[1e-4] * 3,
        objective_values=[{"mu": 0.3}] * 3,
    )
    for a, b in zip(plain, given, strict=True):
        for name in a:
            np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def test_the_callers_objective_is_not_changed_by_a_groups_values(dataset, global_params):
    objective = ProximalTerm(0.01)
    cfg = TrainingConfig(local_iters=1, local_batch_size=32)
    data = _device_data(dataset, [40, 40])
    train_group(
        MODEL, global_params, data, cfg, _generators(2), CPU, objective=objective, objective_values=[{"mu": 1.0}] * 2
    )
    assert objective.mu == 0.01


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"lrs": [1e-3]}, "2 devices but 1 learning rates"),
        ({"lrs": [1e-3, 0.0]}, "positive and finite"),
        ({"objective_values": [{"mu": 1.0}] * 2}, "without an objective"),
        ({"objective": ProximalTerm(), "objective_values": [{"mu": 1.0}]}, "2 devices but 1 objective settings"),
        ({"objective": ProximalTerm(), "objective_values": [{"mu": 1.0}, {}]}, "name different settings"),
        ({"objective": ProximalTerm(), "objective_values": [{"nu": 1.0}] * 2}, "nu cannot differ"),
    ],
)
def test_bad_per_device_settings_are_refused(dataset, global_params, kwargs, message):
    cfg = TrainingConfig(local_iters=1, local_batch_size=32)
    with pytest.raises(ValueError, match=message):
        train_group(MODEL, global_params, _device_data(dataset, [40, 40]), cfg, _generators(2), CPU, **kwargs)


# -- step_groups: which devices can share a step ---------------------------------------------------------------------

BASE = TrainingConfig(model=MODEL, local_iters=5, local_batch_size=32)


def test_devices_differing_only_in_lr_and_mu_share_one_group():
    settings = [
        DeviceSettings(replace(BASE, local_lr=lr), PROX, {"mu": mu})
        for lr, mu in ((1e-3, 0.1), (1e-4, 0.0), (1e-3, 1.0))
    ]
    [group] = step_groups(settings)
    assert group.devices == [0, 1, 2]
    assert group.lrs == [1e-3, 1e-4, 1e-3]
    assert group.objective_values == [{"mu": 0.1}, {"mu": 0.0}, {"mu": 1.0}]
    assert group.reason == ""


@pytest.mark.parametrize(
    ("other", "named"),
    [
        (DeviceSettings(replace(BASE, model="femnist_cnn")), "model 'femnist_cnn' (not 'cifar10_convnet')"),
        (DeviceSettings(replace(BASE, local_batch_size=16)), "local_batch_size 16 (not 32)"),
        (DeviceSettings(replace(BASE, local_iters=10)), "local_iters 10 (not 5)"),
        (DeviceSettings(replace(BASE, local_epochs=1, local_iters=25)), "local_epochs 1 (not 0)"),
        (DeviceSettings(replace(BASE, optimizer="sgd")), "optimizer 'sgd' (not 'adam')"),
        (DeviceSettings(replace(BASE, momentum=0.9)), "momentum 0.9 (not 0.0)"),
        (DeviceSettings(BASE, PROX, {"mu": 0.1}), "objective 'examples.fedprox:ProximalTerm' (not '')"),
        (DeviceSettings(BASE, rule="examples.scaffold:ScaffoldRule", rule_args={"lr": 1.0}), "rule "),
    ],
)
def test_settings_that_cannot_share_a_step_split_the_group_with_a_one_line_reason(other, named):
    settings = [DeviceSettings(BASE), other, DeviceSettings(replace(BASE, local_lr=1e-2))]
    groups = step_groups(settings)
    assert [g.devices for g in groups] == [[0, 2], [1]]
    assert groups[0].reason == ""
    assert named in groups[1].reason and "\n" not in groups[1].reason
    assert "learning rate" in groups[1].reason  # says what may differ


def test_a_rules_arguments_split_groups_even_when_they_carry_the_lr():
    """A training rule's constants (SCAFFOLD's lr) are not batched: different ones train apart."""
    settings = [DeviceSettings(BASE, rule="r:R", rule_args={"lr": lr}) for lr in (1e-3, 1e-3, 1e-2)]
    assert [g.devices for g in step_groups(settings)] == [[0, 1], [2]]
