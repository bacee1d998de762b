"""NVFlare's own quantiser as a compressor (``--compress nvflare:MODE``): what the server decodes is exactly what
NVFlare's ``ModelQuantizer`` and ``ModelDequantizer`` give when called directly, the bytes counted are those of
NVFlare's quantized payload, and a mode this machine cannot run is refused in one line before NVFlare starts."""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

import numpy as np
import pytest
import torch

from common.compression import parse_compress
from processors.compress import CompressionHost, make_compressor, split_flat, transfer_bytes

if TYPE_CHECKING:
    from nvflare.apis.dxo import DXO

# NVFlare's quantization filters import bitsandbytes (pip install bitsandbytes), which takes seconds to import:
# looked for here, imported by the first test that calls the filters
pytestmark = pytest.mark.skipif(importlib.util.find_spec("bitsandbytes") is None, reason="needs bitsandbytes")

NAMES = ["conv.weight", "conv.bias", "fc.weight", "bn.running_mean"]
SHAPES = [(4, 3, 3, 3), (4,), (10, 36), (4,)]


def update(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {
        n: (rng.standard_normal(s) * 10.0 ** rng.integers(-6, 3, size=s)).astype(np.float32)
        for n, s in zip(NAMES, SHAPES, strict=True)
    }
    out["fc.weight"][0, :3] = [1e6, -7e4, 65519.0]  # beyond float16's range: NVFlare clamps
    return out


def nvflare_roundtrip(entries: dict[str, np.ndarray], mode: str) -> tuple[dict[str, np.ndarray], DXO]:
    """NVFlare's filters called directly, as a job's filter chain calls them."""
    from nvflare.apis.dxo import DXO, DataKind, from_shareable
    from nvflare.apis.fl_context import FLContext
    from nvflare.app_opt.pt.quantization.dequantizer import ModelDequantizer
    from nvflare.app_opt.pt.quantization.quantizer import ModelQuantizer

    shareable = DXO(DataKind.WEIGHT_DIFF, data={k: v.copy() for k, v in entries.items()}).to_shareable()
    shareable = ModelQuantizer(quantization_type=mode).process(shareable, FLContext())
    sent = from_shareable(shareable)
    sent = DXO(sent.data_kind, data=dict(sent.data), meta=dict(sent.meta))
    back = from_shareable(ModelDequantizer().process(shareable, FLContext()))
    return {k: np.asarray(v) for k, v in back.data.items()}, sent


def flat(entries: dict[str, np.ndarray]) -> torch.Tensor:
    return torch.from_numpy(np.concatenate([entries[n].reshape(-1) for n in NAMES]))


def test_the_server_decodes_exactly_nvflares_dequantized_update():
    compressor = make_compressor("nvflare:float16").with_layout(NAMES, SHAPES)
    updates = [update(s) for s in range(3)]
    decoded = compressor.decode_group(torch.stack([flat(u) for u in updates]), [1, 2, 3])
    for row, entries in zip(decoded, updates, strict=True):
        expected, _ = nvflare_roundtrip(entries, "float16")
        got = split_flat(row.numpy(), NAMES, SHAPES)
        for name in NAMES:
            assert got[name].dtype == np.float32 and np.array_equal(got[name], expected[name]), name
    assert decoded[0].abs().max() == 65504.0  # clamped to float16's largest, never inf
    assert not torch.equal(decoded[0], flat(updates[0]))  # it did quantise


def test_the_counted_bytes_are_nvflares_quantized_payload():
    n = sum(int(np.prod(s)) for s in SHAPES)
    _, sent = nvflare_roundtrip(update(0), "float16")
    payload = sum(v.nbytes for v in sent.data.values())
    states = sent.get_meta_prop("quant_state")
    payload += sum(v.nbytes for s in states.values() for v in s.values() if isinstance(v, np.ndarray))
    compressor = make_compressor("nvflare:float16").with_layout(NAMES, SHAPES)
    assert compressor.encoded_bytes(n) == payload == 2 * n == parse_compress("nvflare:float16").encoded_bytes(n)
    assert sum(a.nbytes for a in compressor.encode(flat(update(0)), 0).values()) == payload
    assert transfer_bytes("cifar10_convnet", "nvflare:float16") == (2 * 62050, 4 * 62050)


def test_nvflares_float16_is_this_projects_fp16():
    """The same values: a real device sends fp16's wire for them (nvflare:MODE is refused with --devices real)."""
    rows = torch.stack([flat(update(s)) for s in range(2)])
    nv = make_compressor("nvflare:float16").with_layout(NAMES, SHAPES).decode_group(rows, [0, 0])
    assert torch.equal(nv, make_compressor("fp16").decode_group(rows, [0, 0]))


def test_the_host_sends_nvflares_values_and_keeps_error_feedbacks_residual(tmp_path):
    settings = {"compress": "nvflare:float16", "error_feedback": True, "state": {"dir": str(tmp_path)}}
    host = CompressionHost(settings, seed=1)
    first, second = update(4), update(5)
    out = host.apply([first], ["site-1#0"], [1], [7])[0]
    expected, _ = nvflare_roundtrip(first, "float16")
    assert all(np.array_equal(out[n], expected[n]) for n in NAMES)
    residual = flat(first) - flat(expected)
    out = host.apply([second], ["site-1#0"], [2], [8])[0]  # its next selection: the residual of 7 added
    carried = split_flat((flat(second) + residual).numpy(), NAMES, SHAPES)
    expected, _ = nvflare_roundtrip(carried, "float16")
    assert all(np.array_equal(out[n], expected[n]) for n in NAMES)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="NVFlare's blockwise8 runs bitsandbytes on CUDA")
@pytest.mark.parametrize("mode", ["blockwise8", "float4", "normfloat4"])
def test_the_gpu_modes_decode_as_nvflare_does(mode):
    compressor = make_compressor(f"nvflare:{mode}").with_layout(NAMES, SHAPES)
    entries = update(2)
    expected, sent = nvflare_roundtrip(entries, mode)
    got = split_flat(compressor.decode_group(flat(entries).unsqueeze(0), [0])[0].numpy(), NAMES, SHAPES)
    assert all(np.array_equal(got[n], expected[n]) for n in NAMES)
    assert compressor.encoded_bytes(flat(entries).numel()) < 4 * flat(entries).numel()
