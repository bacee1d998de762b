"""The NVFlare ``DeviceTaskProcessor`` of a simulated device: receive global weights, train on the compute device,
return a WEIGHT_DIFF.

Instances hold only their small configuration (NVFlare deep-copies the processor for every simulated device);
data, global weights and models are cached per process and per worker thread.

The utilisation profile (``common.profiles``, by name) sets, on CUDA only: the cap on this process's CUDA
caching allocator, a stream per worker thread with pinned copies of the diffs, whether the data stays on the
GPU, how many global-model versions stay converted there, and when the allocator's cache is emptied.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from nvflare.edge.simulation.device_task_processor import DeviceTaskProcessor
from nvflare.edge.web.models.job_response import JobResponse
from nvflare.edge.web.models.task_response import TaskResponse

from common.delays import DelayConfig, DeviceDelays
from common.finite import zeroed
from common.profiles import DEFAULT_PROFILE, get_profile
from common.protocol import DEVICE_EXTRA_PREFIX, short_error
from common.seeds import stable_seed
from processors.compress import CompressionHost
from processors.compute_context import compute_context, global_params_on
from processors.data.config import DataConfig
from processors.data.device_samples import device_samples
from processors.data.sources import load_dataset
from processors.device import resolve_device
from processors.device_rule import RuleHost
from processors.objective import DeviceObjective, make_objective
from processors.pack_trainer import train_runs
from processors.privatize import clip_norm_for, noise_for, parameter_names, privatized
from processors.reports import LAST_STEP, check_reports, weigh_by_samples, with_reports
from processors.task_wire import device_extras, received_model, weight_diff_result
from processors.training import TrainingConfig, train_local, worker_model

_owners = itertools.count(1)  # each processor's key in the converted weights' cache (``weights_owner``)


@dataclass
class PreparedGroup:
    """A group's devices made ready to train (``TrainingTaskProcessor.prepare_group``).

    Attributes:
        device_ids: the devices, in order.
        versions: each one's model version.
        selections: each one's selection id (None each when not given).
        prepared: each one's (compute device, samples, labels, generator).
        device: the compute device.
        params: the start weights: one dict for all (one version), or one per device.
        extras: their device extras, likewise.
        clips: each one's clip norm (differential privacy), or None.
        rule: the training rule's run (None without a rule).
        last_steps: a list the engine fills with each device's last-step losses, or None when no report needs them.
    """

    device_ids: list[str]
    versions: list[int]
    selections: list[int | None]
    prepared: list[tuple[torch.device, torch.Tensor, torch.Tensor, torch.Generator]]
    device: torch.device
    params: dict[str, torch.Tensor] | list[dict[str, torch.Tensor]]
    extras: dict | list[dict]
    clips: list[float] | None
    rule: Any
    last_steps: list[dict] | None


class TrainingTaskProcessor(DeviceTaskProcessor):
    """Local training of simulated devices, for every method (FedAvg, FedBuff and FedRevive differ only on the
    server): receive the global weights of a version, train on the compute device, return a WEIGHT_DIFF.

    It serves NVFlare's per-device path (``process_task``, one deep copy per device, as ``TPODeviceFactory``
    makes them) and our device simulator's ``process_group`` (many devices of one task in one call, on the
    shared instance). Constructor arguments are plain dicts and values, because NVFlare writes a component into
    the job config by reading back the attributes named like its constructor arguments.

    Args:
        data: ``DataConfig.to_dict()``: the dataset and its split over devices.
        training: ``TrainingConfig.to_dict()``: model, optimizer, iterations, batch size, learning rate, device.
        seed: the run seed (data partition, batch order).
        profile: a utilisation profile name (``common.profiles``): the CUDA knobs.
        torch_threads: intra-op threads of this leaf process (0: torch's default).
        leaves_per_gpu: leaves sharing this leaf's GPU (they split its memory share).
        stock_delays: ``DelayConfig.to_dict()`` to sleep each task's delays after training, as NVFlare's example
            does (the stock-simulator baseline only); ``None``: no sleeping.
        objective: the method's device hook (``processors.objective.DeviceObjective``) by import path; "": none.
        objective_args: its constructor's keyword arguments.
        reports: what each device reports besides its diff, by name (``processors.reports``: its last loss, its
            steps, its label histogram, ...), in its diff under ``DEVICE_EXTRA_PREFIX``; what its method asks for.
        weighting: ``devices`` (each device's diff as trained) or ``samples`` (its diff times the samples it holds,
            with its ``data_size`` report; ``jobs.methods.Method.weighting``).
        rule: the method's training rule (``processors.device_rule.DeviceRule``) by import path; "": none. Its
            reports join the diff like the others.
        rule_args: its constructor's keyword arguments.
        device_state: where a rule that keeps state keeps it (``processors.device_state.DeviceStateStore``):
            ``dir`` ("": ``device_state/`` in the working folder), ``memory_mb``, ``durable``, ``fresh``.
        device_offsets: with ``--partition natural``, each leaf's first global device index, for the global
            device-to-user map (``processors.data.partition.range_offsets``); None otherwise.
        privacy: differential privacy on the device (``common.privacy.PrivacyConfig.device_settings``): every
            update is clipped to its version's clip norm and, with local DP, noised (``processors.privatize``);
            None: off.
        compression: each device's upload compressor, after clipping and local noise (``processors.compress``:
            ``compress``, ``error_feedback`` and the residuals' store, ``state``); None: off.
    """

    def __init__(
        self,
        data: dict,
        training: dict,
        seed: int = 0,
        profile: str = DEFAULT_PROFILE,
        torch_threads: int = 0,
        leaves_per_gpu: int = 1,
        stock_delays: dict | None = None,
        objective: str = "",
        objective_args: dict | None = None,
        reports: list[str] | tuple[str, ...] = (),
        weighting: str = "devices",
        rule: str = "",
        rule_args: dict | None = None,
        device_state: dict | None = None,
        device_offsets: dict[str, int] | None = None,
        privacy: dict | None = None,
        compression: dict | None = None,
    ):
        DeviceTaskProcessor.__init__(self)
        self.data = data
        self.training = training
        self.seed = seed
        self.profile = profile
        self.torch_threads = torch_threads
        self.leaves_per_gpu = leaves_per_gpu
        self.stock_delays = stock_delays
        self.objective = objective
        self.objective_args = objective_args or {}
        self.reports = list(check_reports(reports))
        if weighting not in ("devices", "samples"):
            raise ValueError(f"weighting {weighting!r}: use devices or samples")
        self.weighting = weighting
        self._objective: DeviceObjective | None = make_objective(objective, self.objective_args)
        self.rule = rule
        self.rule_args = rule_args or {}
        self.device_state = device_state or {}
        self.device_offsets = device_offsets
        self.privacy = privacy
        self._noise = noise_for(privacy)  # local DP's source: secure (this process's entropy) or seeded
        self._rules = RuleHost(rule, self.rule_args, self.device_state)
        self.compression = compression
        self._compression = CompressionHost(compression, seed)
        self._data = DataConfig(**data)
        # a job's build (jobs.build) resolved auto already; a processor made outside a job (tests, benches) here
        self._training = TrainingConfig(**training).resolved(self._data.dataset)
        self._settings = get_profile(profile)
        self.tasks_done = 0
        # the key of this processor's converted global weights (``global_params_on``): a pack's runs (one processor
        # each, in one leaf process) number their versions alike; NVFlare's per-device deep copies share it
        self.weights_owner = next(_owners)

    @property
    def resolved_training(self) -> TrainingConfig:
        """The training settings, ``auto`` resolved (``training`` is the job's raw dict: its NVFlare argument)."""
        return self._training

    @property
    def device_objective(self) -> DeviceObjective | None:
        """The objective made from ``objective`` and ``objective_args`` (None: the plain loss)."""
        return self._objective

    @property
    def dataset(self) -> str:
        return self._data.dataset

    @property
    def pinned_streams(self) -> bool:
        """Whether the profile gives each worker thread its own CUDA stream with pinned copies."""
        return self._settings.pinned_streams

    def apply_plan(self, torch_threads: int, leaves_per_gpu: int) -> None:
        """The leaf's own plan, made at run start from its machine (``simulation.leaf_plan``), replaces the
        values the job was built with."""
        self.torch_threads, self.leaves_per_gpu = torch_threads, leaves_per_gpu

    def setup(self, job: JobResponse) -> None:
        pass

    def shutdown(self) -> None:
        pass

    def process_task(self, task: TaskResponse) -> dict:
        """NVFlare's per-device entry point: this copy's device trains the task."""
        device_id = self.device.device_id
        version, weights = received_model(task)
        diff = self.train(device_id, weights, version)
        if self.stock_delays is not None:  # the stock baseline: heterogeneity by real sleeping, like NVFlare's example
            delays = DeviceDelays(DelayConfig.from_dict(self.stock_delays), self.seed)
            time.sleep(delays.durations(device_id, self.tasks_done).total)
        self.tasks_done += 1
        return weight_diff_result(device_id, diff, stock_lists=self.stock_delays is not None)

    def process_group(self, device_ids: list[str], task: TaskResponse) -> list[dict]:
        """Train the devices that received the same task; one result each, in order. One device trains with the
        per-device engine, several together with the vectorised one (equal up to float summation order)."""
        version, weights = received_model(task)
        if len(device_ids) == 1:
            diffs = [self.train(device_ids[0], weights, version)]
        else:
            diffs = self.train_group(device_ids, weights, version)
        return [weight_diff_result(d, diff) for d, diff in zip(device_ids, diffs, strict=True)]

    def train_devices(
        self, device_ids: list[str], weights: list[dict], versions: list[int], selections: list[int] | None = None
    ) -> list[dict[str, np.ndarray]]:
        """The leaf gateway's entry point (``simulation.trainer.WeightsTrainer``): train each device from the
        global ``weights`` of its own ``versions`` entry (devices of one version share one dict), as
        ``process_group`` does from a task; one diff each, in order. ``selections``: each task's selection id,
        the key of the state a training rule keeps (``processors.device_state``)."""
        if len(device_ids) == 1:
            return [self.train(device_ids[0], weights[0], versions[0], selections[0] if selections else None)]
        return self.train_group(device_ids, weights, versions, selections)

    def failed_result(self, device_id: str, task: TaskResponse, error: str = "") -> dict:
        """What a device whose training failed for good reports: an all-zero diff with weight ``count`` 0, and
        ``error`` (why, one short line) in its meta. The server then frees the device's slot while the mean over
        the other updates is unchanged (the mean divides the summed diffs by the summed counts), and stops a run
        whose devices keep failing, naming the last error (``scheduling.failure_streak``)."""
        _, weights = received_model(task)
        zeros = zeroed({k: v for k, v in weights.items() if not k.startswith(DEVICE_EXTRA_PREFIX)})
        return weight_diff_result(device_id, zeros, count=0, error=short_error(error or "training failed"))

    def compute_context(self) -> contextlib.AbstractContextManager:
        """``compute_context`` for this processor's device, profile, precision and denormal setting."""
        t = self._training
        flush = t.flushes_denormals(self.privacy is not None)
        return compute_context(
            resolve_device(t.compute_device), self._settings, self.leaves_per_gpu, t.precision, flush
        )

    def _prepare(
        self, device_id: str, version: int
    ) -> tuple[torch.device, torch.Tensor, torch.Tensor, torch.Generator]:
        """This device's samples (on DEVICE, or on the CPU when the profile keeps data off it) and its training
        generator, the same for either engine."""
        if self.torch_threads and torch.get_num_threads() != self.torch_threads:
            torch.set_num_threads(self.torch_threads)
        device = resolve_device(self._training.compute_device)
        data_device = device if self._settings.data_resident else torch.device("cpu")
        spec = self._data.spec(self.seed)
        x, y = device_samples(spec, self._data, device_id, self.seed, self.device_offsets, data_device)
        generator = torch.Generator().manual_seed(stable_seed("train", self.seed, device_id, version) % 2**63)
        return device, x, y, generator

    def input_shape(self) -> tuple[int, ...]:
        """One sample's shape as the model receives it."""
        return load_dataset(self._data.spec(self.seed)).input_shape

    def input_prep(self):
        """How a stored batch becomes the model's input: the dataset's own ``prepare``."""
        return load_dataset(self._data.spec(self.seed)).prepare

    def train(
        self, device_id: str, model_data: dict, version: int, selection: int | None = None, wire: dict | None = None
    ) -> dict[str, np.ndarray]:
        """Train ``device_id`` from the given global weights; return its WEIGHT_DIFF as numpy arrays
        (``selection``: its task's selection id, for the state a training rule keeps). ``wire``: a real device's
        (``processors.device_processor``): with a compressor, filled with its encoded update
        (``processors.compress.CompressionHost.encode_one``, and with ``weighting`` by samples its ``data_size``,
        which the leaf multiplies the decoded update by); the diff returned is then what the server decodes."""
        settings = self._settings
        with self.compute_context():
            device, x, y, generator = self._prepare(device_id, version)
            net = worker_model(self._training.model, device)
            params = global_params_on(model_data, version, device, settings.cached_versions, self.weights_owner)
            clip, norms = clip_norm_for(params, version) if self.privacy else None, []
            diff = train_local(
                net,
                params,
                x,
                y,
                self._training,
                generator,
                settings.pinned_streams,
                self.input_prep(),
                self._objective,
                device_extras(params),
                last_step := self._last_step(),
                rule := self._rules.start([device_id], [selection]),
                clip,
                norms,
            )
            diff = self._rules.finish(rule, [device_id], [selection], [diff])[0]
            if clip is not None:
                diff = self._privatized(diff, clip, norms[0], device_id, version)
            if wire is not None and (encoded := self._compression.encode_one(diff, device_id, version, selection)):
                wire |= encoded[0] | ({"data_size": len(y)} if self.weighting == "samples" else {})
                diff = encoded[1]
            else:
                diff = self._compression.apply([diff], [device_id], [version], [selection])[0]
            return self._with_reports(diff, y, last_step)

    def _privatized(self, diff: dict, clip: float, norm: float, device_id: str, version: int) -> dict:
        """A clipped diff as it leaves the device (``processors.privatize.privatized``)."""
        names = parameter_names(self._training.model)
        return privatized(diff, self.privacy, names, clip, norm, self._noise, device_id, version)

    def _last_step(self) -> dict | None:
        """Where an engine puts a device's last-step losses, when a report needs them (else it measures none)."""
        return {} if set(self.reports) & set(LAST_STEP) else None

    def _with_reports(self, diff: dict[str, np.ndarray], y: torch.Tensor, last_step: dict | None) -> dict:
        """The diff, with the reports the method asks for (``processors.reports``), weighted by the device's
        samples when its method weights so."""
        if self.weighting == "samples":
            diff = weigh_by_samples(diff, len(y))
        if not self.reports:
            return diff
        classes = load_dataset(self._data.spec(self.seed)).num_classes
        t, n = self._training, len(y)
        batch = min(t.local_batch_size, n)
        return with_reports(diff, tuple(self.reports), y, classes, t.steps(n), batch, last_step, t.work(n))

    def train_group(
        self,
        device_ids: list[str],
        model_data: dict | list[dict],
        version: int | list[int],
        selections: list[int] | None = None,
    ) -> list[dict[str, np.ndarray]]:
        """Train several devices in one vectorised call (``train_group``), each from its own version's weights
        (``model_data`` and ``version``: one for all, or one per device); each diff equals what ``train`` gives
        for that device, up to floating-point summation order. The engine is called in ``processors.pack_trainer``'s
        ``train_runs``, which a pack's cross-run groups go through too, between the two halves (``prepare_group``,
        ``finish_group``)."""
        return train_runs([(self, device_ids, model_data, version, selections)])[0]

    def prepare_group(
        self,
        device_ids: list[str],
        model_data: dict | list[dict],
        version: int | list[int],
        selections: list[int] | None = None,
    ) -> PreparedGroup:
        """The first half of ``train_group`` (inside ``compute_context``): each device's samples and generator, its
        start weights converted from its own version's (keyed by this processor: a pack's runs number their
        versions alike), their extras, clip norms and the rule's start."""
        settings = self._settings
        k = len(device_ids)
        versions = [version] * k if isinstance(version, int) else list(version)
        models = [model_data] * k if isinstance(model_data, dict) else list(model_data)
        chosen = selections or [None] * k
        prepared = [self._prepare(d, v) for d, v in zip(device_ids, versions, strict=True)]
        device = prepared[0][0]
        by_version: dict[int, dict[str, torch.Tensor]] = {}  # each version converted once, one dict per version
        for v, data in zip(versions, models, strict=True):
            if v not in by_version:
                by_version[v] = global_params_on(data, v, device, settings.cached_versions, self.weights_owner)
        clips = [clip_norm_for(by_version[v], v) for v in versions] if self.privacy else None
        if len(by_version) == 1:  # one version: its weights broadcast to every device, as always
            params = next(iter(by_version.values()))
            extras = device_extras(params)
        else:
            extras_of = {v: device_extras(p) for v, p in by_version.items()}
            params = [by_version[v] for v in versions]
            extras = [extras_of[v] for v in versions]
        last_steps = [] if self._last_step() is not None else None
        rule = self._rules.start(device_ids, chosen)
        return PreparedGroup(
            list(device_ids), versions, chosen, prepared, device, params, extras, clips, rule, last_steps
        )

    def finish_group(
        self,
        group: PreparedGroup,
        diffs: list[dict[str, np.ndarray]],
        norms: list[float],
        last_steps: list[dict] | None,
    ) -> list[dict[str, np.ndarray]]:
        """The second half of ``train_group``: the engine's diffs of ``group``'s devices through the rule's finish,
        privatisation, compression and the reports, in that order (``norms``: their norms before clipping;
        ``last_steps``: their last-step losses, when a report needs them)."""
        ids, versions, chosen = group.device_ids, group.versions, group.selections
        diffs = self._rules.finish(group.rule, ids, chosen, diffs)
        if group.clips is not None:
            diffs = [
                self._privatized(d, c, n, i, v)
                for d, c, n, i, v in zip(diffs, group.clips, norms, ids, versions, strict=True)
            ]
        diffs = self._compression.apply(diffs, ids, versions, chosen)
        steps = last_steps if last_steps is not None else [None] * len(diffs)
        return [
            self._with_reports(d, y, last) for d, (_, _, y, _), last in zip(diffs, group.prepared, steps, strict=True)
        ]
