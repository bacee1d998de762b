"""Compressed updates on the device (``--compress``, ``--error-feedback``; ``docs/communication.md``).

A compressor is one small class, as FLSim's channels are: ``decode_group`` gives, for K devices' flattened updates
at once (``[K, n]`` float32), exactly what the server decodes from what each device sends; ``encode`` and
``decode`` are that wire form for one device (what a real device sends, ``CompressionHost.encode_one``, and what
the tests decode to check that the counted bytes, ``common.compression.CompressorSpec.encoded_bytes``, hold the
update). Random draws
(qsgd's rounding, randk's indices) come from a generator seeded per device and version with
``common.seeds.stable_seed``, so either engine, any worker count and a resumed run draw the same.

Where: the task processor runs ``CompressionHost.apply`` on the diffs either engine returns, after clipping and
local DP's noise (``processors.privatize``: clip, then compress) and before the method's sample weighting and
reports; the reports a method adds (``DEVICE_EXTRA_PREFIX``) travel as they are and are not counted. The group's
devices are compressed together, batched along their first dimension (``torch.topk``, ``scatter`` and the
quantiser's arithmetic take the K rows at once); the per-device draws (qsgd's uniforms, randk's permutations) are
made in a loop over the group's devices, from each one's own generator. It runs on the CPU, on the float32
arrays the engines copy out, so a compressed update's bits do not depend on the compute device.

Error feedback (Stich et al. 2018, Karimireddy et al. 2019): a device adds the residual it kept to its update,
sends the compressed sum and keeps what compression dropped. The residual is kept per device in a
``processors.device_state.DeviceStateStore`` of its own (the results folder's ``error_feedback/``), with the same
keys and durability as a training rule's state (SCAFFOLD's ``c_i``), so a resumed run continues bit for bit.
"""

from __future__ import annotations

import os
import threading

import numpy as np
import torch

from common.compression import QSGD_BUCKET, parse_compress
from common.finite import nonfinite_entry
from common.protocol import DEVICE_EXTRA_PREFIX
from common.result_files import ERROR_FEEDBACK
from common.seeds import stable_seed
from processors.compressor import Compressor, Payload, split_flat
from processors.device_state import DeviceStateStore

RESIDUAL = "residual"  # the one array of a device's error-feedback state: its flattened residual
FP16_MAX = 65504.0  # the largest finite float16: larger values are clamped to it, never sent as inf
_store_lock = threading.Lock()
COMPRESSED = "edgesim_compressed"  # a real device's result: its encoded update, beside the reports (decode_wire)
WIRE_DTYPES = frozenset({"int16", "uint8", "int32", "uint64", "float32"})  # what encode's payloads hold


def generator_for(seed: int) -> torch.Generator:
    """A CPU generator for one device's draws (``seed``: ``device_seed``)."""
    return torch.Generator().manual_seed(seed % 2**63)


def device_seed(run_seed: int, device_id: str, version: int) -> int:
    """The seed of a device's compression draws for the version it trained."""
    return stable_seed("compress", run_seed, device_id, version)


class HalfPrecision(Compressor):
    """fp16 (clamped to float16's range) or bf16: each value rounded to nearest, 2 bytes."""

    def _dtype(self) -> torch.dtype:
        return torch.float16 if self.spec.name == "fp16" else torch.bfloat16

    def _rounded(self, flat: torch.Tensor) -> torch.Tensor:
        if self.spec.name == "fp16":
            flat = flat.clamp(-FP16_MAX, FP16_MAX)
        return flat.to(self._dtype())

    def decode_group(self, flat: torch.Tensor, seeds: list[int]) -> torch.Tensor:
        return self._rounded(flat).to(torch.float32)

    def encode(self, flat: torch.Tensor, seed: int) -> Payload:
        return {"values": self._rounded(flat).view(torch.int16).numpy().copy()}

    def decode(self, payload: Payload, n: int) -> torch.Tensor:
        return torch.from_numpy(payload["values"]).view(self._dtype()).to(torch.float32)


