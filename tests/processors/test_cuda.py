"""Training on a CUDA device gives the numbers the CPU paths give, up to float32 summation order: a device alone,
an asynchronous release trained as one vectorised group, and the processor's GPU profile (data resident, pinned
copies on per-worker streams) against its host-data profile. Skipped where CUDA is absent (CI); run on a GPU
machine, with the measured errors printed by ``benchmarks/checks/gpu_equivalence.py``.

The bounds are relative errors over every tensor of the diffs, at ``--precision fp32`` (TF32 off: full float32
convolutions): a wrong start version, a device's data leaking into another or a diff taken on the wrong device gives
errors of order 1. Whether a seeded group repeats bit for bit on CUDA is checked at every precision."""

from __future__ import annotations

import pytest
import torch

from benchmarks.checks import gpu_equivalence as eq

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
CUDA = torch.device("cuda:0")


def test_auto_resolves_to_the_cuda_device_when_one_is_present():
    from processors.device import resolve_device

    assert resolve_device("auto") == CUDA


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_a_device_trained_on_cuda_gets_the_diff_it_gets_on_the_cpu(optimizer):
    with eq.tf32(False):  # --precision fp32
        worst, rel, scale = eq.cuda_vs_cpu(optimizer, CUDA)
    assert scale > 1e-3  # it trained
    assert rel < 1e-3, (worst, rel)


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_a_release_of_three_versions_grouped_on_cuda_equals_each_device_alone_on_cuda(optimizer):
    with eq.tf32(False):  # --precision fp32
        worst, rel, scale = eq.group_vs_alone(optimizer, CUDA)
    assert scale > 1e-3
    assert rel < 1e-3, (worst, rel)


def test_the_gpu_profile_gives_the_host_data_profiles_diffs():
    with eq.tf32(False):  # --precision fp32
        worst, rel, scale = eq.profiles("cuda")
    assert scale > 1e-4
    assert rel < 1e-4, (worst, rel)


def test_the_processor_keeps_its_model_and_data_on_cuda():
    from processors.models import initial_model
    from tests.conftest import make_processor

    proc = make_processor(synthetic_size=1000, subset_size=60, compute_device="cuda")
    weights = {k: v.numpy() for k, v in initial_model(eq.MODEL, 0).state_dict().items()}
    before = torch.cuda.memory_allocated(CUDA)
    proc.train("device-1", weights, version=1)
    device, x, _, _ = proc._prepare("device-1", 1)
    assert device == CUDA and x.device.type == "cuda"
    assert torch.cuda.memory_allocated(CUDA) > before


@pytest.mark.parametrize("precision", ["fp32", "tf32", "bf16"])
def test_a_seeded_group_repeats_bit_for_bit_on_cuda_at_every_precision(precision, monkeypatch):
    from processors.precision import use_precision

    monkeypatch.setattr(eq, "PRECISION", precision)
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    try:
        use_precision(precision, CUDA)
        worst, _, scale = eq.repeat("adam", CUDA)
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved
    assert scale > 1e-3 and worst == 0.0, (precision, worst)


def test_both_engines_clip_on_cuda_as_a_plain_pytorch_clip_of_the_same_diff():
    """Differential privacy's clipping on the GPU (``processors.privatize``): per device, under ``vmap`` in the
    vectorised engine, as ``torch.nn.utils.clip_grad_norm_`` clips the same diff."""
    from processors.data.sources import make_synthetic
    from processors.device import full_float32
    from processors.models import build_model
    from processors.training import TrainingConfig, train_local, worker_model
    from processors.training_vectorized import train_group

    full_float32()  # TF32 off, as the engines run on CUDA
    ds = make_synthetic(300, 50, seed=4).to(CUDA)
    data = [(ds.x_train[i * 60 : (i + 1) * 60], ds.y_train[i * 60 : (i + 1) * 60]) for i in range(3)]
    torch.manual_seed(3)
    start = {k: v.to(CUDA) for k, v in build_model("cifar10_convnet").state_dict().items()}
    cfg = TrainingConfig(local_iters=4, local_batch_size=16, local_lr=0.05, optimizer="sgd")
    names = [n for n, _ in worker_model("cifar10_convnet", CUDA).named_parameters()]

    def gens():
        return [torch.Generator().manual_seed(20 + i) for i in range(3)]

    model = worker_model("cifar10_convnet", CUDA)
    plain = [train_local(model, start, x, y, cfg, g) for (x, y), g in zip(data, gens(), strict=True)]
    clip = 0.5 * min(float(sum((d[n] ** 2).sum() for n in names)) ** 0.5 for d in plain)  # every one clipped
    alone = [train_local(model, start, x, y, cfg, g, clip_norm=clip) for (x, y), g in zip(data, gens(), strict=True)]
    grouped = train_group("cifar10_convnet", start, data, cfg, gens(), CUDA, clip_norms=[clip] * 3)
    plain_grouped = train_group("cifar10_convnet", start, data, cfg, gens(), CUDA)
    for engine, raw_diffs in ((alone, plain), (grouped, plain_grouped)):
        for got, raw in zip(engine, raw_diffs, strict=True):
            grads = [torch.nn.Parameter(torch.zeros(raw[n].shape, device=CUDA)) for n in names]
            for p, n in zip(grads, names, strict=True):
                p.grad = torch.as_tensor(raw[n], device=CUDA).clone()
            torch.nn.utils.clip_grad_norm_(grads, clip)
            for p, n in zip(grads, names, strict=True):
                torch.testing.assert_close(torch.as_tensor(got[n]), p.grad.cpu(), rtol=1e-4, atol=1e-9)
