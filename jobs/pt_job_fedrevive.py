"""Asynchronous FL on simulated edge devices: FedRevive (default), FedBuff, or FedAvg with the paper's presets.

``python jobs/pt_job_fedrevive.py --method fedrevive|fedbuff|fedavg --help``. Presets follow the FedRevive paper's
reference runs (concurrent devices / updates buffered per global model / server learning rate):
FedAvg 100 / 100 / 1.4, FedBuff 100 / 2 / 0.05, FedRevive 100 / 1 / 0.10. Any preset value given as a flag wins.
FedRevive's knobs are the ``--fr-*`` flags (one per ``FedReviveConfig`` field, with the paper's defaults).
"""

from __future__ import annotations

import dataclasses
import sys

from fedrevive.config import FedReviveConfig
from jobs.cli import build_parser, config_from_args
from jobs.config import JobConfig
from jobs.driver import run
from jobs.fedrevive_recipe import AsyncEdgeRecipe

PRESETS = {
    "fedavg": {"device_selection_size": 100, "num_updates_for_model": 100, "min_hole_to_fill": 100, "global_lr": 1.4},
    "fedbuff": {"device_selection_size": 100, "num_updates_for_model": 2, "min_hole_to_fill": 1, "global_lr": 0.05},
    "fedrevive": {"device_selection_size": 100, "num_updates_for_model": 1, "min_hole_to_fill": 1, "global_lr": 0.10},
}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser(__doc__.splitlines()[0], JobConfig(method="fedrevive"))
    parser.add_argument("--method", default="fedrevive", choices=sorted(PRESETS), help="FL method (sets its preset)")
    # None marks "not given", so the method's preset applies
    parser.set_defaults(device_selection_size=None, global_lr=None, max_num_active_model_versions=None)
    fr = parser.add_argument_group("FedRevive (server-side data-free distillation)")
    for f in dataclasses.fields(FedReviveConfig):
        fr.add_argument(f"--fr-{f.name.replace('_', '-')}", dest=f"fr_{f.name}", type=type(f.default),
                        default=f.default, help=f"FedReviveConfig.{f.name}")  # fmt: skip
    args = parser.parse_args(argv)
    for key, value in PRESETS[args.method].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.max_num_active_model_versions is None:
        # async leaves must keep aggregators for every version a device may still report on (0 = no limit):
        # NVFlare's default of 3 drops late updates and can stall the job
        args.max_num_active_model_versions = 0 if args.method != "fedavg" else 3
    try:
        fedrevive = FedReviveConfig(
            **{f.name: getattr(args, f"fr_{f.name}") for f in dataclasses.fields(FedReviveConfig)}
        )
        cfg = config_from_args(args, args.method, fedrevive=fedrevive)
    except ValueError as ex:
        parser.error(str(ex))
    return run(cfg, recipe_cls=AsyncEdgeRecipe)


if __name__ == "__main__":
    sys.exit(main())
