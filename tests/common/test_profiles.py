"""Utilisation profiles (--profile): the knobs each one sets, the planner honouring them, the task processor's
CPU path, and validation. Fast: no NVFlare job."""

from dataclasses import FrozenInstanceError, fields

import numpy as np
import pytest
import torch

from common.choices import ConfigError
from common.profiles import DEFAULT_PROFILE, PROFILES, format_knob, get_profile
from jobs.config import JobConfig
from jobs.engine_config import EngineConfig
from processors.compute_context import compute_context, global_params_on
from processors.models import build_model
from simulation.planner import GpuInfo, HardwareProfile, estimate_worker_bytes, plan_engine, plan_workers
from tests.conftest import assert_trained_alike, make_processor, nudged_alone

GB = 2**30
CONVNET_BYTES = estimate_worker_bytes(build_model("cifar10_convnet"), 32, "adam")
FAKE_GPU = HardwareProfile(16, (GpuInfo("fake 8GB", 8 * GB, 8 * GB),))


def test_the_three_profiles_exist_high_is_the_default_and_they_are_frozen():
    assert list(PROFILES) == ["conservative", "high", "aggressive"]
    assert DEFAULT_PROFILE == "high" == JobConfig().engine.profile
    with pytest.raises(FrozenInstanceError):
        PROFILES["high"].gpu_memory_share = 1.0


@pytest.mark.parametrize("name", list(PROFILES))
def test_describe_prints_every_knob_with_its_value(name):
    profile = PROFILES[name]
    lines = profile.describe().splitlines()
    assert lines[0].startswith(f"Utilisation profile: {name}")
    printed = dict(line.split(None, 1) for line in lines[1:])
    knobs = {f.name: format_knob(getattr(profile, f.name)) for f in fields(profile) if f.name != "name"}
    assert printed == knobs


def test_profile_knobs():
    c, h, a = PROFILES["conservative"], PROFILES["high"], PROFILES["aggressive"]
    assert (c.gpu_memory_share, h.gpu_memory_share, a.gpu_memory_share) == (0.5, 0.8, 0.9)
    assert (c.cached_versions, h.cached_versions, a.cached_versions) == (1, 3, 3)
    assert (c.data_resident, h.data_resident, a.data_resident) == (False, True, True)
    assert (c.empty_cache_every_task, h.empty_cache_every_task, a.empty_cache_every_task) == (True, False, False)
    assert a.memory_slack < h.memory_slack == c.memory_slack


def test_unknown_profile_is_refused_by_the_engine_config_and_get_profile():
    with pytest.raises(ConfigError, match="--profile 'turbo': use conservative, high, aggressive"):
        EngineConfig(profile="turbo")
    with pytest.raises(ValueError, match="turbo"):
        get_profile("turbo")
    for name in PROFILES:
        JobConfig(engine=EngineConfig(profile=name))


def test_high_is_the_planner_without_profiles():
    default = plan_workers(FAKE_GPU, devices_per_leaf=50, per_worker_bytes=2 * GB, leaves_on_host=2, use_gpu=True)
    high = plan_workers(
        FAKE_GPU, devices_per_leaf=50, per_worker_bytes=2 * GB, leaves_on_host=2, use_gpu=True, profile="high"
    )
    assert default == high and default.per_worker_bytes == 2 * GB


