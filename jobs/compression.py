"""Communication for a whole job: what compression must agree on with the other parts, and the bytes the schedule
times (``docs/communication.md``).

``check_compression`` runs when a ``JobConfig`` is built (one line naming the fix); ``transfer_delays`` when it is
validated: it computes an update's encoded size and a version's size from the model's shapes and the compressor
(``processors.compress.transfer_bytes``) and hands them, with the bandwidths, to the delay model
(``common.delays.DelayConfig``'s derived ``upload_bytes``, ``download_bytes``, ``uplink_bandwidth``,
``downlink_bandwidth``),
so the server's schedule, the dry-run planner and the event reference all time transfers by the same numbers.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from common.choices import ConfigError

if TYPE_CHECKING:
    from jobs.config import JobConfig


def check_compression(cfg: JobConfig) -> None:
    """Refuse what compression cannot run with, naming the fix (``ConfigError``).

    With central differential privacy the device clips, then compresses, and the server's noise is calibrated to
    the clip norm, so what is sent must stay within it: sparsifying a clipped update does (top-k and random-k keep
    some of its values); error feedback does not (the residual adds earlier updates), nor can stochastic
    quantisation or rounding to half precision (either can lengthen the vector). Local DP compresses the noised
    update: post-processing, any compressor."""
    c = cfg.compression
    spec = c.spec
    if not c.on:
        return
    if cfg.engine.devices == "real" and (c.uplink_kbps is not None or c.downlink_kbps is not None):
        raise ConfigError(
            "--uplink-kbps and --downlink-kbps time simulated devices' links only: real devices bring their own; "
            "leave them out with --devices real (--compress works: they send the encoded update)"
        )
    if cfg.delays.capacity_file and (c.uplink_kbps is not None or c.downlink_kbps is not None):
        raise ConfigError(
            "--capacity-file gives every device's bandwidth: leave out --uplink-kbps and --downlink-kbps (its "
            "transfers take the compressed bytes already)"
        )
    if spec.name == "nvflare":
        if cfg.engine.devices == "real":
            raise ConfigError(
                f"--compress {c.compress} with --devices real: a device would need NVFlare's quantiser to send it; "
                "use fp16 (NVFlare's float16 values, on the device wire)"
            )
        from processors.nvflare_quantize import missing_for  # torch: only for NVFlare's modes

        if problem := missing_for(str(spec.setting)):
            raise ConfigError(problem)
    if cfg.privacy.central and spec.on:
        if spec.name not in ("topk", "randk"):
            raise ConfigError(
                f"--compress {c.compress} with --dp central: it can lengthen a clipped update beyond the clip norm "
                "the noise is calibrated to; use topk or randk (docs/privacy.md), or --dp local"
            )
        if c.feedback:
            raise ConfigError(
                "--dp central with error feedback: the residual adds earlier updates to what is sent, beyond the "
                "clip norm; add --error-feedback off (docs/privacy.md)"
            )


def transfer_delays(cfg: JobConfig) -> JobConfig:
    """The config with the delay model's transfer fields filled (compression or a bandwidth on; else as it is).
    Real devices: only a version's bytes (each task's download, for ``bytes_down``); their leaves measure each
    upload's bytes as it arrives (``simulation.leaf_executor.upload_bytes``)."""
    c = cfg.compression
    if not c.on:
        return cfg
    from processors.compress import transfer_bytes  # imports torch (the model's shapes)

    upload, download = transfer_bytes(cfg.training.model, c.compress)
    if cfg.engine.devices == "real":
        return replace(cfg, delays=replace(cfg.delays, download_bytes=download))
    delays = replace(
        cfg.delays,
        upload_bytes=upload,
        download_bytes=download,
        uplink_bandwidth=c.uplink_kbps or 0.0,
        downlink_bandwidth=c.downlink_kbps or 0.0,
    )
    return replace(cfg, delays=delays)
