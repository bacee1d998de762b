"""The public Python API: build and run this project's FedAvg, FedBuff and FedRevive jobs from Python, with your
own ``torch.nn.Module`` and your own data, without writing a task processor. The command line (``jobs/cli.py``)
is a thin layer over it: every flag is an option here, with underscores (``--devices-per-leaf 50`` is
``devices_per_leaf=50``, ``--fr-s-max 10`` is ``fr_s_max=10``).

    from jobs.api import run

    result = run("fedbuff", model=TinyNet, data=(x_train, y_train, x_test, y_test), delays="paper",
                 num_leaf_nodes=2, devices_per_leaf=50, device_selection_size=20, max_model_version=30)
    print(result.final_accuracy, result.output)

* ``model``: ``auto`` (the default: the dataset's model, ``processors.model_names``), a built-in name
  (``cifar10_convnet``, ``resnet18``, ``resnet18_bn``, ``femnist_cnn``, ``char_lstm``, ``word_lstm``), an import
  path ``package.module:Class``, or the class itself. Its constructor takes no required argument (an optional
  ``init_seed`` keyword seeds it); its output for a batch is one score per class. A class defined in the script you run (``__main__``) is shipped
  with the job: guard the script's own work with ``if __name__ == "__main__":``.
* ``data``: ``cifar10``, ``synthetic``, ``synthetic-text``, a ``.npz`` path, an import path
  ``package.module:function``, a function, or the arrays themselves (a 4-tuple ``(x_train, y_train, x_test,
  y_test)``, a mapping or an object with those names). Arrays are saved as ``dataset.npz`` in the results folder and read from there. Inputs are uint8 images
  (N x H x W, N x H x W x C or N x C x H x W, C = 1 or 3), float arrays N x ..., or integer token ids N x L (a
  text task, ``docs/tasks.md``); labels 0 .. K - 1.
* ``delays``: a preset name (``none``, ``paper``, ``paper-shifted``, ``edge-example``), a ``DelayConfig``, or a
  dict of ``DelayConfig`` fields (with an optional ``"preset"``); ``None`` (the default): the method's delay
  preset when ``presets`` apply and no delay field is given (FedBuff's and FedRevive's: ``paper``), else ``none``.
* ``presets`` (default True): the method's concurrency / buffer / server learning rate / delay presets
  (``jobs.methods``) and the model's local-training preset (batch size, learning rate, optimizer:
  ``processors.model_names``) fill the options not given.
* ``method``: a built-in method's name (``fedavg``, ``fedbuff``, ``fedrevive``), an import path
  ``package.module:Name``, or a ``jobs.methods.Method`` subclass (or an instance of one); its settings are the
  options ``<flag_prefix>_<field>`` (FedRevive's: ``fr_s_max=...``). One defined in the script you run is shipped
  with the job, like a model.

``make_config`` is the build step (``jobs.build``): it checks everything (``JobConfig.validate`` too), computes
every derived value once and returns the frozen, resolved ``JobConfig``; ``run`` runs it (or a config: one made
otherwise is resolved first) and returns a ``RunResult``. Bad options raise ``ConfigError`` naming the fix.

``run(..., seeds=[0, 1, 2])`` runs those seeds as one NVFlare job (a pack, ``docs/packs.md``) and returns a
``SeedsResult``: each seed's ``RunResult`` (``runs``) and the mean +- std of the final accuracies (``mean``,
``std``), which it prints as the job scripts' ``--seeds`` does; ``run(..., runs={"a": {"local_lr": 0.01}, "b":
{"local_lr": 0.1}})`` runs runs of different options as one job (the job scripts' ``--runs``). ``run(resume=FOLDER)``
continues a run from its checkpoint, or, given a pack's folder, every run of the pack as one job again
(``jobs.run.pack_folder``), returning its ``SeedsResult`` or ``RunsResult``.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Mapping, Sequence

from common.choices import ConfigError
from common.imports import import_path
from jobs.build import build_config, resolve
from jobs.config import JobConfig
from jobs.methods import BUILT_IN, Method
from jobs.pack_runs import RunsResult, option_configs, run_runs, runs_table
from jobs.run.pack_folder import KIND_SEEDS, read_manifest, resumed_configs
from jobs.run.results import RunResult, read_metrics
from jobs.seeds import SeedsResult, run_seeds, seed_configs, seeds_table
from processors.data.sources import DatasetError
from processors.model_names import AUTO


def method_option(method) -> str:
    """``method`` as ``JobConfig.method`` holds it: a name, or a class's (or an instance's class's) import path."""
    if isinstance(method, str):
        return method
    if isinstance(method, Method):
        method = type(method)
    if inspect.isclass(method) and issubclass(method, Method):
        built_in = BUILT_IN.get(method.name)
        return method.name if built_in is not None and type(built_in) is method else _import_path(method, "method")
    raise ConfigError(f"method={method!r}: give a method name, an import path package.module:Name, or a Method class")


