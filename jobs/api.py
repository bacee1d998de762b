"""The public Python API: build and run this project's FedAvg, FedBuff and FedRevive jobs from Python, with your
own ``torch.nn.Module`` and your own data, without writing a task processor. The command line (``jobs/cli.py``)
is a thin layer over it: every flag is an option here, with underscores (``--devices-per-leaf 50`` is
``devices_per_leaf=50``, ``--fr-s-max 10`` is ``fr_s_max=10``).

    from jobs.api import run

    result = run("fedbuff", model=TinyNet, data=(x_train, y_train, x_test, y_test), delays="paper",
                 num_leaf_nodes=2, devices_per_leaf=50, device_selection_size=20, max_model_version=30)
    print(result.final_accuracy, result.output)

* ``model``: a built-in name (``cifar10_convnet``, ``resnet18``), an import path ``package.module:Class``, or the
  class itself. Its constructor takes no required argument (an optional ``init_seed`` keyword seeds it); its
  output for a batch is one score per class. A class defined in the script you run (``__main__``) is shipped
  with the job: guard the script's own work with ``if __name__ == "__main__":``.
* ``data``: ``cifar10``, ``synthetic``, a ``.npz`` path, an import path ``package.module:function``, a function, or
  the arrays themselves (a 4-tuple ``(x_train, y_train, x_test, y_test)``, a mapping or an object with those
  names). Arrays are saved as ``dataset.npz`` in the results folder and read from there. Inputs are uint8 images
  (N x H x W, N x H x W x C or N x C x H x W, C = 1 or 3) or float arrays N x ...; labels 0 .. K - 1.
* ``delays``: a preset name (``none``, ``paper``, ``paper-shifted``, ``edge-example``), a ``DelayConfig``, or a
  dict of ``DelayConfig`` fields (with an optional ``"preset"``).
* ``presets`` (default True): the method's concurrency / buffer / server learning rate presets (``jobs.methods``)
  fill the federation options not given.

``make_config`` checks everything and returns the frozen ``JobConfig``; ``run`` runs it (or a config) and returns
a ``RunResult``. Bad options raise ``ConfigError`` naming the fix.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from common.choices import ConfigError
from common.delays import DelayConfig
from fedrevive.config import FedReviveConfig
from jobs.config import FederationConfig, JobConfig, RunConfig
from jobs.methods import METHODS
from jobs.outputs import DATASET_FILE
from jobs.results import read_metrics
from processors.data.config import DataConfig
from processors.data.sources import NPZ_KEYS, DatasetError, as_arrays, from_arrays
from processors.training import TrainingConfig
from simulation.config import EngineConfig

PARTS = {
    "data": DataConfig,
    "federation": FederationConfig,
    "training": TrainingConfig,
    "engine": EngineConfig,
    "run": RunConfig,
}
DELAY_FIELDS = tuple(f.name for f in dataclasses.fields(DelayConfig))
FEDREVIVE_PREFIX = "fr_"
NOT_CONFIG = {"verbose", "method"}  # command-line destinations that are not part of a JobConfig


def option_names() -> set[str]:
    """Every option ``make_config`` knows: the config parts' fields, the delay fields and ``fr_*``."""
    names = {f.name for part in PARTS.values() for f in dataclasses.fields(part)}
    return (
        names
        | set(DELAY_FIELDS)
        | {"delays"}
        | {FEDREVIVE_PREFIX + f.name for f in dataclasses.fields(FedReviveConfig)}
    )


def _part(cls, given: dict) -> dict:
    return {f.name: given[f.name] for f in dataclasses.fields(cls) if f.name in given}


def config_from_options(method: str, options: dict, presets: bool = False) -> JobConfig:
    """The ``JobConfig`` of flat options (the command line's destinations; ``None`` means not given). ``presets``:
    the method's federation presets fill every federation option not given. ``ConfigError`` names the fix."""
    given = {k: v for k, v in options.items() if v is not None and k not in NOT_CONFIG}
    unknown = sorted(set(given) - option_names())
    if unknown:
        raise ConfigError(
            f"unknown option(s) {', '.join(unknown)}; the options are the command line's flags with "
            "underscores (python jobs/pt_job_fedrevive.py --help)"
        )
    federation = _part(FederationConfig, given)
    if presets:
        federation = METHODS[method].presets | federation
    fedrevive = {k[len(FEDREVIVE_PREFIX) :]: v for k, v in given.items() if k.startswith(FEDREVIVE_PREFIX)}
    try:
        return JobConfig(
            method=method,
            data=DataConfig(**_part(DataConfig, given)),
            federation=FederationConfig(**federation),
            training=TrainingConfig(**_part(TrainingConfig, given)),
            engine=EngineConfig(**_part(EngineConfig, given)),
            delays=DelayConfig.from_spec(
                given.get("delays", "none"), **{k: given[k] for k in DELAY_FIELDS if k in given}
            ),
            run=RunConfig(**_part(RunConfig, given)),
            fedrevive=FedReviveConfig(**fedrevive),
        )
    except ConfigError:
        raise
    except (TypeError, ValueError) as ex:  # a part's own check outside ConfigError, or a wrong type
        raise ConfigError(str(ex)) from ex


