"""FL methods: a method is one class that owns everything about itself, and this module finds it.

A method subclasses ``Method`` and says, in class attributes and a few overridable methods:

* its server strategy (``aggregation.strategy.ServerStrategy``, by import path) and the arguments it gets;
* optionally its device hook (``processors.objective.DeviceObjective``): a term added to every device's local
  loss, in both training engines, with extra state the strategy sends down with each version;
* optionally its training rule (``processors.device_rule.DeviceRule``): hooks before, at every step of and after
  local training (SCAFFOLD's gradient correction), with state each device keeps across its tasks and reports of
  its own;
* the reports its devices send besides their diffs (``reports``: their last loss, steps, label histogram, ...;
  ``processors.reports``), which its strategy gets in ``add_update`` as ``Update.reports``;
* optionally its selection policy (``scheduling.selection.SelectionPolicy``): whom the schedule selects, from the
  idle online devices and what the run knows of them (the reports it ``needs`` are sent too);
* its own settings, a frozen dataclass that checks itself in ``__post_init__`` and names the fix; its fields
  become the flags ``--<flag_prefix>-<field>`` (help from the dataclass's ``Attributes:`` docstring,
  ``common.config_flags``) and the ``jobs.api`` options ``<flag_prefix>_<field>``;
* its presets (``jobs/pt_job_fedrevive.py`` applies them to the flags not given): federation values and, under
  ``delays``, a delay preset (``common.delays``; used when no delay flag is given);
* whether it is synchronous, and its leaf aggregation (``leaf_sums``);
* how its mean weights the devices (``weighting``): uniformly, or by the samples each holds;
* its checks of a whole configuration (``check_privacy``: whether it can offer differential privacy's guarantee),
  and notes for the user before a run starts;
* the files its strategy writes besides every run's (``result_files``: FedRevive's ``fedrevive_log.jsonl``).

FedAvg, FedBuff and FedRevive are the built-in ones (``BUILT_IN``, chosen by name). A user's method is chosen by
its import path, ``--method package.module:Name`` (shipped with the job like ``--model``; a class defined in the
script that runs the job works too), or passed to ``jobs.api.run(method=...)`` as the class or an instance.
``docs/bring-your-own.md`` walks through one. Every other module asks the method, never its name. The exact-time
machinery (selection, arrival order, B, events, checkpoints, evaluation, results) is the same for every method.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, ClassVar, Literal

from common.choices import ConfigError, check_choice
from common.imports import import_object, import_path
from common.protocol import DATA_SIZE, LABEL_COUNTS
from fedrevive.config import LOG_FILE as FEDREVIVE_LOG
from fedrevive.config import FedReviveConfig
from processors.data.spec import NORMALISATIONS
from scheduling.selection import make_policy

Weighting = Literal["devices", "samples"]  # aggregation.buffered_mean


class Method:
    """A federated learning method (see the module docstring).

    Attributes:
        name: the ``--method`` value of a built-in method; a user's method is named by its import path.
        strategy: its server strategy: a ``ServerStrategy`` subclass, or its import path ``package.module:Class``.
        objective: its device hook: a ``DeviceObjective`` subclass, or its import path (``None``: plain local
            training, the cross-entropy only).
        rule: its local training rule: a ``DeviceRule`` subclass, or its import path (``None``: the engines' plain
            optimiser steps).
        selection: its selection policy: a ``SelectionPolicy`` subclass, or its import path (``None``: uniform
            among idle devices, the default).
        settings: its own settings, a frozen dataclass (``None``: it has none).
        flag_prefix: the prefix of its settings' flags and options (required with ``settings``).
        presets: federation values applied to whatever is not given as a flag (``jobs/pt_job_fedrevive.py``), and
            ``delays``, the delay preset when no delay flag is given.
        synchronous: every selected device's update goes into the next model (updates = min hole = selection).
        stock_baseline: NVFlare's stock path (``--simulator stock``) can run it, for the benchmarks' comparisons.
        weighting: how the mean weights each device's update: ``devices`` (uniformly, every built-in method's
            choice: today's bits) or ``samples`` (by the samples it holds, FedAvg's ``n_k / n``; its devices then
            report ``data_size`` and send their diffs times it, ``aggregation.buffered_mean``). A method whose
            strategy is not ``BufferedMean`` (or a subclass taking ``weighting``) keeps ``devices``.
        result_files: the files (names or glob patterns) its strategy writes into the results folder besides every
            run's own (``common.result_files``): the end-of-run report names them, a deployment's download brings
            them home, and a new run in the same folder clears them.
    """

    name: ClassVar[str] = ""
    strategy: ClassVar[str | type] = "aggregation.buffered_mean:BufferedMean"
    objective: ClassVar[str | type | None] = None
    rule: ClassVar[str | type | None] = None
    selection: ClassVar[str | type | None] = None
    settings: ClassVar[type | None] = None
    flag_prefix: ClassVar[str] = ""
    presets: ClassVar[dict] = {}
    synchronous: ClassVar[bool] = False
    stock_baseline: ClassVar[bool] = False
    result_files: ClassVar[tuple[str, ...]] = ()
    weighting: ClassVar[Weighting] = "devices"

    def strategy_args(self, cfg: Any) -> dict:
        """The strategy's constructor arguments for this run (``cfg``: the ``JobConfig``)."""
        args = {"global_lr": cfg.federation.global_lr}
        if self.weighting != "devices":  # the default is left out: a strategy without the argument still builds
            args["weighting"] = self.weighting
        return args

    def objective_args(self, cfg: Any) -> dict:
        """Its device hook's constructor arguments for this run (``cfg``: the ``JobConfig``)."""
        return {}

    def rule_args(self, cfg: Any) -> dict:
        """Its training rule's constructor arguments for this run (``cfg``: the ``JobConfig``)."""
        return {}

    def rule_reports(self) -> tuple[str, ...]:
        """The reports its training rule adds (none without a rule)."""
        if self.rule is None:
            return ()
        return tuple(
            getattr(import_object(self.rule, "rule") if isinstance(self.rule, str) else self.rule, "reports", ())
        )

    def selection_args(self, cfg: Any) -> dict:
        """Its selection policy's constructor arguments for this run (``cfg``: the ``JobConfig``)."""
        return {}

    def selection_policy(self, cfg: Any) -> Any:
        """Its selection policy for this run, built (``scheduling.selection.make_policy``; ``None``: uniform)."""
        return make_policy(self.selection_path, self.selection_args(cfg))

    def reports(self, cfg: Any) -> tuple[str, ...]:
        """The reports devices send with each update (``common.protocol`` names, ``processors.reports``): those
        its strategy reads (override, and add to this) and those its selection policy ``needs`` (and ``data_size``
        when it weights by samples). Devices compute only these."""
        return self.selection_needs() + ((DATA_SIZE,) if self.weighting == "samples" else ())

    def selection_needs(self) -> tuple[str, ...]:
        """The device reports its selection policy reads (none without a policy)."""
        if self.selection is None:
            return ()
        found = import_object(self.selection, "selection") if isinstance(self.selection, str) else self.selection
        return tuple(getattr(found, "needs", ()))

    def leaf_sums(self, cfg: Any) -> bool:
        """Leaf aggregation: ``True``, a leaf sends one sum per selection (every device of a synchronous
        selection goes into the same version); ``False``, each device's own update (always when its selection
        policy reads reports, or its training rule sends its own: a sum would carry no device's own)."""
        return cfg.federation.synchronous and not self.selection_needs() and not self.rule_reports()

    def check(self, cfg: Any) -> None:
        """Refuse a configuration this method cannot run, naming the fix (``ConfigError``)."""
        check_choice(f"{self.label}'s weighting", self.weighting, Weighting)
        if self.synchronous and not cfg.federation.synchronous:
            raise ConfigError(
                f"{self.label} is synchronous and waits for every selected device: leave --num-updates-for-model "
                "and --min-hole-to-fill at the selection size, or use --method fedbuff for buffered asynchronous FL"
            )
        if self.selection_needs() and cfg.run.dry_run:
            raise ConfigError(
                f"--method {self.label} selects devices by what they report after training "
                f"({', '.join(self.selection_needs())}), and --dry-run trains nothing: run it without --dry-run"
            )
        if self.rule is not None and cfg.engine.simulator == "stock":
            raise ConfigError(
                f"--method {self.label} has its own training rule, which our leaves run: use --simulator fast"
            )
        if self.selection is not None and cfg.engine.simulator == "stock":
            raise ConfigError(
                f"--method {self.label} has its own selection policy, which our server runs: use --simulator fast"
            )
        if cfg.privacy.on:
            self.check_privacy(cfg)
        if cfg.engine.simulator == "stock" and not self.stock_baseline:
            raise ConfigError(
                f"--simulator stock is NVFlare's own path, a baseline for synchronous FedAvg; --method {self.label} "
                "needs our server (each device's update, applied on exact simulated time): use --simulator fast"
            )

    def check_privacy(self, cfg: Any) -> None:
        """Refuse differential privacy this method cannot offer, naming why (``docs/privacy.md``): what its devices
        report besides their clipped diffs would leave them unclipped and un-noised; with central DP its strategy
        must take the noise into the aggregate its versions are made of (``ServerStrategy.add_noise``)."""
        from aggregation.strategy import offers_central_dp

        reports = sorted(set(self.reports(cfg)) | set(self.rule_reports()))
        if reports:
            why = " (it weights by samples)" if self.weighting == "samples" else ""
            raise ConfigError(
                f"--dp {cfg.privacy.dp}: --method {self.label}'s devices report {', '.join(reports)}{why} beside their "
                "updates, outside the privacy mechanism; differential privacy needs a method whose devices send their "
                "clipped update only"
            )
        strategy = import_object(self.strategy, "strategy") if isinstance(self.strategy, str) else self.strategy
        if cfg.privacy.central and not offers_central_dp(strategy):
            raise ConfigError(
                f"--dp central: --method {self.label}'s strategy {strategy.__name__} does not say how central DP's "
                "noise enters its versions: define add_noise (aggregation.strategy) where it combines updates, or use "
                "--dp local"
            )

    def check_data(self, cfg: Any, dataset: Any) -> None:
        """Refuse data this method cannot train on (``dataset``: ``processors.data.sources.Dataset``)."""

    def notes(self, cfg: Any) -> tuple[str, ...]:
        """What the user should know before this run starts (printed by the driver)."""
        return ()

    @property
    def strategy_path(self) -> str:
        """The import path of its strategy (what the server builds it from)."""
        return self.strategy if isinstance(self.strategy, str) else import_path(self.strategy, "strategy")

    @property
    def objective_path(self) -> str:
        """The import path of its device hook ("": none)."""
        if self.objective is None:
            return ""
        return self.objective if isinstance(self.objective, str) else import_path(self.objective, "objective")

    @property
    def rule_path(self) -> str:
        """The import path of its training rule ("": none)."""
        if self.rule is None:
            return ""
        return self.rule if isinstance(self.rule, str) else import_path(self.rule, "rule")

    @property
    def selection_path(self) -> str:
        """The import path of its selection policy ("": uniform)."""
        if self.selection is None:
            return ""
        return self.selection if isinstance(self.selection, str) else import_path(self.selection, "selection")

    @property
    def short_name(self) -> str:
        """Its name, or its class's name in lower case (for job names)."""
        return self.name or type(self).__name__.lower()

    @property
    def label(self) -> str:
        """Its name, or the import path it was chosen by."""
        return self.name or f"{type(self).__module__}:{type(self).__qualname__}"

    def settings_from(self, values: dict) -> Any:
        """Its settings from option values (``fr_s_max=...`` without the prefix; none given: its defaults); ``None``
        if it has none."""
        if self.settings is None:
            if values:
                raise ConfigError(f"--method {self.label} has no settings of its own; leave out {sorted(values)}")
            return None
        return self.settings(**values)

    def settings_from_record(self, values: dict) -> Any:
        """Its settings as a run recorded them (``metrics.json``'s config, for ``--resume``): a field the record
        lacks, because the run predates it, takes the value that run had, not today's default."""
        return self.settings_from(values)

    def option_names(self) -> set[str]:
        """Its settings' option names (``fr_s_max``)."""
        if self.settings is None:
            return set()
        return {f"{self.flag_prefix}_{f.name}" for f in dataclasses.fields(self.settings)}


