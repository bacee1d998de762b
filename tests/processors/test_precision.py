"""``--precision``: bfloat16 autocast really runs in both engines and in FedRevive's server (on the CPU, where its
numerics run too), a seeded run repeats bit for bit at every precision, the engines still agree with each other,
the weights and optimiser state stay float32, and the TF32 switches follow the setting on CUDA."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from common.choices import ConfigError
from processors.data.sources import make_synthetic
from processors.models import build_model
from processors.models.stat_tracker import batch_moments
from processors.precision import autocast, use_precision, widened
from processors.training import TrainingConfig, train_local, worker_model
from processors.training_vectorized import train_group

CPU = torch.device("cpu")
MODEL = "cifar10_convnet"


@pytest.fixture(scope="module")
def runs() -> dict[tuple[str, str], list[list[dict[str, np.ndarray]]]]:
    """(engine, precision) -> two seeded runs of the same three devices (2 epochs' worth of small batches)."""
    data = make_synthetic(100, 10, seed=5)
    torch.manual_seed(3)
    start = {k: v.detach().clone() for k, v in build_model(MODEL).state_dict().items()}
    devices = [(data.x_train[i * 20 : (i + 1) * 20], data.y_train[i * 20 : (i + 1) * 20]) for i in range(3)]
    out = {}
    for precision in ("fp32", "tf32", "bf16"):
        cfg = TrainingConfig(local_iters=3, local_batch_size=8, local_lr=1e-3, augment=True, precision=precision)
        model = worker_model(MODEL, CPU)
        for _ in range(2):
            gens = [torch.Generator().manual_seed(i) for i in range(len(devices))]
            out.setdefault(("alone", precision), []).append(
                [train_local(model, start, x, y, cfg, g) for (x, y), g in zip(devices, gens, strict=True)]
            )
            gens = [torch.Generator().manual_seed(i) for i in range(len(devices))]
            out.setdefault(("grouped", precision), []).append(train_group(MODEL, start, devices, cfg, gens, CPU))
    return out


def same_bits(a: list[dict], b: list[dict]) -> bool:
    return all(np.array_equal(x[k], y[k]) for x, y in zip(a, b, strict=True) for k in x)


def relative(a: list[dict], b: list[dict]) -> float:
    """||a - b|| / ||b|| over every device's whole diff."""
    flat_a, flat_b = (np.concatenate([d[k].ravel() for d in ds for k in sorted(d)]) for ds in (a, b))
    return float(np.linalg.norm(flat_a - flat_b) / np.linalg.norm(flat_b))


@pytest.mark.parametrize("engine", ["alone", "grouped"])
@pytest.mark.parametrize("precision", ["fp32", "tf32", "bf16"])
def test_a_seeded_device_repeats_bit_for_bit_at_every_precision_in_both_engines(runs, engine, precision):
    first, again = runs[(engine, precision)]
    assert same_bits(first, again)


def test_bf16_really_changes_the_numerics_and_the_engines_still_agree_at_it(runs):
    fp32, bf16 = runs[("alone", "fp32")][0], runs[("alone", "bf16")][0]
    assert same_bits(runs[("alone", "tf32")][0], fp32)  # TF32 is a CUDA switch: on the CPU, fp32's bits
    assert not same_bits(bf16, fp32)
    off = relative(bf16, fp32)
    assert off < 0.15  # bfloat16's 8-bit mantissa (seen: 5%), not another training
    # grouped vs alone: at fp32 to float rounding; at bf16 of the order bf16 itself is from fp32 (seen: 6% vs 5%)
    assert relative(runs[("grouped", "fp32")][0], fp32) < 1e-4
    assert relative(runs[("grouped", "bf16")][0], bf16) < 3 * off
    assert all(d[k].dtype == np.float32 for d in bf16 for k in d)


def test_under_bf16_the_forward_is_bfloat16_and_losses_and_tracker_moments_are_float32():
    model = build_model(MODEL)
    x = torch.randn(4, 3, 32, 32)
    with autocast("bf16", CPU):
        logits = model(x)
        activations = model.conv1(x)
    assert logits.dtype == torch.bfloat16 and widened(logits).dtype == torch.float32
    mean, var = batch_moments(activations)
    assert mean.dtype == var.dtype == torch.float32
    assert widened(x) is x and widened(x.double()).dtype == torch.float64  # float32 and float64 as they are
    with autocast("fp32", CPU):
        assert model(x).dtype == torch.float32
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_the_tf32_switches_follow_the_precision_on_cuda_and_are_left_alone_on_the_cpu():
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    try:
        use_precision("tf32", torch.device("cuda", 0))  # switches only: no CUDA call
        assert torch.backends.cudnn.allow_tf32 and torch.backends.cuda.matmul.allow_tf32
        for precision in ("fp32", "bf16"):
            use_precision("tf32", torch.device("cuda", 0))
            use_precision(precision, torch.device("cuda", 0))
            assert not torch.backends.cudnn.allow_tf32 and not torch.backends.cuda.matmul.allow_tf32
        use_precision("tf32", CPU)
        assert not torch.backends.cudnn.allow_tf32  # the CPU: untouched
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def test_an_unknown_precision_is_refused_naming_the_choices():
    with pytest.raises(ConfigError, match="--precision 'fp16': use fp32, tf32, bf16"):
        TrainingConfig(precision="fp16")


def test_fedrevives_server_at_bf16_repeats_bit_for_bit_and_stays_near_fp32():
    from fedrevive import FedReviveConfig, FedReviveDistiller

    def revive(precision: str) -> dict[str, np.ndarray]:
        cfg = FedReviveConfig(
            teacher_buffer_size=2,
            synth_batch_size=4,
            synth_per_teacher=2,
            gen_noise_dim=16,
            gen_width=8,
            kd_iters=1,
            gen_adapt_steps=1,
            distill_from_version=2,
            kd_train_from_version=2,
            synth_every_versions=1,
            s_max=2.0,
        )
        distiller = FedReviveDistiller(cfg, lambda: build_model(MODEL), CPU, seed=1, precision=precision)
        for k in range(2):
            torch.manual_seed(20 + k)
            weights = {n: v.numpy().copy() for n, v in build_model(MODEL).state_dict().items()}
            distiller.observe_client_model(f"client-{k}", weights, np.arange(10.0) + k)
        torch.manual_seed(4)
        global_weights = {n: v.numpy().copy() for n, v in build_model(MODEL).state_dict().items()}
        delta = {n: np.full_like(v, 1e-3) for n, v in global_weights.items()}
        out, info = distiller.process_update(global_weights, delta, "client-0", base_version=3, current_version=5)
        assert info["phase"] == "distill" and info["synthesized"]
        return out

    first, again, fp32 = revive("bf16"), revive("bf16"), revive("fp32")
    assert all(np.array_equal(first[k], again[k]) for k in first)
    assert not all(np.array_equal(first[k], fp32[k]) for k in first)
    assert all(first[k].dtype == np.float32 for k in first)
    # one Adam step of the student moves a weight by about kd_lr (1e-4) x beta: bf16 stays of that order
    assert max(float(np.abs(first[k] - fp32[k]).max()) for k in first) < 1e-3


def test_batches_copied_to_the_device_once_give_the_same_bits_in_both_engines():
    data = make_synthetic(100, 10, seed=6)
    torch.manual_seed(2)
    start = {k: v.detach().clone() for k, v in build_model(MODEL).state_dict().items()}
    devices = [(data.x_train[i * 20 : (i + 1) * 20], data.y_train[i * 20 : (i + 1) * 20]) for i in range(2)]
    found = {}
    for on in (False, True):
        cfg = TrainingConfig(local_iters=3, local_batch_size=8, augment=True, batches_on_device=on)
        gens = [torch.Generator().manual_seed(i) for i in range(2)]
        alone = [
            train_local(worker_model(MODEL, CPU), start, x, y, cfg, g) for (x, y), g in zip(devices, gens, strict=True)
        ]
        gens = [torch.Generator().manual_seed(i) for i in range(2)]
        found[on] = (alone, train_group(MODEL, start, devices, cfg, gens, CPU))
    assert same_bits(found[True][0], found[False][0]) and same_bits(found[True][1], found[False][1])


def test_channels_last_equals_the_default_layout_to_rounding_and_a_later_task_gets_the_default_back():
    data = make_synthetic(100, 10, seed=7)
    torch.manual_seed(2)
    start = {k: v.detach().clone() for k, v in build_model(MODEL).state_dict().items()}
    x, y = data.x_train[:30], data.y_train[:30]
    model = worker_model(MODEL, CPU)

    def train(channels_last: bool) -> list[dict[str, np.ndarray]]:
        cfg = TrainingConfig(local_iters=3, local_batch_size=8, channels_last=channels_last)
        return [train_local(model, start, x, y, cfg, torch.Generator().manual_seed(1))]

    default = train(False)
    last = train(True)
    assert model.conv1.weight.is_contiguous(memory_format=torch.channels_last)
    assert relative(last, default) < 1e-4 and all(d[k].flags.c_contiguous for d in last for k in d)
    assert same_bits(train(False), default)  # the worker's model is back in the default layout


def test_the_compiled_per_device_step_gives_the_eager_steps_bits(monkeypatch):
    # torch.compile's graph capture and autograd, with the eager backend (inductor's fused kernels would move
    # the bits by rounding and take minutes to build on a small CPU): what compiling changes besides the kernels
    import torch._dynamo

    from processors import training

    real = torch.compile
    monkeypatch.setattr(torch, "compile", lambda model, **kw: real(model, backend="aot_eager", dynamic=False))
    monkeypatch.setattr(training._worker, "compiled", {}, raising=False)  # this test's compiled models only
    data = make_synthetic(100, 10, seed=8)
    torch.manual_seed(2)
    start = {k: v.detach().clone() for k, v in build_model(MODEL).state_dict().items()}
    x, y = data.x_train[:30], data.y_train[:30]
    model = worker_model(MODEL, CPU)
    found = {}
    for mode in ("off", "reduce-overhead"):
        cfg = TrainingConfig(local_iters=3, local_batch_size=8, augment=True, compile=mode)
        found[mode] = [train_local(model, start, x, y, cfg, torch.Generator().manual_seed(1))]
    torch._dynamo.reset()
    assert same_bits(found["reduce-overhead"], found["off"])
    assert any(np.abs(d[k]).max() > 0 for d in found["off"] for k in d)  # it trained (trackers included)