def import_path(obj: Callable, what: str) -> str:
    """``module:qualname`` of a class or function, importable by the job's processes. One defined in the script
    being run is named by the script's file, which the job ships (``jobs.recipe.ship_user_code``)."""
    module = obj.__module__
    if module == "__main__":
        main = sys.modules["__main__"]
        main_file = getattr(main, "__file__", None)
        if not main_file:
            raise ConfigError(
                f"{what} {obj.__qualname__} is defined in an interactive session; define it in a "
                "module file (e.g. my_models.py) and import it from there"
            )
        spec = getattr(main, "__spec__", None)  # python -m package.module: its real name
        module = spec.name if spec is not None else os.path.splitext(os.path.basename(main_file))[0]
    if "<locals>" in obj.__qualname__:
        raise ConfigError(f"{what} {obj.__qualname__} is defined inside a function; define it at module level")
    return f"{module}:{obj.__qualname__}"


def model_option(model) -> str:
    if isinstance(model, str):
        return model
    if inspect.isclass(model):
        return import_path(model, "model")
    raise ConfigError(
        f"model={model!r}: give a model name, an import path package.module:Class, or the class itself "
        "(not an instance: every device builds its own)"
    )


def save_arrays(data, results_dir: str) -> str:
    """Check a user's arrays (as the job will) and save them as ``dataset.npz`` in the results folder."""
    try:
        arrays = as_arrays(data, "data")
        from_arrays(arrays, "data")
    except DatasetError as ex:
        raise ConfigError(str(ex)) from ex
    os.makedirs(results_dir, exist_ok=True)
    path = os.path.join(results_dir, DATASET_FILE)
    np.savez(path, **{k: arrays[k] for k in NPZ_KEYS})
    return path


def data_option(data, results_dir: str) -> str:
    if isinstance(data, str):
        return data
    if inspect.isfunction(data):
        return import_path(data, "data function")
    return save_arrays(data, results_dir)


def make_config(
    method: str = "fedavg", *, model="cifar10_convnet", data="synthetic", delays="none", presets: bool = True, **options
) -> JobConfig:
    """A checked ``JobConfig`` (see the module docstring for ``model``, ``data``, ``delays`` and ``presets``)."""
    options = dict(options, model=model_option(model), delays=delays)
    if not isinstance(data, str) and not inspect.isfunction(data):
        draft = config_from_options(method, options | {"dataset": "synthetic"}, presets)  # where its results go
        options["output"] = draft.output_dir
        options["dataset"] = data_option(data, draft.output_dir)
    else:
        options["dataset"] = data_option(data, "")
    return config_from_options(method, options, presets)


@dataclass(frozen=True)
class RunResult:
    """Attributes:
    exit_code: 0 completed, 1 ended early (``outcome`` says why), 2 refused before start, 130/143 interrupted.
    output: the results folder.
    metrics: ``metrics.json`` (empty when the run wrote none).
    """

    exit_code: int
    output: str
    metrics: dict

    @property
    def accuracies(self) -> list[tuple[int, float]]:
        return [(r["version"], r["accuracy"]) for r in self.metrics.get("versions", [])]

    @property
    def final_accuracy(self) -> float | None:
        return self.accuracies[-1][1] if self.accuracies else None

    @property
    def outcome(self) -> dict | None:
        return self.metrics.get("outcome")


def run(config_or_method: JobConfig | str = "fedavg", *, verbose: bool = False, **options) -> RunResult:
    """Run a job: a ``JobConfig``, or a method name and ``make_config``'s options."""
    from jobs.driver import run as run_job

    cfg = config_or_method if isinstance(config_or_method, JobConfig) else make_config(config_or_method, **options)
    code = run_job(cfg, verbose=verbose)
    return RunResult(code, cfg.output_dir, read_metrics(cfg.output_dir))
