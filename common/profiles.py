"""Utilisation profiles (``--profile``): how hard a job may use the machine, as concrete engine knobs.

One frozen ``UtilisationProfile`` per name in ``PROFILES``. The planner reads the worker, group and memory
knobs (``plan_workers`` / ``plan_engine``); each leaf's task processor reads the CUDA, caching and cleanup
knobs (it gets the profile's name as a constructor argument and looks it up here). Every CUDA knob is a no-op
on the CPU. ``aggressive`` differs from ``high`` only in its memory share and slack.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Literal

ProfileName = Literal["conservative", "high", "aggressive"]
DEFAULT_PROFILE: ProfileName = "high"


@dataclass(frozen=True)
class UtilisationProfile:
    name: str
    # share of the free GPU memory the job may use (planner); each leaf also caps its CUDA caching allocator at
    # share / leaves on its GPU with torch.cuda.set_per_process_memory_fraction
    gpu_memory_share: float
    # parallel workers per leaf on the CPU bound: max(1, int(cores per leaf x this))
    workers_per_core: float
    # the vectorised engine's group: max(1, int(memory/device-limited group x this))
    group_fraction: float
    # allocator / workspace slack on the estimated memory of one device trained (the estimate's own is 1.25)
    memory_slack: float
    # CUDA: one stream per worker thread around training, diffs copied out through pinned host buffers
    pinned_streams: bool
    # global-model versions each leaf keeps converted on the compute device (for stale tasks)
    cached_versions: int
    # the training data stays on the compute device (False: kept on the CPU, each batch moved over)
    data_resident: bool
    # torch.cuda.empty_cache() after every task / group (the simulator also empties it once after an out-of-memory
    # error, whatever the profile)
    empty_cache_every_task: bool

    def describe(self) -> str:
        """The settings block printed at the start of a job: one ``name value`` line per knob."""
        lines = [f"Utilisation profile: {self.name}" + (" (default)" if self.name == DEFAULT_PROFILE else "")]
        for f in fields(self):
            if f.name != "name":
                lines.append(f"  {f.name:<18} {format_knob(getattr(self, f.name))}")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return asdict(self)


def format_knob(value) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


PROFILES: dict[str, UtilisationProfile] = {
    "conservative": UtilisationProfile(
        name="conservative",
        gpu_memory_share=0.5,
        workers_per_core=0.5,
        group_fraction=0.5,
        memory_slack=1.25,
        pinned_streams=False,
        cached_versions=1,
        data_resident=False,
        empty_cache_every_task=True,
    ),
    "high": UtilisationProfile(
        name="high",
        gpu_memory_share=0.8,
        workers_per_core=1.0,
        group_fraction=1.0,
        memory_slack=1.25,
        pinned_streams=True,
        cached_versions=3,
        data_resident=True,
        empty_cache_every_task=False,
    ),
    "aggressive": UtilisationProfile(
        name="aggressive",
        gpu_memory_share=0.9,
        workers_per_core=1.0,
        group_fraction=1.0,
        memory_slack=1.1,
        pinned_streams=True,
        cached_versions=3,
        data_resident=True,
        empty_cache_every_task=False,
    ),
}


def get_profile(profile: UtilisationProfile | str | None) -> UtilisationProfile:
    """The profile itself, or the one a name (None: the default) stands for; unknown names raise ValueError."""
    if isinstance(profile, UtilisationProfile):
        return profile
    name = profile or DEFAULT_PROFILE
    if name not in PROFILES:
        raise ValueError(f"--profile {name!r}: use {', '.join(PROFILES)}")
    return PROFILES[name]
