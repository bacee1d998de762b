"""Flat options (the command line's destinations, ``make_config``'s keyword arguments) -> a ``JobConfig``: the one
translation the command line (``jobs.cli``) and the Python API (``jobs.api``) share, with the method's presets.
An option is a config field's name (``devices_per_leaf``), a delay-model field, ``delays`` (a preset), or a
method's setting (``<flag_prefix>_<field>``, FedRevive's ``fr_*``)."""

from __future__ import annotations

import dataclasses

from common.choices import ConfigError
from common.compression import CompressionConfig
from common.delays import DelayConfig
from common.privacy import PrivacyConfig
from jobs.config import PARTS, FederationConfig, JobConfig
from jobs.engine_config import EngineConfig
from jobs.methods import BUILT_IN, Method, method_of
from jobs.run_config import RunConfig
from processors.data.config import DataConfig
from processors.model_names import AUTO, auto_model, model_preset
from processors.training_config import TrainingConfig

DELAY_FIELDS = tuple(f.name for f in dataclasses.fields(DelayConfig))
NOT_CONFIG = {"verbose", "method"}  # command-line destinations that are not part of a JobConfig


def option_names(method: Method | None = None) -> set[str]:
    """Every option ``make_config`` knows: the config parts' fields (the delay model's too), the delay preset, and
    the built-in methods' (and ``method``'s) settings (``fr_*``)."""
    names = {f.name for part in PARTS.values() for f in dataclasses.fields(part)}
    methods = [*BUILT_IN.values(), *([method] if method is not None else [])]
    return names | set(DELAY_FIELDS) | {"delays"} | {n for m in methods for n in m.option_names()}


def _part(cls, given: dict) -> dict:
    return {f.name: given[f.name] for f in dataclasses.fields(cls) if f.name in given}


def presets_applied(method: str | Method, options: dict) -> dict:
    """The method's presets the options leave to it (``None`` means not given): federation fields not given, and
    ``delays`` (a preset name) when neither ``delays`` nor any delay field is given."""
    given = {k for k, v in options.items() if v is not None}
    applied = {k: v for k, v in method_of(method).presets.items() if k not in given}
    if "delays" in applied and given & set(DELAY_FIELDS):
        del applied["delays"]  # a delay field given alone builds on the plain model, as without presets
    return applied


def resolved_model(options: dict) -> str:
    """The model the options name: ``model``, or with ``auto`` (or none given) the dataset's
    (``processors.model_names.auto_model``)."""
    model = options.get("model") or AUTO
    return auto_model(options.get("dataset") or DataConfig().dataset) if model == AUTO else model


def model_presets_applied(options: dict) -> dict:
    """The model's local-training preset the options leave to it (``None`` means not given): its fields not
    given."""
    given = {k for k, v in options.items() if v is not None}
    return {k: v for k, v in model_preset(resolved_model(options)).items() if k not in given}


def config_from_options(method: str, options: dict, presets: bool = False, model_presets: bool = True) -> JobConfig:
    """The ``JobConfig`` of flat options (the command line's destinations; ``None`` means not given). ``presets``:
    the method's presets fill every federation option not given, and its delay preset the delay model when no
    delay option is given (``presets_applied``). ``model_presets``: the model's preset fills the local-training
    options not given (``model_presets_applied``). ``ConfigError`` names the fix."""
    given = {k: v for k, v in options.items() if v is not None and k not in NOT_CONFIG}
    chosen = method_of(method)
    unknown = sorted(set(given) - option_names(chosen))
    if unknown:
        raise ConfigError(
            f"unknown option(s) {', '.join(unknown)}; the options are the command line's flags with "
            "underscores (python jobs/pt_job_fedrevive.py --help)"
        )
    if presets:
        given = presets_applied(chosen, given) | given
    if model_presets:
        given = model_presets_applied(given) | given
    federation = _part(FederationConfig, given)
    mine = chosen.option_names()
    prefix = f"{chosen.flag_prefix}_"
    # another method's settings are left unused, so one command line serves several methods (reproduce_fedrevive)
    settings = {k[len(prefix) :]: v for k, v in given.items() if k in mine}
    try:
        return JobConfig(
            method=method,
            data=DataConfig(**_part(DataConfig, given)),
            federation=FederationConfig(**federation),
            training=TrainingConfig(**_part(TrainingConfig, given)),
            engine=EngineConfig(**_part(EngineConfig, given)),
            delays=DelayConfig.from_spec(given.get("delays"), **{k: given[k] for k in DELAY_FIELDS if k in given}),
            run=RunConfig(**_part(RunConfig, given)),
            privacy=PrivacyConfig(**_part(PrivacyConfig, given)),
            compression=CompressionConfig(**_part(CompressionConfig, given)),
            method_settings=chosen.settings_from(settings),
        )
    except ConfigError:
        raise
    except (TypeError, ValueError) as ex:  # a part's own check outside ConfigError, or a wrong type
        raise ConfigError(str(ex)) from ex
