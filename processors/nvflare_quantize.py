"""NVFlare's own quantiser on a device's upload (``--compress nvflare:MODE``; ``docs/communication.md``).

Instead of writing NVFlare's modes again, the compressor runs NVFlare's public filters
(``nvflare.app_opt.pt.quantization``): ``ModelQuantizer(MODE)`` on the device's update, as a ``WEIGHT_DIFF`` DXO of
its model entries, and ``ModelDequantizer`` on the result, through ``DXOFilter.process`` as an NVFlare job's filter
chain calls them. So what the server decodes is exactly NVFlare's dequantized update, entry by entry, and the bytes
counted are those of NVFlare's quantized payload: every quantized entry's array plus the arrays of its
quantisation state (``payload_bytes``; as NVFlare's own log counts "after quantization" and "meta").

NVFlare's filters import bitsandbytes (every mode), and run blockwise8, float4 and normfloat4 on CUDA; the driver
refuses a mode this machine cannot run (``missing_for``). ADAQUANT is refused when parsed
(``common.compression``): its size depends on the update's values. With ``--devices real`` these modes are refused
(a device would need NVFlare's quantiser; ``fp16`` is NVFlare's float16 on the wire).
"""

from __future__ import annotations

import importlib.util
from copy import deepcopy

import numpy as np
import torch

from common.compression import NVFLARE_GPU_MODES, CompressorSpec
from processors.compressor import Compressor, Payload, split_flat

Layout = tuple[list[str], list[tuple[int, ...]]]  # a model's entry names and shapes, in the flattened order


def missing_for(mode: str) -> str:
    """What this machine lacks to run NVFlare's ``mode`` (one line naming the fix), or "" when it can."""
    if importlib.util.find_spec("bitsandbytes") is None:
        return (
            f"--compress nvflare:{mode}: NVFlare's quantization filters import bitsandbytes, which is not installed: "
            "pip install bitsandbytes (or use fp16, the same values as nvflare:float16)"
        )
    if mode in NVFLARE_GPU_MODES and not torch.cuda.is_available():
        return (
            f"--compress nvflare:{mode}: NVFlare's filter runs bitsandbytes' {mode} on a CUDA GPU, and this "
            "machine has none; use nvflare:float16 here, or qsgd:BITS"
        )
    return ""


def quantized(entries: dict[str, np.ndarray], mode: str):
    """NVFlare's quantized DXO of ``entries`` (float32 arrays, copied first: the filter works in place)."""
    from nvflare.apis.dxo import DXO, DataKind, from_shareable
    from nvflare.apis.fl_context import FLContext
    from nvflare.app_opt.pt.quantization.quantizer import ModelQuantizer

    dxo = DXO(DataKind.WEIGHT_DIFF, data={k: np.array(v, dtype=np.float32) for k, v in entries.items()})
    return from_shareable(ModelQuantizer(mode).process(dxo.to_shareable(), FLContext()))


def dequantized(quantized_dxo) -> dict[str, np.ndarray]:
    """``ModelDequantizer``'s float32 entries from NVFlare's quantized DXO."""
    from nvflare.apis.dxo import DXO, from_shareable
    from nvflare.apis.fl_context import FLContext
    from nvflare.app_opt.pt.quantization.dequantizer import ModelDequantizer

    copy = DXO(quantized_dxo.data_kind, data=dict(quantized_dxo.data), meta=deepcopy(quantized_dxo.meta))  # in place
    out = from_shareable(ModelDequantizer().process(copy.to_shareable(), FLContext()))
    return {k: np.asarray(v, dtype=np.float32) for k, v in out.data.items()}


def state_arrays(quantized_dxo) -> dict[str, np.ndarray]:
    """The arrays of each entry's quantisation state (``entry.state`` -> array), as NVFlare's DXO carries them."""
    states = quantized_dxo.get_meta_prop("quant_state") or {}
    return {
        f"{name}.{key}": np.asarray(value.cpu() if isinstance(value, torch.Tensor) else value)
        for name, state in states.items()
        for key, value in state.items()
        if isinstance(value, np.ndarray | torch.Tensor)
    }


def payload_bytes(quantized_dxo) -> int:
    """Bytes of NVFlare's quantized payload: each entry's quantized array and its state's arrays."""
    values = sum(np.asarray(v).nbytes for v in quantized_dxo.data.values())
    return int(values + sum(a.nbytes for a in state_arrays(quantized_dxo).values()))


def layout_bytes(layout: Layout, mode: str) -> int:
    """Bytes NVFlare's ``mode`` sends for an update of this layout (measured on a zero update: every mode run
    here sizes its payload by the entries' shapes alone)."""
    names, shapes = layout
    return payload_bytes(
        quantized({n: np.zeros(s, dtype=np.float32) for n, s in zip(names, shapes, strict=True)}, mode)
    )


class NVFlareQuantizer(Compressor):
    """``nvflare:MODE``: each device's update through NVFlare's ``ModelQuantizer`` and ``ModelDequantizer``, entry
    by entry (``with_layout`` names the model's entries; the host binds them)."""

    def __init__(self, spec: CompressorSpec, layout: Layout | None = None):
        super().__init__(spec)
        self.layout = layout

    @property
    def mode(self) -> str:
        return str(self.spec.setting)

    def with_layout(self, names: list[str], shapes: list) -> NVFlareQuantizer:
        return NVFlareQuantizer(self.spec, (list(names), [tuple(s) for s in shapes]))

    def _layout(self, n: int) -> Layout:
        if self.layout is None:
            return ["update"], [(n,)]  # one entry: the flattened update
        return self.layout

    def encoded_bytes(self, n: int) -> int:
        return layout_bytes(self._layout(n), self.mode)

    def _roundtrip(self, flat: torch.Tensor) -> tuple[torch.Tensor, object]:
        names, shapes = self._layout(flat.shape[0])
        q = quantized(split_flat(flat.numpy(), names, shapes), self.mode)
        entries = dequantized(q)
        return torch.from_numpy(np.concatenate([entries[n].reshape(-1) for n in names])), q

    def decode_group(self, flat: torch.Tensor, seeds: list[int]) -> torch.Tensor:
        return torch.stack([self._roundtrip(row)[0] for row in flat])

    def encode(self, flat: torch.Tensor, seed: int) -> Payload:
        """NVFlare's quantized arrays (each entry's, then its state's), for the tests' byte count."""
        q = self._roundtrip(flat)[1]
        return {name: np.asarray(v) for name, v in q.data.items()} | state_arrays(q)

    def decode(self, payload: Payload, n: int) -> torch.Tensor:
        raise NotImplementedError("nvflare:MODE has no device wire of its own: --devices real refuses it")
