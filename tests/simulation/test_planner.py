"""The worker planner on injected hardware profiles: every branch without needing a GPU."""

import pytest

from processors.models import build_model
from simulation.planner import GpuInfo, HardwareProfile, estimate_worker_bytes, plan_engine, plan_workers

GB = 2**30
CONVNET_BYTES = estimate_worker_bytes(build_model("cifar10_convnet"), 32, "adam")


def test_cpu_only_16_cores_is_limited_by_cores_per_leaf():
    plan = plan_workers(HardwareProfile(16), devices_per_leaf=50, per_worker_bytes=CONVNET_BYTES, leaves_on_host=2)
    assert (plan.num_workers, plan.limited_by) == (8, "cpu")
    assert plan.describe() == (
        "Parallel workers: 8 per leaf for 50 devices per leaf (limited by cpu); ~6.2 waves per round"
    )


def test_few_devices_per_leaf_limit_workers():
    plan = plan_workers(HardwareProfile(16), devices_per_leaf=3, per_worker_bytes=CONVNET_BYTES, leaves_on_host=1)
    assert (plan.num_workers, plan.limited_by) == (3, "devices")
    assert plan.waves == 1.0


def test_one_8gb_gpu_with_a_large_worker_is_limited_by_gpu_memory():
    hw = HardwareProfile(16, (GpuInfo("fake 8GB", 8 * GB, 8 * GB),))
    plan = plan_workers(hw, devices_per_leaf=50, per_worker_bytes=2 * GB, leaves_on_host=2, use_gpu=True)
    # (8 GB - 2 x 600 MiB context) x 0.8 / 2 leaves = ~2.7 GB per leaf -> one 2 GB worker
    assert (plan.num_workers, plan.limited_by) == (1, "gpu_memory")


def test_two_80gb_gpus_small_model_is_limited_by_cpu():
    hw = HardwareProfile(16, (GpuInfo("fake 80GB", 80 * GB, 79 * GB), GpuInfo("fake 80GB", 80 * GB, 79 * GB)))
    plan = plan_workers(hw, devices_per_leaf=50, per_worker_bytes=CONVNET_BYTES, leaves_on_host=2, use_gpu=True)
    assert (plan.num_workers, plan.limited_by) == (8, "cpu")
    assert plan.limits["gpu_memory"] > 1000


def test_model_too_big_for_one_worker_is_refused_with_the_fix():
    hw = HardwareProfile(16, (GpuInfo("fake 8GB", 8 * GB, 8 * GB),))
    with pytest.raises(ValueError, match="lower --local-batch-size"):
        plan_workers(hw, devices_per_leaf=10, per_worker_bytes=20 * GB, leaves_on_host=1, use_gpu=True)


def test_gpu_path_without_a_gpu_is_refused():
    with pytest.raises(ValueError, match="no GPU"):
        plan_workers(HardwareProfile(4), devices_per_leaf=10, per_worker_bytes=CONVNET_BYTES, use_gpu=True)


def test_requested_num_workers_is_honoured():
    plan = plan_workers(HardwareProfile(2), devices_per_leaf=50, per_worker_bytes=CONVNET_BYTES, requested=13)
    assert (plan.num_workers, plan.limited_by) == (13, "--num-workers")


def test_worker_memory_grows_with_batch_and_optimizer_state():
    net = build_model("cifar10_convnet")
    assert estimate_worker_bytes(net, 128, "adam") > estimate_worker_bytes(net, 32, "adam")
    assert estimate_worker_bytes(net, 32, "adam") > estimate_worker_bytes(net, 32, "sgd")


def test_vectorized_groups_split_a_leafs_devices_over_its_workers_on_cpu():
    plan = plan_workers(HardwareProfile(4), devices_per_leaf=50, per_worker_bytes=CONVNET_BYTES, leaves_on_host=2)
    planned = plan_engine(plan, "auto", model_has_buffers=False)
    assert (planned.engine, planned.num_workers, planned.group_size) == ("vectorized", 2, 25)
    assert "groups of 25" in planned.reasoning()


