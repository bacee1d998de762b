"""A real device's compressed upload, in-process: the project's device processor answers a task built as the leaf
builds it, and the leaf's reading of that result (``simulation.leaf_executor.device_diff``, what
``accept_device_result`` runs before its checks) gives exactly what the server decodes from a simulated device,
while the serialized result shrinks by the compressor's ratio."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from nvflare.apis.dxo import DXO, DataKind
from nvflare.edge.constants import EdgeApiStatus, MsgKey

from common.compression import CompressionConfig, parse_compress
from common.device_wire import DEVICE_SETTINGS_META, diff_problem, to_wire
from common.protocol import DEVICE_EXTRA_PREFIX
from processors.compress import COMPRESSED, device_seed, make_compressor, update_values
from processors.data.config import DataConfig
from processors.device_processor import RealDeviceProcessor
from processors.models import initial_model
from processors.task_processor import TrainingTaskProcessor
from processors.training_config import TrainingConfig
from simulation.leaf_executor import device_diff, device_settings, upload_bytes

DEVICE, VERSION, SEED = "site-1#3", 2, 7


def job_processor(compress: str, state_dir: str, weighting: str = "devices") -> TrainingTaskProcessor:
    """The job's task processor, as ``jobs.run.components`` makes it (its residuals under ``state_dir``)."""
    settings = CompressionConfig(compress=compress).device_settings()
    if settings and settings["error_feedback"]:
        settings["state"] = {"dir": state_dir, "memory_mb": 1}
    return TrainingTaskProcessor(
        data=DataConfig(synthetic_size=500, subset_size=16).to_dict(),
        training=TrainingConfig(compute_device="cpu", local_iters=2, local_batch_size=8, optimizer="sgd").to_dict(),
        seed=SEED,
        reports=["data_size"] if weighting == "samples" else (),
        weighting=weighting,
        compression=settings,
    )


def weights() -> dict[str, np.ndarray]:
    return {k: v.numpy() for k, v in initial_model("cifar10_convnet", 0).state_dict().items()}


def device_result(settings: dict, state_dir: str) -> dict:
    """What the project's real device sends for one task, as the leaf receives it (through JSON)."""
    task = DXO(DataKind.WEIGHTS, data=to_wire(weights()))
    task.set_meta_prop(MsgKey.MODEL_VERSION, VERSION)
    task.set_meta_prop(DEVICE_SETTINGS_META, settings)
    response = SimpleNamespace(status=EdgeApiStatus.OK, task_data=json.loads(json.dumps(task.to_dict())))
    device = RealDeviceProcessor(compute_device="cpu", state_dir=state_dir)
    device.device = SimpleNamespace(device_id=DEVICE)
    return json.loads(json.dumps(device.process_task(response)))


def model_entries(diff: dict) -> dict:
    return {k: v for k, v in diff.items() if not k.startswith(DEVICE_EXTRA_PREFIX)}


def test_a_topk_device_sends_one_percent_and_the_leaf_decodes_what_the_server_would(tmp_path):
    job = job_processor("topk:0.01", str(tmp_path / "ef"))
    settings = device_settings(job)
    assert settings["compression"] == {"compress": "topk:0.01", "error_feedback": True}
    result = device_result(settings, str(tmp_path / "device"))
    dense = device_result(device_settings(job_processor("none", "")), str(tmp_path / "device"))
    assert COMPRESSED in result["data"] and COMPRESSED not in dense["data"]

    # the bytes NVFlare carries: the serialized DXO shrinks about as the counted bytes do (8 bytes of 4n kept)
    n = update_values("cifar10_convnet")[0]
    expected = parse_compress("topk:0.01").encoded_bytes(n) / (4 * n)
    measured = len(json.dumps(result)) / len(json.dumps(dense))
    assert 0.6 * expected < measured < 1.25 * expected, (measured, expected)
    payload = result["data"][COMPRESSED]["payload"]
    assert len(payload["values"]["values"]) == len(payload["indices"]["values"]) == parse_compress("topk:0.01").kept(n)
    assert all(isinstance(i, int) for i in payload["indices"]["values"])

    # the leaf's decode equals the simulator's decode_group for the same diff and seed, exactly
    plain = TrainingTaskProcessor(**{k: getattr(job, k) for k in ("data", "training", "seed")})
    diff = plain.train(DEVICE, weights(), VERSION)  # the device's diff before compression (no residual yet)
    names = list(diff)
    flat = torch.cat([torch.from_numpy(diff[k]).reshape(-1) for k in names]).unsqueeze(0)
    server = make_compressor("topk:0.01").decode_group(flat, [device_seed(SEED, DEVICE, VERSION)])[0].numpy()
    leaf = device_diff(result["data"], settings)
    assert diff_problem(leaf, weights()) == ""
    np.testing.assert_array_equal(np.concatenate([leaf[k].reshape(-1) for k in names]), server)
    assert (tmp_path / "device" / "error_feedback").is_dir()  # the device kept its residual itself

    # the bytes its leaf counts (metrics.json's bytes_up): the encoded payload, as the simulator counts a device's
    assert upload_bytes(result["data"], leaf) == parse_compress("topk:0.01").encoded_bytes(n)
    assert upload_bytes(dense["data"], device_diff(dense["data"], settings)) == 4 * n  # a device that sends dense


@pytest.mark.parametrize("compress", ["qsgd:4", "fp16"])
def test_the_leaf_reads_what_a_simulated_device_of_the_same_id_sends(compress, tmp_path):
    """Quantisers too, and a method weighting by samples: the leaf's decode times the device's ``data_size``
    equals the simulated device's diff bit for bit."""
    job = job_processor(compress, str(tmp_path / "ef"), weighting="samples")
    simulated = job.train(DEVICE, weights(), VERSION)
    settings = device_settings(job)
    data = device_result(settings, str(tmp_path / "device"))["data"]
    leaf = device_diff(data, settings)
    n = update_values("cifar10_convnet")[0]
    assert upload_bytes(data, leaf) == parse_compress(compress).encoded_bytes(n)  # as the simulator counts it
    assert set(leaf) == set(simulated)
    for name, value in simulated.items():
        np.testing.assert_array_equal(leaf[name], value, err_msg=name)


def test_a_result_compressed_otherwise_than_the_job_is_refused(tmp_path):
    job = job_processor("topk:0.01", str(tmp_path / "ef"))
    settings = device_settings(job)
    data = device_result(settings, str(tmp_path / "device"))["data"]
    other = settings | {"compression": {"compress": "topk:0.02", "error_feedback": True}}
    with pytest.raises(ValueError, match="the job's compressor is 'topk:0.02'"):
        device_diff(data, other)
    data[COMPRESSED]["payload"]["indices"]["values"] = data[COMPRESSED]["payload"]["indices"]["values"][:-1]
    with pytest.raises(ValueError, match="does not decode"):
        device_diff(data, settings)
