"""Command-line flags of every job, grouped like the config parts, and their translation into one ``JobConfig``.

Every flag of a config field is generated (``common.config_flags``) from the part that owns the field: its name
from the field's, its help from the part's ``Attributes:`` docstring, its default from the field and its choices
from the field's ``Literal``. What is not that simple is listed once, here: ``FLAGS`` (a field whose flag is
named otherwise, has no flag, or is filled by a preset when not given) and ``EXTRAS`` (flags with no field:
``--delays``, ``--real-delays``, ``-v``; ``--method`` comes with the method's choice). ``None`` defaults mean "not
given": the part's (or the method's preset) value then applies.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import typing

from common import startup_gc
from common.choices import ConfigError, literal_choices
from common.config_flags import Extra, Flag, add_dataclass_flags, default_words, given_flags, show
from common.delays import DELAY_PRESET_ORIGINS, DELAY_PRESETS, TRANSFER_FIELDS, DelayConfig, DelayPreset
from common.result_files import PACK_MANIFEST
from jobs.build import build_config, checked_config, option_names
from jobs.config import PARTS, FederationConfig, JobConfig
from jobs.methods import BUILT_IN, Method, method_of
from jobs.pack_runs import RUNS_AT_ONCE_HELP, RUNS_HELP, read_runs, run_configs, run_runs, runs_table
from jobs.run.pack_folder import KIND_SEEDS, PackManifest, read_manifest, resumed_configs
from jobs.seeds import SEEDS_HELP, parse_seeds, run_seeds, seed_configs, seeds_table
from processors.model_names import PRESET_FIELDS as MODEL_PRESET_FIELDS
from processors.training_config import TrainingConfig

DEFAULT_METHOD = "fedrevive"  # pt_job_fedrevive.py's --method (jobs.api's default is fedavg)

GROUPS = {
    "data": "data",
    "federation": "federation",
    "training": "local training",
    "delays": "device heterogeneity: simulated delays (a preset, any field overridden)",
    "engine": "simulation engine",
    "run": "run",
    "privacy": "differential privacy (docs/privacy.md)",
    "compression": "communication: compressed updates and bandwidths (docs/communication.md)",
}
"""The flag groups of ``--help``, one per config part (``jobs.config.PARTS``), in this order."""

# The built-in methods' presets fill these federation fields when not given (pt_job_fedrevive.py), so their flags
# default to None ("not given") in both jobs; a preset's "delays" fills --delays (see EXTRAS)
PRESET_FIELDS = {
    name
    for method in BUILT_IN.values()
    for name in method.presets
    if name in {f.name for f in dataclasses.fields(FederationConfig)}
}


def _delay_default(name: str) -> str:
    """A delay field's default: the delay preset's value, the same in every preset or not."""
    values = {repr(getattr(preset, name)) for preset in DELAY_PRESETS.values()}
    return show(getattr(DelayConfig(), name)) if len(values) == 1 else "the --delays preset's"


FLAGS: dict[str, dict[str, Flag]] = {
    "data": {},
    "federation": {"device_reuse": Flag(name="--no-device-reuse", action="store_false")},
    "training": {  # a model's preset (processors.model_names) fills these when not given, in both jobs
        "momentum": Flag(hidden=True),  # jobs.api only
        **{
            name: Flag(filled=f"{default_words(TrainingConfig, name)}, or the model's preset")
            for name in MODEL_PRESET_FIELDS
        },
    },
    "delays": {  # the --delays preset fills every delay field not given
        **{f.name: Flag(filled=_delay_default(f.name)) for f in dataclasses.fields(DelayConfig)},
        "capacity_file": Flag(metavar="FILE", filled=""),
        "availability": Flag(metavar="MODEL", filled=_delay_default("availability")),
        "task_samples": Flag(hidden=True),  # set by the job from the training part
        "model_bytes": Flag(hidden=True),  # set by the job from the model
        # set by the job from the model, --compress and --uplink-kbps / --downlink-kbps (jobs.compression)
        **{name: Flag(hidden=True) for name in TRANSFER_FIELDS},
    },
    "engine": {"trainer": Flag(hidden=True)},  # jobs.api and benchmarks only
    "run": {
        "dry_run": Flag(action="store_true"),
        "export_only": Flag(metavar="DIR"),
        "resume": Flag(metavar="DIR"),
        "tracking": Flag(metavar="LIST"),
        "tracking_uri": Flag(metavar="URI"),
        "tracking_parent": Flag(metavar="RUN_ID"),
    },
    "privacy": {  # derived by the build step's privacy plan (jobs.privacy)
        "dp_noise_key": Flag(hidden=True),
        "dp_planned_compositions": Flag(hidden=True),
    },
    "compression": {"compress": Flag(metavar="NAME[:SETTING]")},
}
"""Per part, the fields whose flag is not plainly ``--<field>`` with the field's default (``Flag``)."""


