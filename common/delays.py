"""How long a simulated device takes: download, training and upload delays, a seeded function of the device.

The model follows the FedRevive reference simulator (ZiyueXu77/NVFlare ``research/fed-revive/codes/client.py``,
``Client._create_delay_generator``; NVIDIA's port ``research/fedrevive/data.py``, ``DELAY_SCHEDULES``):

* once per device: a speed class k (probabilities ``speed_probs``, default equal) and an upload mean, one of
  ``upload_delays`` with equal probability;
* per task: training time ~ Exponential(mean ``speed_means[k]``) or ~ max(0, Normal(``speed_means[k]``,
  ``speed_stds[k]``)), upload time ~ Uniform(max(0, m - ``upload_jitter``), m + ``upload_jitter``) around the
  device's upload mean m, and the constant ``download_delay``.

Or, with ``capacity_file``, measured speeds (``common.capacity``: a FedScale capacity trace): training takes
``task_samples x ms per sample x capacity_cost / 1000`` and download and upload ``model_bytes x 8 / (kbit/s x
1000)`` each, for the trace client the device is.

Local work (``work``, with ``--local-epochs``): a device that trains on more samples takes longer. ``work(device)``
is the samples the device trains on per task (``processors.local_work.device_work``: epochs x the samples it
holds), a pure function of the seed, the device's key and the data. With a capacity trace it replaces
``task_samples`` in the training time above (ms per sample x samples processed). With a delay preset (or the speed
flags) the drawn training time is the time of a task of ``task_samples`` samples (the jobs set E x --subset-size,
the nominal device), scaled by ``work(device) / task_samples``; download and upload do not change. Without
``work`` (``--local-iters``: every device does the same work) the durations are today's, bit for bit.

Every draw comes from a generator seeded by SHA-256 of (run seed, device id[, task number]), never from a shared
stream, so the server, a leaf and the pure reference schedule all compute the same durations for the same device
and task, in any order and in any process.

Building a ``DelayConfig`` checks its values only; the trace files it names are read by ``validate()`` (the job
calls it before anything starts; ``DeviceDelays`` calls it too, so a model built from a dict on the server or a
leaf refuses a bad file before it is used).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Literal

import numpy as np

from common.availability import NAMED as NAMED_AVAILABILITY
from common.availability import Availability, check_availability, check_named_availability
from common.bandwidth import Bandwidth, device_bandwidth, parse_bandwidth
from common.capacity import device_capacity, load_capacities
from common.choices import ConfigError, check_choice
from common.seeds import stable_seed

SpeedDistribution = Literal["normal", "exponential"]
DelayPreset = Literal["none", "paper", "paper-shifted", "edge-example"]
DEFAULT_DELAY_PRESET: DelayPreset = "none"


@dataclass(frozen=True)
class DelayConfig:
    """Device heterogeneity: the delay model of every simulated device (all zero: no heterogeneity).

    Attributes:
        speed_means: mean training time of each speed class (simulated seconds), e.g. ``1,1.3,1.6``; empty:
            training takes 0.
        speed_stds: standard deviation of each class (``normal`` only).
        speed_probs: probability of each class; empty: equally likely.
        speed_distribution: ``exponential`` (the FedRevive paper) or ``normal`` (NVFlare's edge example).
        download_delay: constant time from selection to the start of training.
        upload_delays: per-device upload means, one drawn per device with equal probability; empty: 0.
        upload_jitter: half-width of the uniform noise around a device's upload mean, per task.
        capacity_file: a FedScale capacity trace (pickle or JSON ``{client: {computation: ms per sample,
            communication: kbit/s}}``, ``common.capacity``): each device's training time (local iterations x batch
            x ms per sample) and transfers (model size / bandwidth) from the trace client it is mapped to (seeded),
            instead of the delay preset and the fields above.
        availability: when devices are online (``common.availability``): ``always``, ``diurnal`` (one session a
            day at each device's own seeded hour), or a FedScale availability file. Only online devices are
            selected; one that goes offline before its update arrives drops out then, its update lost (failed in
            ``events.jsonl``).
        availability_period: the diurnal model's day, in simulated time units.
        availability_online: the share of its day a device is online in the diurnal model (one session of that
            length each day, at the device's own seeded phase).
        capacity_cost: the trace's milliseconds per sample are multiplied by this: 1 keeps them as measured (for
            FedScale's own model); give your model's cost relative to it.
        task_samples: samples a device trains on per task (with ``capacity_file``; the jobs set local iterations
            x batch size), or with --local-epochs the reference task a drawn training time is for (the jobs set
            epochs x --subset-size; a device's time scales with its own samples, common.delays).
        model_bytes: bytes of the model sent each way (with ``capacity_file``; the jobs set the model's size).
        upload_bytes: an update's encoded bytes (``common.compression``: the jobs set it from the model's shapes and
            ``--compress`` when compression or a bandwidth is on; 0: none, ``model_bytes`` with a capacity trace).
            Each line of ``events.jsonl`` then records it.
        download_bytes: a version's bytes (set with ``upload_bytes``; 0: ``model_bytes`` with a capacity trace).
        uplink_bandwidth: each device's uplink in kbit/s (``--uplink-kbps``, set by the jobs): a number for every
            device or a distribution each device's own is drawn from once (``common.bandwidth``); an upload takes
            ``upload_bytes x 8 / (kbit/s x 1000)`` instead of the drawn upload time; 0: the drawn one.
        downlink_bandwidth: each device's downlink in kbit/s (``--downlink-kbps``), as ``uplink_bandwidth``: a
            download takes ``download_bytes x 8 / (kbit/s x 1000)`` instead of ``download_delay``; 0:
            ``download_delay``.
    """

    speed_means: tuple[float, ...] = ()
    speed_stds: tuple[float, ...] = ()
    speed_probs: tuple[float, ...] = ()
    speed_distribution: SpeedDistribution = "normal"
    download_delay: float = 0.0
    upload_delays: tuple[float, ...] = ()
    upload_jitter: float = 0.0
    capacity_file: str = ""
    capacity_cost: float = 1.0
    task_samples: int = 0
    model_bytes: int = 0
    upload_bytes: int = 0
    download_bytes: int = 0
    uplink_bandwidth: Bandwidth = 0.0
    downlink_bandwidth: Bandwidth = 0.0
    availability: str = "always"
    availability_period: float = 24.0
    availability_online: float = 0.5

    def __post_init__(self) -> None:
        for name in ("speed_means", "speed_stds", "speed_probs", "upload_delays"):
            object.__setattr__(self, name, tuple(float(v) for v in getattr(self, name)))
        check_choice("--speed-distribution", self.speed_distribution, SpeedDistribution)
        if self.speed_distribution == "normal" and len(self.speed_stds) != len(self.speed_means):
            raise ConfigError(
                f"--speed-means has {len(self.speed_means)} values but --speed-stds has {len(self.speed_stds)}: "
                "normal training times need one std per speed class"
            )
        if self.speed_distribution == "exponential" and self.speed_stds:
            raise ConfigError("--speed-stds is for --speed-distribution normal; exponential times have no std")
        if self.speed_probs and len(self.speed_probs) != len(self.speed_means):
            raise ConfigError(f"--speed-probs has {len(self.speed_probs)} values; it needs one per speed class")
        if self.speed_probs and (any(p < 0 for p in self.speed_probs) or abs(sum(self.speed_probs) - 1) > 1e-6):
            raise ConfigError(f"--speed-probs {list(self.speed_probs)} must be non-negative and sum to 1")
        values = (*self.speed_means, *self.speed_stds, *self.upload_delays, self.download_delay, self.upload_jitter)
        if any(v < 0 for v in values):
            raise ConfigError("speeds and delays must be >= 0 (a negative delay makes no sense)")
        if self.availability not in NAMED_AVAILABILITY:
            object.__setattr__(self, "availability", os.path.abspath(os.path.expanduser(self.availability)))
        check_named_availability(self.availability, self.availability_period, self.availability_online)
        for name in ("uplink_bandwidth", "downlink_bandwidth"):
            if (value := getattr(self, name)) != 0:  # 0: not set; else one spelling, a number stays a float
                object.__setattr__(self, name, parse_bandwidth(name, value))
        if self.upload_bytes < 0 or self.download_bytes < 0:
            raise ConfigError("byte counts must be >= 0")
        if not self.capacity_cost > 0:
            raise ConfigError(f"--capacity-cost {self.capacity_cost}: must be > 0 (1: the trace's own speeds)")
        if self.capacity_file:
            if self.speed_means or self.upload_delays or self.download_delay:
                raise ConfigError(
                    "--capacity-file gives every device's training, download and upload times: leave out --delays "
                    "and the speed / upload / download flags"
                )
            if self.uplink_bandwidth or self.downlink_bandwidth:
                raise ConfigError(
                    "--capacity-file gives every device's bandwidth: leave out --uplink-kbps and --downlink-kbps"
                )
            object.__setattr__(self, "capacity_file", os.path.abspath(os.path.expanduser(self.capacity_file)))

    def validate(self) -> None:
        """Read the trace files it names (``ConfigError`` naming the fix for a missing or malformed one)."""
        check_availability(self.availability, self.availability_period, self.availability_online)
        if self.capacity_file:
            load_capacities(self.capacity_file)

    def summary(self) -> str:
        """The delay model in a few words (``--help`` describes each preset with it)."""
        if not self.enabled:
            return "no delays"

        def values(v: tuple[float, ...]) -> str:
            return "/".join(f"{x:g}" for x in v)

        parts = []
        if self.speed_means:
            spread = f"std {values(self.speed_stds)}" if self.speed_stds else ""
            odds = f"p {values(self.speed_probs)}" if self.speed_probs else ""
            detail = ", ".join(p for p in (spread, odds) if p)
            parts.append(
                f"{self.speed_distribution} speeds {values(self.speed_means)}" + (f" ({detail})" if detail else "")
            )
        if self.download_delay:
            parts.append(f"download {self.download_delay:g}")
        if self.upload_delays:
            jitter = f" +-{self.upload_jitter:g}" if self.upload_jitter else ""
            parts.append(f"upload {' or '.join(f'{u:g}' for u in self.upload_delays)}{jitter}")
        return ", ".join(parts)

    @property
    def enabled(self) -> bool:
        return (
            bool(self.speed_means)
            or self.download_delay > 0
            or any(self.upload_delays)
            or bool(self.capacity_file)
            or bool(self.uplink_bandwidth)
            or bool(self.downlink_bandwidth)
        )

    def to_dict(self) -> dict:
        """The fields as plain values; the transfer fields (``TRANSFER_FIELDS``) only when set, so a run without
        compression or bandwidths records (and keys its seeded noise with) the config it always did."""
        return {
            k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items() if k not in TRANSFER_FIELDS or v
        }

    @classmethod
    def from_dict(cls, d: dict | None) -> DelayConfig:
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in (d or {}).items()})

    @classmethod
    def preset(cls, name: DelayPreset, **overrides) -> DelayConfig:
        """A named delay model, with any field overridden."""
        check_choice("--delays", name, DelayPreset)
        return replace(DELAY_PRESETS[name], **overrides)

    @classmethod
    def from_spec(cls, spec: DelayConfig | dict | str | None, **overrides) -> DelayConfig:
        """A delay model from a ``DelayConfig``, a preset name, or a dict of fields (with an optional
        ``"preset"`` they override), plus field overrides. An exponential distribution given without stds drops
        the preset's normal stds."""
        overrides = {k: tuple(v) if isinstance(v, list) else v for k, v in overrides.items()}
        if isinstance(spec, DelayConfig):
            return replace(spec, **overrides)
        if isinstance(spec, dict):
            fields = dict(spec)
            return cls.from_spec(fields.pop("preset", DEFAULT_DELAY_PRESET), **(fields | overrides))
        if overrides.get("speed_distribution") == "exponential" and "speed_stds" not in overrides:
            overrides = overrides | {"speed_stds": ()}
        return cls.preset(spec or DEFAULT_DELAY_PRESET, **overrides)


TRANSFER_FIELDS = ("upload_bytes", "download_bytes", "uplink_bandwidth", "downlink_bandwidth")

DELAY_PRESETS: dict[str, DelayConfig] = {
    "none": DelayConfig(),
    # the FedRevive paper's main setting (reference simulator's SampleConfigFiles/cifar10/*.json)
    "paper": DelayConfig(
        speed_means=(1.0, 1.3, 1.6),
        speed_probs=(0.25, 0.5, 0.25),
        speed_distribution="exponential",
        download_delay=0.1,
        upload_delays=(0.15, 0.25),
        upload_jitter=0.02,
    ),
    # its shifted schedule (NVIDIA's port, DELAY_SCHEDULES["shifted"]): ten times faster training
    "paper-shifted": DelayConfig(
        speed_means=(0.1,),
        speed_distribution="exponential",
        download_delay=0.02,
        upload_delays=(0.05, 0.10),
        upload_jitter=0.01,
    ),
    # NVFlare's edge example: speeds 100/200/400 s (std 4), 5 s upload
    "edge-example": DelayConfig(speed_means=(100.0, 200.0, 400.0), speed_stds=(4.0, 4.0, 4.0), upload_delays=(5.0,)),
}
DELAY_PRESET_ORIGINS: dict[str, str] = {
    "paper": "the FedRevive paper's main setting",
    "paper-shifted": "the paper's shifted schedule",
    "edge-example": "NVFlare's edge example, in seconds",
}
"""Where each preset comes from, for ``--help`` (which adds each preset's ``summary``)."""


@dataclass(frozen=True)
class TaskDurations:
    download: float
    train: float
    upload: float

    @property
    def total(self) -> float:
        return self.download + self.train + self.upload


TRAITS_KEPT = 1 << 16  # devices whose traits DeviceDelays keeps (a pure function of seed and id: only speed)


class DeviceDelays:
    """The delay model of one run: ``durations(device_id, task_number)`` is a pure function of its arguments.

    ``work``: the samples a device trains on per task, by device id (the module docstring); ``None``: every device
    trains ``task_samples``."""

    def __init__(self, config: DelayConfig, seed: int, work: Callable[[str], float] | None = None):
        config.validate()  # its trace files, before any duration is drawn from them
        if (config.uplink_bandwidth and not config.upload_bytes) or (
            config.downlink_bandwidth and not config.download_bytes
        ):
            raise ConfigError("a bandwidth (--uplink-kbps, --downlink-kbps) needs the bytes it carries: upload_bytes")
        if work is not None and not config.capacity_file and config.speed_means and not config.task_samples > 0:
            raise ConfigError("scaling training times by each device's work needs task_samples, the reference task")
        self.config = config
        self.seed = seed
        self.work = work
        self._traits: dict[str, tuple[int, float]] = {}  # device -> device_traits, for the devices seen lately
        self._links: dict[str, tuple[float, float]] = {}  # device -> links, for the devices seen lately
        self.availability = Availability(
            config.availability, seed, config.availability_period, config.availability_online
        )

    def device_traits(self, device_id: str) -> tuple[int, float]:
        """(speed class, upload mean) of a device, drawn once from the seed and its id (and kept: a generator
        made and drawn from costs more than the rest of a selection; the devices seen last are kept, so a pool of
        millions costs no memory)."""
        traits = self._traits.get(device_id)
        if traits is None:
            if len(self._traits) >= TRAITS_KEPT:
                self._traits.clear()
            traits = self._traits[device_id] = self._draw_traits(device_id)
        return traits

    def links(self, device_id: str) -> tuple[float, float]:
        """(uplink, downlink) of a device in kbit/s (0: not set), each drawn once from the seed and its id when the
        setting is a distribution (``common.bandwidth``), kept as ``device_traits`` are."""
        links = self._links.get(device_id)
        if links is None:
            if len(self._links) >= TRAITS_KEPT:
                self._links.clear()
            c = self.config
            up, down = (
                device_bandwidth(setting, self.seed, device_id, link) if setting else 0.0
                for setting, link in ((c.uplink_bandwidth, "up"), (c.downlink_bandwidth, "down"))
            )
            links = self._links[device_id] = (up, down)
        return links

    def _draw_traits(self, device_id: str) -> tuple[int, float]:
        c = self.config
        rng = np.random.default_rng(stable_seed("delay-traits", self.seed, device_id))
        k = (
            int(rng.choice(len(c.speed_means), p=np.asarray(c.speed_probs) if c.speed_probs else None))
            if c.speed_means
            else 0
        )
        upload = float(c.upload_delays[int(rng.integers(len(c.upload_delays)))]) if c.upload_delays else 0.0
        return k, upload

    def durations(self, device_id: str, task_number: int) -> TaskDurations:
        """Download, training and upload time of the device's ``task_number``-th task (0-based)."""
        c = self.config
        if not c.enabled:
            return TaskDurations(0.0, 0.0, 0.0)
        if c.capacity_file:
            ms_per_sample, kbit_per_s = device_capacity(c.capacity_file, self.seed, device_id)
            download = transfer_seconds(c.download_bytes or c.model_bytes, kbit_per_s)
            upload = transfer_seconds(c.upload_bytes or c.model_bytes, kbit_per_s)
            samples = c.task_samples if self.work is None else self.work(device_id)
            return TaskDurations(download, samples * ms_per_sample * c.capacity_cost / 1000, upload)
        k, upload_mean = self.device_traits(device_id)
        rng = np.random.default_rng(stable_seed("delay-task", self.seed, device_id, task_number))
        train = 0.0
        if c.speed_means:
            if c.speed_distribution == "exponential":
                train = float(rng.exponential(c.speed_means[k]))
            else:
                train = max(0.0, float(rng.normal(c.speed_means[k], c.speed_stds[k])))
            if self.work is not None:  # drawn for the reference task; this device's own work
                train *= self.work(device_id) / c.task_samples
        upload = upload_mean
        uplink, downlink = self.links(device_id) if c.uplink_bandwidth or c.downlink_bandwidth else (0.0, 0.0)
        if uplink:  # the update's encoded bytes over the device's uplink (common.compression)
            upload = transfer_seconds(c.upload_bytes, uplink)
        elif c.upload_jitter:
            upload = float(rng.uniform(max(0.0, upload_mean - c.upload_jitter), upload_mean + c.upload_jitter))
        download = transfer_seconds(c.download_bytes, downlink) if downlink else c.download_delay
        return TaskDurations(download, train, upload)


def transfer_seconds(nbytes: int, kbit_per_s: float) -> float:
    """Simulated seconds to move ``nbytes`` over a link of ``kbit_per_s``: bytes x 8 / (kbit/s x 1000)."""
    return nbytes * 8 / (kbit_per_s * 1000)
