"""What FedRevive's server-side work costs per update: one synthesis round and one distillation, timed in-process.

Builds a distiller at the given ``FedReviveConfig`` (default: the paper's), fills its teacher buffer with 8
client models of the chosen architecture (random weights: the cost does not depend on what they learned), then
times ``--repeats`` synthesis rounds and distillations (``kd_iters`` steps each) and prints the median seconds of
each, and what an update costs on average when rounds run every ``synth_every_versions`` versions. It does this
twice in one run, first with the round shape and schedule this project used before (generator width 64, 256
images, a round on every update; today's code), then with the given configuration, and prints the ratio.

    python benchmarks/perf/bench_fedrevive_round.py [--model cifar10_convnet] [--fr-gen-width 128] ...

``--variants fp32:off,fp32:on,bf16:on`` times the given configuration at each ``precision:batched-teachers`` pair
instead (``--precision``, ``--fr-batched-teachers``), alternating, and prints each one's seconds per stale update
and its ratio to the first, after the largest relative difference of the batched teachers' generator loss and input
gradient from the loop's on this device (what batching does to the numbers):

    python benchmarks/perf/bench_fedrevive_round.py --model resnet18 --device cuda --repeats 2 \
        --fr-synth-every-versions 1 --variants fp32:off,fp32:on,tf32:on,bf16:on
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from fedrevive import FedReviveConfig, FedReviveDistiller  # noqa: E402
from fedrevive.teacher_batch import TeacherBatch  # noqa: E402
from processors.models import build_model  # noqa: E402

PREVIOUS_SHAPE = {"gen_width": 64, "synth_batch_size": 256, "synth_every_versions": 1}  # before issue 12's fixes


def filled(cfg: FedReviveConfig, model: str, device: torch.device, precision: str = "fp32") -> FedReviveDistiller:
    """A distiller at ``cfg`` whose teacher buffer holds ``teacher_buffer_size`` models of random weights."""
    distiller = FedReviveDistiller(cfg, lambda: build_model(model), device, seed=0, precision=precision)
    for k in range(cfg.teacher_buffer_size):
        torch.manual_seed(k)
        weights = {n: v.detach().numpy() for n, v in build_model(model).state_dict().items()}
        counts = np.ones(cfg.num_classes)  # "true" proportions need a label histogram; the cost ignores it
        distiller.observe_client_model(f"client-{k}", weights, counts)
    return distiller


def per_update_seconds(
    cfg: FedReviveConfig, model: str, repeats: int, device: torch.device, precision: str = "fp32"
) -> float:
    """Median seconds of a synthesis round and of a distillation at ``cfg``, printed; returns what a stale update
    costs on average when rounds run every ``synth_every_versions`` versions."""
    distiller = filled(cfg, model, device, precision)
    batch = TeacherBatch(list(distiller.teachers)) if distiller.batched else None
    global_weights = {n: v.detach().numpy() for n, v in build_model(model).state_dict().items()}
    teachers = list(distiller.teachers)
    weights = distiller.teachers.class_weights(distiller.estimator)
    proportions = distiller.teachers.proportions(distiller.estimator)
    student = distiller.frozen_model(global_weights)
    synth, kd = [], []
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        distiller.synthesizer.synthesize(teachers, weights, proportions, student, batch)
        sync(device)
        synth.append(time.perf_counter() - start)
        start = time.perf_counter()
        distiller.distill(student, global_weights, teachers, proportions, batch)
        sync(device)
        kd.append(time.perf_counter() - start)
    s, d = statistics.median(synth), statistics.median(kd)
    per_update = d + s / cfg.synth_every_versions
    print(
        f"  {precision}, teachers {'batched' if batch is not None else 'one after another'}: "
        f"generator width {cfg.gen_width}, {cfg.synth_batch_size} images a round, a round every "
        f"{cfg.synth_every_versions} version(s): synthesis round {s:.2f} s, distillation {d:.2f} s "
        f"(median of {repeats}) -> {per_update:.2f} s per stale update"
    )
    return per_update


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def batched_vs_loop(cfg: FedReviveConfig, model: str, device: torch.device) -> tuple[float, float]:
    """Relative difference of the generator's loss and of its input gradient, batched teachers against the loop,
    on ``device`` (float32)."""
    distiller = filled(cfg, model, device)
    teachers = list(distiller.teachers)
    weights = distiller.teachers.class_weights(distiller.estimator)
    labels = torch.arange(cfg.synth_batch_size, device=device) % cfg.num_classes
    found = []
    for batch in (None, TeacherBatch(teachers)):
        images = torch.randn(cfg.synth_batch_size, 3, 32, 32, generator=torch.Generator().manual_seed(0))
        images = images.to(device).requires_grad_()
        loss = distiller.synthesizer.generator_loss(images, labels, teachers, weights, None, batch)
        loss.backward()
        found.append((loss.detach(), images.grad))
    (loss_a, grad_a), (loss_b, grad_b) = found
    return float((loss_b - loss_a).abs() / loss_a.abs()), float((grad_b - grad_a).norm() / grad_a.norm())


def variants(cfg: FedReviveConfig, args) -> None:
    """``--variants``: each precision:batched pair's seconds per stale update, alternating, and its ratio."""
    device = torch.device(args.device)
    loss_err, grad_err = batched_vs_loop(cfg, args.model, device)
    print(f"batched vs loop (float32): generator loss {loss_err:.2e}, its input gradient {grad_err:.2e} relative")
    pairs = [tuple(v.split(":")) for v in args.variants.split(",")]
    seconds: dict[tuple, list[float]] = {pair: [] for pair in pairs}
    for _ in range(2):  # two alternating rounds: load hits every variant alike
        for precision, batched in pairs:
            c = dataclasses.replace(cfg, batched_teachers=batched)
            seconds[(precision, batched)].append(per_update_seconds(c, args.model, args.repeats, device, precision))
    first = min(seconds[pairs[0]])
    for pair in pairs:
        best = min(seconds[pair])
        print(
            f"{pair[0]}:{pair[1]}: {best:.3f} s per stale update, {first / best:.2f}x the first ({pairs[0][0]}:{pairs[0][1]})"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="cifar10_convnet")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", default="cpu")
    p.add_argument("--no-previous", action="store_true", help="time the given configuration only")
    p.add_argument("--precision", default="fp32", choices=["fp32", "tf32", "bf16"])
    p.add_argument("--variants", default="", help="precision:batched pairs, e.g. fp32:off,bf16:on (see above)")
    for f in dataclasses.fields(FedReviveConfig):
        p.add_argument(f"--fr-{f.name.replace('_', '-')}", dest=f.name, type=type(f.default), default=f.default)
    args = p.parse_args()
    cfg = FedReviveConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(FedReviveConfig)})
    device = torch.device(args.device)
    if args.variants:
        variants(cfg, args)
        return
    print(
        f"{args.model}, {cfg.teacher_buffer_size} teachers, KD {cfg.kd_iters} x {cfg.synth_per_teacher} per "
        f"teacher, {torch.get_num_threads()} torch threads"
    )
    if not args.no_previous:
        print("previous round shape and schedule (every update):")
        before = per_update_seconds(dataclasses.replace(cfg, **PREVIOUS_SHAPE), args.model, args.repeats, device)
    print("this configuration:")
    now = per_update_seconds(cfg, args.model, args.repeats, device, args.precision)
    if not args.no_previous:
        print(f"per stale update: {before / now:.1f}x less server time than the previous shape and schedule")


if __name__ == "__main__":
    main()
