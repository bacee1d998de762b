"""``python -m jobs.tune``: the tuner's command line (the job's flags plus its own), its run and its report."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

import torch

from jobs.tune.measure import make_trial_runner, pinned_cores
from jobs.tune.probe import probe_job_start
from jobs.tune.search import candidate_points, explore, format_table, recommend

# -- command line --------------------------------------------------------------------------------------------------
TUNER_FLAGS = {"trial_devices", "max_workers", "trial_cores", "min_gain", "skip_job_probe", "probe_timeout", "json"}


def build_tune_parser() -> argparse.ArgumentParser:
    import jobs.tune
    from jobs.cli import build_parser

    p = build_parser(jobs.tune.__doc__.splitlines()[0])
    p.prog = "python -m jobs.tune"
    t = p.add_argument_group("tuner")
    t.add_argument(
        "--trial-devices", type=int, default=None, help="devices trained per trial (default: max(32, 4 x the cap))"
    )
    t.add_argument(
        "--max-workers",
        type=int,
        default=None,
        help="largest worker count tried (default: 2 x trial cores on CPU, 32 on GPU)",
    )
    t.add_argument(
        "--trial-cores",
        type=int,
        default=None,
        help="cores a trial may use (default: this host's cores / leaves, one leaf's share)",
    )
    t.add_argument(
        "--min-gain", type=float, default=0.05, help="stop when more workers gain less than this fraction of devices/s"
    )
    t.add_argument(
        "--skip-job-probe", action="store_true", help="do not run the tiny real job that measures --job-timeout"
    )
    t.add_argument("--probe-timeout", type=float, default=600.0, help="seconds the job probe may take")
    t.add_argument("--json", default=None, metavar="PATH", help="also write trials and recommendation as JSON")
    return p


def _job_argv(argv: Sequence[str], parser: argparse.ArgumentParser) -> list[str]:
    """``argv`` without the tuner's own flags (the probe child only knows job flags)."""
    tuner_options = {s for a in parser._actions if a.dest in TUNER_FLAGS for s in a.option_strings}
    out, skip = [], False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in tuner_options:
            takes_value = name != "--skip-job-probe" and "=" not in arg
            skip = takes_value and i + 1 < len(argv)
            continue
        out.append(arg)
    return out


def main(argv: list[str] | None = None) -> int:
    from common.choices import ConfigError
    from jobs.cli import build_from_args
    from jobs.run.plan import prepare
    from processors.data.sources import DatasetError

    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_tune_parser()
    args = parser.parse_args(argv)
    try:
        cfg = build_from_args(args, "fedavg")
        run_plan = prepare(cfg)
        plan, run_info, device = run_plan.workers, run_plan.run_info, run_plan.device
    except (ConfigError, DatasetError, ValueError) as ex:
        print(f"error: {ex}", file=sys.stderr)
        return 2
    host_cores = run_info["environment"]["cpu_cores"]
    leaves_on_host = cfg.federation.num_leaf_nodes if cfg.run.env in ("sim", "poc") else 1
    cores = args.trial_cores or max(1, host_cores // leaves_on_host)
    cap = args.max_workers or (32 if device.type == "cuda" else max(2, 2 * cores))
    group_sizes = (1, plan.group_size) if plan.engine == "vectorized" and plan.group_size > 1 else (1,)
    trial_devices = args.trial_devices or max(32, 4 * cap, 2 * group_sizes[-1])
    for flag, value in (("--trial-cores", cores), ("--max-workers", cap), ("--trial-devices", trial_devices)):
        if value < 1:
            parser.error(f"{flag} {value}: must be >= 1")
    cap = min(cap, trial_devices)  # more workers than devices measure nothing new
    print(
        f"[tune] {cfg.training.model}, batch {cfg.training.local_batch_size}, {cfg.training.optimizer}, "
        f"{cfg.training.local_iters} local iters on {device}; "
        f"{trial_devices} devices per trial on {cores} of {host_cores} cores (one leaf's share of {leaves_on_host})"
    )
    print(f"[tune] the planner would pick: {plan.describe()}")

    threads_before = torch.get_num_threads()
    with pinned_cores(cores) as cores:
        runner = make_trial_runner(cfg, plan, device, trial_devices, cores)
        trials = explore(
            runner,
            candidate_points(cap, group_sizes),
            args.min_gain,
            log=lambda t: print(
                f"[tune] W={t.workers}, group {t.group_size}: {t.devices_per_s:.2f} devices/s, {t.status} "
                f"{t.detail}".rstrip()
            ),
        )
    torch.set_num_threads(threads_before)

    probe = None
    if not args.skip_job_probe:
        if cfg.run.env != "sim":
            print("[tune] job probe runs on SimEnv only; measuring it there")
        print("[tune] job probe: running a tiny real SimEnv job ...")
        probe = probe_job_start(_job_argv(argv, parser), cfg, args.probe_timeout)
        if probe.first_task_seconds is None:
            print(f"[tune] job probe failed (rc {probe.returncode}): {probe.detail}")
        else:
            print(
                f"[tune] job probe: first device report after {probe.first_task_seconds:.1f} s (slowest leaf; "
                f"per leaf {probe.first_report_per_site}); whole probe {probe.total_seconds:.1f} s"
            )
    rec = recommend(trials, tolerance=args.min_gain, first_task_seconds=probe.first_task_seconds if probe else None)

    print()
    print(format_table(trials))
    print()
    print(f"[tune] recommendation: {rec.reason}")
    if rec.job_timeout is None:
        print(f"[tune] --job-timeout not measured; the job's default is {cfg.engine.job_timeout:g}")
    else:
        print(f"[tune] --job-timeout {rec.job_timeout:g} = max(60, 3 x {rec.first_task_seconds:.1f} s), rounded up")
    print(f"recommended flags: {rec.flags() or '(none)'}")
    if args.json:
        report = {
            "config": cfg.to_dict(),
            "environment": run_info["environment"],
            "planner": run_info["planner"],
            "tuner": {
                "trial_devices": trial_devices,
                "max_workers": cap,
                "trial_cores": cores,
                "min_gain": args.min_gain,
            },
            "trials": [t.to_dict() for t in trials],
            "job_probe": probe.to_dict() if probe else None,
            "recommendation": rec.to_dict(),
        }
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
        print(f"[tune] wrote {args.json}")
    return 0 if rec.num_workers is not None else 1


if __name__ == "__main__":
    sys.exit(main())