def _delays_help() -> str:
    presets = [
        f"{name}{f' ({DELAY_PRESET_ORIGINS[name]})' if name in DELAY_PRESET_ORIGINS else ''}: {preset.summary()}"
        for name, preset in DELAY_PRESETS.items()
    ]
    return (
        "the delay model, where none makes an asynchronous run a serial chain (every update arrives at time 0): "
        + "; ".join(presets)
        + " (default: the method's preset, paper for FedBuff and FedRevive, unless a delay flag is given; else none)"
    )


EXTRAS: dict[str, dict[str, list[Extra]]] = {
    "delays": {
        "": [
            (
                ["--delays"],
                {"default": None, "choices": literal_choices(DelayPreset), "help": _delays_help()},
            )
        ]
    },
    "engine": {
        "time_scale": [
            (
                ["--real-delays"],
                {"dest": "time_scale", "action": "store_const", "const": 1.0, "help": "same as --time-scale 1"},
            )
        ]
    },
    "run": {
        "resume": [
            (["-v", "--verbose"], {"action": "store_true", "help": "show NVFlare's own INFO logging on the console"})
        ]
    },
}
"""Per part, the flags with no field of their own, keyed by the field they follow ("": first in the group)."""

SEEDS: Extra = (["--seeds"], {"default": None, "metavar": "S1,S2,..", "help": SEEDS_HELP})
"""The job scripts' ``--seeds`` (``jobs.seeds``: a pack of seeds; ``jobs.api.run``'s ``seeds``), after ``--seed``."""
RUNS: Extra = (["--runs"], {"default": None, "metavar": "FILE", "help": RUNS_HELP})
"""The job scripts' ``--runs`` (``jobs.pack_runs``: a pack of runs of different flags), after ``--seeds``."""
RUNS_AT_ONCE: Extra = (["--runs-at-once"], {"default": None, "type": int, "metavar": "K", "help": RUNS_AT_ONCE_HELP})
"""The job scripts' ``--runs-at-once`` (with ``--runs``: K runs at a time, the others joining the job in order)."""


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


def _federation_flags(presets: bool) -> dict[str, Flag]:
    """The federation fields a method's preset fills: not given means "the preset's" (or the field's default)."""
    note = ", or the method's preset" if presets else ""
    filled = {name: Flag(filled=default_words(FederationConfig, name) + note) for name in PRESET_FIELDS}
    return FLAGS["federation"] | filled


def add_method_choice(parser: argparse.ArgumentParser) -> None:
    """``--method``: a built-in method or a user's ``Method`` subclass."""
    parser.add_argument(
        "--method",
        default=DEFAULT_METHOD,
        help=f"FL method: {', '.join(BUILT_IN)}, or package.module:Name of your own jobs.methods.Method subclass "
        "(its preset fills the federation flags not given)",
    )


def build_parser(description: str, method_choice: bool = False, seeds: bool = False) -> JobArgumentParser:
    """Every job flag; ``method_choice`` adds ``--method`` (with presets) and the ``--fr-*`` FedRevive flags,
    ``seeds`` the job scripts' ``--seeds`` and ``--runs`` (``SEEDS``, ``RUNS``)."""
    p = JobArgumentParser(description=plain_description(description), formatter_class=HelpFormatter)
    for part, title in GROUPS.items():
        flags = _federation_flags(method_choice) if part == "federation" else FLAGS[part]
        extras = EXTRAS.get(part)
        if seeds and part == "run":
            extras = extras | {"seed": [SEEDS, RUNS, RUNS_AT_ONCE]}
        add_dataclass_flags(p.add_argument_group(title), PARTS[part], flags=flags, extras=extras)
    if method_choice:
        add_method_choice(p)
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


