"""Compressed updates on the device: each compressor's decode against a plain-PyTorch reference, the counted bytes
against a payload that holds them, and error feedback's residual carried across tasks and a resume."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from common.compression import QSGD_BUCKET, CompressionConfig, parse_compress
from common.protocol import DEVICE_EXTRA_PREFIX
from processors.compress import (
    RESIDUAL,
    CompressionHost,
    device_seed,
    generator_for,
    make_compressor,
    transfer_bytes,
    update_values,
)

N = 1300  # three qsgd buckets, the last one partial


def vectors(k: int = 3, n: int = N, seed: int = 0) -> torch.Tensor:
    return torch.randn(k, n, generator=torch.Generator().manual_seed(seed)) * torch.linspace(0.01, 3, n)


def reference_topk(row: torch.Tensor, k: int) -> torch.Tensor:
    order = sorted(range(len(row)), key=lambda i: -abs(float(row[i])))[:k]
    out = torch.zeros_like(row)
    for i in order:
        out[i] = row[i]
    return out


def reference_qsgd(row: torch.Tensor, bits: int, uniforms: torch.Tensor) -> torch.Tensor:
    """QSGD's rounding written value by value: each bucket scaled by its largest magnitude s, a value rounded up
    to the next of the 2^bits levels of [-s, s] with probability its distance above the lower one."""
    top = 2**bits - 1
    out = torch.zeros_like(row)
    for start in range(0, len(row), QSGD_BUCKET):
        bucket = row[start : start + QSGD_BUCKET]
        s = float(bucket.abs().max())
        for j, x in enumerate(bucket.tolist()):
            if s == 0:
                continue
            t = min(max((x / s + 1) * top / 2, 0.0), top)
            low = math.floor(t)
            level = min(low + (float(uniforms[start + j]) < t - low), top)
            out[start + j] = (level * 2 / top - 1) * s
    return out


@pytest.mark.parametrize("name, cast", [("fp16", torch.float16), ("bf16", torch.bfloat16)])
def test_half_precision_decodes_as_a_cast(name, cast):
    flat = vectors()
    decoded = make_compressor(name).decode_group(flat, [1, 2, 3])
    assert torch.equal(decoded, flat.to(cast).to(torch.float32))


def test_fp16_clamps_to_its_range_instead_of_sending_infinity():
    decoded = make_compressor("fp16").decode_group(torch.tensor([[1e6, -1e6, 1.0]]), [0])
    assert torch.isfinite(decoded).all() and float(decoded[0, 0]) == 65504.0


def test_topk_keeps_the_largest_values_of_each_device():
    flat = vectors()
    compressor = make_compressor("topk:0.05")
    k = math.ceil(0.05 * N)
    decoded = compressor.decode_group(flat, [0, 0, 0])
    for i in range(len(flat)):
        assert torch.equal(decoded[i], reference_topk(flat[i], k))


def test_randk_keeps_the_values_at_positions_drawn_from_the_device_seed():
    flat = vectors()
    seeds = [device_seed(7, f"site-1#{i}", 3) for i in range(len(flat))]
    decoded = make_compressor("randk:0.1").decode_group(flat, seeds)
    k = math.ceil(0.1 * N)
    for i, seed in enumerate(seeds):
        index = torch.randperm(N, generator=generator_for(seed))[:k]
        expected = torch.zeros(N)
        expected[index] = flat[i, index]
        assert torch.equal(decoded[i], expected)
    assert not torch.equal(decoded[0] != 0, decoded[1] != 0)  # each device its own positions


@pytest.mark.parametrize("bits", [1, 2, 4, 8])
def test_qsgd_matches_the_reference_rounding(bits):
    flat = vectors(k=2)
    flat[1, :QSGD_BUCKET] = 0  # an all-zero bucket decodes to zeros
    seeds = [11, 12]
    decoded = make_compressor(f"qsgd:{bits}").decode_group(flat, seeds)
    padded = math.ceil(N / QSGD_BUCKET) * QSGD_BUCKET
    for i, seed in enumerate(seeds):
        uniforms = torch.rand(padded, generator=generator_for(seed))
        assert torch.allclose(decoded[i], reference_qsgd(flat[i], bits, uniforms), atol=1e-6, rtol=1e-6)


def test_qsgd_is_unbiased():
    row = vectors(k=1, n=64)[0]
    copies = row.expand(4000, -1).clone()
    mean = make_compressor("qsgd:2").decode_group(copies, list(range(4000))).mean(0)
    scale = float(row.abs().max())
    assert float((mean - row).abs().max()) < 0.05 * scale


@pytest.mark.parametrize("text", ["fp16", "bf16", "qsgd:1", "qsgd:3", "qsgd:16", "topk:0.01", "randk:0.02"])
def test_the_counted_bytes_hold_the_update_the_server_decodes(text):
    """A payload of exactly the counted bytes decodes to what the simulator hands the server."""
    compressor = make_compressor(text)
    flat = vectors(k=1)
    seed = device_seed(3, "site-2#5", 4)
    payload = compressor.encode(flat[0], seed)
    assert sum(a.nbytes for a in payload.values()) == parse_compress(text).encoded_bytes(N)
    assert torch.equal(compressor.decode(payload, N), compressor.decode_group(flat, [seed])[0])


def test_an_update_is_sized_from_the_model_shapes():
    values, version = update_values("cifar10_convnet")
    assert values == version == 62050
    up, down = transfer_bytes("cifar10_convnet", "topk:0.01")
    assert (up, down) == (8 * math.ceil(0.01 * values), 4 * version)
    assert transfer_bytes("cifar10_convnet", "none")[0] == 4 * values


def diffs(step: int, devices: int = 2) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(step)
    return [
        {
            "w": rng.normal(size=(20, 10)).astype(np.float32),
            "b": rng.normal(size=(10,)).astype(np.float32),
            DEVICE_EXTRA_PREFIX + "loss": np.asarray(1.5, dtype=np.float32),
        }
        for _ in range(devices)
    ]


def host(tmp_path, fresh: bool = True, feedback: bool = True) -> CompressionHost:
    settings = CompressionConfig(compress="topk:0.1", error_feedback="on" if feedback else "off").device_settings()
    state = {"dir": str(tmp_path / "error_feedback"), "memory_mb": 1, "durable": True, "fresh": fresh}
    return CompressionHost(settings | {"state": state}, seed=5)


def flat(diff: dict) -> np.ndarray:
    return np.concatenate([diff["w"].reshape(-1), diff["b"].reshape(-1)])


def test_error_feedback_adds_what_was_dropped_to_the_next_update(tmp_path):
    ids = ["site-1#0", "site-1#1"]
    h = host(tmp_path)
    first = h.apply(diffs(1), ids, [2, 2], [1, 1])
    second = h.apply(diffs(2), ids, [3, 3], [2, 2])
    plain = host(tmp_path / "plain", feedback=False).apply(diffs(2), ids, [3, 3], [2, 2])
    for i in range(2):
        assert first[i][DEVICE_EXTRA_PREFIX + "loss"] == 1.5  # reports travel as they are
        assert np.count_nonzero(flat(first[i])) == 21  # ceil(0.1 x 210)
        residual = flat(diffs(1)[i]) - flat(first[i])
        carried = torch.from_numpy(flat(diffs(2)[i]) + residual).unsqueeze(0)
        expected = make_compressor("topk:0.1").decode_group(carried, [0])[0].numpy()
        assert np.array_equal(flat(second[i]), expected)
        assert not np.array_equal(flat(second[i]), flat(plain[i]))
        kept = h.store().get(ids[i])
        assert np.array_equal(kept[RESIDUAL], carried[0].numpy() - expected)


def test_a_resumed_run_continues_error_feedback_bit_for_bit(tmp_path):
    """A run killed after its second task and resumed (the store read back from disk, the third task's selection
    trained again) gives the third update the uninterrupted run gave."""
    ids = ["site-1#0", "site-1#1"]
    whole = host(tmp_path / "whole")
    for step in (1, 2):
        whole.apply(diffs(step), ids, [step + 1] * 2, [step] * 2)
    third = whole.apply(diffs(3), ids, [4, 4], [3, 3])

    killed = host(tmp_path / "killed")
    for step in (1, 2, 3):  # it trained selection 3 too before dying; the resume trains it again
        killed.apply(diffs(step), ids, [step + 1] * 2, [step] * 2)
    resumed = host(tmp_path / "killed", fresh=False).apply(diffs(3), ids, [4, 4], [3, 3])
    for a, b in zip(third, resumed, strict=True):
        assert np.array_equal(flat(a), flat(b))


def test_no_compression_leaves_the_diffs_as_they_are():
    d = diffs(1)
    assert CompressionHost(None, seed=0).apply(d, ["a", "b"], [1, 1], [1, 1]) is d


def test_both_engines_send_what_the_compressor_decodes(tmp_path):
    """The task processor compresses after either engine: each device's model entries keep ceil(F x n) values,
    and the per-device engine's update equals the group's up to the engines' float order."""
    from processors.data.config import DataConfig
    from processors.models import initial_model
    from processors.task_processor import TrainingTaskProcessor
    from processors.training_config import TrainingConfig

    settings = CompressionConfig(compress="topk:0.02").device_settings()
    proc = TrainingTaskProcessor(
        data=DataConfig(synthetic_size=500, subset_size=16).to_dict(),
        training=TrainingConfig(compute_device="cpu", local_iters=2, local_batch_size=8, optimizer="sgd").to_dict(),
        seed=5,
        compression=settings | {"state": {"dir": str(tmp_path / "ef"), "memory_mb": 1}},
    )
    weights = {k: v.numpy() for k, v in initial_model("cifar10_convnet", 0).state_dict().items()}
    values, _ = update_values("cifar10_convnet")
    devices = ["site-1#0", "site-1#1", "site-2#4"]
    grouped = proc.train_devices(devices, [weights] * 3, [1] * 3, [1] * 3)
    alone = proc.train_devices(devices[:1], [weights], [1], [1])[0]  # selection 1 again: the same residual in
    for diff in [*grouped, alone]:
        assert sum(np.count_nonzero(v) for v in diff.values()) == math.ceil(0.02 * values)
    for name in alone:
        np.testing.assert_allclose(alone[name], grouped[0][name], rtol=0, atol=1e-5, err_msg=name)
