"""The paper's seed in minutes? Runs a slice of one seed of R2's table (``reproduce_fedrevive.py --scale paper``)
for each method and extrapolates the whole seed from the jobs' own counts.

Each method's slice is its real job (``jobs/pt_job_fedrevive.py`` with the paper scale's flags), stopped after its
first versions (``--versions``). The whole seed's counts (updates, versions, evaluations, FedRevive's synthesis
rounds and distillations within the 200 time units) come from the same job's event trace over the whole budget,
computed in-process as ``--dry-run`` computes it (``jobs.run.schedule_plan.schedule_for``). From each slice's steady
stretch (``benchmarks.repro.seed_slice``) it prints:

* the wall seconds of each phase (device training, the server's intake and aggregation, FedRevive's synthesis and
  distillation, evaluation, and the server's waiting: the wire, or training still under way), per unit and over
  the whole seed, all taken from what the job records (``metrics.json``'s ``server`` and ``eval_seconds``, the
  leaves' ``train_seconds``, FedRevive's ``synth_seconds`` and ``distill_seconds``);
* the GPU busy % the run's system monitor recorded, and the job's training samples/s against the engine's floor
  (one device trained alone, in this process, at the job's precision);
* each method's estimate and, last, ``seed estimate: N min (goal 30)``.

FedRevive's slice starts synthesis at version 10 and revival at 20 (the paper: 50 and 100) so that revival is
measured within minutes; what an update costs does not depend on when revival starts (8 teachers once 8 updates
came in), and the whole seed's counts keep the paper's phases. Without ``--data-root`` the slices train on
generated CIFAR-shaped data (the same shapes and work; a GPU lease has no CIFAR-10); with it, on CIFAR-10.

``--new FLAGS`` runs every slice twice, with today's settings and with FLAGS added (e.g. ``--precision bf16
--fr-batched-teachers on``), and prints the two side by side with their ratios; the last line is then the new
settings' estimate. ``--tiny`` is a CPU-sized slice of a small seed (the convnet on generated data, FedRevive's
small settings), for CI: it checks the instrument, not the paper. Any other job flag goes after ``--``.

    python benchmarks/repro/paper_seed.py --device cuda [--new "--precision bf16"] [--output DIR]
    python benchmarks/repro/paper_seed.py --device cpu --tiny
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

from benchmarks.lib.fedrevive_small import FEDREVIVE_SMALL  # noqa: E402
from benchmarks.lib.scales import SCALES, resolved_config  # noqa: E402
from benchmarks.repro.reproduce_fedrevive import job_command  # noqa: E402
from benchmarks.repro.seed_slice import (  # noqa: E402
    PHASES,
    estimate,
    phases,
    read_slice,
    seed_counts,
    seed_phase_seconds,
    window,
)

METHODS = ("fedavg", "fedbuff", "fedrevive")
RESERVE = 0.7  # of an equal share of the deadline, kept for each slice still to run
GOAL_MINUTES = 30
# the slice's FedRevive phases start early, so revival is measured within minutes (module docstring)
EARLY_REVIVAL = "--fr-distill-from-version 10 --fr-kd-train-from-version 20".split()
# --tiny: a seed small enough for a CI machine's CPU, the cpu scale's shape (generated data, the convnet)
TINY = (
    "--dataset synthetic --synthetic-size 3000 --model cifar10_convnet --num-leaf-nodes 2 --devices-per-leaf 10 "
    "--device-selection-size 8 --subset-size 50 --local-iters 5 --local-lr 1e-3 --delays paper --eval-backlog wait"
).split()
TINY_ASYNC = ["--eval-frequency", "2"]  # every second version (a synchronous method keeps every version)
SLICE_VERSIONS = {
    "paper": {"fedavg": 2, "fedbuff": 30, "fedrevive": 30},
    "tiny": {"fedavg": 2, "fedbuff": 8, "fedrevive": 6},
}
BUDGET = {"paper": SCALES["paper"]["budget"], "tiny": 40.0}


def seed_command(method: str, scale: str, seed: int, out: str, extra: list[str]) -> list[str]:
    """The whole seed's job command (the paper scale's, or the tiny seed's)."""
    if scale == "paper":
        return job_command(method, seed, "paper", BUDGET[scale], out, extra)
    own = [*TINY_ASYNC, *FEDREVIVE_SMALL] if method == "fedrevive" else TINY_ASYNC if method == "fedbuff" else []
    return job_command(method, seed, "cpu", BUDGET[scale], out, [*TINY, *own, *extra])


