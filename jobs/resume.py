"""``--resume DIR``: the configuration of the run to continue, from its ``metrics.json``, with only harmless changes.

A resumed run must end exactly where the uninterrupted run would have, so it takes its whole configuration from
the run it continues. Flags given with ``--resume`` may change only what does not change the result (how many
workers, sync intervals, timeouts, how often to evaluate or checkpoint) or extend the run (``--max-model-version``,
``--max-sim-time``); any other is refused, naming it, unless it is given with the value the run was saved with
(the original command with ``--resume`` appended).
"""

from __future__ import annotations

import dataclasses
import json
import os

from common.choices import ConfigError
from common.protocol import GLOBAL_MODEL_ALIAS
from common.result_files import METRICS
from jobs.config import HARMLESS, PARTS, JobConfig
from jobs.methods import BUILT_IN
from processors.models import build_model
from scheduling import checkpoint
from scheduling.checkpoint import state_path

NOT_CONFIG = {"verbose"}  # command-line destinations that change nothing of the run


def field_of(dest: str) -> tuple[str, str] | None:
    """(part, field) a command-line destination sets, or None for the method and its settings (``fr_*``)."""
    for part, cls in PARTS.items():
        if dest in {f.name for f in dataclasses.fields(cls)}:
            return part, dest
    return None


def setting_of(dest: str, cfg: JobConfig) -> str | None:
    """The field of ``cfg``'s method settings a command-line destination sets (``fr_s_max`` -> ``s_max``)."""
    method = cfg.method_spec
    return dest[len(method.flag_prefix) + 1 :] if dest in method.option_names() else None


def is_method_setting(dest: str) -> bool:
    """A destination of some built-in method's settings."""
    return any(dest in m.option_names() for m in BUILT_IN.values())


def value_of(dest: str, cfg: JobConfig):
    """What a command-line destination sets in ``cfg``: a part's field, the method, one of its settings, or the
    whole delay model (``--delays`` and each delay field build one ``DelayConfig``); ``None`` for another
    method's settings."""
    where = field_of(dest)
    if where is not None:
        return getattr(getattr(cfg, where[0]), where[1])
    if dest == "method":
        return cfg.method
    setting = setting_of(dest, cfg)
    if setting is not None:
        return getattr(cfg.method_settings, setting)
    if is_method_setting(dest):
        return None
    return cfg.delays


def resumed_config(results_dir: str, flags_cfg: JobConfig, given: set[str], restart: bool = False) -> JobConfig:
    """The saved run's config with the harmless flags of ``flags_cfg`` that were ``given``; ``ConfigError`` for a
    folder that cannot be resumed or a flag that would change the result. ``restart``: a run that wrote no
    checkpoint (a pack's run that never began, or was killed before its first) starts anew in its folder, from its
    saved config, instead of being refused."""
    metrics = os.path.join(results_dir, METRICS)
    if not os.path.exists(metrics):
        raise ConfigError(f"--resume {results_dir}: no {METRICS} there; give the --output folder of the run to resume")
    anew = not os.path.exists(state_path(results_dir))
    if anew and not restart:
        raise ConfigError(f"--resume {results_dir}: the run wrote no checkpoint before it ended; run it again")
    with open(metrics) as f:
        saved = JobConfig.from_dict(json.load(f)["config"])
    changes: dict[str, dict] = {}
    for dest in sorted(given - {"resume", "output"} - NOT_CONFIG):
        where = field_of(dest)
        if value_of(dest, flags_cfg) == value_of(dest, saved):
            continue  # given again with the saved value: the original command plus --resume
        if setting_of(dest, saved) is None and is_method_setting(dest):
            continue  # another method's settings mean nothing to this one
        if where is None or where not in HARMLESS:
            flag = "--" + dest.replace("_", "-")
            raise ConfigError(
                f"{flag} would change the result of the resumed run: leave it out (the saved "
                f"configuration applies), or start a new run"
            )
        part, name = where
        changes.setdefault(part, {})[name] = getattr(getattr(flags_cfg, part), name)
    changes.setdefault("run", {}).update(output=results_dir, resume=None if anew else results_dir)
    parts = {part: dataclasses.replace(getattr(saved, part), **values) for part, values in changes.items()}
    resumed = dataclasses.replace(saved, **parts)
    if not anew:
        check_checkpoint_model(results_dir, resumed.training.model)
    return resumed


def check_checkpoint_model(results_dir: str, model: str) -> None:
    """The checkpoint's global model must have the weights and statistics the model has today (a checkpoint of an
    older edgesim-flare may lack, e.g., the convnet's statistic trackers); ``ConfigError`` naming them otherwise."""
    model_state = checkpoint.read(results_dir)[GLOBAL_MODEL_ALIAS]
    saved = set(model_state["versions"][model_state["current_version"]])
    expected = set(build_model(model).state_dict())
    if saved != expected:
        missing, extra = sorted(expected - saved), sorted(saved - expected)
        raise ConfigError(
            f"--resume {results_dir}: the checkpoint's {model} lacks {missing[:4]} and has {extra[:4]}, "
            "so it was written by another version of this code or model; start a new run"
        )
