"""What per-device state costs: SCAFFOLD's ``c_i`` (one float32 array per parameter) for many devices that each
trained once, in a leaf's store (``processors.device_state``), and SCAFFOLD's rule in the vectorised engine.

Part 1, the store: ``--devices`` devices (10^4 by default) each put their state once (the size of the model's
parameters: 248 KB for ``cifar10_convnet``), then each reads it back as its next task would. Printed: the
process's resident memory before and after, the bytes in memory and on disk, and the time per device of a put and
of a get, for the store as a run without checkpoints uses it (memory up to the budget, then spilled) and as one
with checkpoints (``durable``: every state also written when made). A device that never trained costs nothing.

Part 2, training: one group of ``--group`` devices trained by the vectorised engine with SCAFFOLD's rule against
the same group without it (FedAvg), ``--reps`` times each, interleaved: the ratio is the rule's cost per device.

    python benchmarks/perf/bench_device_state.py                    # 10^4 devices, budget 256 MiB
    python benchmarks/perf/bench_device_state.py --devices 1000 --memory-mb 64
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np
import psutil
import torch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "examples"))
from scaffold import C, ScaffoldRule  # noqa: E402

from processors.data.sources import make_synthetic  # noqa: E402
from processors.device_rule import RuleRun  # noqa: E402
from processors.device_state import DeviceStateStore  # noqa: E402
from processors.models import build_model  # noqa: E402
from processors.training import TrainingConfig  # noqa: E402
from processors.training_vectorized import train_group  # noqa: E402


def rss() -> int:
    return psutil.Process().memory_info().rss


def bench_store(model: str, devices: int, memory_mb: float, durable: bool) -> dict:
    shapes = {f"c_i/{n}": tuple(p.shape) for n, p in build_model(model).named_parameters()}
    rng = np.random.default_rng(0)
    template = {n: rng.normal(0, 1, s).astype(np.float32) for n, s in shapes.items()}
    per_device = sum(a.nbytes for a in template.values())
    with tempfile.TemporaryDirectory() as folder:
        store = DeviceStateStore(folder, int(memory_mb * 2**20), durable=durable)
        before = rss()
        started = time.perf_counter()
        for d in range(devices):
            store.put(f"site-1#{d}", d, {n: a + np.float32(d) for n, a in template.items()})
        put = (time.perf_counter() - started) / devices
        after = rss()
        started = time.perf_counter()
        for d in range(devices):
            state = store.get(f"site-1#{d}", before=devices + d)
            assert state is not None
        get = (time.perf_counter() - started) / devices
        return {
            "per_device_kb": per_device / 1024,
            "rss_mb": (after - before) / 2**20,
            "memory_mb": store.memory_bytes() / 2**20,
            "disk_mb": store.disk_bytes() / 2**20,
            "put_ms": put * 1e3,
            "get_ms": get * 1e3,
        }


def bench_training(model: str, group: int, reps: int) -> tuple[float, float]:
    cfg = TrainingConfig(model=model, local_iters=5, local_batch_size=32, local_lr=0.05, optimizer="sgd")
    data = make_synthetic(group * 64, 10, seed=1)
    devices = [(data.x_train[i * 64 : (i + 1) * 64], data.y_train[i * 64 : (i + 1) * 64]) for i in range(group)]
    torch.manual_seed(0)
    params = {k: v.detach().clone() for k, v in build_model(model).state_dict().items()}
    extras = {C + n: torch.zeros_like(p) for n, p in build_model(model).named_parameters()}
    rule = ScaffoldRule(cfg.local_iters, cfg.local_lr)
    times = {"fedavg": [], "scaffold": []}
    for _ in range(reps + 1):  # the first of each warms up
        for name in times:
            gens = [torch.Generator().manual_seed(i) for i in range(group)]
            run = RuleRun(rule, [None] * group) if name == "scaffold" else None
            started = time.perf_counter()
            train_group(model, params, devices, cfg, gens, torch.device("cpu"), extras=extras, rule=run)
            times[name].append(time.perf_counter() - started)
    return float(np.median(times["fedavg"][1:])) / group, float(np.median(times["scaffold"][1:])) / group


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="cifar10_convnet")
    parser.add_argument("--devices", type=int, default=10_000)
    parser.add_argument("--memory-mb", type=float, default=256.0)
    parser.add_argument("--group", type=int, default=16)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    print(f"SCAFFOLD c_i of {args.model}, {args.devices} devices that each trained once, budget {args.memory_mb} MiB")
    print("store      state/device  RSS growth  in memory   on disk    put/device  get/device")
    for durable in (False, True):
        r = bench_store(args.model, args.devices, args.memory_mb, durable)
        print(
            f"{'durable' if durable else 'spilling':<10} {r['per_device_kb']:>8.1f} KB {r['rss_mb']:>8.1f} MB "
            f"{r['memory_mb']:>8.1f} MB {r['disk_mb']:>8.1f} MB {r['put_ms']:>8.3f} ms {r['get_ms']:>8.3f} ms"
        )
    fedavg, scaffold = bench_training(args.model, args.group, args.reps)
    print(
        f"vectorised training, group of {args.group}: FedAvg {fedavg * 1e3:.2f} ms/device, SCAFFOLD's rule "
        f"{scaffold * 1e3:.2f} ms/device, ratio {scaffold / fedavg:.3f}"
    )


if __name__ == "__main__":
    main()
