"""Command-line flags of every job, grouped like the config parts, and their translation into one ``JobConfig``.

Each group's defaults come from its part's dataclass and each choice from its ``Literal``, so a default or a
valid value is written once (in the part). ``None`` defaults mean "not given": the part's (or the method's
preset) value then applies.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import typing

from common.choices import ConfigError, literal_choices
from common.config_flags import add_dataclass_flags, attribute_docs
from common.delays import DelayPreset, SpeedDistribution
from common.profiles import ProfileName
from evaluation.evaluator import EvalBacklog
from jobs.api import config_from_options, option_names
from jobs.config import EnvName, FederationConfig, JobConfig, LeafLossPolicy, RunConfig
from jobs.methods import BUILT_IN, Method, method_of
from processors.data.config import DataConfig
from processors.training import Optimizer, TrainingConfig
from simulation.config import DevicesName, EngineConfig, EngineName, SimulatorName


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(v) for v in text.split(",") if v.strip()) if text else ()


def _defaults(part) -> dict:
    return {f.name: f.default for f in dataclasses.fields(part) if f.default is not dataclasses.MISSING}


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """One default per flag: added as ``(default: X)`` unless the help already says it, or the flag has none
    (``None``, an empty string, an on/off switch)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if "(default" in text or default is None or default == "" or isinstance(default, bool):
            return text
        if default is argparse.SUPPRESS or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)"


class JobArgumentParser(argparse.ArgumentParser):
    """An argparse parser whose errors are one line naming the fix, not a usage block."""

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


def plain_description(docstring: str) -> str:
    """A module docstring as plain text for ``--help``: its paragraphs, without reST literal markers."""
    return docstring.strip().replace("``", "")