@pytest.mark.parametrize("cores, leaves", [(16, 2), (4, 1), (2, 2)])
def test_cpu_workers_and_groups_follow_the_profile(cores, leaves):
    plans = {}
    for name in PROFILES:
        plan = plan_workers(
            HardwareProfile(cores),
            devices_per_leaf=50,
            per_worker_bytes=CONVNET_BYTES,
            leaves_on_host=leaves,
            profile=name,
        )
        plans[name] = plan_engine(plan, "auto")
    per_leaf = max(1, cores // leaves)
    assert plans["conservative"].num_workers == max(1, per_leaf // 2)
    assert plans["high"].num_workers == plans["aggressive"].num_workers == per_leaf
    for plan in plans.values():
        assert plan.torch_threads == max(1, per_leaf // plan.num_workers)  # a leaf's cores, shared by its workers
    c, a = plans["conservative"], plans["aggressive"]
    assert c.num_workers <= a.num_workers
    # devices in flight per leaf (workers x group): conservative trains fewer at once
    assert c.num_workers * c.group_size < a.num_workers * a.group_size
    assert c.group_size == max(1, -(-50 // c.num_workers) // 2)


def test_gpu_memory_share_workers_and_groups_follow_the_profile():
    plans = {}
    for name in PROFILES:
        plan = plan_workers(
            FAKE_GPU, devices_per_leaf=400, per_worker_bytes=64 * 2**20, leaves_on_host=2, use_gpu=True, profile=name
        )
        plans[name] = plan_engine(plan, "vectorized")
    free_per_leaf = (8 * GB - 2 * 600 * 2**20) / 2
    for name, plan in plans.items():
        assert abs(plan.gpu_bytes_per_leaf - free_per_leaf * PROFILES[name].gpu_memory_share) <= 1
        assert plan.leaves_per_gpu == 2 and plan.profile == name
    c, h, a = plans["conservative"], plans["high"], plans["aggressive"]
    assert c.gpu_bytes_per_leaf < h.gpu_bytes_per_leaf < a.gpu_bytes_per_leaf
    assert a.per_worker_bytes < h.per_worker_bytes == c.per_worker_bytes  # aggressive: less slack
    assert (c.num_workers, h.num_workers, a.num_workers) == (4, 8, 8)
    assert c.num_workers < a.num_workers and c.group_size < a.group_size
    assert "profile conservative" in c.engine_reason
    # --group-size and --num-workers still win over any profile
    assert plan_engine(c, "vectorized", group_size=7).group_size == 7
    assert plan_workers(FAKE_GPU, 50, CONVNET_BYTES, use_gpu=True, requested=3, profile="conservative").num_workers == 3


def test_compute_context_is_a_no_op_on_the_cpu(monkeypatch):
    def boom(*_a, **_k):
        raise AssertionError("a CUDA call on the CPU path")

    for fn in ("set_per_process_memory_fraction", "empty_cache", "Stream", "stream", "current_stream"):
        monkeypatch.setattr(torch.cuda, fn, boom)
    for profile in PROFILES.values():
        with compute_context(torch.device("cpu"), profile, leaves_per_gpu=2):
            pass


def test_global_params_cache_keeps_the_profiles_number_of_versions():
    import processors.compute_context as tp

    weights = {"w": np.zeros(3, dtype=np.float32)}
    tp._global_params.clear()
    for version in range(1, 6):
        global_params_on(weights, version, torch.device("cpu"), keep_versions=1)
    assert sorted(k[0] for k in tp._global_params) == [5]
    for version in range(6, 10):
        global_params_on(weights, version, torch.device("cpu"), keep_versions=3)
    assert sorted(k[0] for k in tp._global_params) == [7, 8, 9]
    tp._global_params.clear()


def test_conservative_processor_trains_from_cpu_data_like_high(monkeypatch):
    import processors.task_processor as tp

    seen = []
    real = tp.train_local

    def spy(net, params, x, y, *args):
        seen.append(x.device.type)
        return real(net, params, x, y, *args)

    monkeypatch.setattr(tp, "train_local", spy)
    torch.manual_seed(0)  # fixed weights, not whatever ran before in the process
    weights = {k: v.numpy() for k, v in build_model("cifar10_convnet").state_dict().items()}
    diffs, group_diffs = {}, {}
    for name in ("conservative", "high"):
        proc = make_processor(local_iters=3, seed=1, profile=name)
        assert proc.profile == name and proc._settings is PROFILES[name]
        diffs[name] = proc.train("site-1#3", weights, version=1)
        group_diffs[name] = proc.train_group(["site-1#3", "site-2#4"], weights, version=1)
    assert seen == ["cpu", "cpu"]
    assert set(diffs["conservative"]) == set(weights)
    for key in weights:
        np.testing.assert_allclose(diffs["conservative"][key], diffs["high"][key], rtol=1e-5, atol=1e-6)
        for c, h in zip(group_diffs["conservative"], group_diffs["high"], strict=True):
            np.testing.assert_allclose(c[key], h[key], rtol=1e-5, atol=1e-6)
    # the group against the device alone: equal up to summation order on every element, or, on a weight draw that
    # float32 rounding tips (a ReLU input within rounding of 0, its gradient's sign flips spread by Adam), no further
    # apart than rounding alone moves the device (assert_trained_alike measures it, and says why)
    assert_trained_alike(
        group_diffs["high"][0], diffs["high"], lambda: nudged_alone(proc, "site-1#3", weights, version=1)
    )
    assert any(np.abs(d).max() > 0 for d in diffs["conservative"].values())
