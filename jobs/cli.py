"""Command-line flags shared by every job, and their translation into one ``JobConfig``."""

from __future__ import annotations

import argparse

from jobs.config import JobConfig
from simulation.clock import DeviceSpeedConfig


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(v) for v in text.split(",") if v.strip()) if text else ()


def build_parser(description: str, defaults: JobConfig) -> argparse.ArgumentParser:
    d = defaults
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    data = p.add_argument_group("data")
    data.add_argument(
        "--dataset", default=d.dataset, help="cifar10, synthetic, or PATH.npz (x_train, y_train, x_test, y_test)"
    )
    data.add_argument("--data-root", default=d.data_root, help="where torchvision's CIFAR-10 lives / is downloaded")
    data.add_argument(
        "--synthetic-size", type=int, default=d.synthetic_size, help="training images of the synthetic dataset"
    )
    data.add_argument("--subset-size", type=int, default=d.subset_size, help="training samples per device")
    data.add_argument(
        "--dirichlet-alpha", type=float, default=d.dirichlet_alpha, help="non-IID label skew; <= 0 means IID"
    )

    fl = p.add_argument_group("federation")
    fl.add_argument(
        "--num-leaf-nodes", type=int, default=d.num_leaf_nodes, help="leaf clients (simulator clients in sim)"
    )
    fl.add_argument("--devices-per-leaf", type=int, default=d.devices_per_leaf, help="simulated devices on each leaf")
    fl.add_argument(
        "--device-selection-size",
        type=int,
        default=d.device_selection_size,
        help="devices training at once (concurrency)",
    )
    fl.add_argument(
        "--num-updates-for-model",
        type=int,
        default=None,
        help="updates buffered per new global model (default: the selection size)",
    )
    fl.add_argument(
        "--min-hole-to-fill",
        type=int,
        default=None,
        help="finished devices before new ones are selected (default: the selection size)",
    )
    fl.add_argument(
        "--global-lr", type=float, default=d.global_lr, help="server learning rate applied to the mean update"
    )
    fl.add_argument(
        "--max-model-version",
        type=int,
        default=d.max_model_version,
        help="stop after this global model version (1 is the initial model)",
    )
    fl.add_argument(
        "--max-num-active-model-versions",
        type=int,
        default=d.max_num_active_model_versions,
        help="model versions a leaf keeps aggregators for",
    )
    fl.add_argument(
        "--no-device-reuse", dest="device_reuse", action="store_false", help="select every device at most once"
    )

    tr = p.add_argument_group("local training")
    tr.add_argument(
        "--model", default=d.model, choices=["cifar10_convnet", "resnet18"], help="network trained by the devices"
    )
    tr.add_argument("--local-iters", type=int, default=d.local_iters, help="local iterations per task")
    tr.add_argument("--local-batch-size", type=int, default=d.local_batch_size, help="local batch size")
    tr.add_argument("--local-lr", type=float, default=d.local_lr, help="local learning rate")
    tr.add_argument("--optimizer", default=d.optimizer, choices=["adam", "sgd"], help="local optimizer")
    tr.add_argument("--compute-device", default=d.compute_device, help="auto (CUDA when present), cpu, cuda, cuda:N")

    het = p.add_argument_group("device heterogeneity (virtual clock; default off)")
    het.add_argument(
        "--speed-means",
        type=_floats,
        default=(),
        help="comma-separated mean training seconds per speed class, e.g. 100,200,400",
    )
    het.add_argument("--speed-stds", type=_floats, default=(), help="comma-separated std of each speed class")
    het.add_argument(
        "--speed-probs", type=_floats, default=(), help="comma-separated class probabilities (default equal)"
    )
    het.add_argument("--comm-delay-mean", type=float, default=0.0, help="mean upload delay in seconds")
    het.add_argument("--comm-delay-std", type=float, default=0.0, help="std of the upload delay")
    het.add_argument(
        "--time-scale",
        type=float,
        default=d.time_scale,
        help="0: virtual clock (no sleeping; exact for synchronous FedAvg). S > 0: sleep each sampled delay x S "
        "(wall seconds per simulated second), so asynchronous runs start new tasks at the simulated time the "
        "server reacted; 1 is real time",
    )
    het.add_argument(
        "--real-delays", dest="time_scale", action="store_const", const=1.0, help="same as --time-scale 1"
    )

    sim = p.add_argument_group("simulation engine")
    sim.add_argument(
        "--simulator",
        default=d.simulator,
        choices=["fast", "stock"],
        help="our device simulator or NVFlare's stock one",
    )
    sim.add_argument(
        "--wire-format",
        default=d.wire_format,
        choices=["numpy", "lists"],
        help="how weights and diffs travel; 'lists' is NVFlare's example format (slow, for baselines)",
    )
    sim.add_argument(
        "--num-workers",
        type=int,
        default=None,
        help="parallel device workers per leaf (default: planned from the hardware)",
    )
    sim.add_argument(
        "--engine",
        default=d.engine,
        choices=["auto", "vectorized", "per-device"],
        help="how a leaf trains its devices: vectorized trains a group of devices in one batched step "
        "(torch.func.vmap); auto picks it on a GPU for models without BatchNorm, per-device otherwise",
    )
    sim.add_argument(
        "--group-size",
        type=int,
        default=None,
        help="devices one worker trains together with the vectorized engine (default: planned from memory)",
    )
    sim.add_argument(
        "--profile",
        default=d.profile,
        help="utilisation profile: conservative (half the workers and groups, half the GPU memory, data on the "
        "CPU, cache emptied after every task), high (the planner's defaults), aggressive (90%% of free GPU "
        "memory, tighter memory estimate); the settings it stands for are printed at the start",
    )
    sim.add_argument(
        "--job-timeout",
        type=float,
        default=d.job_timeout,
        help="seconds a leaf's device simulator waits for the job to reach it (not a limit on the job)",
    )
    sim.add_argument(
        "--device-wait-timeout",
        type=float,
        default=d.device_wait_timeout,
        help="seconds the server waits for enough devices before stopping the job",
    )
    sim.add_argument(
        "--update-interval",
        type=float,
        default=d.update_interval,
        help="seconds between a leaf's syncs with the server (NVFlare's default 1.0); results wait this long "
        "before the server can react to them",
    )
    sim.add_argument(
        "--update-timeout",
        type=float,
        default=d.update_timeout,
        help="seconds a leaf waits for its parent to take an update",
    )

    run = p.add_argument_group("run")
    run.add_argument("--eval-frequency", type=int, default=d.eval_frequency, help="evaluate every N model versions")
    run.add_argument("--seed", type=int, default=d.seed, help="fixes data, partition, device speeds and local sampling")
    run.add_argument("--env", default=d.env, choices=["sim", "poc", "prod"], help="NVFlare SimEnv, PocEnv or ProdEnv")
    run.add_argument("--startup-kit", default=None, help="admin startup kit (--env prod)")
    run.add_argument("--username", default=None, help="admin user name (--env prod)")
    run.add_argument("--workspace", default=d.workspace, help="NVFlare simulation workspace and default results root")
    run.add_argument("--output", default=None, help="results directory (default: WORKSPACE/results/JOB_NAME)")
    run.add_argument(
        "--export-only",
        default=None,
        metavar="DIR",
        help="export the job to DIR and exit (run it with: nvflare simulator DIR/JOB -n L -t L)",
    )
    run.add_argument("--job-name", default=d.job_name, help="NVFlare job name")
    return p


def config_from_args(args: argparse.Namespace, method: str, **extra) -> JobConfig:
    values = {k: v for k, v in vars(args).items() if k in JobConfig.__dataclass_fields__ and k != "method"}
    values["speed"] = DeviceSpeedConfig(
        means=args.speed_means,
        stds=args.speed_stds,
        probs=args.speed_probs,
        comm_mean=args.comm_delay_mean,
        comm_std=args.comm_delay_std,
        seed=args.seed,
    )
    return JobConfig(method=method, **values, **extra)
