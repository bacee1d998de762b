"""The server's CPU per asynchronous update without NVFlare's transport: what this project's code costs per update.

    python benchmarks/perf/bench_server_update.py --baseline-rev main --repeat 3

One process runs the server's own pieces as a FedBuff run at ``bench_protocol.py --null-training``'s setting
(2 leaves x 1,000 devices, K = 2,000, B = 2, server lr 0.05, ``--delays paper``, the convnet's layout): each
update's diff arrives as the leaf packs it (``DeviceUpdate.to_dict``, then ``from_dict`` as the server reads it),
the applier applies it in the schedule's order (``UpdateApplier.apply``: the schedule, the strategy, the version
store, the trace line, retention, the publish), and after each sync of ``--sync`` updates each leaf is answered
(``reply_to``, models included). NVFlare's messaging, sockets and FOBS are not here: ``bench_protocol.py`` measures
the whole server; this isolates the part this project writes, with the CPU time of its one thread.

``--baseline-rev REV`` runs the same measurement on an earlier commit (a temporary git worktree, its code first
on the path), alternating sides ``--repeat`` times, and prints the medians and their ratio. ``--bulk wire`` keeps
this commit's versions as a run on NVFlare's wire does (in the process's own memory), ``auto`` (the default, as a
job's) as one whose leaves map them does (``aggregation.shared_versions``); a commit without the option keeps its
own way.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# the code measured: this checkout, or the baseline's tree (the parent passes it)
sys.path.insert(0, os.environ.get("BENCH_SERVER_TREE") or REPO)

CONVNET = {  # cifar10_convnet's state_dict: names and shapes (data statistics: the trackers)
    "conv1.weight": (6, 3, 5, 5),
    "conv1.bias": (6,),
    "conv2.weight": (16, 6, 5, 5),
    "conv2.bias": (16,),
    "track1.running_mean": (6,),
    "track1.running_var": (6,),
    "track2.running_mean": (16,),
    "track2.running_var": (16,),
    "fc1.weight": (120, 400),
    "fc1.bias": (120,),
    "fc2.weight": (84, 120),
    "fc2.bias": (84,),
    "fc3.weight": (10, 84),
    "fc3.bias": (10,),
}


def measure(updates: int, sync: int, seed: int, bulk: str = "auto") -> dict:
    """CPU seconds of this thread per update over ``updates`` updates after a warm-up of 300."""
    import numpy as np
    from nvflare.apis.event_type import EventType
    from nvflare.edge.mud import StateUpdateReport

    from aggregation.global_model import GlobalModel
    from common.delays import DELAY_PRESETS
    from common.jsonio import JsonlWriter
    from common.protocol import DeviceUpdate
    from common.result_files import EVENTS
    from scheduling.applier import UpdateApplier
    from scheduling.child_reply import reply_to
    from scheduling.event_reference import make_schedule
    from tests.fakes.engine import EventEngine

    rng = np.random.default_rng(seed)
    weights = {k: rng.standard_normal(s).astype(np.float32) for k, s in CONVNET.items()}
    diff = {k: (1e-3 * rng.standard_normal(s)).astype(np.float32) for k, s in CONVNET.items()}
    model = GlobalModel(
        "aggregation.buffered_mean:BufferedMean",
        {"global_lr": 0.05},
        model="cifar10_convnet",
        seed=seed,
        compute_device="cpu",
        **({"bulk": bulk} if "bulk" in inspect.signature(GlobalModel).parameters else {}),
    )
    engine = EventEngine({"model": model})
    ctx = engine.new_context()
    engine.fire_event(EventType.START_RUN, ctx)
    leaves = {"site-1": 1000, "site-2": 1000}
    schedule = make_schedule(DELAY_PRESETS["paper"], seed, leaves, 2000, 2, 1, max_model_version=10**9)
    with tempfile.TemporaryDirectory(prefix="bench_server_update_") as tmp:
        events = JsonlWriter(os.path.join(tmp, EVENTS))
        model.start(weights, 1, ctx)
        schedule.start()
        applier = UpdateApplier(schedule, model, events, engine.new_context)
        with applier.lock:
            schedule.take_unneeded_versions()
        applier.republish()
        held = {leaf: set() for leaf in leaves}
        report = StateUpdateReport(0, 0, None, None)
        timed = started = 0.0
        for n in range(updates + 300):
            if n == 300:
                started = time.thread_time()
            due = schedule.next_due()
            if due.device in applier._held:  # the applier's own rule: the server needs it, so release
                with applier.lock:
                    applier._release_held()
            wire = DeviceUpdate(due.device, due.selection_id, due.base_version, diff).to_dict()
            t0 = time.thread_time()
            update = DeviceUpdate.from_dict(wire)
            applier.receive(update)
            applier.apply(applier.received.pop(update.device), None, ctx)
            if n % sync == sync - 1:  # each leaf's sync is answered, with the models it lacks
                for leaf in leaves:
                    reply = reply_to(applier, {leaf}, report, held[leaf])
                    held[leaf] |= set((reply.get("edgesim_models") or {}).keys())
                    held[leaf] &= set(model._versions.keys())
            if n < 300:
                continue
            timed += time.thread_time() - t0
        total = time.thread_time() - started
        events.close()
    return {"cpu_ms_per_update": 1000 * timed / updates, "thread_ms_per_update": 1000 * total / updates}


def run_side(tree: str, args) -> dict:
    env = dict(os.environ, BENCH_SERVER_TREE=tree, PYTHONPATH=tree)
    command = [sys.executable, os.path.abspath(__file__), "--inner", "--updates", str(args.updates)]
    command += ["--sync", str(args.sync), "--seed", str(args.seed), "--bulk", args.bulk]
    out = subprocess.run(command, env=env, cwd=tree, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        sys.exit(f"the measurement in {tree} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--updates", type=int, default=3000)
    p.add_argument("--sync", type=int, default=64, help="updates per leaf sync (a reply per leaf after each)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--baseline-rev", default="")
    p.add_argument("--bulk", default="auto", choices=["auto", "shm", "wire"], help="how this commit keeps versions")
    p.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.inner:
        print(json.dumps(measure(args.updates, args.sync, args.seed, args.bulk)))
        return
    sides = {"this commit": REPO}
    work = tempfile.mkdtemp(prefix="bench_server_update_")
    if args.baseline_rev:
        path = os.path.join(work, "baseline")
        subprocess.run(["git", "-C", REPO, "worktree", "add", "--detach", path, args.baseline_rev], check=True)
        sides = {args.baseline_rev: path} | sides
    try:
        found: dict[str, list[float]] = {label: [] for label in sides}
        for _ in range(args.repeat):  # alternating, so a change in the machine's load hits both sides alike
            for label, tree in sides.items():
                found[label].append(run_side(tree, args)["cpu_ms_per_update"])
    finally:
        if args.baseline_rev:
            subprocess.run(["git", "-C", REPO, "worktree", "remove", "--force", path], capture_output=True)
    print(
        f"the server's own code per FedBuff update (no transport), {args.updates} updates, --bulk {args.bulk}, "
        f"load {os.getloadavg()}"
    )
    for label, values in found.items():
        print(f"{label:<14} {statistics.median(values):.4f} ms (runs: {', '.join(f'{v:.4f}' for v in values)})")
    if args.baseline_rev:
        ratio = statistics.median(found["this commit"]) / statistics.median(found[args.baseline_rev])
        print(f"this commit / {args.baseline_rev}: {ratio:.2f}x")


if __name__ == "__main__":
    main()
