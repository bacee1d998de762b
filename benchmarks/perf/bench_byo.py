"""A user's own NVFlare edge recipe and task processor: NVFlare's stock device simulator vs ``use_fast_simulator``,
back to back in one run, with the processor's own compute floor.

Both runs are ``examples/drop_in_recipe.py``: NVFlare's ``EdgeFedBuffRecipe`` with a ``SimulationConfig``
(NVFlare's ``TPORunner``, 10 workers per leaf, as in NVFlare's examples) and ``examples/example_style_processor.py``:
each task loads the dataset file, builds a DataLoader and trains a small ConvNet with Adam (25 steps of 32 by
default). Synchronous rounds: 2 leaves x 60 devices, 100 devices a round, a new version from all 100 updates. The
first run is NVFlare's stock simulator (``--stock``); the second the same recipe after ``use_fast_simulator(recipe)``
with no option: each leaf plans its own workers and torch threads; the third (``--interval``, default 0.25 s) also
sets the leaves' sync interval (NVFlare's default is 1 s). Each run has its own process and workspace.

Seconds per version are taken from the server's log (the times NVFlare's ``BuffModelManager`` logs "generated new
model version"), from the first new version to the last, so start-up is left out. The compute floor is the
processor's training of one device, timed in this process on one torch thread, times a round's devices, divided by
the machine's cores (every core training its own device): what no simulator can beat with this processor.

    python benchmarks/perf/bench_byo.py [--versions 4] [--loader-workers 0]

The last line is ``speedup: <X>x``.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from types import SimpleNamespace

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLES = os.path.join(REPO, "examples")
sys.path.insert(0, EXAMPLES)
VERSION_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*generated new model version (\d+) with (\d+)")


def seconds_per_version(workspace: str) -> tuple[float, list[int]]:
    """(seconds per version between the first trained version and the last, updates per version) from the
    server's log."""
    logs = glob.glob(os.path.join(workspace, "**", "server", "log.txt"), recursive=True)
    if not logs:
        raise RuntimeError(f"no server log under {workspace}")
    stamps, updates = [], []
    with open(logs[0]) as f:
        for line in f:
            m = VERSION_LINE.match(line)
            if m and int(m.group(3)) > 0:  # version 1 is the initial model
                stamps.append(datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp())
                updates.append(int(m.group(3)))
    if len(stamps) < 2:
        raise RuntimeError(f"fewer than two new versions in {logs[0]}")
    return (stamps[-1] - stamps[0]) / (len(stamps) - 1), updates


def compute_floor(args) -> tuple[float, float]:
    """(seconds per task on one torch thread, floor seconds per version on this machine)."""
    import numpy as np
    import torch
    from example_style_processor import ExampleStyleProcessor, TutorialConvNet

    proc = ExampleStyleProcessor(
        args.data_file,
        subset_size=args.steps * args.batch_size,
        batch_size=args.batch_size,
        loader_workers=args.loader_workers,
    )
    weights = {k: v.clone() for k, v in TutorialConvNet().state_dict().items()}
    torch.set_num_threads(1)  # one task per core, every core busy: the best any simulator can do
    tasks = min(args.selection, 20)
    proc.device = SimpleNamespace(device_id="site-1#0")
    proc.train(weights)  # warm-up
    started = time.perf_counter()
    for i in range(tasks):
        proc.device = SimpleNamespace(device_id=f"site-{i % 2 + 1}#{i}")
        np.asarray(proc.train(weights)["fc3.bias"])
    per_task = (time.perf_counter() - started) / tasks
    return per_task, per_task * args.selection / (os.cpu_count() or 1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--devices-per-leaf", type=int, default=60)
    p.add_argument("--selection", type=int, default=100)
    p.add_argument("--versions", type=int, default=4, help="max model version (versions 2.. are trained)")
    p.add_argument("--steps", type=int, default=25, help="local steps per device (one epoch of steps x batch)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--loader-workers", type=int, default=0, help="the processor's DataLoader num_workers")
    p.add_argument("--dataset-size", type=int, default=10_000, help="images in the file each task loads")
    p.add_argument(
        "--interval",
        type=float,
        default=0.25,
        help="a third run: use_fast_simulator(recipe, update_interval=...) (0: skip it)",
    )
    args = p.parse_args()
    if args.versions < 3:
        p.error("--versions must be >= 3 (two new versions at least, to time one between them)")

    from example_style_processor import write_dataset

    root = tempfile.mkdtemp(prefix="bench_byo_")
    args.data_file = write_dataset(os.path.join(root, "data.npz"), args.dataset_size)
    print(
        f"user's recipe: 2 leaves x {args.devices_per_leaf} devices, {args.selection} a round, versions 2..{args.versions}; "
        f"processor: {args.steps} x {args.batch_size} Adam, DataLoader num_workers={args.loader_workers}, "
        f"{args.dataset_size} images loaded per task; workspace {root}"
    )
    results = {}
    runners = ("stock", "fast") + (("fast+interval",) if args.interval else ())
    for runner in runners:
        workspace = os.path.join(root, runner)
        os.makedirs(workspace)
        cmd = [
            sys.executable,
            os.path.join(EXAMPLES, "drop_in_recipe.py"),
            "--data-file",
            args.data_file,
            "--workspace",
            workspace,
        ] + [
            f"--{k.replace('_', '-')}={getattr(args, k)}"
            for k in ("devices_per_leaf", "selection", "versions", "steps", "batch_size", "loader_workers")
        ]
        cmd += {"stock": ["--stock"], "fast": [], "fast+interval": ["--update-interval", str(args.interval)]}[runner]
        started = time.time()
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
        wall = time.time() - started
        if proc.returncode:
            sys.exit(f"{runner} run failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        per_version, updates = seconds_per_version(workspace)
        results[runner] = per_version
        print(f"{runner:>13}: {per_version:6.1f} s/version (updates per version {updates}; whole run {wall:.0f} s)")
    per_task, floor = compute_floor(args)
    print(f"compute floor: {per_task:.3f} s per task in one process -> {floor:.1f} s/version on {os.cpu_count()} cores")
    print("vs the floor: " + ", ".join(f"{r} {t / floor:.2f}x" for r, t in results.items()))
    if "fast+interval" in results:
        print(f"speedup with update_interval={args.interval}: {results['stock'] / results['fast+interval']:.2f}x")
    print(f"speedup: {results['stock'] / results['fast']:.2f}x")


if __name__ == "__main__":
    main()
