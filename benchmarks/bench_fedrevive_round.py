"""What FedRevive's server-side work costs per update: one synthesis round and one distillation, timed in-process.

Builds a distiller at the given ``FedReviveConfig`` (default: the paper's), fills its teacher buffer with 8
client models of the chosen architecture (random weights: the cost does not depend on what they learned), then
times ``--repeats`` synthesis rounds and distillations (``kd_iters`` steps each) and prints the median seconds of
each, and what an update costs on average when rounds run every ``synth_every_versions`` versions. It does this
twice in one run, first with the round shape and schedule this project used before (generator width 64, 256
images, a round on every update; today's code), then with the given configuration, and prints the ratio.

    python benchmarks/bench_fedrevive_round.py [--model cifar10_convnet] [--fr-gen-width 128] ...
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from fedrevive import FedReviveConfig, FedReviveDistiller  # noqa: E402
from processors.models import build_model  # noqa: E402

PREVIOUS_SHAPE = {"gen_width": 64, "synth_batch_size": 256, "synth_every_versions": 1}  # before issue 12's fixes


def per_update_seconds(cfg: FedReviveConfig, model: str, repeats: int, device: torch.device) -> float:
    """Median seconds of a synthesis round and of a distillation at ``cfg``, printed; returns what a stale update
    costs on average when rounds run every ``synth_every_versions`` versions."""
    distiller = FedReviveDistiller(cfg, lambda: build_model(model), device, seed=0)
    for k in range(cfg.teacher_buffer_size):
        torch.manual_seed(k)
        weights = {n: v.detach().numpy() for n, v in build_model(model).state_dict().items()}
        counts = np.ones(cfg.num_classes)  # "true" proportions need a label histogram; the cost ignores it
        distiller.observe_client_model(f"client-{k}", weights, counts)
    global_weights = {n: v.detach().numpy() for n, v in build_model(model).state_dict().items()}
    teachers = list(distiller.teachers)
    weights = distiller.teachers.class_weights(distiller.estimator)
    proportions = distiller.teachers.proportions(distiller.estimator)
    student = distiller.frozen_model(global_weights)
    synth, kd = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        distiller.synthesizer.synthesize(teachers, weights, proportions, student)
        synth.append(time.perf_counter() - start)
        start = time.perf_counter()
        distiller.distill(student, global_weights, teachers, proportions)
        kd.append(time.perf_counter() - start)
    s, d = statistics.median(synth), statistics.median(kd)
    per_update = d + s / cfg.synth_every_versions
    print(
        f"  generator width {cfg.gen_width}, {cfg.synth_batch_size} images a round, a round every "
        f"{cfg.synth_every_versions} version(s): synthesis round {s:.2f} s, distillation {d:.2f} s "
        f"(median of {repeats}) -> {per_update:.2f} s per stale update"
    )
    return per_update


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="cifar10_convnet")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", default="cpu")
    p.add_argument("--no-previous", action="store_true", help="time the given configuration only")
    for f in dataclasses.fields(FedReviveConfig):
        p.add_argument(f"--fr-{f.name.replace('_', '-')}", dest=f.name, type=type(f.default), default=f.default)
    args = p.parse_args()
    cfg = FedReviveConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(FedReviveConfig)})
    device = torch.device(args.device)
    print(
        f"{args.model}, {cfg.teacher_buffer_size} teachers, KD {cfg.kd_iters} x {cfg.synth_per_teacher} per "
        f"teacher, {torch.get_num_threads()} torch threads"
    )
    if not args.no_previous:
        print("previous round shape and schedule (every update):")
        before = per_update_seconds(dataclasses.replace(cfg, **PREVIOUS_SHAPE), args.model, args.repeats, device)
    print("this configuration:")
    now = per_update_seconds(cfg, args.model, args.repeats, device)
    if not args.no_previous:
        print(f"per stale update: {before / now:.1f}x less server time than the previous shape and schedule")


if __name__ == "__main__":
    main()
