"""What FedRevive's server-side work costs per update: one synthesis round and one distillation, timed in-process.

Builds a distiller at the given ``FedReviveConfig`` (default: the paper's), fills its teacher buffer with 8
client models of the chosen architecture (random weights: the cost does not depend on what they learned), then
times ``--repeats`` synthesis rounds and distillations (``kd_iters`` steps each) and prints the median seconds of
each, and what an update costs on average when rounds run every ``synth_every_versions`` versions.

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

import torch  # noqa: E402

from fedrevive import FedReviveConfig, FedReviveDistiller  # noqa: E402
from processors.models import build_model  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="cifar10_convnet")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", default="cpu")
    for f in dataclasses.fields(FedReviveConfig):
        p.add_argument(f"--fr-{f.name.replace('_', '-')}", dest=f.name, type=type(f.default), default=f.default)
    args = p.parse_args()
    cfg = FedReviveConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(FedReviveConfig)})
    device = torch.device(args.device)
    distiller = FedReviveDistiller(cfg, lambda: build_model(args.model), device, seed=0)
    for k in range(cfg.teacher_buffer_size):
        torch.manual_seed(k)
        weights = {n: v.detach().numpy() for n, v in build_model(args.model).state_dict().items()}
        distiller.observe_client_model(f"client-{k}", weights)
    global_weights = {n: v.detach().numpy() for n, v in build_model(args.model).state_dict().items()}
    teachers = list(distiller.teachers)
    weights = distiller.teachers.class_weights(distiller.estimator)
    proportions = distiller.teachers.proportions(distiller.estimator)
    student = distiller.frozen_model(global_weights)
    synth, kd = [], []
    for _ in range(args.repeats):
        start = time.perf_counter()
        distiller.synthesizer.synthesize(teachers, weights, proportions, student)
        synth.append(time.perf_counter() - start)
        start = time.perf_counter()
        distiller.distill(student, global_weights, teachers, proportions)
        kd.append(time.perf_counter() - start)
    s, d = statistics.median(synth), statistics.median(kd)
    print(f"{args.model}, {len(teachers)} teachers, generator width {cfg.gen_width}, {cfg.synth_batch_size} images a "
          f"round, KD {cfg.kd_iters} x {cfg.synth_per_teacher} per teacher, {torch.get_num_threads()} torch threads")
    print(f"synthesis round: {s:.2f} s; distillation: {d:.2f} s (median of {args.repeats})")
    print(f"per stale update with a round every {cfg.synth_every_versions} version(s): "
          f"{d + s / cfg.synth_every_versions:.2f} s")


if __name__ == "__main__":
    main()