def build_parser(description: str, method_choice: bool = False) -> JobArgumentParser:
    """Every job flag; ``method_choice`` adds ``--method`` (with presets) and the ``--fr-*`` FedRevive flags."""
    p = JobArgumentParser(description=plain_description(description), formatter_class=HelpFormatter)
    d = _defaults(DataConfig)
    data = p.add_argument_group("data")
    data.add_argument(
        "--dataset",
        default=d["dataset"],
        help="cifar10, synthetic, PATH.npz (x_train, y_train, x_test, y_test), or package.module:function "
        "returning those arrays",
    )
    data.add_argument("--data-root", default=d["data_root"], help="where torchvision's CIFAR-10 lives / is downloaded")
    data.add_argument(
        "--synthetic-size", type=int, default=d["synthetic_size"], help="training images of the synthetic dataset"
    )
    data.add_argument(
        "--synthetic-difficulty",
        type=float,
        default=d["synthetic_difficulty"],
        help="0: easy synthetic classes (every method reaches ~1.0); 1: calibrated hard ones",
    )
    data.add_argument("--subset-size", type=int, default=d["subset_size"], help="training samples per device")
    data.add_argument(
        "--dirichlet-alpha", type=float, default=d["dirichlet_alpha"], help="non-IID label skew; <= 0 means IID"
    )
    for name in ("partition", "normalisation", "train_split"):  # choices and help: DataConfig's type and docstring
        hint, flag = typing.get_type_hints(DataConfig)[name], f"--{name.replace('_', '-')}"
        data.add_argument(flag, choices=literal_choices(hint), default=d[name], help=attribute_docs(DataConfig)[name])

    d = _defaults(FederationConfig)
    fl = p.add_argument_group("federation")
    fl.add_argument(
        "--num-leaf-nodes", type=int, default=d["num_leaf_nodes"], help="leaf clients (simulator clients in sim)"
    )
    fl.add_argument(
        "--devices-per-leaf", type=int, default=d["devices_per_leaf"], help="simulated devices on each leaf"
    )
    fl.add_argument(
        "--device-selection-size",
        type=int,
        default=None,
        help=f"devices training at once (default {d['device_selection_size']}, or the method's preset)",
    )
    fl.add_argument(
        "--num-updates-for-model",
        type=int,
        default=None,
        help="updates buffered per new global model (default: the selection size, or the method's preset)",
    )
    fl.add_argument(
        "--min-hole-to-fill",
        type=int,
        default=None,
        help="finished devices before new ones are selected (default: the selection size, or the preset)",
    )
    fl.add_argument(
        "--global-lr",
        type=float,
        default=None,
        help=f"server learning rate applied to the mean update (default {d['global_lr']}, or the preset)",
    )
    fl.add_argument(
        "--max-model-version",
        type=int,
        default=d["max_model_version"],
        help="stop after this global model version (1 is the initial model)",
    )
    fl.add_argument(
        "--max-sim-time",
        type=float,
        default=None,
        help="simulated-time budget: stop before the first update that arrives later (default: none)",
    )
    fl.add_argument(
        "--no-device-reuse",
        dest="device_reuse",
        action="store_false",
        help="select every device at most once (default: a device may be selected again once its update arrived)",
    )
    fl.add_argument(
        "--device-wait-timeout",
        type=float,
        default=d["device_wait_timeout"],
        help="seconds the server waits for every leaf's devices before stopping the job",
    )
    fl.add_argument(
        "--leaf-timeout",
        type=float,
        default=None,
        help="seconds a leaf may stay silent before the server counts it lost (default: derived from the "
        "sync interval and the report size, printed at the start)",
    )
    fl.add_argument(
        "--on-leaf-loss",
        default=d["on_leaf_loss"],
        choices=literal_choices(LeafLossPolicy),
        help="stop: end the run naming the lost leaf (metrics.json keeps what was made); continue: go on "
        "with the living leaves, the lost one's in-flight devices counted as failed",
    )

    d = _defaults(TrainingConfig)
    tr = p.add_argument_group("local training")
    tr.add_argument(
        "--model",
        default=d["model"],
        help="cifar10_convnet, resnet18 (the FedRevive paper's: statistic trackers, no BatchNorm), resnet18_bn, or an "
        "nn.Module class as package.module:Class",
    )
    tr.add_argument("--local-iters", type=int, default=d["local_iters"], help="local iterations per task")
    tr.add_argument("--local-batch-size", type=int, default=d["local_batch_size"], help="local batch size")
    tr.add_argument("--local-lr", type=float, default=d["local_lr"], help="local learning rate")
    tr.add_argument("--optimizer", default=d["optimizer"], choices=literal_choices(Optimizer), help="local optimizer")
    tr.add_argument("--compute-device", default=d["compute_device"], help="auto (CUDA when present), cpu, cuda, cuda:N")
    tr.add_argument(
        "--augment",
        action=argparse.BooleanOptionalAction,
        default=d["augment"],
        help="random crop (padding 4) and horizontal flip of each local batch, as the FedRevive references train "
        "their clients, for natural images (default: off; on at reproduce_fedrevive.py's paper scale)",
    )

    het = p.add_argument_group("device heterogeneity: simulated delays (a preset, any field overridden)")
    het.add_argument(
        "--delays",
        default="none",
        choices=literal_choices(DelayPreset),
        help="paper: the FedRevive paper's exponential speeds 1.0/1.3/1.6 (p 0.25/0.5/0.25), download "
        "0.1, upload 0.15 or 0.25 +-0.02; paper-shifted: mean 0.1, download 0.02, upload 0.05 or "
        "0.10 +-0.01; edge-example: NVFlare's 100/200/400 s (std 4), upload 5 s",
    )
    het.add_argument(
        "--speed-means", type=_floats, default=None, help="mean training time of each speed class, e.g. 1,1.3,1.6"
    )
    het.add_argument("--speed-stds", type=_floats, default=None, help="std of each speed class (normal distribution)")
    het.add_argument("--speed-probs", type=_floats, default=None, help="class probabilities (default equal)")
    het.add_argument(
        "--speed-distribution",
        default=None,
        choices=literal_choices(SpeedDistribution),
        help="training time distribution around the class mean",
    )
    het.add_argument("--download-delay", type=float, default=None, help="constant time from selection to training")
    het.add_argument(
        "--upload-delays", type=_floats, default=None, help="per-device upload means (one drawn per device)"
    )
    het.add_argument(
        "--upload-jitter", type=float, default=None, help="uniform half-width around a device's upload mean"
    )
    het.add_argument(
        "--capacity-file",
        default=None,
        metavar="FILE",
        help="a FedScale capacity trace (pickle or JSON: {client: {computation: ms per sample, communication: "
        "kbit/s}}): training time = local iterations x batch x ms per sample, transfers = model size / bandwidth, "
        "per device from the trace client it is mapped to (seeded); replaces --delays",
    )
    het.add_argument(
        "--availability",
        default=None,
        metavar="MODEL",
        help="when devices are online: always (default), diurnal (one session a day at each device's own seeded "
        "hour), or a FedScale availability file; only online devices are selected, and one that goes offline "
        "before its update arrives drops out then (failed in events.jsonl)",
    )
    het.add_argument(
        "--availability-period", type=float, default=None, help="the diurnal model's day in time units (default 24)"
    )
    het.add_argument(
        "--availability-online",
        type=float,
        default=None,
        help="the diurnal model's share of a day online: the mean session length over the day (default 0.5)",
    )
    het.add_argument(
        "--capacity-cost",
        type=float,
        default=None,
        help="multiplies the trace's ms per sample: your model's cost relative to the trace's (default 1)",
    )

    d = _defaults(EngineConfig)
    sim = p.add_argument_group("simulation engine")
    sim.add_argument(
        "--simulator",
        default=d["simulator"],
        choices=literal_choices(SimulatorName),
        help="our device simulator and server components, or NVFlare's stock path (baseline)",
    )
    sim.add_argument(
        "--engine",
        default=d["engine"],
        choices=literal_choices(EngineName),
        help="vectorized trains a group of devices in one batched step (torch.func.vmap); per-device one "
        "at a time; auto = vectorized unless the model has BatchNorm",
    )
    sim.add_argument("--num-workers", type=int, default=None, help="device workers per leaf (default: planned)")
    sim.add_argument("--group-size", type=int, default=None, help="devices a worker trains together (default: planned)")
    sim.add_argument(
        "--profile",
        default=d["profile"],
        choices=literal_choices(ProfileName),
        help="utilisation profile: conservative (half the workers and groups, half the GPU memory, data "
        "on the CPU, cache emptied after every task), high (the planner's defaults), aggressive "
        "(90%% of free GPU memory, tighter memory estimate); printed at the start",
    )
    sim.add_argument(
        "--time-scale",
        type=float,
        default=d["time_scale"],
        help="0: exact simulated time, nothing sleeps. S > 0: a real-time mode for load-testing a "
        "deployment: each result is held for its delays x S wall seconds and the server applies "
        "updates as they come (simulated time = wall time / S)",
    )
    sim.add_argument("--real-delays", dest="time_scale", action="store_const", const=1.0, help="same as --time-scale 1")
    sim.add_argument(
        "--devices",
        default=d["devices"],
        choices=literal_choices(DevicesName),
        help="simulated: each leaf runs our device simulator; real: leaves wait for real devices (NVFlare's HTTP "
        "device client or an app, through NVFlare's routing proxy: python -m jobs.deploy up --proxy) and the "
        "server applies updates as they arrive, on the wall clock (needs --env poc or prod; docs/real-devices.md)",
    )
    sim.add_argument(
        "--device-timeout",
        type=float,
        default=d["device_timeout"],
        help="with --devices real: seconds a selected device may take before it counts as failed and its slot is "
        "refilled (default 0: derived, printed at the start)",
    )
    sim.add_argument(
        "--job-timeout",
        type=float,
        default=d["job_timeout"],
        help="seconds a leaf's device simulator waits for the job to reach it (not a limit on the job)",
    )
    sim.add_argument(
        "--update-interval",
        type=float,
        default=d["update_interval"],
        help="a leaf's heartbeat: it syncs with the server at once when it has results or news, and at least this "
        "often (NVFlare's fixed interval is 1.0)",
    )
    sim.add_argument(
        "--update-timeout",
        type=float,
        default=None,
        help="seconds a leaf waits for its parent to take an update (default: derived from the report "
        "size, printed at the start)",
    )

    d = _defaults(RunConfig)
    run = p.add_argument_group("run")
    run.add_argument("--eval-frequency", type=int, default=d["eval_frequency"], help="evaluate every N model versions")
    run.add_argument(
        "--eval-backlog",
        default=d["eval_backlog"],
        choices=literal_choices(EvalBacklog),
        help="when evaluation falls behind: skip evaluates the newest version and skips older waiting ones (never "
        "the last); wait evaluates every scheduled version",
    )
    run.add_argument(
        "--seed",
        type=int,
        default=d["seed"],
        help="fixes model, data, partition, device delays, local sampling and selection",
    )
    run.add_argument(
        "--env", default=d["env"], choices=literal_choices(EnvName), help="NVFlare SimEnv, PocEnv or ProdEnv"
    )
    run.add_argument("--startup-kit", default=None, help="admin startup kit (--env prod)")
    run.add_argument("--username", default=None, help="admin user name (--env prod)")
    run.add_argument("--workspace", default=d["workspace"], help="the default results root")
    run.add_argument(
        "--output",
        default=None,
        help="results folder (default: a new WORKSPACE/results/JOB_NAME-DATE-TIME-PID); NVFlare's own "
        "workspace and logs go into its nvflare/ subfolder",
    )
    run.add_argument(
        "--export-only",
        default=None,
        metavar="DIR",
        help="export the job to DIR and exit (run it with: nvflare simulator DIR/JOB -n L -t L)",
    )
    run.add_argument(
        "--dry-run",
        action="store_true",
        help="compute the run's event trace only, in seconds (no training, no NVFlare): events.jsonl (the one a "
        "real run writes) and timeline.json (versions per time unit, staleness, failure rate, fleet use)",
    )
    run.add_argument("--job-name", default="", help="NVFlare job name (default edgesim_<method>)")
    run.add_argument(
        "--checkpoint-every",
        type=int,
        default=d["checkpoint_every"],
        help="versions between checkpoints of the server's state (0: automatic, at most 5%% of the run's "
        "wall time; -1: none)",
    )
    run.add_argument(
        "--resume",
        default=None,
        metavar="DIR",
        help="continue the run whose --output folder DIR is, from its last checkpoint, with its saved "
        "configuration (flags that would change its result are refused)",
    )
    run.add_argument("-v", "--verbose", action="store_true", help="show NVFlare's own INFO logging on the console")

    if method_choice:
        p.add_argument(
            "--method",
            default="fedrevive",
            help=f"FL method: {', '.join(BUILT_IN)}, or package.module:Name of your own jobs.methods.Method subclass "
            "(its preset fills the federation flags not given)",
        )
        for method in BUILT_IN.values():
            add_method_flags(p, method)
    return p


