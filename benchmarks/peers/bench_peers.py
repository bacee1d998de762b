"""Our FedAvg job beside pfl-research (and a plain-PyTorch floor) on the same work, side by side from one run.

The work (issue 34, pfl-research's CIFAR-10 setting on our generated hard data):

- 1,000 users of 50 samples of the hard synthetic data (``--synthetic-difficulty 1``; 50,000 training images),
  user ``site-L#i`` holding the samples our job's device of that name trains on (``processors.data.partition``);
- 50 users a round, ``--rounds`` rounds (small by default);
- ``Cifar10ConvNet`` with the run seed's initial weights (``processors.models.initial_model``);
- 5 SGD steps of batch 10 at lr 0.1 on each user, plain FedAvg (server learning rate 1).

Sides:

- ``ours``: ``jobs/pt_job_fedavg.py`` in SimEnv (2 leaves x 500 devices), a subprocess;
- ``pfl``: pfl 0.6 in its best local setting, one process per core (``torchrun --nproc_per_node=2``), running
  ``benchmarks/peers/peers_pfl.py``;
- ``flower``: Flower 1.42's Simulation Runtime (Ray, one CPU per client, a client per core at once), running
  ``benchmarks/peers/peers_flower.py``: its ``FedAvg`` strategy, one SuperNode per user; by default only where ``flwr``
  imports;
- ``floor``: plain PyTorch, no FL framework: 2 processes each train half of a round's users one after another.

Each side prints start-up (its process start to its first round done), seconds per round (median), client
updates per second, the ratio of its round time to the floor's, the time from its last round to its exit, the
whole process, and its final accuracy on the 10,000 test images. Timings are wall-clock on whatever machine runs
it: on a shared machine, compare the sides of one run, not runs.

The peers are an optional extra (``pip install -e '.[peers]'``); the project never imports them. Without the
extra this prints one line and exits with 2. ``--ours-python`` names the interpreter for our job (one with NVFlare)
when the peers live in another environment.

    python benchmarks/peers/bench_peers.py --rounds 10
    /path/to/peers-venv/bin/python benchmarks/peers/bench_peers.py --ours-python .venv/bin/python --rounds 10
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SIDES = ("ours", "pfl", "flower", "floor")
LEAVES = 2
PEERS = {"pfl": "pfl", "flower": "flwr"}  # side -> the module of the extra it needs
OPTIONAL = ("flower",)  # sides left out of the default when their module does not import
TIMEOUT = 3600  # seconds one side may take


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5, help="FedAvg rounds on every side (default: 5)")
    p.add_argument("--users", type=int, default=1000, help="users (an even number: 2 leaves) (default: 1000)")
    p.add_argument("--samples", type=int, default=50, help="training samples per user (default: 50)")
    p.add_argument("--cohort", type=int, default=50, help="users a round (default: 50)")
    p.add_argument("--seed", type=int, default=0, help="the run seed: data, partition, initial weights")
    p.add_argument(
        "--sides",
        default="",
        help=f"comma-separated, of {', '.join(SIDES)} (default: all; flower only if flwr imports)",
    )
    p.add_argument("--ours-python", default=sys.executable, help="the interpreter our job runs with (has NVFlare)")
    args = p.parse_args(argv)
    args.sides = [s.strip() for s in args.sides.split(",") if s.strip()] or [
        s for s in SIDES if s not in OPTIONAL or importlib.util.find_spec(PEERS[s]) is not None
    ]
    unknown = [s for s in args.sides if s not in SIDES]
    if unknown:
        p.error(f"--sides: unknown {unknown}; choose from {list(SIDES)}")
    if args.users % LEAVES or args.users < args.cohort or min(args.rounds, args.samples, args.cohort) < 1:
        p.error("--users must be even and at least --cohort; --rounds, --samples and --cohort at least 1")
    return args


def missing_peers(sides: list[str]) -> list[str]:
    """The extra's modules the ``sides`` need that this interpreter lacks."""
    return [PEERS[s] for s in sides if s in PEERS and importlib.util.find_spec(PEERS[s]) is None]


# -- the shared work: data, users, model ---------------------------------------------------------------------
def work(args: argparse.Namespace) -> dict:
    """What every side trains on, as plain values (they travel to the pfl workers as JSON)."""
    return {
        "users": args.users,
        "samples": args.samples,
        "cohort": args.cohort,
        "rounds": args.rounds,
        "seed": args.seed,
        "synthetic_size": args.users * args.samples,
        "difficulty": 1.0,
        "alpha": 0.5,  # the job's default label skew
        "steps": 5,
        "batch": 10,
        "lr": 0.1,
    }


def user_names(w: dict) -> list[str]:
    """Our job's device names: ``site-L#i``, the key of each device's samples."""
    per_leaf = w["users"] // LEAVES
    return [f"site-{leaf + 1}#{i}" for leaf in range(LEAVES) for i in range(per_leaf)]