class QSGD(Compressor):
    """Stochastic quantisation, QSGD-style (Alistarh et al. 2017): the flattened update is cut into buckets of
    ``QSGD_BUCKET`` values, each scaled by its largest magnitude s, and every value rounded at random to one of the
    2^BITS evenly spaced levels of [-s, s], up or down with the probabilities that make it unbiased. Sent: each
    level in BITS bits, and each bucket's scale as a float32."""

    @property
    def levels(self) -> int:
        return 2 ** int(self.spec.setting)

    def _levels(self, flat: torch.Tensor, uniforms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(each value's level ``[K, n]`` as int64, each bucket's scale ``[K, buckets]``)."""
        k, n = flat.shape
        buckets = -(-n // QSGD_BUCKET)
        padded = torch.nn.functional.pad(flat, (0, buckets * QSGD_BUCKET - n)).view(k, buckets, QSGD_BUCKET)
        scale = padded.abs().amax(dim=2)
        safe = torch.where(scale > 0, scale, torch.ones_like(scale)).unsqueeze(2)
        top = self.levels - 1
        position = ((padded / safe + 1) * (top / 2)).clamp(0, top)  # in [0, top]
        low = position.floor()
        level = (low + (uniforms.view(k, buckets, QSGD_BUCKET) < position - low)).clamp(max=top)
        return level.view(k, -1)[:, :n].to(torch.int64), scale

    def _values(self, level: torch.Tensor, scale: torch.Tensor, n: int) -> torch.Tensor:
        k = level.shape[0]
        buckets = scale.shape[1]
        top = self.levels - 1
        padded = torch.nn.functional.pad(level.to(torch.float32), (0, buckets * QSGD_BUCKET - n))
        unit = padded.view(k, buckets, QSGD_BUCKET) * (2 / top) - 1
        return (unit * scale.unsqueeze(2)).view(k, -1)[:, :n]

    def _uniforms(self, n: int, seeds: list[int]) -> torch.Tensor:
        padded = -(-n // QSGD_BUCKET) * QSGD_BUCKET
        return torch.stack([torch.rand(padded, generator=generator_for(s)) for s in seeds])

    def decode_group(self, flat: torch.Tensor, seeds: list[int]) -> torch.Tensor:
        level, scale = self._levels(flat, self._uniforms(flat.shape[1], seeds))
        return self._values(level, scale, flat.shape[1])

    def encode(self, flat: torch.Tensor, seed: int) -> Payload:
        n, bits = flat.shape[0], int(self.spec.setting)
        level, scale = self._levels(flat.unsqueeze(0), self._uniforms(n, [seed]))
        codes = level[0].numpy().astype(np.uint32)
        bit_planes = ((codes[:, None] >> np.arange(bits, dtype=np.uint32)) & 1).astype(np.uint8)
        return {"levels": np.packbits(bit_planes.reshape(-1)), "scales": scale[0].numpy().astype(np.float32)}

    def decode(self, payload: Payload, n: int) -> torch.Tensor:
        bits = int(self.spec.setting)
        planes = np.unpackbits(payload["levels"])[: n * bits].reshape(n, bits).astype(np.int64)
        level = torch.from_numpy((planes << np.arange(bits, dtype=np.int64)).sum(axis=1)).unsqueeze(0)
        return self._values(level, torch.from_numpy(payload["scales"]).unsqueeze(0), n)[0]


class TopK(Compressor):
    """Top-k sparsification: the ceil(fraction x n) values of largest magnitude over the whole flattened update,
    sent as int32 indices and float32 values; the others are zero."""

    def _indices(self, flat: torch.Tensor, seeds: list[int]) -> torch.Tensor:
        return flat.abs().topk(self.spec.kept(flat.shape[1]), dim=1, sorted=False).indices

    def decode_group(self, flat: torch.Tensor, seeds: list[int]) -> torch.Tensor:
        index = self._indices(flat, seeds)
        return torch.zeros_like(flat).scatter(1, index, flat.gather(1, index))

    def encode(self, flat: torch.Tensor, seed: int) -> Payload:
        index = self._indices(flat.unsqueeze(0), [seed])[0]
        return {"indices": index.numpy().astype(np.int32), "values": flat[index].numpy().astype(np.float32)}

    def decode(self, payload: Payload, n: int) -> torch.Tensor:
        out = torch.zeros(n, dtype=torch.float32)
        out[torch.from_numpy(payload["indices"].astype(np.int64))] = torch.from_numpy(payload["values"])
        return out


class RandK(TopK):
    """Random-k sparsification: ceil(fraction x n) positions drawn uniformly without replacement from the device's
    seed, sent as their float32 values and the 8-byte seed (the server draws the same positions); unscaled, so
    biased, as Stich et al. use it with error feedback."""

    def _indices(self, flat: torch.Tensor, seeds: list[int]) -> torch.Tensor:
        n = flat.shape[1]
        kept = self.spec.kept(n)
        return torch.stack([torch.randperm(n, generator=generator_for(s))[:kept] for s in seeds])

    def encode(self, flat: torch.Tensor, seed: int) -> Payload:
        index = self._indices(flat.unsqueeze(0), [seed])[0]
        return {"seed": np.asarray([seed], dtype=np.uint64), "values": flat[index].numpy().astype(np.float32)}

    def decode(self, payload: Payload, n: int) -> torch.Tensor:
        seed = int(payload["seed"][0])
        index = self._indices(torch.zeros(1, n), [seed])[0]
        out = torch.zeros(n, dtype=torch.float32)
        out[index] = torch.from_numpy(payload["values"])
        return out


COMPRESSOR_CLASSES: dict[str, type[Compressor]] = {
    "fp16": HalfPrecision,
    "bf16": HalfPrecision,
    "qsgd": QSGD,
    "topk": TopK,
    "randk": RandK,
}


def make_compressor(text: str) -> Compressor | None:
    """The compressor ``--compress`` names; None for ``none``."""
    spec = parse_compress(text)
    if spec.name == "nvflare":  # NVFlare's filters (they import bitsandbytes): only when named
        from processors.nvflare_quantize import NVFlareQuantizer

        return NVFlareQuantizer(spec)
    return COMPRESSOR_CLASSES[spec.name](spec) if spec.on else None


def update_layout(model_name: str) -> tuple[list[str], list[tuple[int, ...]], int]:
    """(a device's update's entries: the model's parameters and data statistics, as the engines' diffs hold
    them; their shapes; values in a version: its whole state)."""
    from processors.models import build_model, statistic_names

    model = build_model(model_name)
    state = model.state_dict()
    names = [n for n, _ in model.named_parameters()] + list(statistic_names(model))
    return names, [tuple(state[n].shape) for n in names], int(sum(t.numel() for t in state.values()))


def update_values(model_name: str) -> tuple[int, int]:
    """(values in a device's update, values in a version)."""
    _, shapes, version = update_layout(model_name)
    return int(sum(int(np.prod(s)) for s in shapes)), version


def transfer_bytes(model_name: str, compress: str) -> tuple[int, int]:
    """(an update's encoded bytes, a version's float32 bytes) for ``model_name`` under ``--compress``: what the
    driver passes to the schedule (``common.delays.DelayConfig.upload_bytes``, ``download_bytes``)."""
    names, shapes, version = update_layout(model_name)
    n = int(sum(int(np.prod(s)) for s in shapes))
    compressor = make_compressor(compress)
    if compressor is None:
        return parse_compress(compress).encoded_bytes(n), 4 * version
    return compressor.with_layout(names, shapes).encoded_bytes(n), 4 * version


class CompressionHost:
    """A task processor's compressor and the store of its devices' error-feedback residuals.

    Args:
        settings: ``common.compression.CompressionConfig.device_settings()`` (``compress``, ``error_feedback``)
            and, with error feedback, ``state``: where residuals are kept (``processors.device_state
            .DeviceStateStore``: ``dir`` ("": ``error_feedback/`` in the working folder), ``memory_mb``,
            ``durable``, ``fresh``); None: no compression.
        seed: the run's seed (each device's draws: ``device_seed``).
    """

    def __init__(self, settings: dict | None, seed: int):
        self.compressor = make_compressor(settings["compress"]) if settings else None
        self.feedback = bool(settings and settings.get("error_feedback"))
        self.seed = seed
        self.settings = (settings or {}).get("state") or {}
        self._store: DeviceStateStore | None = None

    def __deepcopy__(self, memo: dict) -> CompressionHost:
        return self  # NVFlare deep-copies the processor per simulated device: the copies share one store

    def store(self) -> DeviceStateStore | None:
        if not self.feedback:
            return None
        with _store_lock:
            if self._store is None:
                cfg = self.settings
                self._store = DeviceStateStore(
                    cfg.get("dir") or os.path.join(os.getcwd(), ERROR_FEEDBACK),
                    int(float(cfg.get("memory_mb", 256.0)) * 2**20),
                    durable=bool(cfg.get("durable", False)),
                    fresh=bool(cfg.get("fresh", True)),
                )
        return self._store

    def encode_one(
        self, diff: dict[str, np.ndarray], device_id: str, version: int, selection: int | None
    ) -> tuple[dict, dict[str, np.ndarray]] | None:
        """A real device's upload (``processors.device_processor``): (its ``wire_update``, the diff as the server
        decodes it, equal to ``apply``'s), with error feedback's residual added before and kept after as ``apply``
        does; None without a compressor."""
        if self.compressor is None:
            return None
        names = [n for n in diff if not n.startswith(DEVICE_EXTRA_PREFIX)]
        shapes = [np.shape(diff[n]) for n in names]
        flat = torch.cat([torch.as_tensor(np.asarray(diff[n], dtype=np.float32)).reshape(-1) for n in names])
        store = self.store()
        if store is not None and (state := store.get(device_id, selection)) is not None:
            flat += torch.from_numpy(state[RESIDUAL])
        compressor = self.compressor.with_layout(names, shapes)
        payload = compressor.encode(flat, device_seed(self.seed, device_id, version))
        decoded = compressor.decode(payload, flat.shape[0])
        if store is not None:
            state = {RESIDUAL: (flat - decoded).numpy().copy()}
            if not nonfinite_entry(state):
                store.put(device_id, selection, state)
        wire = {
            "compress": str(self.compressor.spec),
            "names": names,
            "shapes": [list(s) for s in shapes],
            "payload": {k: {"dtype": str(v.dtype), "values": v.tolist()} for k, v in payload.items()},
        }
        return wire, dict(diff) | split_flat(decoded.numpy(), names, shapes)

    def apply(
        self,
        diffs: list[dict[str, np.ndarray]],
        device_ids: list[str],
        versions: list[int],
        selections: list[int | None],
    ) -> list[dict[str, np.ndarray]]:
        """Each device's diff as the server decodes it from what the device sends (its model entries; its reports
        as they are), with error feedback's residual added before and kept after."""
        if self.compressor is None or not diffs:
            return diffs
        names = [n for n in diffs[0] if not n.startswith(DEVICE_EXTRA_PREFIX)]
        shapes = [np.shape(diffs[0][n]) for n in names]
        flat = torch.stack(
            [torch.cat([torch.as_tensor(np.asarray(d[n], dtype=np.float32)).reshape(-1) for n in names]) for d in diffs]
        )
        store = self.store()
        if store is not None:
            kept = [store.get(d, s) for d, s in zip(device_ids, selections, strict=True)]
            for i, state in enumerate(kept):
                if state is not None:
                    flat[i] += torch.from_numpy(state[RESIDUAL])
        seeds = [device_seed(self.seed, d, v) for d, v in zip(device_ids, versions, strict=True)]
        decoded = self.compressor.with_layout(names, shapes).decode_group(flat, seeds)
        if store is not None:
            residual = (flat - decoded).numpy()
            for i, (d, s) in enumerate(zip(device_ids, selections, strict=True)):
                state = {RESIDUAL: residual[i].copy()}
                if not nonfinite_entry(state):  # a poisoned update fails at its leaf; its residual is not kept
                    store.put(d, s, state)
        values = decoded.numpy()
        return [dict(diff) | split_flat(values[i], names, shapes) for i, diff in enumerate(diffs)]


def wire_bytes(wire: dict) -> int:
    """Bytes of a real device's encoded update (``CompressionHost.encode_one``'s wire form): its payload's arrays, as
    ``CompressorSpec.encoded_bytes`` counts them (call after ``decode_wire`` accepted it)."""
    return int(sum(np.asarray(part["values"], dtype=part["dtype"]).nbytes for part in wire["payload"].values()))


def decode_wire(wire: dict, expected: str) -> dict[str, np.ndarray]:
    """A real device's compressed update (``CompressionHost.encode_one``'s wire form) as the float32 entries the
    server reads: exactly what ``decode_group`` gives for the same update and seed. ``expected``: the job's
    ``--compress``; ValueError, naming the problem, for anything else or for a payload that does not decode
    (a device the leaf does not control sent it)."""
    if not isinstance(wire, dict) or wire.get("compress") != expected:
        got = wire.get("compress") if isinstance(wire, dict) else type(wire).__name__
        raise ValueError(f"its update is compressed with {got!r}, the job's compressor is {expected!r}")
    try:
        names = [str(n) for n in wire["names"]]
        shapes = [tuple(int(d) for d in s) for s in wire["shapes"]]
        payload = {}
        for key, part in wire["payload"].items():
            if part["dtype"] not in WIRE_DTYPES:
                raise ValueError(f"payload entry {key!r} has dtype {part['dtype']!r}")
            payload[str(key)] = np.asarray(part["values"], dtype=part["dtype"]).reshape(-1)
        n = sum(int(np.prod(s)) for s in shapes)
        flat = make_compressor(expected).decode(payload, n).numpy()
        if flat.shape != (n,):
            raise ValueError(f"it decodes to {flat.shape[0]} values, its shapes hold {n}")
        return split_flat(flat, names, list(shapes))
    except (KeyError, TypeError, ValueError, IndexError, RuntimeError, OverflowError) as ex:
        raise ValueError(f"its compressed update does not decode ({type(ex).__name__}: {ex})") from ex
