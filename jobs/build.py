"""The build step: a method and flat options -> the one resolved, frozen ``JobConfig`` a run uses.

Options are the command line's destinations (``jobs.cli``), ``jobs.api.make_config``'s keywords and a sweep
trial's flags alike: a config field's name (``devices_per_leaf``), a delay-model field, ``delays`` (a preset), or a
method's setting (``<flag_prefix>_<field>``, FedRevive's ``fr_*``). ``build_config`` goes down its stages once,
each value computed once:

1. the method (``jobs.methods``) and its presets fill the options not given; the results folder and job name;
2. the model: ``auto`` becomes the dataset's (``processors.model_names``), whose preset fills the local-training
   options not given;
3. the parts (each checks its own values) and ``JobConfig``'s cross-checks, with privacy's (``jobs.privacy``):
   a bad value is refused here, in one line, before torch loads;
4. ``JobConfig.validate``: what needs the files and models the config names;
5. the privacy plan (``jobs.privacy.resolve_privacy``): the planned compositions, the noise multiplier for a
   target epsilon, seeded noise's key.

The result is marked ``resolved``: the driver runs nothing else, and nothing downstream derives any of it again.
``resolve`` does stages 2 to 5 for a config made otherwise (by hand, or a saved run's with ``--resume``).
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Collection

from common.choices import ConfigError
from common.compression import CompressionConfig
from common.delays import DelayConfig
from common.privacy import PrivacyConfig
from jobs.compression import check_compression
from jobs.config import PARTS, FederationConfig, JobConfig
from jobs.engine_config import EngineConfig
from jobs.methods import BUILT_IN, Method, method_of
from jobs.privacy import check_privacy, resolve_privacy
from jobs.run_config import RunConfig
from processors.data.config import DataConfig
from processors.model_names import AUTO, MODELS, auto_model, auto_words, model_preset
from processors.training_config import TrainingConfig

DELAY_FIELDS = tuple(f.name for f in dataclasses.fields(DelayConfig))
NOT_CONFIG = {"verbose", "method"}  # command-line destinations that are not part of a JobConfig


def option_names(method: Method | None = None) -> set[str]:
    """Every option the build knows: the config parts' fields (the delay model's too), the delay preset, and the
    built-in methods' (and ``method``'s) settings (``fr_*``)."""
    names = {f.name for part in PARTS.values() for f in dataclasses.fields(part)}
    methods = [*BUILT_IN.values(), *([method] if method is not None else [])]
    return names | set(DELAY_FIELDS) | {"delays"} | {n for m in methods for n in m.option_names()}


def presets_applied(method: Method, given: Collection[str]) -> dict:
    """The method's presets the options ``given`` leave to it: federation fields not given, and ``delays`` (a preset
    name) when neither ``delays`` nor any delay field is given."""
    applied = {k: v for k, v in method.presets.items() if k not in given}
    if "delays" in applied and set(given) & set(DELAY_FIELDS):
        del applied["delays"]  # a delay field given alone builds on the plain model, as without presets
    return applied


def flag_words(values: dict) -> str:
    """Option values as the flags that give them: ``--local-batch-size 10, --local-lr 0.01``."""
    return ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in values.items())


def results_folder(run: RunConfig, method: Method) -> RunConfig:
    """The run part with its job name (``edgesim_<method>``) and results folder (a new
    ``WORKSPACE/results/JOB_NAME-DATE-TIME-PID``; a resumed run's own folder) where not given."""
    job_name = run.job_name or f"edgesim_{method.short_name}"
    output = run.output or run.resume
    if not output and not run.export_only:
        output = os.path.join(run.workspace, "results", f"{job_name}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
    return dataclasses.replace(run, job_name=job_name, output=output)


def save_arrays(data, results_dir: str) -> str:
    """Check a user's arrays (as the job will) and save them as ``dataset.npz`` in the results folder; its path."""
    import numpy as np

    from common.result_files import DATASET
    from processors.data.sources import NPZ_KEYS, DatasetError, as_arrays, from_arrays

    try:
        arrays = as_arrays(data, "data")
        from_arrays(arrays, "data")
    except DatasetError as ex:
        raise ConfigError(str(ex)) from ex
    os.makedirs(results_dir, exist_ok=True)
    path = os.path.join(results_dir, DATASET)
    np.savez(path, **{k: arrays[k] for k in NPZ_KEYS})
    return path


def _part(cls, given: dict) -> dict:
    return {f.name: given[f.name] for f in dataclasses.fields(cls) if f.name in given}


def build_config(
    method: str | Method,
    options: dict,
    *,
    presets: bool = False,
    model_presets: bool = True,
    arrays=None,
    given: set[str] | None = None,
    announce: Callable[[str], None] | None = None,
    restart: bool = False,
) -> JobConfig:
    """The resolved ``JobConfig`` of ``method`` and flat ``options`` (``None`` means not given; see the module
    docstring). ``presets``: the method's presets fill the federation options and the delay model not given;
    ``model_presets``: the model's the local-training options not given. ``arrays``: a user's data, saved into
    the results folder as the dataset. With a ``resume`` option, ``given`` names the options written (the command
    line's flags): the saved run's config with those of them that are harmless (``jobs.resume``); ``restart``: a
    saved run without a checkpoint starts anew from its saved config (a pack's resume). ``announce`` gets the lines
    that say which presets and model were chosen. ``ConfigError`` names the fix."""
    cfg = checked_config(method, options, presets=presets, model_presets=model_presets, arrays=arrays)
    if announce is not None and not cfg.run.resume:
        for line in _choices(cfg, options, presets, model_presets):
            announce(line)
    if cfg.run.resume:
        from jobs.resume import resumed_config  # imports torch (the saved model's shapes)

        # validated first: it fills in what the saved config holds too (a capacity trace's task samples and bytes)
        flags = cfg.validate()
        saved = os.path.abspath(os.path.expanduser(cfg.run.resume))
        written = given if given is not None else {k for k, v in options.items() if v is not None}
        return resolve(resumed_config(saved, flags, set(written), restart=restart))
    return _resolved(cfg)


def checked_config(
    method: str | Method, options: dict, *, presets: bool = False, model_presets: bool = True, arrays=None
) -> JobConfig:
    """Stages 1 to 3 (``build_config``): every value checked that needs no file and no model, the presets and the
    model chosen, the results folder named; not resolved (a sweep checks its trials' flags with this)."""
    chosen = method_of(method)
    given = {k: v for k, v in options.items() if v is not None and k not in NOT_CONFIG}
    unknown = sorted(set(given) - option_names(chosen))
    if unknown:
        raise ConfigError(
            f"unknown option(s) {', '.join(unknown)}; the options are the command line's flags with "
            "underscores (python jobs/pt_job_fedrevive.py --help)"
        )
    if presets:
        given = presets_applied(chosen, given) | given
    try:
        run = results_folder(RunConfig(**_part(RunConfig, given)), chosen)
        if arrays is not None:
            run = dataclasses.replace(run, output=os.path.abspath(os.path.expanduser(run.output)))
            given["dataset"] = save_arrays(arrays, run.output)
        given["model"] = _model(given.get("model"), given.get("dataset") or DataConfig().dataset)
        if model_presets:
            given = {k: v for k, v in model_preset(given["model"]).items() if k not in given} | given
        mine = chosen.option_names()
        prefix = f"{chosen.flag_prefix}_"
        # another method's settings are left unused, so one command line serves several methods (reproduce_fedrevive)
        settings = {k[len(prefix) :]: v for k, v in given.items() if k in mine}
        cfg = JobConfig(
            method=method if isinstance(method, str) else chosen.label,
            data=DataConfig(**_part(DataConfig, given)),
            federation=FederationConfig(**_part(FederationConfig, given)),
            training=TrainingConfig(**_part(TrainingConfig, given)),
            engine=EngineConfig(**_part(EngineConfig, given)),
            delays=DelayConfig.from_spec(given.get("delays"), **{k: given[k] for k in DELAY_FIELDS if k in given}),
            run=run,
            privacy=PrivacyConfig(**_part(PrivacyConfig, given)),
            compression=CompressionConfig(**_part(CompressionConfig, given)),
            method_settings=chosen.settings_from(settings),
        )
    except ConfigError:
        raise
    except (TypeError, ValueError) as ex:  # a part's own check outside ConfigError, or a wrong type
        raise ConfigError(str(ex)) from ex
    check_privacy(cfg)
    check_compression(cfg)
    return cfg


def resolve(cfg: JobConfig) -> JobConfig:
    """Stages 2 to 5 (``build_config``) for a config made otherwise: the model, the results folder and privacy's
    cross-checks where they are not done yet, then the validation and the privacy plan. A resolved config is
    returned as it is."""
    if cfg.resolved:
        return cfg
    model = _model(cfg.training.model, cfg.data.dataset)
    if model != cfg.training.model:
        cfg = dataclasses.replace(cfg, training=dataclasses.replace(cfg.training, model=model))
    if not cfg.run.job_name or not (cfg.run.output or cfg.run.export_only):
        cfg = dataclasses.replace(cfg, run=results_folder(cfg.run, cfg.method_spec))
    check_privacy(cfg)
    check_compression(cfg)
    return _resolved(cfg)


def _resolved(cfg: JobConfig) -> JobConfig:
    """Stages 4 and 5: validated, its privacy planned, marked resolved."""
    cfg, timeline = resolve_privacy(cfg.validate())
    return cfg.mark_resolved(timeline if cfg.run.dry_run else None)


def _model(model: str | None, dataset: str) -> str:
    """The model the options name: ``model``, or with ``auto`` (or none given) the dataset's (``auto_model``)."""
    return auto_model(dataset) if model in (None, AUTO) else model


def _choices(cfg: JobConfig, options: dict, presets: bool, model_presets: bool) -> list[str]:
    """The lines that say which of the method's and the model's presets filled the options not given, and which
    model ``auto`` picked."""
    given = {k for k, v in options.items() if v is not None}
    lines = []
    applied = presets_applied(cfg.method_spec, given) if presets else {}
    if applied:
        lines.append(f"[edgesim] {cfg.method_spec.label} presets (flags not given): {flag_words(applied)}")
    model = cfg.training.model
    if options.get("model") in (None, AUTO):
        lines.append(f"[edgesim] --model {AUTO}: {auto_words(cfg.data.dataset, model)}")
    applied = {k: v for k, v in model_preset(model).items() if k not in given} if model_presets else {}
    if applied:
        card = MODELS[model]
        lines.append(f"[edgesim] {card.name} presets (flags not given): {flag_words(applied)} ({card.source})")
    return lines