def slice_command(seed_cmd: list[str], method: str, scale: str, versions: int) -> list[str]:
    """The slice: the seed's command stopped after ``versions`` versions (FedRevive's phases early at the paper
    scale; evaluation, checkpoints as the seed has them)."""
    early = EARLY_REVIVAL if method == "fedrevive" and scale == "paper" else []
    return [*seed_cmd, *early, "--max-model-version", str(versions), "--checkpoint-every", "-1"]


def whole_seed(cmd: list[str], budget: float) -> dict:
    """The seed's counts from its own event trace (``--dry-run``'s schedule, computed here)."""
    from jobs.run.schedule_plan import schedule_for
    from scheduling.timeline import run_timeline

    cfg = resolved_config(cmd)
    schedule = schedule_for(cfg)
    trace = run_timeline(schedule, len(schedule.pool)).trace
    revive = cfg.method_settings.to_dict() if cfg.method_spec.name == "fedrevive" else None
    return seed_counts(trace, budget, cfg.method_spec.synchronous, revive)


def run_slice(cmd: list[str], out: str, deadline: float) -> tuple[float, float, int]:
    """Run a slice's job until it ends or ``deadline`` (epoch seconds) passes; then SIGTERM, which the job turns
    into a recorded interruption (its ``metrics.json`` keeps what it measured). (started, ended, exit code)."""
    os.makedirs(out, exist_ok=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH")) if p)
    started = time.time()
    with open(os.path.join(out, "..", "job.log"), "w") as log:
        job = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = job.wait(timeout=max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            job.send_signal(signal.SIGTERM)
            try:
                code = job.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(job.pid, signal.SIGKILL)  # the job's own session: nothing of it is left behind
                code = job.wait()
    return started, time.time(), code


def engine_floor(training: dict, device: str, repeats: int = 3) -> float:
    """Samples/s of one device trained alone by the per-device engine (``train_local``), at the job's model,
    local work, precision and layout levers, uncompiled (a compile would outlast the deadline): the floor a job's
    training is compared with. Best of ``repeats`` after a warm-up."""
    import torch

    from processors.data.sources import make_synthetic
    from processors.device import resolve_device
    from processors.models import build_model
    from processors.training import TrainingConfig, train_local, worker_model

    dev = resolve_device(device)
    cfg = TrainingConfig(**(training | {"compute_device": str(dev), "local_epochs": 0, "compile": "off"}))
    data = make_synthetic(400, 10, seed=0).to(dev)
    x, y = data.x_train[:350], data.y_train[:350]
    torch.manual_seed(0)
    start = {k: v.detach().to(dev) for k, v in build_model(cfg.model).state_dict().items()}
    model = worker_model(cfg.model, dev)
    best = float("inf")
    for i in range(repeats + 1):
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        began = time.perf_counter()
        train_local(model, start, x, y, cfg, torch.Generator().manual_seed(i))  # copies its diff to the host
        if i:  # the first is the warm-up
            best = min(best, time.perf_counter() - began)
    return cfg.work(len(y)) / best


def measure(method: str, scale: str, args, extra: list[str], side: str, deadline: float) -> dict:
    """One method's slice on one side: its run, window, phases and estimate, as a dict (and the lines to print)."""
    out = os.path.join(args.output, side, method, "out")
    seed_cmd = seed_command(method, scale, args.seed, out, extra)
    counts = whole_seed(seed_cmd, BUDGET[scale])
    cmd = slice_command(seed_cmd, method, scale, args.versions[method])
    print(f"[paper-seed] {side} {method}: {shlex.join(cmd[1:])}", flush=True)
    started, ended, code = run_slice(cmd, out, deadline)
    s = read_slice(method, out, started, ended, code)
    config = s.metrics.get("config", {})
    revive = config.get("method_settings") or {}
    steady_from = revive.get("kd_train_from_version", 2) if method == "fedrevive" else 2
    w = window(s, steady_from)
    result = {"method": method, "side": side, "exit": code, "seconds": round(ended - started, 1), "seed": counts}
    if w is None:
        result["error"] = f"fewer than two versions evaluated in {ended - started:.0f} s (see {out}/../job.log)"
        return result
    from processors.training_config import TrainingConfig

    training = TrainingConfig(**config["training"])
    p = phases(s, w, training.work(config["data"]["subset_size"]))
    e = estimate(s, w, p, counts)
    result |= {
        "window": {"from": w.first, "to": w.last, "seconds": w.seconds, "updates": w.updates, "steady": w.steady},
        "phases": p.seconds,
        "counts": p.counts,
        "per_unit": {k: p.per_unit(k) for k in p.seconds},
        "seed_phases": seed_phase_seconds(p, counts),
        "gpu_busy": p.gpu_busy,
        "samples_per_second": p.samples / w.seconds if w.seconds > 0 else None,
        "estimate": {"start": e.start, "steady": e.steady, "evaluating": e.evaluating, "tail": e.tail},
        "estimate_seconds": e.seconds,
        "training": config["training"],
    }
    return result


def report(r: dict, floor: float | None) -> list[str]:
    """A method's lines: its window, the phase table, GPU busy %, samples/s against the floor, its estimate."""
    head = f"{r['side']} {r['method']}: slice exit {r['exit']}, {r['seconds']:.0f} s"
    if "error" in r:
        return [f"{head}; {r['error']}"]
    w = r["window"]
    per = w["seconds"] / w["updates"] if w["updates"] else float("nan")
    lines = [
        f"{head}; window versions {w['from']}-{w['to']}{'' if w['steady'] else ' (start-up included)'}: "
        f"{w['updates']} updates in {w['seconds']:.1f} s, {per:.3f} s per update",
        f"  {'phase':<16} {'window s':>9} {'share':>6} {'n':>6} {'s per unit':>11} {'whole seed s':>13}"
        "  (training: summed over the leaves' calls, which overlap)",
    ]
    for phase, _unit, _what in PHASES:
        seconds = r["phases"].get(phase, 0.0)
        n = r["counts"].get(phase, "")
        unit = r["per_unit"].get(phase)
        whole = r["seed_phases"].get(phase)
        lines.append(
            f"  {phase:<16} {seconds:>9.2f} {100 * seconds / max(w['seconds'], 1e-9):>5.0f}% {n!s:>6} "
            f"{'-' if unit is None else f'{unit:.4f}':>11} {'-' if whole is None else f'{whole:.0f}':>13}"
        )
    busy = "n/a (no GPU)" if r["gpu_busy"] is None else f"{r['gpu_busy']:.0f}%"
    rate = r["samples_per_second"] or 0.0
    against = f" against the engine's floor {floor:.0f} ({rate / floor:.2f}x)" if floor else ""
    lines.append(f"  GPU busy {busy} (the run's monitor); training {rate:.0f} samples/s over the window{against}")
    e = r["estimate"]
    lines.append(
        f"  estimate {r['estimate_seconds'] / 60:.1f} min: start {e['start']:.0f} s + {r['seed']['updates']} "
        f"updates at the window's pace {e['steady']:.0f} s (evaluations {e['evaluating']:.0f} s) + end {e['tail']:.0f} s"
    )
    return lines


def minutes(seconds: float) -> str:
    value = seconds / 60
    return f"{value:.0f}" if value >= 10 else f"{value:.1f}"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="auto", help="the jobs' --compute-device (auto, cpu, cuda)")
    p.add_argument("--tiny", action="store_true", help="a CPU-sized slice of a small seed (CI)")
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--versions", default="", help="versions per slice, e.g. fedavg=2,fedbuff=30,fedrevive=30")
    p.add_argument("--new", default="", metavar="FLAGS", help="also run every slice with these job flags added")
    p.add_argument("--data-root", default="", help="CIFAR-10's folder (default: generated data of its shape)")
    p.add_argument("--deadline", type=float, default=480.0, help="seconds for all slices (each stops at its share)")
    p.add_argument("--output", default="", help="results folder (default: a new temporary one)")
    args = p.parse_args(argv)
    scale = "tiny" if args.tiny else "paper"
    methods = [m for m in args.methods.split(",") if m]
    if set(methods) - set(METHODS):
        p.error(f"--methods: choose among {','.join(METHODS)}")
    try:
        given = dict(item.split("=") for item in args.versions.split(",") if item)
        args.versions = SLICE_VERSIONS[scale] | {m: int(v) for m, v in given.items()}
    except ValueError:
        p.error(f"--versions {args.versions}: give method=N pairs, e.g. fedavg=2,fedbuff=30")
    if any(v < 2 for v in args.versions.values()):
        p.error("--versions: each slice needs at least 2 versions")
    args.output = os.path.abspath(args.output or tempfile.mkdtemp(prefix="paper_seed_"))
    data = ["--dataset", "cifar10", "--data-root", args.data_root] if args.data_root else ["--dataset", "synthetic"]
    base = [*(data if scale == "paper" else []), "--compute-device", args.device, *extra]
    sides = {"today": base} | ({"new": [*base, *shlex.split(args.new)]} if args.new else {})

    from processors.device import resolve_device

    device = resolve_device(args.device)
    name = "cpu"
    if device.type == "cuda":
        import torch

        name = torch.cuda.get_device_name(device)
    print(f"[paper-seed] {scale} scale, seed {args.seed}, {device} ({name}); output {args.output}", flush=True)
    started = time.time()
    jobs = len(methods) * len(sides)
    results: dict[str, list[dict]] = {side: [] for side in sides}
    floors: dict[str, float] = {}
    for method in methods:
        for side, flags in sides.items():
            left = started + args.deadline - time.time()
            remaining = jobs - sum(len(rs) for rs in results.values())
            # this slice may run past an equal share, while each slice after it keeps RESERVE of one
            allowed = left - RESERVE * left / remaining * (remaining - 1)
            results[side].append(measure(method, scale, args, flags, side, time.time() + max(allowed, 30.0)))
    for side, rs in results.items():
        training = next((r["training"] for r in rs if "training" in r), None)
        if training is not None:
            floors[side] = engine_floor(training, str(device))
    totals = {}
    for side, rs in results.items():
        print(f"\n[paper-seed] {side}: {shlex.join(sides[side]) or 'the scale as it is'}")
        if side in floors:
            t = next(r["training"] for r in rs if "training" in r)
            print(
                f"engine floor: {floors[side]:.0f} samples/s ({t['model']}, one device alone, {t['local_iters']} x "
                f"{t['local_batch_size']}, precision {t.get('precision', 'fp32')})"
            )
        counts = "; ".join(f"{r['method']} {json.dumps(r['seed'])}" for r in rs)
        print(f"whole seed ({BUDGET[scale]:g} time units, from the jobs' own event traces): {counts}")
        for r in rs:
            print("\n".join(report(r, floors.get(side))))
        done = [r for r in rs if "estimate_seconds" in r]
        totals[side] = sum(r["estimate_seconds"] for r in done) if len(done) == len(rs) else None
    with open(os.path.join(args.output, "paper_seed.json"), "w") as f:
        json.dump({"scale": scale, "device": name, "sides": sides, "results": results, "floors": floors}, f, indent=1)
    if "new" in results:
        print("\n[paper-seed] new vs today (ratio of today's to the new settings' seconds: above 1 is faster)")
        for today, new in zip(results["today"], results["new"], strict=True):
            if "estimate_seconds" in today and "estimate_seconds" in new:
                ratios = {
                    k: today["per_unit"][k] / new["per_unit"][k]
                    for k in today["per_unit"]
                    if today["per_unit"][k] and new["per_unit"].get(k)
                }
                shown = ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items())
                print(f"{today['method']}: seed {today['estimate_seconds'] / new['estimate_seconds']:.2f}x; {shown}")
    print(f"[paper-seed] {jobs} slice(s) in {time.time() - started:.0f} s; details in {args.output}/paper_seed.json")
    if totals.get("today") is not None and "new" in totals:
        print(f"seed estimate today: {minutes(totals['today'])} min")
    final = totals.get("new", totals.get("today"))
    if final is None:
        print("seed estimate: unknown min (goal 30): a slice evaluated fewer than two versions (see above)")
        return 1
    print(f"seed estimate: {minutes(final)} min (goal {GOAL_MINUTES})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
