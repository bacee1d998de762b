"""FedRevive's teachers in one batched pass (``fedrevive.teacher_batch``) equal the loop of one teacher after another
to rounding: the generator's loss and its gradient, a distillation step, and a whole revived update; ``auto``
batches on CUDA only, so a CPU run keeps its bits."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from fedrevive import FedReviveConfig, FedReviveDistiller, kd_step
from fedrevive.synthesis import Synthesizer
from fedrevive.teacher_batch import TeacherBatch, batches_teachers
from fedrevive.teachers import Teacher
from fedrevive.weights import frozen
from processors.models import build_model

CPU = torch.device("cpu")


def teachers(model: str, n: int) -> list[Teacher]:
    """``n`` teachers of one architecture, each with its own weights and its own data statistics."""
    out = []
    for k in range(n):
        torch.manual_seed(10 + k)
        net = build_model(model)
        with torch.no_grad():
            for name, b in net.named_buffers():
                if name.endswith("running_mean"):
                    b.normal_(0, 0.2)
                elif name.endswith("running_var"):
                    b.uniform_(0.5, 2.0)
        out.append(Teacher(f"client-{k}", frozen(net), None))
    return out


def cfg(**overrides) -> FedReviveConfig:
    base = dict(teacher_buffer_size=3, synth_batch_size=6, gen_noise_dim=16, gen_width=8, kd_iters=2)
    return FedReviveConfig(**(base | overrides))


# the convnet's statistic trackers (the paper's kind), and BatchNorm's statistics (a ResNet-18: a slow test)
@pytest.mark.parametrize("model", ["cifar10_convnet", pytest.param("resnet18_bn", marks=pytest.mark.slow)])
def test_the_generators_loss_and_its_gradient_equal_the_teacher_loop_to_rounding(model):
    buffer = teachers(model, 3)
    synthesizer = Synthesizer(cfg(), CPU)
    class_weights = torch.softmax(torch.randn(3, 10, generator=torch.Generator().manual_seed(1)), 0)
    labels = torch.tensor([0, 3, 3, 7, 9, 1])
    student = frozen(build_model(model))
    found = {}
    for batched in (False, True):
        images = torch.randn(6, 3, 32, 32, generator=torch.Generator().manual_seed(2)).requires_grad_()
        loss = synthesizer.generator_loss(
            images, labels, buffer, class_weights, student, TeacherBatch(buffer) if batched else None
        )
        loss.backward()
        found[batched] = (loss.item(), images.grad.clone())
    (loop_loss, loop_grad), (batch_loss, batch_grad) = found[False], found[True]
    assert batch_loss == pytest.approx(loop_loss, rel=1e-5)
    assert torch.allclose(batch_grad, loop_grad, rtol=1e-4, atol=1e-6 * float(loop_grad.abs().max()))
    assert loop_loss != pytest.approx(0.0)  # the terms are really there: CE, statistics, adversarial


def test_a_distillation_step_with_the_teachers_batched_equals_the_loop_to_rounding():
    buffer = teachers("cifar10_convnet", 3)
    torch.manual_seed(5)
    start = build_model("cifar10_convnet").eval()
    images = [torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(20 + k)) for k in range(3)]
    found = {}
    for batched in (False, True):
        student = copy.deepcopy(start)
        optimizer = torch.optim.Adam(student.parameters(), lr=1e-3)
        batch = TeacherBatch(buffer) if batched else None
        loss = kd_step(student, list(zip(buffer, images, strict=True)), optimizer, 1.0, teacher_batch=batch)
        found[batched] = (loss, {k: v.detach().clone() for k, v in student.named_parameters()})
    assert found[True][0] == pytest.approx(found[False][0], rel=1e-5)
    for name, value in found[False][1].items():
        # one Adam step moves every weight by about lr: the two students agree far below it
        assert torch.allclose(found[True][1][name], value, atol=1e-6), name


def test_a_revived_update_with_batched_teachers_is_the_loops_to_rounding_and_auto_keeps_the_loop_on_the_cpu():
    def revive(setting: str) -> tuple[dict, FedReviveDistiller]:
        c = cfg(
            batched_teachers=setting,
            distill_from_version=2,
            kd_train_from_version=2,
            synth_every_versions=1,
            class_proportions="true",
            teacher_buffer_size=2,
            synth_per_teacher=4,
            s_max=2.0,
        )
        distiller = FedReviveDistiller(c, lambda: build_model("cifar10_convnet"), CPU, seed=3)
        for k, t in enumerate(teachers("cifar10_convnet", 2)):
            weights = {n: v.numpy().copy() for n, v in t.model.state_dict().items()}
            distiller.observe_client_model(t.client_id, weights, np.arange(10.0) + k)
        torch.manual_seed(4)
        global_weights = {n: v.numpy().copy() for n, v in build_model("cifar10_convnet").state_dict().items()}
        delta = {n: np.full_like(v, 1e-3) for n, v in global_weights.items()}
        out, info = distiller.process_update(global_weights, delta, "client-0", base_version=3, current_version=5)
        assert info["phase"] == "distill" and info["beta"] > 0
        return out, distiller, info["beta"] * c.kd_lr

    loop, auto = revive("off"), revive("auto")
    batched = revive("on")
    assert not auto[1].batched and batched[1].batched  # auto: the loop on the CPU
    step = loop[2]  # one Adam step of the student, as it reaches the revived update (beta x kd_lr)
    for name, value in loop[0].items():
        np.testing.assert_array_equal(auto[0][name], value)  # auto on the CPU: the same bits
        # the teachers' summation order changes a gradient's last bits, and Adam divides by the gradient's running
        # norm, so an element whose gradient is near zero can move by a small part of one step (on some CPUs a few
        # elements in 10,000 by 2.5% of a step); a wrong teacher or weighting moves most elements by whole steps
        np.testing.assert_allclose(batched[0][name], value, rtol=0, atol=0.1 * step)
        close = np.isclose(batched[0][name], value, rtol=1e-4, atol=1e-6)
        assert close.mean() >= 0.999, f"{name}: {close.size - close.sum()} of {close.size} elements beyond rounding"


def test_which_models_run_batched():
    assert batches_teachers("auto", torch.device("cuda", 0), build_model("resnet18"))
    assert not batches_teachers("auto", CPU, build_model("resnet18"))
    assert batches_teachers("on", CPU, build_model("resnet18_bn"))
    assert not batches_teachers("off", torch.device("cuda", 0), build_model("resnet18"))
    plain = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(), torch.nn.LazyLinear(10))
    assert not batches_teachers("on", CPU, plain)  # no data statistics: the loop and its recorded reference
    with pytest.raises(ValueError, match="use auto, on or off"):
        FedReviveConfig(batched_teachers="yes")
