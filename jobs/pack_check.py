"""Which runs can share one NVFlare job (a pack, ``docs/packs.md``): the same model, dataset, leaves and devices per
leaf, policy when a leaf is lost, and the leaves' engine; ``pack_refusal`` says why not in one line naming the fix
(``jobs.run.pack`` exits 2 with it, before NVFlare starts). Beside ``jobs.config``, whose ``JobConfig`` it compares.
"""

from __future__ import annotations

from dataclasses import asdict

from common.choices import ConfigError
from jobs.config import JobConfig

# what every run of a pack shares (``docs/packs.md``): one model architecture and dataset on one set of leaves,
# and one policy when one of them is lost
PACK_SHARED = (
    ("training", "model", "--model"),
    ("data", "dataset", "--dataset"),
    ("federation", "num_leaf_nodes", "--num-leaf-nodes"),
    ("federation", "devices_per_leaf", "--devices-per-leaf"),
    ("federation", "on_leaf_loss", "--on-leaf-loss"),
)


def pack_refusal(cfgs: list[JobConfig]) -> str | None:
    """Why these runs cannot share one NVFlare job (a pack, ``docs/packs.md``), in one line naming the fix; None
    when they can. They share the model, the dataset, the leaves and their devices, the policy when a leaf is lost,
    and the leaves' engine (one set of processes); a pack runs on SimEnv, on exact simulated time, with simulated
    devices on our simulator (its diffs and versions through shared memory as a job's: ``scheduling.pack_links``)."""
    if len(cfgs) < 2:
        return f"a pack needs at least 2 runs, got {len(cfgs)}: run a single config as a job of its own"
    first = cfgs[0]
    for i, cfg in enumerate(cfgs):
        for part, name, flag in PACK_SHARED:
            mine, theirs = getattr(getattr(cfg, part), name), getattr(getattr(first, part), name)
            if mine != theirs:
                return (
                    f"run {i} has {flag} {mine}, run 0 has {theirs}: runs of one pack share {flag}; "
                    "run the others in a pack (or a job) of their own"
                )
        if cfg.engine != first.engine:
            diff = sorted(k for k, v in asdict(cfg.engine).items() if getattr(first.engine, k) != v)
            flags = ", ".join("--" + k.replace("_", "-") for k in diff)
            return f"run {i}'s engine differs from run 0's ({flags}): the runs of one pack share one set of leaves"
        e = cfg.engine
        if e.simulator != "fast" or e.devices != "simulated" or e.time_scale > 0:
            return f"run {i}: a pack runs simulated devices on exact time: leave out --simulator, --devices and --time-scale"
        if cfg.run.env != "sim" or cfg.run.export_only:
            return f"run {i}: --env {cfg.run.env}: a pack runs on SimEnv only; leave out --env and --export-only"
    return None


def check_pack(cfgs: list[JobConfig]) -> list[JobConfig]:
    """The runs of a pack, or ``ConfigError`` with ``pack_refusal``'s line."""
    refusal = pack_refusal(cfgs)
    if refusal:
        raise ConfigError(refusal)
    return cfgs
