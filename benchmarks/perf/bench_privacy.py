"""Differential privacy at the cpu scale: accuracy at a few epsilon values, and what DP costs a job's wall time.

Accuracy (the default): FedAvg and FedBuff on ``reproduce_fedrevive.py``'s cpu scale (the hard generated data,
cifar10_convnet, 2 x 100 devices, K = 20, 25 local Adam steps, the paper's delays, 40 simulated time units), each
without DP and with central DP at each target epsilon of ``--epsilons`` (delta ``--delta``), the noise multiplier
computed for the planned run (``--dp-target-epsilon`` with ``--max-sim-time``: the dry-run planner). One line per
run and ``results.md`` in ``--output``: the noise multiplier, the epsilon spent, final and best accuracy (chance:
0.1) and wall seconds.

    python benchmarks/perf/bench_privacy.py --methods fedavg,fedbuff --epsilons 8,2 --seed 0
    python benchmarks/perf/bench_privacy.py --methods fedavg --epsilons 8,2 -- --synthetic-difficulty 0 --global-lr 0.3
    python benchmarks/perf/bench_privacy.py --methods fedbuff --epsilons 8,2 -- --synthetic-difficulty 0 --global-lr 0.01

``--overhead``: one job (``--methods``' first, ``--overhead-versions`` versions of the cpu scale) run without and
with central DP, alternated ``--repeats`` times; the median of each side's steady-state seconds per version
(between the first and the last evaluated version, start-up left out) and of its whole wall time, and the line
``job dp: <X>x`` (DP's steady-state seconds per version over the plain run's), after a line timing the training
of the cpu scale's devices from the last DP run's final weights against the last plain run's, without DP (what the
weights DP's noise leads to cost training, apart from DP's own work), and a line timing the same at one thread
with denormal floats kept and flushed to zero (whether that cost is denormal arithmetic; a DP run flushes them by
default, ``--flush-denormal auto``); ``--kept`` adds a third side, DP with ``--flush-denormal off``, and the line
``job dp kept: <X>x``. Take it on an idle
machine, with FedAvg: central DP holds each asynchronous device until its version is made
(``scheduling.schedule``), so a FedBuff run with DP follows another schedule (other groups, other waits) and its
time differs for that reason too; a synchronous run's schedule is the same with and without DP, so the ratio is
what DP costs the run: its own work, and training from the weights its noise leads to (the lines before separate
them).

    python benchmarks/perf/bench_privacy.py --overhead --methods fedavg --repeats 3

Extra job flags after ``--`` go to every run (e.g. ``-- --dp-clip-norm 1 --num-updates-for-model 10``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from benchmarks.lib.harness import run_job  # noqa: E402
from benchmarks.lib.scales import SCALES, resolved_config  # noqa: E402
from processors.training_config import TrainingConfig  # noqa: E402

CPU = SCALES["cpu"]
CLIP_NORM = "2"  # about the median L2 norm of a device's update at this scale (25 Adam steps at 1e-3: 2.1 to 2.3)


def flags(method: str, epsilon: float | None, delta: float, seed: int, extra: list[str]) -> list[str]:
    dp = [] if epsilon is None else ["--dp", "central", "--dp-target-epsilon", str(epsilon), "--dp-delta", str(delta)]
    dp += ["--dp-clip-norm", CLIP_NORM] if dp else []
    return ["--method", method, *CPU["flags"], "--seed", str(seed), *dp, *extra]


def accuracy(args, extra: list[str]) -> None:
    rows = []
    for method in args.methods.split(","):
        for epsilon in [None, *[float(e) for e in args.epsilons.split(",") if e.strip()]]:
            name = f"{method}-{'none' if epsilon is None else f'eps{epsilon:g}'}"
            budget = ["--max-sim-time", str(CPU["budget"]), "--max-model-version", "100000"]  # the time budget ends it
            run = flags(method, epsilon, args.delta, args.seed, [*budget, *extra])
            result = run_job("jobs/pt_job_fedrevive.py", run, os.path.join(args.output, name))
            records = result.versions
            privacy = records[-1].get("privacy") or {}
            row = {
                "method": method,
                "target epsilon": "no DP" if epsilon is None else f"{epsilon:g}",
                "noise multiplier": privacy.get("noise_multiplier", "-"),
                "epsilon spent": privacy.get("epsilon", "-"),
                "versions": records[-1]["version"],
                "final accuracy": records[-1]["accuracy"],
                "best accuracy": max(r["accuracy"] for r in records),
                "wall s": round(result.ended - result.started, 1),
            }
            rows.append(row)
            print(" | ".join(f"{k} {v}" for k, v in row.items()), flush=True)
    head = list(rows[0])
    table = "\n".join(
        ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
        + ["| " + " | ".join(str(r[k]) for k in head) + " |" for r in rows]
    )
    with open(os.path.join(args.output, "results.md"), "w") as f:
        f.write(
            f"cpu scale, {CPU['budget']:g} time units, seed {args.seed}, delta {args.delta:g}, chance 0.1\n\n{table}\n"
        )
    print(table)


def overhead(args, extra: list[str]) -> None:
    method = args.methods.split(",")[0]
    more = ["--max-model-version", str(args.overhead_versions), "--eval-frequency", "1", *extra]
    sides = {"plain": flags(method, None, args.delta, args.seed, more)}
    sides["dp"] = [*sides["plain"], "--dp", "central", "--dp-noise-multiplier", "1.0", "--dp-clip-norm", CLIP_NORM]
    if args.kept:
        sides["dp-kept"] = [*sides["dp"], "--flush-denormal", "off"]
    per_version: dict[str, list[float]] = {k: [] for k in sides}
    wall: dict[str, list[float]] = {k: [] for k in sides}
    for i in range(args.repeats):
        names = list(sides)
        for side in names[i % len(names) :] + names[: i % len(names)]:  # rotate which runs first
            result = run_job("jobs/pt_job_fedrevive.py", sides[side], os.path.join(args.output, f"{side}-{i}"))
            steady = result.steady_state()
            per_version[side].append(steady["wall_seconds"] / (steady["to_version"] - steady["from_version"]))
            wall[side].append(result.ended - result.started)
            print(f"{side} run {i}: {per_version[side][-1]:.3f} s/version, {wall[side][-1]:.1f} s in all", flush=True)
    trial = WeightsTrial.of(*(os.path.join(args.output, f"{side}-{args.repeats - 1}") for side in ("plain", "dp")))
    print(
        "training from the dp run's final weights / from the plain run's (the same devices and code, no DP; "
        f"median of 10 alternating pairs): {weights_cost(trial):.3f}x"
    )
    print(denormal_cost(trial))
    med = {side: (statistics.median(per_version[side]), statistics.median(wall[side])) for side in sides}
    for side, (v, w) in med.items():
        print(f"{method} {side}: median {v:.3f} s/version (steady state), {w:.1f} s wall in all")
    print(f"job dp wall: {med['dp'][1] / med['plain'][1]:.3f}x")
    if "dp-kept" in med:
        print(f"job dp kept: {med['dp-kept'][0] / med['plain'][0]:.3f}x (denormals kept: --flush-denormal off)")
    print(f"job dp: {med['dp'][0] / med['plain'][0]:.3f}x")


@dataclass
class WeightsTrial:
    """The cpu scale's devices, their training settings, and the two runs' final global models (plain, DP): what
    ``weights_cost`` trains, built once for all its timings."""

    training: TrainingConfig
    data: list[tuple]
    weights: list[dict]

    @classmethod
    def of(cls, plain_run: str, dp_run: str) -> WeightsTrial:
        import torch

        from benchmarks.perf.bench_engine import device_data
        from common.result_files import GLOBAL_MODEL
        from processors.data.sources import make_synthetic

        cfg = resolved_config(["python", "job", *flags("fedavg", None, 1e-5, 0, [])])
        devices, samples = cfg.federation.device_selection_size, cfg.data.subset_size
        cpu = torch.device("cpu")
        data = device_data(make_synthetic(devices * samples, 100, seed=0), devices, samples, seed=1, device=cpu)
        runs = (plain_run, dp_run)
        weights = [torch.load(os.path.join(r, GLOBAL_MODEL), map_location=cpu, weights_only=True) for r in runs]
        return cls(cfg.training, data, weights)


def weights_cost(trial: WeightsTrial, pairs: int = 10) -> float:
    """Training the cpu scale's devices from the DP run's final global model over training them from the plain
    run's: the same devices, batches and code, without DP, in alternating pairs (the median ratio). It tells how
    much of ``job dp`` is DP's own work and how much the speed of training from the weights DP's noise leads to."""
    import torch

    from processors.data.sources import normalize
    from processors.training_vectorized import train_group

    cpu = torch.device("cpu")

    def seconds(params: dict) -> float:
        gens = [torch.Generator().manual_seed(i) for i in range(len(trial.data))]
        start = time.perf_counter()
        train_group(trial.training.model, params, trial.data, trial.training, gens, cpu, prepare=normalize)
        return time.perf_counter() - start

    for params in trial.weights:  # warm-up
        seconds(params)
    ratios = []
    for i in range(pairs):  # the sides' order alternates, so neither always runs on a warmer cache
        first, second = (0, 1) if i % 2 == 0 else (1, 0)
        took = {first: seconds(trial.weights[first]), second: seconds(trial.weights[second])}
        ratios.append(took[1] / took[0])
    return statistics.median(ratios)


def denormal_cost(trial: WeightsTrial) -> str:
    """``weights_cost`` at one thread with denormal floats kept and flushed to zero (``torch.set_flush_denormal``,
    which sets the calling thread only: at one thread it holds wherever the training runs). Where flushing brings
    the ratio to 1, the DP weights' extra time is denormal arithmetic (activations and gradients under about
    1.2e-38, which the CPU computes slowly), not DP's work."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        kept = weights_cost(trial)
        torch.set_flush_denormal(True)
        flushed = weights_cost(trial)
    finally:
        torch.set_flush_denormal(False)
        torch.set_num_threads(threads)
    return f"the same at one thread: denormals kept {kept:.3f}x, flushed to zero {flushed:.3f}x"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--methods", default="fedavg,fedbuff")
    p.add_argument("--epsilons", default="8,2", help="target epsilons (besides a run without DP)")
    p.add_argument("--delta", type=float, default=1e-5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output", default=None, help="where the runs go (default: a new temporary folder)")
    p.add_argument("--overhead", action="store_true", help="measure DP's cost in one job instead (see above)")
    p.add_argument("--overhead-versions", type=int, default=12)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--kept", action="store_true", help="--overhead: also DP with --flush-denormal off (a third side)")
    args = p.parse_args(argv)
    args.output = args.output or tempfile.mkdtemp(prefix="bench_privacy_")
    print(f"[bench_privacy] runs in {args.output}")
    (overhead if args.overhead else accuracy)(args, extra)
    return 0


if __name__ == "__main__":
    sys.exit(main())