def test_gpu_memory_bounds_the_group_size():
    hw = HardwareProfile(4, (GpuInfo("fake 8GB", 8 * GB, 8 * GB),))
    plan = plan_workers(hw, devices_per_leaf=100, per_worker_bytes=GB // 2, leaves_on_host=1, use_gpu=True)
    planned = plan_engine(plan, "vectorized")
    # (8 GB - 600 MiB) x 0.8 = ~5.9 GB for 4 workers of 0.5 GB per device -> groups of 2
    assert (planned.num_workers, planned.group_size) == (4, 2)
    assert "gpu_memory" in planned.engine_reason


def test_batchnorm_models_use_the_per_device_engine_and_refuse_an_explicit_vectorized():
    plan = plan_workers(HardwareProfile(4), devices_per_leaf=10, per_worker_bytes=CONVNET_BYTES)
    assert plan_engine(plan, "auto", model_has_buffers=True).engine == "per-device"
    with pytest.raises(ValueError, match="--engine per-device"):
        plan_engine(plan, "vectorized", model_has_buffers=True)


def test_requested_group_size_and_per_device_engine_are_honoured():
    plan = plan_workers(HardwareProfile(4), devices_per_leaf=10, per_worker_bytes=CONVNET_BYTES)
    assert plan_engine(plan, "auto", group_size=3).group_size == 3
    assert (plan_engine(plan, "per-device").engine, plan_engine(plan, "per-device").group_size) == ("per-device", 1)


def test_auto_trains_a_heavy_model_one_device_at_a_time_on_the_cpu_only():
    from simulation.planner import CPU_GROUP_MAX_MFLOPS, training_mflops

    resnet, convnet = (training_mflops(build_model(m), (3, 32, 32)) for m in ("resnet18", "cifar10_convnet"))
    assert convnet < CPU_GROUP_MAX_MFLOPS < resnet
    cpu = plan_workers(HardwareProfile(4), devices_per_leaf=10, per_worker_bytes=CONVNET_BYTES)
    heavy = plan_engine(cpu, "auto", mflops_per_sample=resnet)
    assert heavy.engine == "per-device" and "MFLOP per training sample" in heavy.engine_reason
    assert plan_engine(cpu, "auto", mflops_per_sample=convnet).engine == "vectorized"
    assert plan_engine(cpu, "vectorized", mflops_per_sample=resnet).engine == "vectorized"  # asked for: given
    gpu = plan_workers(HardwareProfile(16, (GpuInfo("fake", 80 * GB, 80 * GB),)), 10, CONVNET_BYTES, use_gpu=True)
    assert plan_engine(gpu, "auto", mflops_per_sample=resnet).engine == "vectorized"


def test_a_models_mflops_are_counted_once_per_machine_and_again_when_its_source_changes(tmp_path, monkeypatch):
    """``cached_training_mflops``: the count of ``training_mflops``, read back by a later process (here: a later
    call) without counting again; a model whose source file changed is counted anew."""
    import importlib.util
    import sys

    from simulation import planner

    source = tmp_path / "tiny_model.py"
    source.write_text(
        "import torch.nn as nn\nclass Tiny(nn.Sequential):\n    def __init__(self):\n"
        "        super().__init__(nn.Flatten(), nn.Linear(12, 4))\n"
    )

    # read from its source each time: a cached .pyc of the same size and second would hide the change below
    monkeypatch.setattr(sys, "dont_write_bytecode", True)

    def load():
        spec = importlib.util.spec_from_file_location("tiny_model", source)
        module = importlib.util.module_from_spec(spec)
        monkeypatch.setitem(sys.modules, "tiny_model", module)
        spec.loader.exec_module(module)
        return module.Tiny()

    counted = []
    real = planner.training_mflops
    monkeypatch.setattr(planner, "training_mflops", lambda m, s: counted.append(s) or real(m, s))
    folder = str(tmp_path / "cache")
    first = planner.cached_training_mflops(load(), (3, 2, 2), folder)
    assert first == real(load(), (3, 2, 2)) and counted == [(3, 2, 2)]
    assert planner.cached_training_mflops(load(), (3, 2, 2), folder) == first and len(counted) == 1  # read back
    source.write_text(source.read_text().replace("nn.Linear(12, 4)", "nn.Linear(12, 8)"))
    assert planner.cached_training_mflops(load(), (3, 2, 2), folder) == 2 * first and len(counted) == 2


def test_a_light_vectorised_model_gets_one_worker_per_gpu_and_the_whole_round_as_its_group():
    from simulation.planner import GPU_ONE_WORKER_MAX_MFLOPS, training_mflops

    convnet, resnet = (training_mflops(build_model(m), (3, 32, 32)) for m in ("cifar10_convnet", "resnet18"))
    assert convnet <= GPU_ONE_WORKER_MAX_MFLOPS < resnet
    hw = HardwareProfile(16, (GpuInfo("fake 140GB", 140 * GB, 140 * GB),))
    plan = plan_workers(hw, devices_per_leaf=500, per_worker_bytes=CONVNET_BYTES, leaves_on_host=2, use_gpu=True)
    assert plan.num_workers == 8  # the cores' bound, before the engine is chosen
    light = plan_engine(plan, "auto", mflops_per_sample=convnet)
    assert (light.engine, light.num_workers, light.group_size) == ("vectorized", 1, 500)
    assert "one worker per GPU" in light.describe() and "~1.0 waves per round" in light.describe()
    # a heavy model, an explicit engine or --num-workers keep the cores' workers and split the round over them
    assert plan_engine(plan, "auto", mflops_per_sample=resnet).num_workers == 8
    assert plan_engine(plan, "vectorized", mflops_per_sample=convnet).num_workers == 8
    asked = plan_workers(hw, 500, CONVNET_BYTES, leaves_on_host=2, use_gpu=True, requested=4)
    assert plan_engine(asked, "auto", mflops_per_sample=convnet).num_workers == 4
    # a leaf with two GPUs to itself: a worker each, the round split between them
    two = HardwareProfile(16, (GpuInfo("a", 140 * GB, 140 * GB), GpuInfo("b", 140 * GB, 140 * GB)))
    both = plan_engine(plan_workers(two, 500, CONVNET_BYTES, use_gpu=True), "auto", mflops_per_sample=convnet)
    assert (both.num_workers, both.group_size) == (2, 250)
    # the CPU path is unchanged: the cores' workers, each a share of the round
    cpu = plan_engine(
        plan_workers(HardwareProfile(16), 500, CONVNET_BYTES, leaves_on_host=2), "auto", None, None, None, convnet
    )
    assert cpu.num_workers == 8