def _import_path(obj, what: str) -> str:
    try:
        return import_path(obj, what)
    except ValueError as ex:
        raise ConfigError(str(ex)) from ex


def model_option(model) -> str:
    if isinstance(model, str):
        return model
    if inspect.isclass(model):
        return _import_path(model, "model")
    raise ConfigError(
        f"model={model!r}: give a model name, an import path package.module:Class, or the class itself "
        "(not an instance: every device builds its own)"
    )


def _options(method, model, data, delays, options: dict) -> tuple[str, dict, object]:
    """``make_config``'s arguments as the build takes them: the method option, the options, and the user's arrays
    (``None`` unless ``data`` is arrays)."""
    options = dict(options, model=model_option(model), delays=delays)
    arrays = None
    if isinstance(data, str):
        options["dataset"] = data
    elif inspect.isfunction(data):
        options["dataset"] = _import_path(data, "data function")
    else:  # saved as dataset.npz in the results folder the build names
        arrays = data
    return method_option(method), options, arrays


def make_config(
    method="fedavg",
    *,
    model=AUTO,
    data="synthetic",
    delays=None,
    presets: bool = True,
    **options,
) -> JobConfig:
    """The run's resolved ``JobConfig`` (``jobs.build.build_config``: checked, validated, every derived value
    computed); see the module docstring for ``method``, ``model``, ``data``, ``delays`` and ``presets``."""
    return _built(method, model, data, delays, presets, options)


def _built(method, model, data, delays, presets: bool, options: dict, restart: bool = False) -> JobConfig:
    """``make_config``'s build; ``restart``: a resumed run without a checkpoint starts anew (a pack's resume)."""
    method, options, arrays = _options(method, model, data, delays, options)
    return build_config(method, options, presets=presets, model_presets=presets, arrays=arrays, restart=restart)