class FedAvg(Method):
    """Synchronous FedAvg: every selected device's update, averaged, times the server learning rate."""

    name = "fedavg"
    presets = {"device_selection_size": 100, "global_lr": 1.4}  # updates and min hole: the selection
    synchronous = True
    stock_baseline = True


class FedBuff(Method):
    """Buffered asynchronous FL: every B arrived updates, averaged, times the server learning rate."""

    name = "fedbuff"
    # the paper's delays: without them every update arrives at time 0 and the run is a serial chain
    presets = {
        "device_selection_size": 100,
        "num_updates_for_model": 2,
        "min_hole_to_fill": 1,
        "global_lr": 0.05,
        "delays": "paper",
    }


class FedRevive(Method):
    """FedBuff whose stale updates are revived by server-side data-free distillation (arXiv 2511.00655)."""

    name = "fedrevive"
    strategy = "aggregation.fedrevive_strategy:FedReviveStrategy"
    settings = FedReviveConfig
    flag_prefix = "fr"
    presets = {
        "device_selection_size": 100,
        "num_updates_for_model": 1,
        "min_hole_to_fill": 1,
        "global_lr": 0.10,
        "delays": "paper",
    }
    result_files = (FEDREVIVE_LOG,)

    def check(self, cfg: Any) -> None:
        super().check(cfg)
        if self.weighting != "devices":  # its staleness blend treats each update as one device's
            raise ConfigError(f"{self.label}: FedRevive weights each update as one device; leave weighting devices")

    def check_privacy(self, cfg: Any) -> None:
        if cfg.privacy.central:
            raise ConfigError(
                "--dp central cannot hold for FedRevive: its server distils from each client's model (base version "
                "plus its update) as a teacher before any noise is added, and a teacher serves several later "
                "versions; use --dp local (devices noise their own updates, so distilling is post-processing) or "
                "--method fedbuff"
            )
        if cfg.method_settings.class_proportions == "true":
            raise ConfigError(
                "--dp local with FedRevive: --fr-class-proportions true sends each device's label histogram "
                "un-noised; give --fr-class-proportions estimate (probed from the noised updates)"
            )
        super().check_privacy(cfg)

    def strategy_args(self, cfg: Any) -> dict:
        args = super().strategy_args(cfg) | {"fedrevive": cfg.method_settings.to_dict()}
        if cfg.data.normalisation != "cifar":  # only then: a default run's job config keeps its bytes
            args["image_std"] = list(NORMALISATIONS[cfg.data.normalisation][1])
        if cfg.training.precision != "fp32":  # likewise
            args["precision"] = cfg.training.precision
        return args

    def leaf_sums(self, cfg: Any) -> bool:
        return False  # it revives each update on its own

    def reports(self, cfg: Any) -> tuple[str, ...]:
        # its true class proportions: each teacher's label histogram (``fedrevive.teachers``)
        return super().reports(cfg) + ((LABEL_COUNTS,) if cfg.method_settings.class_proportions == "true" else ())

    def settings_from_record(self, values: dict) -> Any:
        # runs recorded before these settings existed passed warm-up updates whole, probed for proportions and
        # did not stabilise their losses
        before = {"warmup_blend": "pass", "class_proportions": "estimate", "stabilize_losses": False}
        return self.settings_from(before | values)

    def check_data(self, cfg: Any, dataset: Any) -> None:
        if getattr(dataset, "is_text", False):  # its generator, teachers' BatchNorm matching and KD are image-only
            raise ConfigError(
                f"FedRevive synthesizes images; this is a text task (token ids {dataset.input_shape}): use --method "
                "fedbuff or fedavg"
            )
        if dataset.input_shape != (3, 32, 32) or dataset.mean is None:
            raise ConfigError(
                f"FedRevive synthesizes 3 x 32 x 32 images; the data's samples are {dataset.input_shape}"
                f"{'' if dataset.mean is not None else ' floats'}: use --method fedbuff or fedavg"
            )
        if dataset.num_classes != cfg.method_settings.num_classes:
            raise ConfigError(
                f"the data has {dataset.num_classes} classes; give --fr-num-classes {dataset.num_classes}"
            )

    def notes(self, cfg: Any) -> tuple[str, ...]:
        """A run too short to revive anything is FedBuff with FedRevive's presets: say so."""
        fr, last = cfg.method_settings, cfg.federation.max_model_version
        if last <= fr.distill_from_version:
            return (
                f"FedRevive neither synthesises nor revives before version {fr.distill_from_version} "
                f"(--fr-distill-from-version) and this run ends at version {last}: every update passes unchanged, "
                "as in FedBuff. Raise --max-model-version or lower --fr-distill-from-version and "
                "--fr-kd-train-from-version.",
            )
        if last <= fr.kd_train_from_version:
            return (
                f"FedRevive revives no update before version {fr.kd_train_from_version} (--fr-kd-train-from-version) "
                f"and this run ends at version {last}: it only warms up its generator. Raise --max-model-version or "
                "lower --fr-kd-train-from-version.",
            )
        return ()