def options_of(args: argparse.Namespace, method: str) -> dict:
    """A parsed command line's options for the build (``jobs.build``): its destinations the build knows (a parser
    may carry its own flags too: the tuner's)."""
    known = option_names(method_of(method))
    return {k: v for k, v in vars(args).items() if k in known}


def method_and_options(args: argparse.Namespace, method: str | None = None) -> tuple[str, dict]:
    """A parsed command line's method (``method``, or its ``--method``) and its options for the build."""
    chosen = method or args.method
    return chosen, options_of(args, chosen)


def build_from_args(args: argparse.Namespace, method: str, presets: bool = False) -> JobConfig:
    """The resolved ``JobConfig`` a parsed command line describes, ready to run (``jobs.build.build_config``: the
    flags are its options). ``presets``: the method's federation presets fill every federation flag not given.
    Raises ``ConfigError`` (a ``ValueError``) naming the fix."""
    return build_config(method, options_of(args, method), presets=presets)


def config_from_args(args: argparse.Namespace, method: str, presets: bool = False) -> JobConfig:
    """The checked, not resolved, ``JobConfig`` of a parsed command line (``jobs.build.checked_config``): every value
    a flag gives is checked, no file is read, no model built, nothing planned (a sweep checks its trials' flags
    so); ``build_from_args`` for one to run."""
    return checked_config(method, options_of(args, method), presets=presets)


def seeds_from_args(
    parser: argparse.ArgumentParser,
    argv: list[str],
    args: argparse.Namespace,
    method: str,
    presets: bool = False,
    announce=None,
) -> list[JobConfig]:
    """A job script's ``--seeds``: one resolved config per seed (``jobs.seeds.seed_configs``), every check made
    before any process starts. The default ``--seed`` is left out of the options; a written one is refused beside
    ``--seeds``. Raises ``ConfigError`` naming the fix."""
    options = options_of(args, method)
    written = given_flags(parser, argv)
    options = {k: v for k, v in options.items() if k != "seed" or k in written}
    return seed_configs(method, options, args.seeds, presets=presets, announce=announce)


def resumed_pack(
    parser: argparse.ArgumentParser,
    argv: list[str],
    args: argparse.Namespace,
    method: str,
    pack: PackManifest,
    presets: bool = False,
) -> list[JobConfig]:
    """``--resume PACK_FOLDER``: each run of the pack resumed from its own folder (``jobs.run.pack_folder``), with
    the harmless flags written on the command line; the original command with ``--resume`` appended works too
    (``--seeds`` then must name the pack's seeds, in order; ``--runs`` is refused: each run keeps its saved flags,
    so a pack of ``--runs`` is resumed with ``--resume`` alone). Raises
    ``ConfigError`` naming the fix."""
    folder = args.resume
    if args.runs is not None:
        raise ConfigError(f"--runs with --resume {folder}: each run of the pack keeps its own flags; leave out --runs")
    if args.seeds is not None and (pack.kind != KIND_SEEDS or parse_seeds(args.seeds) != list(map(int, pack.runs))):
        raise ConfigError(
            f"--seeds {args.seeds} with --resume {folder}: the pack's runs are {','.join(pack.runs)}; leave out --seeds"
        )
    written = given_flags(parser, argv) - {"seeds"}
    options = options_of(args, method)

    def build(run_folder: str) -> JobConfig:
        own = options | {"resume": run_folder, "output": run_folder}
        return build_config(method, own, presets=presets, given=written, restart=True)

    return resumed_configs(folder, pack, build)


def _run_seeds(cfgs: list[JobConfig], verbose: bool) -> int:
    """Run a pack of seeds (``jobs.seeds``) and print each seed's result and their mean +- std."""
    startup_gc.resume()  # the pack's modules load now (a job script paused it: common.startup_gc)
    result = run_seeds(cfgs, verbose=verbose)
    print(seeds_table(result))
    return result.exit_code


def _run_runs(cfgs: list[JobConfig], verbose: bool, at_once: int = 0) -> int:
    """Run a pack of runs of different flags (``jobs.pack_runs``; ``at_once``: ``--runs-at-once``) and print each
    run's result."""
    startup_gc.resume()
    result = run_runs(cfgs, verbose=verbose, at_once=at_once)
    print(runs_table(result))
    return result.exit_code


