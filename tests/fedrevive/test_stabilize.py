"""FedRevive's loss stabilisation (``fedrevive.stabilize``): what the references reject, and that a rejected value
stays out of its window and still lets the optimiser step."""

from __future__ import annotations

import math

import pytest
import torch

from fedrevive.config import FedReviveConfig
from fedrevive.distill import kd_step
from fedrevive.stabilize import MIN_HISTORY, WINDOW, LossStabilizer
from fedrevive.teachers import Teacher


def fill(stab: LossStabilizer, name: str, values: list[float]) -> None:
    for v in values:
        out = stab(torch.tensor(v, requires_grad=True), name)
        assert out.item() == v  # accepted unchanged


def test_spike_and_nan_are_rejected_and_kept_out_of_the_window():
    stab = LossStabilizer()
    fill(stab, "kd", [1.0] * MIN_HISTORY)
    before = list(stab.windows["kd"])

    x = torch.tensor(2.0, requires_grad=True)
    spike = stab(x * 3.5, "kd")  # 7.0 > 3 x mean 1.0
    assert spike.item() == 0.0
    spike.backward()  # the rejected zero keeps a graph (the caller's backward still runs), with zero gradient
    assert x.grad.item() == 0.0

    y = torch.tensor(1.0, requires_grad=True)
    nan = stab(y * float("nan"), "kd")
    assert nan.item() == 0.0 and math.isfinite(nan.item())
    nan.backward()  # runs, and no gradient (a NaN one, 0 x NaN, with the references' zero) reaches y
    assert y.grad is None
    inf = stab(torch.tensor(float("inf")), "kd")
    assert inf.item() == 0.0

    assert stab.windows["kd"] == before  # neither rejected value entered the window
    assert stab.rejected == {"kd": 3}
    # the window mean is unchanged, so a value just under the threshold is accepted and enters it
    assert stab(torch.tensor(2.9), "kd").item() == pytest.approx(2.9)
    assert stab.windows["kd"][-1] == pytest.approx(2.9)


def test_no_spike_rejection_before_ten_values_or_with_a_non_positive_mean():
    stab = LossStabilizer()
    fill(stab, "one_hot", [1.0] * (MIN_HISTORY - 1))
    assert stab(torch.tensor(100.0), "one_hot").item() == 100.0  # 9 values: too few for a mean, accepted
    # the adversarial term is -KL <= 0: its mean is never positive, so only non-finite values are rejected
    fill(stab, "adversarial", [-1.0] * MIN_HISTORY)
    assert stab(torch.tensor(-0.001), "adversarial").item() == pytest.approx(-0.001)
    assert stab(torch.tensor(float("nan")), "adversarial").item() == 0.0
    assert stab.rejected == {"adversarial": 1}


def test_window_keeps_the_last_twenty_and_each_loss_has_its_own():
    stab = LossStabilizer()
    fill(stab, "feature", [float(i) for i in range(1, 31)])
    assert stab.windows["feature"] == [float(i) for i in range(11, 31)] and WINDOW == 20
    assert "kd" not in stab.windows
    restored = LossStabilizer()
    restored.load_state_dict(stab.state_dict())
    assert restored.windows == stab.windows


def test_disabled_passes_everything():
    stab = LossStabilizer(enabled=False)
    fill(stab, "kd", [1.0] * MIN_HISTORY)
    assert stab(torch.tensor(50.0), "kd").item() == 50.0
    assert math.isnan(stab(torch.tensor(float("nan")), "kd").item())
    assert stab.windows == {} and stab.rejected == {}


def test_on_by_default_and_a_flag_turns_it_off():
    from jobs.cli import build_parser, config_from_args

    assert FedReviveConfig().stabilize_losses is True
    parser = build_parser("t", method_choice=True)
    on = config_from_args(parser.parse_args(["--method", "fedrevive"]), "fedrevive", presets=True)
    off = config_from_args(
        parser.parse_args(["--method", "fedrevive", "--no-fr-stabilize-losses"]), "fedrevive", presets=True
    )
    assert on.method_settings.stabilize_losses is True
    assert off.method_settings.stabilize_losses is False


def test_a_rejected_kd_loss_still_steps_the_optimizer():
    """As both references: the rejected loss is 0, backward and the Adam step still run (momentum moves the
    student); the step reports 0."""
    torch.manual_seed(0)
    student = torch.nn.Linear(4, 3)
    teacher = Teacher("c", torch.nn.Linear(4, 3), None)
    optimizer = torch.optim.Adam(student.parameters(), lr=0.1)
    stab = LossStabilizer()
    images = torch.randn(5, 4)
    for _ in range(MIN_HISTORY):
        kd_step(student, [(teacher, images)], optimizer, 1.0, stab)
    stab.windows["kd"] = [1e-6] * MIN_HISTORY  # any real loss is now a spike
    weight = student.weight.detach().clone()
    assert kd_step(student, [(teacher, images)], optimizer, 1.0, stab) == 0.0
    assert stab.rejected == {"kd": 1}
    assert not torch.equal(weight, student.weight)  # Adam's momentum still moved it


def test_server_flip_off_crops_the_same_and_never_mirrors():
    from fedrevive.augment import crop_and_flip

    images = torch.arange(2 * 3 * 8 * 8, dtype=torch.float32).view(2, 3, 8, 8)
    flipped = [crop_and_flip(images, torch.Generator().manual_seed(s), padding=0) for s in range(8)]
    assert any(not torch.equal(f, images) for f in flipped)  # padding 0: only flips change anything
    for s in range(8):
        g = torch.Generator().manual_seed(s)
        assert torch.equal(crop_and_flip(images, g, padding=0, flip=False), images)
        assert torch.equal(g.get_state(), torch.Generator().manual_seed(s).get_state()) is False  # it drew
    a, b = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    crop_and_flip(images, a, flip=False)
    crop_and_flip(images, b)
    assert torch.equal(a.get_state(), b.get_state())  # the same draws either way
