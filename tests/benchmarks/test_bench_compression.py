"""The compression benchmarks without their long runs: ``bench_compression.py`` gives each side the cpu scale's
FedBuff, the links, the budget and its compressor (error feedback off for ``/off``), and its table row reads the
run's ``metrics.json``; ``bench_engine.py``'s ``compress:`` side runs the engine's step through
``CompressionHost.apply`` with error feedback, the residual carried from one round to the next."""

from __future__ import annotations

import argparse

import numpy as np
import pytest
import torch

from benchmarks.perf import bench_compression as bc
from common.choices import ConfigError


def flags_of(side: str, cpu_scale: bool = False, extra: tuple[str, ...] = ()) -> dict[str, str]:
    args = argparse.Namespace(uplink_kbps=500.0, downlink_kbps=10000.0, budget=40.0, seed=3, cpu_scale=cpu_scale)
    words = bc.applied(bc.side_flags(side, args, list(extra)))
    flags = [w for w in words if w.startswith("--")]
    assert len(flags) == len(set(flags))  # each flag once, with the value argparse would keep
    return {w: words[i + 1] for i, w in enumerate(words) if w.startswith("--")}


def test_each_side_is_the_cpu_scales_fedbuff_on_slow_links_with_its_compressor():
    plain, ef, no_ef = flags_of("none"), flags_of("topk:0.01"), flags_of("topk:0.01/off")
    for f in (plain, ef, no_ef):
        assert f["--method"] == "fedbuff" and f["--uplink-kbps"] == "500" and f["--downlink-kbps"] == "10000"
        assert f["--max-sim-time"] == "40" and f["--seed"] == "3" and f["--delays"] == "paper"
        assert (f["--devices-per-leaf"], f["--synthetic-difficulty"]) == ("25", "0")  # the default fleet and data
    scale = flags_of("none", cpu_scale=True)
    assert (scale["--devices-per-leaf"], scale["--synthetic-difficulty"]) == ("100", "1")  # the cpu scale's own
    assert flags_of("none", extra=("--devices-per-leaf", "40"))["--devices-per-leaf"] == "40"  # extra flags win
    assert "--compress" not in plain
    assert (ef["--compress"], ef["--error-feedback"]) == ("topk:0.01", "auto")
    assert (no_ef["--compress"], no_ef["--error-feedback"]) == ("topk:0.01", "off")
    assert [bc.label(s) for s in ("none", "topk:0.01", "topk:0.01/on", "topk:0.01/off", "qsgd:4")] == [
        "none",
        "topk:0.01 + EF",
        "topk:0.01 + EF",
        "topk:0.01 no EF",
        "qsgd:4",
    ]


def test_a_row_reads_versions_accuracy_and_bytes_from_the_run():
    records = [
        {"version": 1, "accuracy": 0.1, "fleet": {"updates": 0, "bytes_up": 0, "bytes_down": 4964000}},
        {"version": 11, "accuracy": 0.5, "fleet": {"updates": 20, "bytes_up": 99360, "bytes_down": 9928000}},
        {"version": 21, "accuracy": 0.45, "fleet": {"updates": 40, "bytes_up": 198720, "bytes_down": 14892000}},
    ]
    row = bc.row_of("topk:0.01/off", records, 4968, 12.34)
    assert row == {
        "compressor": "topk:0.01 no EF",
        "bytes per update": 4968,
        "versions": 21,
        "accuracy at budget": 0.45,
        "best accuracy": 0.5,
        "MB up": 0.2,
        "MB down": 14.89,
        "wall s": 12.3,
    }
    assert bc.table([row]).splitlines()[2] == "| topk:0.01 no EF | 4968 | 21 | 0.45 | 0.5 | 0.2 | 14.89 | 12.3 |"


def test_the_engines_compress_side_keeps_and_adds_back_the_residual(monkeypatch):
    from benchmarks.perf import bench_engine as be
    from processors.compress import CompressionHost
    from processors.data.sources import make_synthetic
    from processors.training import TrainingConfig

    seen = []
    real = CompressionHost.apply

    def apply(self, diffs, ids, versions, selections):
        before = None if self.store() is None else self.store().get(ids[0], None)
        seen.append((self.feedback, str(self.compressor.spec), before is not None, versions[0]))
        out = real(self, diffs, ids, versions, selections)
        n = sum(np.size(v) for k, v in diffs[0].items() if not k.startswith("__"))
        kept = sum(int(np.count_nonzero(v)) for k, v in out[0].items() if not k.startswith("__"))
        assert kept <= int(np.ceil(0.01 * n))  # top-1%: the rest stays behind in the residual
        return out

    monkeypatch.setattr(CompressionHost, "apply", apply)
    cpu = torch.device("cpu")
    data = be.device_data(make_synthetic(100, 10, seed=0), 2, 8, seed=1, device=cpu)
    params = {n: p.detach() for n, p in be.build_model(be.MODEL).state_dict().items()}
    cfg = TrainingConfig(model=be.MODEL, local_iters=1, local_batch_size=4)
    cost = be.compress_cost(params, data, cfg, cpu, repeats=1, compress="topk:0.01")
    assert cost["ratio"] > 0 and cost["ops"] > 0 and set(cost) == {"plain", "compressed", "ratio", "ops"}
    assert len(seen) == 3 + 5  # a compressed step per round, then the compressor alone five times
    assert all(feedback and spec == "topk:0.01" for feedback, spec, _, _ in seen)
    assert [had for _, _, had, _ in seen] == [False] + [True] * 7  # the residual came back after the first round
    assert [v for *_, v in seen] == list(range(8))
    with pytest.raises(ConfigError, match="unknown compressor"):
        be.compress_cost(params, data, cfg, cpu, repeats=1, compress="nope")