def raising_parse(parser: argparse.ArgumentParser, hidden: dict | None = None):
    """``parser.parse_args`` (with ``hidden``'s options added) that raises ``ConfigError`` on a bad command line
    instead of exiting, so the caller can say which of several command lines it was."""

    def parse(words: list[str]) -> argparse.Namespace:
        def refuse(message: str) -> typing.NoReturn:
            raise ConfigError(message)

        parser.error = refuse
        try:
            return argparse.Namespace(**vars(parser.parse_args(words)), **(hidden or {}))
        finally:
            del parser.error

    return parse


def job_main(description: str, argv: list[str] | None, method: str | None = None, hidden: dict | None = None) -> int:
    """An entry point: parse, build (or, with ``--resume``, recover) the config, run. ``method`` None: the
    ``--method`` flag chooses, and the method's presets apply. ``hidden``: options without a flag (a benchmark's
    ``trainer``)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(description, method_choice=method is None, seeds=True)
    if method is None:  # a user's method (--method package.module:Name) brings its own settings' flags
        prescan = argparse.ArgumentParser(add_help=False)  # --help must wait until those flags exist
        add_method_choice(prescan)
        chosen, _ = prescan.parse_known_args(argv)
        if chosen.method not in BUILT_IN:
            try:
                add_method_flags(parser, method_of(chosen.method))
            except ConfigError as ex:
                parser.error(str(ex))
    args = parser.parse_args(argv)
    chosen = method or args.method
    try:
        full = argparse.Namespace(**vars(args), **(hidden or {}))
        if args.seeds is not None and args.runs is not None:
            raise ConfigError("--seeds with --runs: give each run its seed in the --runs file, or drop --runs")
        if args.runs_at_once is not None and (args.runs is None or args.resume):
            raise ConfigError(
                "--runs-at-once without --runs: it says how many runs of a --runs pack go at a time"
                + ("; a resumed pack keeps its own" if args.resume else "")
            )
        if args.runs_at_once is not None and args.runs_at_once < 1:
            raise ConfigError(f"--runs-at-once {args.runs_at_once}: give 1 or more runs at a time")
        pack = read_manifest(args.resume) if args.resume else None
        if pack is None and args.resume and (args.seeds is not None or args.runs is not None):
            raise ConfigError(
                f"--resume {args.resume}: not a pack's folder (no {PACK_MANIFEST} there); give the --output folder "
                "of the pack to continue, or a run's own folder without --seeds / --runs"
            )
        if pack is not None:  # --resume of a pack's folder: every run of it continued, as one job again
            cfgs = resumed_pack(parser, argv, full, chosen, pack, presets=method is None)
            if pack.kind == KIND_SEEDS:
                return _run_seeds(cfgs, args.verbose)
            return _run_runs(cfgs, args.verbose, pack.at_once)
        if args.seeds is not None:  # one pack of seeds (jobs.seeds): every check before any process starts
            cfgs = seeds_from_args(parser, argv, full, chosen, presets=method is None, announce=print)
        elif args.runs is not None:  # one pack of runs of different flags (jobs.pack_runs)
            cfgs = run_configs(
                raising_parse(parser, hidden),
                lambda a: method_and_options(a, method),  # each run may choose its own --method
                argv,
                read_runs(args.runs),
                f"--runs {args.runs}",
                presets=method is None,
                announce=print,
            )
        else:  # with --resume: the saved run's config, with the flags written on the command line that are harmless
            given = given_flags(parser, argv) if args.resume else None
            cfgs = [build_config(chosen, options_of(full, chosen), presets=method is None, given=given, announce=print)]
    except ConfigError as ex:
        parser.error(str(ex))
    if args.seeds is not None:
        return _run_seeds(cfgs, args.verbose)
    if args.runs is not None:
        return _run_runs(cfgs, args.verbose, args.runs_at_once or 0)
    # torch and NVFlare's job API come with the driver: --help and a refused flag answer before importing them
    from jobs.run.driver import run

    startup_gc.resume()  # the driver's modules are loaded (a job script paused it: common.startup_gc)
    return run(cfgs[0], verbose=args.verbose)