def load_work(w: dict):
    """(dataset, {user: (x float, y)}) of the shared work: the job's cached hard synthetic set and partition."""
    import torch

    sys.path.insert(0, str(REPO))
    from processors.data.config import DataConfig
    from processors.data.partition import device_indices
    from processors.data.sources import cached_synthetic

    data_root = DataConfig().spec(w["seed"]).data_root
    n_test = max(w["synthetic_size"] // 5, 100)
    data = cached_synthetic(w["synthetic_size"], n_test, w["seed"], w["difficulty"], data_root)
    labels = data.y_train.numpy()
    users = {}
    for name in user_names(w):
        idx = torch.from_numpy(device_indices(labels, name, w["samples"], w["alpha"], w["seed"], data.num_classes))
        users[name] = (data.prepare(data.x_train.index_select(0, idx)), data.y_train.index_select(0, idx))
    return data, users


def initial_net(w: dict):
    sys.path.insert(0, str(REPO))
    from processors.models import initial_model

    return initial_model("cifar10_convnet", w["seed"])


def cohorts(w: dict) -> list[list[str]]:
    """Each round's users, seeded (the floor's; pfl and our job draw their own the same way: uniformly)."""
    import numpy as np

    rng = np.random.default_rng(w["seed"])
    names = user_names(w)
    return [[names[i] for i in rng.choice(len(names), w["cohort"], replace=False)] for _ in range(w["rounds"])]


def test_accuracy(net, data) -> float:
    import torch

    net.eval()
    correct = 0
    with torch.no_grad():
        for start in range(0, len(data.y_test), 1000):
            x = data.prepare(data.x_test[start : start + 1000])
            correct += int((net(x).argmax(1) == data.y_test[start : start + 1000]).sum())
    return correct / len(data.y_test)


# -- the floor: plain PyTorch, two processes -------------------------------------------------------------------
def _floor_worker(w: dict, conn) -> None:
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(1)
    _, users = load_work(w)
    net = initial_net(w)
    conn.send("ready")
    while (job := conn.recv()) is not None:
        state, names = job
        total = {k: torch.zeros_like(v) for k, v in state.items()}
        for name in names:
            net.load_state_dict(state)
            opt = torch.optim.SGD(net.parameters(), lr=w["lr"])
            x, y = users[name]
            net.train()
            for step in range(w["steps"]):
                batch = slice(step * w["batch"], (step + 1) * w["batch"])
                opt.zero_grad(set_to_none=True)
                F.cross_entropy(net(x[batch]), y[batch]).backward()
                opt.step()
            for k, v in net.state_dict().items():
                total[k] += v - state[k]
        conn.send(total)


def run_floor(w: dict) -> dict:
    started = time.time()
    ctx = mp.get_context("spawn")
    pipes, procs = [], []
    for _ in range(LEAVES):
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_floor_worker, args=(w, child), daemon=True)
        proc.start()
        pipes.append(parent)
        procs.append(proc)
    for pipe in pipes:
        pipe.recv()
    data, _ = load_work(w)
    net = initial_net(w)
    ends = [time.time()]
    for names in cohorts(w):
        state = {k: v.clone() for k, v in net.state_dict().items()}
        for rank, pipe in enumerate(pipes):
            pipe.send((state, names[rank::LEAVES]))
        diffs = [pipe.recv() for pipe in pipes]
        net.load_state_dict({k: state[k] + sum(d[k] for d in diffs) / len(names) for k in state})
        ends.append(time.time())
    for pipe in pipes:
        pipe.send(None)
    for proc in procs:
        proc.join()
    accuracy = test_accuracy(net, data)
    return {"started": started, "round_ends": ends[1:], "ready": ends[0], "exit": time.time(), "accuracy": accuracy}


# -- the peers and our job -------------------------------------------------------------------------------------
def run_pfl(w: dict) -> dict:
    out = tempfile.mktemp(suffix=".json", prefix="pfl-")
    started = time.time()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={LEAVES}"]
    cmd += [str(REPO / "benchmarks" / "peers" / "peers_pfl.py"), json.dumps(w), out]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=_env(), timeout=TIMEOUT)
    ended = time.time()
    if done.returncode != 0:
        raise RuntimeError(f"pfl failed ({done.returncode}): {done.stderr[-2000:]}")
    with open(out) as f:
        result = json.load(f)
    os.remove(out)
    return result | {"started": started, "exit": ended}


def run_flower(w: dict) -> dict:
    out = tempfile.mktemp(suffix=".json", prefix="flower-")
    env = _env() | {"BENCH_PEERS_WORK": json.dumps(w), "BENCH_PEERS_OUT": out}
    started = time.time()
    cmd = [sys.executable, str(REPO / "benchmarks" / "peers" / "peers_flower.py")]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env, timeout=TIMEOUT)
    ended = time.time()
    if done.returncode != 0 or not os.path.exists(out):
        raise RuntimeError(f"Flower failed ({done.returncode}): {done.stderr[-2000:]}")
    with open(out) as f:
        result = json.load(f)
    os.remove(out)
    if result.get("unchanged_rounds"):  # its clients failed: Flower logs each error and goes on with the old model
        raise RuntimeError(
            f"Flower's global model did not change in {result['unchanged_rounds']} of {w['rounds']} rounds: its "
            f"clients failed; the first error it logged:\n{first_client_error(done.stdout + done.stderr)}"
        )
    return result | {"started": started, "exit": ended}


