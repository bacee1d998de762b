"""What training on a CUDA device changes in the numbers: each comparison prints its largest absolute error and its
largest relative error ‖a − b‖ / ‖b‖ among the diffs' tensors, so a GPU run records how far each path is from the
one it must equal.

- ``cuda vs cpu``: one device trained alone (``train_local``) on CUDA and on the CPU, same batches.
- ``group vs alone``: an asynchronous release (devices of three model versions, unequal sample counts) trained
  as one vectorised group on CUDA against each device trained alone on CUDA, Adam and SGD.
- ``alone +1 ulp vs alone``: the yardstick for ``group vs alone``: the same devices alone from their start
  weights moved one float32 ulp, against them alone (what rounding alone does to this training).
- ``high vs conservative``: the job's task processor with the ``high`` profile (data on the GPU, pinned copies
  on per-worker streams) against ``conservative`` (data on the host, no streams), a group and a device alone.
- ``precision``: every comparison at each ``--precisions`` (``processors.precision``: ``fp32``, full float32;
  ``tf32``, TF32 convolutions and matrix products, torch's default for cuDNN's convolutions on Ampere and later;
  ``bf16``, bfloat16 autocast), each row naming the precision it checks; ``cuda vs cpu`` compares the same
  precision on both (bf16 autocast runs on the CPU too; TF32 is CUDA's alone, so its CPU side is float32).
- ``repeat``: the same group trained twice on CUDA at each precision, whether it repeats bit for bit.

    .venv/bin/python benchmarks/checks/gpu_equivalence.py            # needs CUDA; exits 2 without it
    .venv/bin/python benchmarks/checks/gpu_equivalence.py --model resnet18   # the paper's ResNet-18 (no processor line)
    .venv/bin/python benchmarks/checks/gpu_equivalence.py --precisions fp32,tf32,bf16

``tests/processors/test_cuda.py`` bounds the same comparisons (it skips where CUDA is absent).
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from processors.data.sources import make_synthetic  # noqa: E402
from processors.models import build_model  # noqa: E402
from processors.precision import use_precision  # noqa: E402
from processors.training import TrainingConfig, train_local, worker_model  # noqa: E402
from processors.training_vectorized import train_group  # noqa: E402

MODEL = "cifar10_convnet"
Diff = dict[str, np.ndarray]


def errors(got: list[Diff], want: list[Diff]) -> tuple[float, float, float]:
    """(largest |got − want|, largest per-tensor ‖got − want‖ / ‖want‖, largest |want|) over every tensor of every
    device: per tensor, so a small weight's error is not hidden by a large statistic's norm."""
    worst, rel, scale = 0.0, 0.0, 0.0
    for a, b in zip(got, want, strict=True):
        assert a.keys() == b.keys()
        for k in b:
            want64, d = b[k].astype(np.float64), a[k].astype(np.float64) - b[k].astype(np.float64)
            worst = max(worst, float(np.abs(d).max()))
            rel = max(rel, float(np.linalg.norm(d)) / max(float(np.linalg.norm(want64)), 1e-30))
            scale = max(scale, float(np.abs(want64).max()))
    return worst, rel, scale


@contextlib.contextmanager
def tf32(enabled: bool) -> Iterator[None]:
    """TF32 for cuDNN convolutions and cuBLAS matrix products, restored afterwards."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def _start(model: str = MODEL, seed: int = 7) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    return {k: p.detach().clone() for k, p in build_model(model).state_dict().items()}


def _versions(count: int, model: str = MODEL) -> list[dict[str, torch.Tensor]]:
    base = _start(model)
    out = [base]
    for v in range(1, count):
        g = torch.Generator().manual_seed(100 + v)
        out.append({k: t + 0.05 * torch.randn(t.shape, generator=g) for k, t in base.items()})
    return out


