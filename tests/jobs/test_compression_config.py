"""Compression's flags: bad input is one line and exit 2 before NVFlare starts; a good one reaches the schedule as
the bytes each transfer carries."""

from __future__ import annotations

import math

import pytest

from common.compression import CompressionConfig
from jobs.api import make_config
from jobs.config import JobConfig
from jobs.pt_job_fedavg import main
from jobs.run import driver


@pytest.fixture(autouse=True)
def no_nvflare(monkeypatch):
    def boom(*_a, **_k):
        raise AssertionError("NVFlare environment was created for an invalid config")

    monkeypatch.setattr(driver, "make_env", boom)


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--compress", "zip"], "unknown compressor"),
        (["--compress", "topk:0"], "must be in (0, 1]"),
        (["--compress", "randk:1.5"], "must be in (0, 1]"),
        (["--compress", "topk"], "needs its setting, e.g. --compress topk:0.01"),
        (["--compress", "qsgd:0"], "an integer in 1-16"),
        (["--compress", "qsgd:17"], "an integer in 1-16"),
        (["--compress", "qsgd:2.5"], "an integer in 1-16"),
        (["--compress", "fp16:3"], "fp16 takes no setting"),
        (["--error-feedback", "on"], "--error-feedback on needs a compressor"),
        (["--error-feedback", "maybe"], "invalid choice: 'maybe'"),
        (["--compress", "nvflare:int8"], "NVFlare's ModelQuantizer has the modes float16, blockwise8"),
        (["--compress", "nvflare:adaquant"], "ADAQUANT's size depends on each update's values"),
        (["--compress", "nvflare:float16", "--devices", "real", "--env", "poc"], "use fp16 (NVFlare's float16"),
        (["--uplink-kbps", "0"], "--uplink-kbps 0: a bandwidth in kbit/s must be > 0"),
        (["--downlink-kbps", "-5"], "--downlink-kbps -5: a bandwidth in kbit/s must be > 0"),
        (["--uplink-kbps", "lognormal:500"], "lognormal takes two numbers, lognormal:MEDIAN:SIGMA"),
        (["--uplink-kbps", "lognormal:-1:1"], "lognormal's median must be > 0"),
        (["--downlink-kbps", "uniform:900:100"], "uniform:LOW:HIGH needs 0 < LOW <= HIGH"),
        (["--uplink-kbps", "pareto:1:2"], "unknown distribution 'pareto'"),
        (["--uplink-kbps", "fast"], "'fast' is not a number"),
        (["--uplink-kbps", "100,-1"], "every bandwidth in kbit/s must be > 0"),
        (["--uplink-kbps", "lognormal:500:1", "--capacity-file", "x.json"], "leave out --uplink-kbps"),
        (["--compress", "qsgd:4", "--dp", "central", "--dp-noise-multiplier", "1"], "use topk or randk"),
        (["--compress", "topk:0.1", "--dp", "central", "--dp-noise-multiplier", "1"], "--error-feedback off"),
        (["--uplink-kbps", "500", "--devices", "real", "--env", "poc"], "leave them out with --devices real"),
        (["--compress", "fp16", "--downlink-kbps", "500", "--devices", "real", "--env", "poc"], "bring their own"),
    ],
)
def test_bad_compression_is_refused_in_one_line(flags, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        raise SystemExit(main(flags))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_central_dp_takes_a_sparsifier_without_error_feedback():
    cfg = make_config("fedavg", compress="topk:0.1", error_feedback="off", dp="central", dp_noise_multiplier=1.0)
    assert cfg.compression.device_settings() == {"compress": "topk:0.1", "error_feedback": False}


def test_error_feedback_is_on_for_biased_compressors_only():
    assert CompressionConfig(compress="topk:0.01").feedback and CompressionConfig(compress="randk:0.5").feedback
    assert not CompressionConfig(compress="qsgd:4").feedback and not CompressionConfig(compress="fp16").feedback
    assert not CompressionConfig(compress="topk:0.01", error_feedback="off").feedback
    assert CompressionConfig(compress="bf16", error_feedback="on").feedback


def test_the_schedule_gets_the_bytes_of_the_model_under_its_compressor():
    cfg = make_config("fedbuff", compress="TopK:0.010", uplink_kbps=500.0)
    values = 62050  # cifar10_convnet, the synthetic task's model
    assert cfg.compression.compress == "topk:0.01"
    assert (cfg.delays.upload_bytes, cfg.delays.download_bytes) == (8 * math.ceil(0.01 * values), 4 * values)
    assert (cfg.delays.uplink_bandwidth, cfg.delays.downlink_bandwidth) == (500.0, 0.0)
    assert JobConfig.from_dict(cfg.to_dict()).validate() == cfg  # metrics.json's config, read back by --resume


def test_a_distribution_of_bandwidths_reaches_the_schedule_in_one_spelling():
    cfg = make_config("fedbuff", compress="topk:0.01", uplink_kbps="LogNormal:500:1", downlink_kbps="2000")
    assert (cfg.compression.uplink_kbps, cfg.compression.downlink_kbps) == ("lognormal:500.0:1.0", 2000.0)
    assert (cfg.delays.uplink_bandwidth, cfg.delays.downlink_bandwidth) == ("lognormal:500.0:1.0", 2000.0)
    assert JobConfig.from_dict(cfg.to_dict()).validate() == cfg  # metrics.json's config, read back by --resume


def test_without_compression_the_config_records_what_it_did():
    cfg = make_config("fedavg")
    assert not {"upload_bytes", "uplink_bandwidth"} & set(cfg.to_dict()["delays"])
    old = cfg.to_dict()
    del old["compression"]  # a metrics.json from before the part existed
    assert JobConfig.from_dict(old).compression == CompressionConfig()


def test_real_devices_take_a_compressor():
    """A real device sends its encoded update (``processors.device_processor``): ``--compress`` is no longer
    refused with ``--devices real``, and its task processor carries the compressor the leaf tells the device."""
    from jobs.run.components import compression_settings

    cfg = make_config("fedavg", compress="topk:0.01", devices="real", env="poc")
    assert cfg.engine.devices == "real"
    assert compression_settings(cfg)["compression"]["compress"] == "topk:0.01"
    # their uploads' bytes are measured as they arrive; each task's download is the version's float32 bytes
    assert (cfg.delays.upload_bytes, cfg.delays.download_bytes) == (0, 4 * 62050)


@pytest.mark.parametrize(
    "compress, lacking, message",
    [
        ("nvflare:float16", "bitsandbytes", "which is not installed: pip install bitsandbytes"),
        ("nvflare:blockwise8", "bitsandbytes", "which is not installed: pip install bitsandbytes"),
        ("nvflare:normfloat4", "cuda", "on a CUDA GPU, and this machine has none"),
    ],
)
def test_an_nvflare_mode_this_machine_cannot_run_is_refused_naming_the_fix(
    compress, lacking, message, monkeypatch, capsys
):
    import importlib.util

    import torch

    find_spec = importlib.util.find_spec
    if lacking == "bitsandbytes":
        monkeypatch.setattr(
            importlib.util, "find_spec", lambda name, *a: None if name == "bitsandbytes" else find_spec(name, *a)
        )
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    if lacking == "cuda" and find_spec("bitsandbytes") is None:
        pytest.skip("bitsandbytes is refused first")
    with pytest.raises(SystemExit) as exit_info:
        raise SystemExit(main(["--compress", compress]))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
