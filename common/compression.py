"""Communication: the compressor on a device's upload (``--compress``, ``--error-feedback``) and the links whose
bandwidth turns bytes into simulated time (``--uplink-kbps``, ``--downlink-kbps``); ``docs/communication.md``.

Two processes read these settings:

* the device (``processors.compress``, run by the task processor for both engines) encodes its update, keeps an
  error-feedback residual for a biased compressor, and sends what the server would decode;
* the schedule (``common.delays.DeviceDelays``, and so the server, the dry-run planner and the event reference)
  times a transfer as its encoded bytes x 8 / (kbit/s x 1000), the same rule as a FedScale capacity trace.

An update's encoded size is a function of the model's shapes and the compressor's setting, never of the data, so
the driver computes it once (``encoded_bytes``) and the schedule takes it as a number
(``DelayConfig.upload_bytes``). This module imports nothing heavier than the standard library.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Literal

from common.bandwidth import parse_bandwidth
from common.choices import ConfigError, check_choice

ErrorFeedback = Literal["auto", "on", "off"]
COMPRESSORS = ("none", "fp16", "bf16", "qsgd", "topk", "randk", "nvflare")
NVFLARE_MODES = ("float16", "blockwise8", "float4", "normfloat4", "adaquant")  # ModelQuantizer's quantization_type
NVFLARE_GPU_MODES = frozenset({"blockwise8", "float4", "normfloat4"})  # its filters run bitsandbytes on CUDA
BIASED = frozenset({"topk", "randk"})  # error feedback is on for these unless --error-feedback off
QSGD_BUCKET = 512  # values sharing one scale (Alistarh et al. 2017 bucket their vectors; 512 as in their runs)
FLOAT_BYTES = 4  # a float32 value or scale
INDEX_BYTES = 4  # an int32 position in the flattened update (a model below 2**31 values)
SEED_BYTES = 8  # random-k's indices are drawn from one 64-bit seed, sent instead of them


@dataclass(frozen=True)
class CompressorSpec:
    """A compressor named by ``--compress NAME[:SETTING]``: ``name`` and its ``setting`` (qsgd: bits per value;
    topk, randk: the fraction of values kept; nvflare: the mode of NVFlare's ``ModelQuantizer``; None for the
    others)."""

    name: str
    setting: float | str | None = None

    @property
    def on(self) -> bool:
        return self.name != "none"

    @property
    def biased(self) -> bool:
        """Its decoded update is not the update in expectation: error feedback recovers what it drops."""
        return self.name in BIASED

    def kept(self, n: int) -> int:
        """Values a sparsifier keeps of ``n``: ceil(fraction x n), at least 1."""
        return max(1, min(n, math.ceil(self.setting * n - 1e-9)))

    def encoded_bytes(self, n: int) -> int:
        """Bytes of an update of ``n`` float32 values as this compressor sends it: none 4n; fp16 and bf16 2n;
        qsgd ceil(n x bits / 8) for the levels plus 4 per bucket of ``QSGD_BUCKET`` values for its scale; topk 8k
        (an int32 index and a float32 value each); randk 4k plus the 8-byte seed its indices are drawn from;
        nvflare:float16 2n (NVFlare's float16 payload, no state). NVFlare's other modes add state per entry of the
        model: ``processors.nvflare_quantize.payload_bytes`` measures them from the entries' shapes."""
        if self.name == "none":
            return FLOAT_BYTES * n
        if self.name in ("fp16", "bf16") or (self.name == "nvflare" and self.setting == "float16"):
            return 2 * n
        if self.name == "nvflare":
            raise ValueError(f"{self}'s bytes depend on the model's entries: processors.nvflare_quantize measures them")
        if self.name == "qsgd":
            return math.ceil(n * int(self.setting) / 8) + FLOAT_BYTES * math.ceil(n / QSGD_BUCKET)
        if self.name == "topk":
            return (INDEX_BYTES + FLOAT_BYTES) * self.kept(n)
        return FLOAT_BYTES * self.kept(n) + SEED_BYTES  # randk

    def __str__(self) -> str:
        if self.setting is None:
            return self.name
        if self.name == "nvflare":
            return f"{self.name}:{self.setting}"
        return f"{self.name}:{int(self.setting) if self.name == 'qsgd' else f'{self.setting:g}'}"


def parse_compress(text: str) -> CompressorSpec:
    """``--compress``'s value as a ``CompressorSpec`` (``ConfigError`` naming the fix for a bad one)."""
    name, _, setting = str(text).strip().partition(":")
    name = name.lower()
    if name not in COMPRESSORS:
        raise ConfigError(
            f"--compress {text!r}: unknown compressor; use none, fp16, bf16, qsgd:BITS, topk:FRACTION, "
            "randk:FRACTION or nvflare:MODE (docs/communication.md)"
        )
    if name == "nvflare":
        return _nvflare_spec(text, setting.strip().lower())
    if name in ("none", "fp16", "bf16"):
        if setting:
            raise ConfigError(f"--compress {text!r}: {name} takes no setting")
        return CompressorSpec(name)
    if not setting:
        example = "qsgd:4" if name == "qsgd" else f"{name}:0.01"
        raise ConfigError(f"--compress {name} needs its setting, e.g. --compress {example}")
    try:
        value = float(setting)
    except ValueError:
        raise ConfigError(f"--compress {text!r}: {setting!r} is not a number") from None
    if name == "qsgd":
        if value != int(value) or not 1 <= value <= 16:
            raise ConfigError(f"--compress {text!r}: qsgd's bits per value must be an integer in 1-16")
        return CompressorSpec(name, float(int(value)))
    if not 0 < value <= 1:
        raise ConfigError(f"--compress {text!r}: the fraction of values {name} keeps must be in (0, 1], e.g. 0.01")
    return CompressorSpec(name, value)


def _nvflare_spec(text: str, mode: str) -> CompressorSpec:
    if mode not in NVFLARE_MODES:
        raise ConfigError(
            f"--compress {text!r}: NVFlare's ModelQuantizer has the modes {', '.join(NVFLARE_MODES)}, e.g. "
            "--compress nvflare:float16"
        )
    if mode == "adaquant":
        raise ConfigError(
            f"--compress {text!r}: ADAQUANT's size depends on each update's values (its levels are bz2-compressed), "
            "and the schedule times an upload before the device trains; use nvflare:float16 or qsgd:BITS"
        )
    return CompressorSpec("nvflare", mode)


@dataclass(frozen=True)
class CompressionConfig:
    """Attributes:
    compress: the compressor on each device's upload: ``none``; ``fp16`` or ``bf16`` (half precision, 2 bytes a
        value); ``qsgd:BITS`` (stochastic quantisation to 2^BITS levels per bucket of 512 values, BITS 1-16, seeded
        per device and version); ``topk:FRACTION`` or ``randk:FRACTION`` (the largest, or random, fraction of the
        values, with their indices); ``nvflare:MODE`` (NVFlare's own ModelQuantizer and ModelDequantizer filters:
        float16; blockwise8, float4 or normfloat4 with bitsandbytes on a CUDA GPU); the server sees exactly what
        it would decode (docs/communication.md).
    error_feedback: keep what a compressor dropped on the device and add it to its next update (Stich et al.
        2018, Karimireddy et al. 2019): ``auto`` (on for the biased topk and randk), ``on`` or ``off``.
    uplink_kbps: each device's uplink in kbit/s: one number for every device, or a distribution each device's
        own is drawn from once, seeded (lognormal:MEDIAN:SIGMA, uniform:LOW:HIGH, or A,B,... with equal odds;
        common.bandwidth); an upload takes the update's encoded bytes x 8 / (kbit/s x 1000) simulated seconds
        instead of the delay model's upload time (default: the delay model's).
    downlink_kbps: each device's downlink in kbit/s, as ``uplink_kbps``: a download takes the version's float32
        bytes x 8 / (kbit/s x 1000) instead of the delay model's download time (default: the delay model's).
    """

    compress: str = "none"
    error_feedback: ErrorFeedback = "auto"
    uplink_kbps: float | str | None = None
    downlink_kbps: float | str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "compress", str(self.spec))  # one spelling: "TopK:0.010" -> "topk:0.01"
        check_choice("--error-feedback", self.error_feedback, ErrorFeedback)
        for name in ("uplink_kbps", "downlink_kbps"):
            if (value := getattr(self, name)) is not None:  # one spelling; a number stays a float
                object.__setattr__(self, name, parse_bandwidth("--" + name.replace("_", "-"), value))
        if self.error_feedback == "on" and not self.spec.on:
            raise ConfigError("--error-feedback on needs a compressor: add --compress (e.g. topk:0.01)")

    @property
    def spec(self) -> CompressorSpec:
        return parse_compress(self.compress)

    @property
    def feedback(self) -> bool:
        """Whether devices keep an error-feedback residual."""
        if self.error_feedback == "auto":
            return self.spec.biased
        return self.error_feedback == "on" and self.spec.on

    @property
    def on(self) -> bool:
        """Compression or a bandwidth is set: updates record their bytes, transfers may take them as time."""
        return self.spec.on or self.uplink_kbps is not None or self.downlink_kbps is not None

    def device_settings(self) -> dict | None:
        """What a device needs (``processors.compress``): the compressor and whether it keeps a residual; None
        without compression (the task processor's config keeps its bytes)."""
        if not self.spec.on:
            return None
        return {"compress": self.compress, "error_feedback": self.feedback}

    def to_dict(self) -> dict:
        return asdict(self)
