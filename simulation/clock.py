"""Device heterogeneity: seeded speed classes and communication delays, sampled per device.

The speed class is drawn once per device (not once per leaf, as NVFlare's example does by accident), from the
run seed and the device id, so a device is equally slow in every run. Durations are drawn per task.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from processors.data.partition import stable_seed


@dataclass(frozen=True)
class DeviceSpeedConfig:
    """Speed classes (mean and std seconds to train a task, class probabilities) and upload delay.

    Empty ``means`` and zero communication delay (the default) mean no heterogeneity: every task takes 0 s.
    """

    means: tuple[float, ...] = ()
    stds: tuple[float, ...] = ()
    probs: tuple[float, ...] = ()  # empty: equally likely
    comm_mean: float = 0.0
    comm_std: float = 0.0
    seed: int = 0
    extra: dict = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        if len(self.means) != len(self.stds):
            raise ValueError(f"--speed-means has {len(self.means)} values but --speed-stds has {len(self.stds)}")
        if self.probs and len(self.probs) != len(self.means):
            raise ValueError(f"--speed-probs has {len(self.probs)} values; it needs one per speed class")
        if self.probs and (any(p < 0 for p in self.probs) or abs(sum(self.probs) - 1) > 1e-6):
            raise ValueError(f"--speed-probs {list(self.probs)} must be non-negative and sum to 1")
        if any(v < 0 for v in (*self.means, *self.stds, self.comm_mean, self.comm_std)):
            raise ValueError("speed means/stds and communication delays must be >= 0 (negative delays make no sense)")

    @property
    def enabled(self) -> bool:
        return bool(self.means) or self.comm_mean > 0 or self.comm_std > 0

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("extra")
        return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}

    @classmethod
    def from_dict(cls, d: dict | None) -> DeviceSpeedConfig:
        d = dict(d or {})
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})

    def speed_class(self, device_id: str) -> int:
        if not self.means:
            return 0
        rng = np.random.default_rng(stable_seed("speed-class", self.seed, device_id))
        p = np.asarray(self.probs) if self.probs else None
        return int(rng.choice(len(self.means), p=p))

    def sample_seconds(self, device_id: str, task_number: int) -> tuple[float, float]:
        """(training seconds, upload seconds) of one task of one device, both >= 0."""
        if not self.enabled:
            return 0.0, 0.0
        rng = np.random.default_rng(stable_seed("duration", self.seed, device_id, task_number))
        train = 0.0
        if self.means:
            k = self.speed_class(device_id)
            train = max(0.0, rng.normal(self.means[k], self.stds[k]))
        comm = max(0.0, rng.normal(self.comm_mean, self.comm_std)) if (self.comm_mean or self.comm_std) else 0.0
        return float(train), float(comm)
