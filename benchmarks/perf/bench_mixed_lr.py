"""What packing trials that differ only in their learning rate costs the vectorised engine (issue 59, docs/packs.md).

K devices (``--k``) of ``--samples`` synthetic images each, ``--iters`` steps of batch ``--batch-size``
(``--optimizer``), trained three ways, alternated in rounds, best of ``--repeats``:

* ``one setting``: one ``train_group`` call, every device at one lr (today's group);
* ``mixed``: one call whose devices hold ``--lrs`` values, K / len(lrs) devices each (``train_group(lrs=...)``: the
  optimiser's step scaled by a per-device column), what a pack of that many lr trials trains as;
* ``separate``: one call per lr value, K / len(lrs) devices each (the trials in separate groups, or processes).

It prints samples per second of each and the ratios ``mixed / one setting`` (what the per-device lr costs) and
``mixed / separate`` (what sharing the step gains).

    .venv/bin/python benchmarks/perf/bench_mixed_lr.py --device cpu --k 32 --iters 5
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from processors.data.sources import make_synthetic  # noqa: E402
from processors.device import full_float32, resolve_device  # noqa: E402
from processors.models import build_model  # noqa: E402
from processors.training_config import TrainingConfig  # noqa: E402
from processors.training_vectorized import train_group  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    p.add_argument("--model", default="cifar10_convnet")
    p.add_argument("--k", type=int, default=32, help="devices in all (a multiple of the number of lrs)")
    p.add_argument("--lrs", default="1e-4,3e-4,1e-3,3e-3", help="the trials' learning rates, comma-separated")
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--samples", type=int, default=64, help="samples per device")
    p.add_argument("--optimizer", default="adam", choices=["adam", "sgd"])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    lrs = [float(v) for v in args.lrs.split(",")]
    if args.k % len(lrs):
        raise SystemExit(f"--k {args.k} is not a multiple of the {len(lrs)} learning rates")
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    full_float32()
    data = make_synthetic(args.k * args.samples, 10, seed=0)
    x, y = data.x_train.to(device), data.y_train.to(device)
    devices = [
        (x[i * args.samples : (i + 1) * args.samples], y[i * args.samples : (i + 1) * args.samples])
        for i in range(args.k)
    ]
    torch.manual_seed(0)
    start = {k: v.to(device) for k, v in build_model(args.model).state_dict().items()}
    cfg = TrainingConfig(
        model=args.model,
        local_iters=args.iters,
        local_batch_size=args.batch_size,
        optimizer=args.optimizer,
        local_lr=lrs[0],
    )
    per = args.k // len(lrs)
    device_lrs = [lr for lr in lrs for _ in range(per)]  # trial by trial: devices of one lr together

    def gens(n: int, offset: int = 0) -> list[torch.Generator]:
        return [torch.Generator().manual_seed(offset + i) for i in range(n)]

    def one_setting() -> None:
        train_group(args.model, start, devices, cfg, gens(args.k), device)

    def mixed() -> None:
        train_group(args.model, start, devices, cfg, gens(args.k), device, lrs=device_lrs)

    def separate() -> None:
        for j in range(len(lrs)):
            part = devices[j * per : (j + 1) * per]
            train_group(args.model, start, part, cfg, gens(per, j * per), device, lrs=[lrs[j]] * per)

    ways = {"one setting": one_setting, "mixed": mixed, "separate": separate}
    for run in ways.values():  # warm-up: the model, kernels and allocator
        run()
    best = dict.fromkeys(ways, float("inf"))
    for _ in range(args.repeats):
        for name, run in ways.items():
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            began = time.perf_counter()
            run()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            best[name] = min(best[name], time.perf_counter() - began)
    samples = args.k * args.iters * min(args.batch_size, args.samples)
    print(
        f"{args.model} on {device}, K={args.k} devices, {len(lrs)} lrs x {per} devices, {args.iters} {args.optimizer} steps"
    )
    for name, seconds in best.items():
        print(f"  {name:>12}: {samples / seconds:10.1f} samples/s ({seconds * 1000:.1f} ms)")
    print(
        f"mixed / one setting: {best['one setting'] / best['mixed']:.2f}x the speed (1.00: the per-device lr is free)"
    )
    print(f"mixed / separate: {best['separate'] / best['mixed']:.2f}x the speed (what sharing one step gains)")


if __name__ == "__main__":
    main()