def run(
    config_or_method=None,
    *,
    verbose: bool = False,
    method=None,
    seeds: Sequence[int] | None = None,
    runs: Mapping[str, Mapping] | None = None,
    runs_at_once: int | None = None,
    model=AUTO,
    data="synthetic",
    delays=None,
    presets: bool = True,
    **options,
) -> RunResult | SeedsResult | RunsResult:
    """Run a job: a ``JobConfig``, or a method (positional or ``method=``: a name, an import path, a ``Method``
    class or instance; default ``fedavg``) and ``make_config``'s options. A config refused before start gives exit
    code 2, its reason printed in one line. ``seeds`` (two or more, e.g. ``[0, 1, 2]``; not with ``seed`` nor a
    ``JobConfig``): the seeds run as one NVFlare job (a pack, ``jobs.seeds``), each in ``output/seed-N``; each
    seed's result and the mean +- std of the final accuracies are printed and returned as a ``SeedsResult``
    (``runs``: each seed's ``RunResult``; ``mean``, ``std``); a refused one raises ``ConfigError``. ``runs``
    (``{NAME: {option: value}}``, two or more; not with ``seeds`` nor a ``JobConfig``): runs of different options
    as one job (``jobs.pack_runs``: each the options with its own after them, in ``output/NAME``), each run's
    result printed and returned as a ``RunsResult``; a refused one raises ``ConfigError``. ``runs_at_once`` (with
    ``runs``): that many go at a time, in order, each later one joining the job when one ends (the job scripts'
    ``--runs-at-once``). ``resume`` (an option) of a
    pack's folder: every run of the pack continued as one job, its ``SeedsResult`` or ``RunsResult`` returned."""
    if runs_at_once is not None and (
        runs is None or isinstance(runs_at_once, bool) or not isinstance(runs_at_once, int) or runs_at_once < 1
    ):
        raise ConfigError(f"runs_at_once={runs_at_once!r}: give it with runs=, 1 or more runs at a time")
    pack = read_manifest(options["resume"]) if options.get("resume") else None
    if pack is not None:  # a pack's folder: every run of it continued, as one job again
        if seeds is not None or runs is not None or isinstance(config_or_method, JobConfig):
            raise ConfigError("resume= of a pack's folder with seeds=, runs= or a JobConfig: give resume= alone")
        chosen = method or config_or_method or "fedavg"

        def resumed(folder: str) -> JobConfig:  # a run without a checkpoint starts anew (``jobs.resume``)
            own = options | {"resume": folder, "output": folder}
            return _built(chosen, model, data, delays, presets, own, restart=True)

        cfgs = resumed_configs(options["resume"], pack, resumed)
        if pack.kind == KIND_SEEDS:
            result = run_seeds(cfgs, verbose=verbose)
            print(seeds_table(result))
        else:
            result = run_runs(cfgs, list(pack.runs), verbose=verbose, at_once=pack.at_once)
            print(runs_table(result))
        return result
    if runs is not None:
        if seeds is not None or isinstance(config_or_method, JobConfig):
            raise ConfigError("runs= with seeds= or a JobConfig: give the method, its options and runs= alone")
        chosen, options, arrays = _options(method or config_or_method or "fedavg", model, data, delays, options)
        cfgs = option_configs(chosen, options, dict(runs), presets=presets, model_presets=presets, arrays=arrays)
        result = run_runs(cfgs, list(runs), verbose=verbose, at_once=runs_at_once or 0)
        print(runs_table(result))
        return result
    if seeds is not None:
        if isinstance(config_or_method, JobConfig):
            raise ConfigError(
                "seeds= with a JobConfig: give the method and its options instead (run(METHOD, seeds=...))"
            )
        chosen, options, arrays = _options(method or config_or_method or "fedavg", model, data, delays, options)
        cfgs = seed_configs(chosen, options, seeds, presets=presets, model_presets=presets, arrays=arrays)
        result = run_seeds(cfgs, verbose=verbose)
        print(seeds_table(result))
        return result
    from jobs.run.driver import run as run_job

    if isinstance(config_or_method, JobConfig):
        cfg = config_or_method
        try:  # a resolved config as it is; one made by hand (or copied) resolved once, refused as the driver would
            cfg = resolve(cfg)
        except (DatasetError, ValueError) as ex:  # ConfigError is a ValueError
            print(f"error: {ex}", file=sys.stderr)
            return RunResult(2, cfg.output_dir, {})
    else:
        cfg = make_config(
            method or config_or_method or "fedavg", model=model, data=data, delays=delays, presets=presets, **options
        )
    code = run_job(cfg, verbose=verbose)
    return RunResult(code, cfg.output_dir, read_metrics(cfg.output_dir))


def sweep(
    spec: str, *, output: str | None = None, storage: str | None = None, parallel: int | None = None, **options
) -> int:
    """Run (or continue) a sweep, as ``python -m jobs.sweep SPEC`` does: ``spec`` is the YAML file's path, the other
    options are the command's flags with underscores (``pruner="median"``, ``min_resource=4.0``, ``patience=2``,
    ``seed=0``, ``bar=False``, ``tensorboard=True`` or a log dir, ``deployment="DIR"``, ``pack=1``). Returns the exit code (0 done, 2 refused before any trial, 130 / 143 stopped: run
    it again to continue). The trials, the table and the plots are in the sweep's folder (docs/sweeps.md)."""
    from jobs.sweep.cli import main

    argv = [spec]
    for name, value in {"output": output, "storage": storage, "parallel": parallel, **options}.items():
        if value is None:
            continue
        if name == "bar":
            argv += [] if value else ["--no-bar"]
        elif value is True or value is False:  # a switch (tensorboard=True: the sweep's own log dir)
            argv += [f"--{name.replace('_', '-')}"] if value else []
        else:
            argv += [f"--{name.replace('_', '-')}", str(value)]
    return main(argv)
