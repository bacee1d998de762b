"""The two scales a FedRevive comparison runs at, one source for the reproduction (``benchmarks.repro``) and the
benches that run a job at one of them (``benchmarks.perf``): ``paper``, the run behind R2's table, and ``cpu``, its
calibrated stand-in on the generated data (``benchmarks/repro/reproduce_fedrevive.py`` says why each flag).
``resolved_config`` is the ``JobConfig`` a job command resolves to, without running it."""

from __future__ import annotations

SCALES = {
    "paper": {
        "budget": 200.0,
        "flags": (
            "--dataset cifar10 --model resnet18 --num-leaf-nodes 4 --devices-per-leaf 250 --device-selection-size 100 "
            "--subset-size 350 --dirichlet-alpha 0.5 --local-iters 25 --local-batch-size 32 --local-lr 3e-4 "
            "--optimizer adam --delays paper --augment --eval-frequency 10 --eval-backlog wait "
            "--partition references --normalisation references --train-split references"
        ).split(),
        # R2's continuous mode, the one its table was made in: every eligible stale update, true proportions
        "method_flags": {"fedrevive": ["--fr-synth-every-versions", "1", "--fr-class-proportions", "true"]},
        "variants": {
            # R2's paper-aligned mode: generation every 10 versions, proportions probed on the server
            "paper-aligned": {
                "fedrevive": "--fr-synth-every-versions 10 --fr-class-proportions estimate --fr-probe-samples 64".split()
            },
        },
    },
    "cpu": {
        "budget": 40.0,
        "flags": (
            "--dataset synthetic --synthetic-difficulty 1 --synthetic-size 20000 --model cifar10_convnet "
            "--num-leaf-nodes 2 --devices-per-leaf 100 --device-selection-size 20 --subset-size 100 --dirichlet-alpha "
            "0.5 --local-iters 25 --local-batch-size 32 --local-lr 1e-3 --delays paper --eval-frequency 10 "
            "--eval-backlog wait"
        ).split(),
        "method_flags": {"fedrevive": ["--fr-s-max", "15"]},
    },
}


def resolved_config(cmd: list[str]):
    """The resolved ``JobConfig`` a job command builds (its flags through the job's own parser and the build step,
    ``jobs.build``), without running it."""
    from jobs.cli import build_from_args, build_parser

    args = build_parser("reproduce_fedrevive", method_choice=True).parse_args(cmd[2:])
    return build_from_args(args, args.method, presets=True)