def add_method_flags(parser: argparse.ArgumentParser, method: Method) -> None:
    """A group of ``--<flag_prefix>-<field>`` flags for the method's settings, help from their docstring."""
    if method.settings is None:
        return
    doc = (method.settings.__doc__ or "").strip().splitlines()[0]
    group = parser.add_argument_group(f"{method.label} ({doc})")
    add_dataclass_flags(group, method.settings, prefix=f"{method.flag_prefix}-", dest_prefix=f"{method.flag_prefix}_")


def config_from_args(args: argparse.Namespace, method: str, presets: bool = False) -> JobConfig:
    """The ``JobConfig`` a parsed command line describes (``jobs.api.config_from_options``: the flags are its
    options). ``presets``: the method's federation presets fill every federation flag not given. Raises
    ``ConfigError`` (a ``ValueError``) naming the fix."""
    known = option_names(method_of(method))  # a parser may carry its own flags too (the tuner's)
    return config_from_options(method, {k: v for k, v in vars(args).items() if k in known}, presets)


def job_main(description: str, argv: list[str] | None, method: str | None = None) -> int:
    """An entry point: parse, build (or, with ``--resume``, recover) the config, run. ``method`` None: the
    ``--method`` flag chooses, and the method's presets apply."""
    from jobs.resume import given_flags, resumed_config
    from jobs.run.driver import run

    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(description, method_choice=method is None)
    if method is None:  # a user's method (--method package.module:Name) brings its own settings' flags
        prescan = argparse.ArgumentParser(add_help=False)  # --help must wait until those flags exist
        prescan.add_argument("--method", default="fedrevive")
        chosen, _ = prescan.parse_known_args(argv)
        if chosen.method not in BUILT_IN:
            try:
                add_method_flags(parser, method_of(chosen.method))
            except ConfigError as ex:
                parser.error(str(ex))
    args = parser.parse_args(argv)
    chosen = method or args.method
    try:
        cfg = config_from_args(args, chosen, presets=method is None)
        if args.resume:
            cfg = resumed_config(os.path.abspath(os.path.expanduser(args.resume)), cfg, given_flags(parser, argv))
    except ConfigError as ex:
        parser.error(str(ex))
    return run(cfg, verbose=args.verbose)