def run_ours(w: dict, python: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-peers-") as folder:
        flags = ["--synthetic-size", w["synthetic_size"], "--synthetic-difficulty", w["difficulty"]]
        flags += ["--subset-size", w["samples"], "--dirichlet-alpha", w["alpha"], "--num-leaf-nodes", LEAVES]
        flags += ["--devices-per-leaf", w["users"] // LEAVES, "--device-selection-size", w["cohort"]]
        flags += ["--local-iters", w["steps"], "--local-batch-size", w["batch"], "--local-lr", w["lr"]]
        flags += ["--optimizer", "sgd", "--max-model-version", w["rounds"] + 1, "--eval-frequency", w["rounds"] + 1]
        flags += ["--seed", w["seed"], "--output", folder]
        started = time.time()
        done = subprocess.run(
            [python, "jobs/pt_job_fedavg.py", *map(str, flags)],
            cwd=REPO,
            capture_output=True,
            text=True,
            env=_env(),
            timeout=TIMEOUT,
        )
        ended = time.time()
        if done.returncode != 0:
            raise RuntimeError(f"our job failed ({done.returncode}): {done.stdout[-2000:]}{done.stderr[-2000:]}")
        sys.path.insert(0, str(REPO))
        from common.result_files import METRICS

        with open(os.path.join(folder, METRICS)) as f:
            metrics = json.load(f)
    versions = metrics["versions"]
    # version 1 is the initial model, version R + 1 the model after R rounds; seconds_per_version is the job's own
    # mean over the rounds between the two
    first, last = versions[0], versions[-1]
    per_round = metrics["summary"]["seconds_per_version"]
    return {
        "started": started,
        "ready": first["epoch"],  # version 1, the initial model: round 1 starts (after its evaluation, though)
        "per_round": per_round,
        "last_round": last["epoch"],
        "exit": ended,
        "accuracy": last["accuracy"],
    }


def first_client_error(log: str) -> str:
    """The first lines of the first error a Flower client reported in ``log`` ("" for none)."""
    at = log.find("Received error in reply")
    return log[at : at + 600] if at >= 0 else log[-600:]


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    return env


def summarise(side: str, r: dict, w: dict) -> dict:
    """The figures of one side from its raw times."""
    if "round_ends" in r:
        ends = r["round_ends"]
        per_round = statistics.median(b - a for a, b in zip([r["ready"], *ends], ends, strict=False))
        r = r | {"last_round": ends[-1], "per_round": per_round}
    return {
        "side": side,
        "startup": r["ready"] - r["started"],
        "per_round": r["per_round"],
        "updates_per_s": w["cohort"] / r["per_round"],
        "after_last": r["exit"] - r["last_round"],
        "whole": r["exit"] - r["started"],
        "accuracy": r["accuracy"],
    }


def table(rows: list[dict]) -> str:
    floor = next((r["per_round"] for r in rows if r["side"] == "floor"), None)
    lines = ["side    start-up to round 1  s/round  updates/s  x floor  after last round  whole process  accuracy"]
    for r in rows:
        ratio = f"{floor / r['per_round']:.2f}x" if floor else "-"
        lines.append(
            f"{r['side']:<7} {r['startup']:>17.1f} s {r['per_round']:>8.3f} {r['updates_per_s']:>10.0f} "
            f"{ratio:>8} {r['after_last']:>15.1f} s {r['whole']:>12.1f} s {r['accuracy']:>9.3f}"
        )
    by = {r["side"]: r for r in rows}
    if "ours" in by and "pfl" in by:
        o, p = by["ours"], by["pfl"]
        lines.append(
            f"ours / pfl: whole process {o['whole'] / p['whole']:.2f}x (goal <= 0.8), "
            f"s per round {o['per_round'] / p['per_round']:.2f}x (goal <= 0.9)"
        )
    if "ours" in by and "flower" in by:
        o, f = by["ours"], by["flower"]
        lines.append(
            f"ours / flower: whole process {o['whole'] / f['whole']:.2f}x, s per round {o['per_round'] / f['per_round']:.2f}x"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    missing = missing_peers(args.sides)
    if missing:
        print(f"bench_peers: the peers extra is not installed ({', '.join(missing)}): pip install -e '.[peers]'")
        return 2
    w = work(args)
    load_work(w)  # the dataset made (and cached for every side) before any side is timed
    rows = []
    for side in args.sides:
        print(f"[bench_peers] {side}: {w['rounds']} rounds of {w['cohort']} of {w['users']} users ...", flush=True)
        runners = {
            "ours": lambda: run_ours(w, args.ours_python),
            "pfl": lambda: run_pfl(w),
            "flower": lambda: run_flower(w),
        }
        raw = runners.get(side, lambda: run_floor(w))()
        rows.append(summarise(side, raw, w))
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