def _data(sizes: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    ds = make_synthetic(sum(sizes), 10, seed=3)
    out, start = [], 0
    for n in sizes:
        out.append((ds.x_train[start : start + n], ds.y_train[start : start + n]))
        start += n
    return out


def _gens(k: int) -> list[torch.Generator]:
    return [torch.Generator().manual_seed(11 + i) for i in range(k)]


def _on(params: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {k: t.to(device) for k, t in params.items()}


CONFIGS = {
    "adam": TrainingConfig(local_iters=10, local_batch_size=32, optimizer="adam", local_lr=3e-4),
    "sgd": TrainingConfig(local_iters=10, local_batch_size=32, optimizer="sgd", local_lr=0.05, momentum=0.9),
}
PRECISION = "fp32"  # the precision the comparisons run at (main's --precisions loop sets it)


def config(optimizer: str) -> TrainingConfig:
    return dataclasses.replace(CONFIGS[optimizer], precision=PRECISION)


def cuda_vs_cpu(optimizer: str, device: torch.device, model: str = MODEL) -> tuple[float, float, float]:
    """One device alone on ``device`` against the same device alone on the CPU."""
    cfg, start = config(optimizer), _start(model)
    (x, y) = _data([100])[0]
    cpu = torch.device("cpu")
    want = train_local(worker_model(model, cpu), start, x, y, cfg, _gens(1)[0])
    got = train_local(worker_model(model, device), _on(start, device), x.to(device), y.to(device), cfg, _gens(1)[0])
    return errors([got], [want])


def _release(device: torch.device, model: str) -> tuple[list[dict[str, torch.Tensor]], list]:
    """An asynchronous release on ``device``: four devices' start weights (of three versions) and their batches."""
    versions = [_on(v, device) for v in _versions(3, model)]
    data = [(x.to(device), y.to(device)) for x, y in _data([40, 64, 12, 100])]
    return [versions[v] for v in (0, 2, 1, 2)], data


def _alone(cfg: TrainingConfig, starts: list, data: list, device: torch.device, model: str) -> list[Diff]:
    """Each device of a release trained alone on ``device`` from its start weights."""
    net = worker_model(model, device)
    return [train_local(net, p, x, y, cfg, g) for p, (x, y), g in zip(starts, data, _gens(len(starts)), strict=True)]


def group_vs_alone(optimizer: str, device: torch.device, model: str = MODEL) -> tuple[float, float, float]:
    """A release of devices of three versions as one vectorised group on ``device``, against each alone there."""
    cfg = config(optimizer)
    of_device, data = _release(device, model)
    alone = _alone(cfg, of_device, data, device, model)
    grouped = train_group(model, of_device, data, cfg, _gens(4), device)
    return errors(grouped, alone)


def nudged_vs_alone(optimizer: str, device: torch.device, model: str = MODEL) -> tuple[float, float, float]:
    """The yardstick for ``group vs alone``: the same devices alone, from their start weights moved one float32 ulp
    up, against them alone. What rounding alone does to this training (Adam turns a gradient element whose sign
    rounding flips into a step of about lr), so a grouped error of this size is rounding, not a wrong version."""
    cfg = config(optimizer)
    of_device, data = _release(device, model)
    up = torch.tensor(float("inf"))
    nudged = [
        {k: torch.nextafter(t, up.to(t)) if t.is_floating_point() else t for k, t in p.items()} for p in of_device
    ]
    return errors(_alone(cfg, nudged, data, device, model), _alone(cfg, of_device, data, device, model))


def repeat(optimizer: str, device: torch.device, model: str = MODEL) -> tuple[float, float, float]:
    """The same release grouped twice on ``device``: all zeros when a seeded run repeats bit for bit there."""
    cfg = config(optimizer)
    of_device, data = _release(device, model)
    first = train_group(model, of_device, data, cfg, _gens(4), device)
    return errors(train_group(model, of_device, data, cfg, _gens(4), device), first)


def profiles(device: str) -> tuple[float, float, float]:
    """The task processor on ``device``: ``high`` (data resident, pinned copies on streams) against
    ``conservative``, for a group of 3 devices and for one device alone."""
    from processors.models import initial_model
    from tests.conftest import make_processor

    weights = {k: v.numpy() for k, v in initial_model(MODEL, 0).state_dict().items()}
    got, want = [], []
    for profile, out in (("high", got), ("conservative", want)):
        proc = make_processor(
            synthetic_size=1000, subset_size=60, profile=profile, compute_device=device, precision=PRECISION
        )
        out.extend(proc.train_group(["device-1", "device-2", "device-3"], weights, version=1))
        out.append(proc.train("device-4", weights, version=1))
    return errors(got, want)


def main(argv: list[str] | None = None) -> int:
    import argparse

    global PRECISION
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=MODEL, help="cifar10_convnet (default) or resnet18 (its statistic trackers too)")
    p.add_argument("--precisions", default="fp32,tf32", help="comma-separated: fp32, tf32, bf16")
    args = p.parse_args(argv)
    model = args.model
    if not torch.cuda.is_available():
        print("gpu_equivalence: no CUDA device (torch.cuda.is_available() is False); run it on a GPU machine")
        return 2
    device = torch.device("cuda:0")
    print(f"{model} on {torch.cuda.get_device_name(device)}, torch {torch.__version__}, CUDA {torch.version.cuda}")
    print(
        f"defaults: cudnn.allow_tf32={torch.backends.cudnn.allow_tf32} "
        f"matmul.allow_tf32={torch.backends.cuda.matmul.allow_tf32}"
    )
    print(f"{'comparison':<34} {'precision':>9} {'max |err|':>11} {'rel err':>11} {'max |diff|':>11}")
    for precision in args.precisions.split(","):
        PRECISION = precision
        use_precision(precision, device)  # the TF32 switches, as the task processor sets them
        for opt in ("adam", "sgd"):
            comparisons = (
                ("cuda vs cpu", cuda_vs_cpu),
                ("group vs alone (3 versions)", group_vs_alone),
                ("alone +1 ulp vs alone", nudged_vs_alone),
                ("repeat (same group twice)", repeat),
            )
            for name, fn in comparisons:
                worst, rel, scale = fn(opt, device, model)
                print(f"{name + ', ' + opt:<34} {precision:>9} {worst:>11.3e} {rel:>11.3e} {scale:>11.3e}")
        if model == MODEL:
            worst, rel, scale = profiles("cuda")
            print(f"{'high vs conservative (processor)':<34} {precision:>9} {worst:>11.3e} {rel:>11.3e} {scale:>11.3e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