BUILT_IN: dict[str, Method] = {m.name: m for m in (FedAvg(), FedBuff(), FedRevive())}


def method_of(method: str | Method | type) -> Method:
    """The method a ``--method`` value names (a built-in name or an import path ``package.module:Name``), or the
    method itself; ``ConfigError`` naming the fix otherwise."""
    if isinstance(method, Method):
        return method
    if inspect.isclass(method) and issubclass(method, Method):
        return method()
    if not isinstance(method, str):
        raise ConfigError(f"method={method!r}: give a method name, an import path, or a Method subclass")
    if method in BUILT_IN:
        return BUILT_IN[method]
    if ":" not in method:
        raise ConfigError(
            f"--method {method!r}: use {', '.join(BUILT_IN)}, or an import path package.module:Name of a "
            "jobs.methods.Method subclass"
        )
    try:
        found = import_object(method, "--method")
    except ValueError as ex:
        raise ConfigError(str(ex)) from ex
    if not (inspect.isclass(found) and issubclass(found, Method)):
        raise ConfigError(f"--method {method!r}: {method.partition(':')[2]} is not a jobs.methods.Method subclass")
    made = found()
    if made.settings is not None and not made.flag_prefix:
        raise ConfigError(f"--method {method!r}: a method with settings needs a flag_prefix for their flags")
    return made
