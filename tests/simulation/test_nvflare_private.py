"""The private NVFlare names this project uses (``simulation/nvflare_private.py``) still exist, with the shapes it
relies on.

If an NVFlare upgrade renamed an overridden handler, the override would silently stop being called and every
device request would again render whole models as text; if it reshaped ``FedJob``'s apps, ``use_fast_simulator``
could no longer replace a recipe's runner. These tests fail first, naming the name."""

import importlib
import inspect
import threading
import time

import pytest
from nvflare.apis.job_def import ALL_SITES
from nvflare.edge.aggregators.num_dxo_factory import NumDXOAggrFactory
from nvflare.edge.executors.edge_model_executor import EdgeModelExecutor
from nvflare.edge.tools.edge_job import EdgeJob
from nvflare.edge.widgets.tpo_runner import TPORunner

from aggregation.leaf_executor import EdgeSimExecutor
from simulation.nvflare_private import (
    NVFLARE_PRIVATE_ATTRIBUTES,
    NVFLARE_PRIVATE_OVERRIDES,
    NVFLARE_PRIVATE_PATCHES,
    ORIGINALS,
    STREAM_CLEANUP,
    QuietEdgeModelExecutor,
    client_app_config,
    recipe_job,
    server_app_config,
    set_sync_interval,
    share_stream_cleanup_thread,
)
from tests.fakes.processors import UsersProcessor


@pytest.mark.parametrize("path, parameters", sorted(NVFLARE_PRIVATE_OVERRIDES.items()))
@pytest.mark.parametrize("executor", [EdgeSimExecutor, QuietEdgeModelExecutor])
def test_overridden_private_nvflare_method_is_unchanged(path, parameters, executor):
    module_name, class_name, method = path.rsplit(".", 2)
    cls = getattr(importlib.import_module(module_name), class_name)
    assert hasattr(cls, method), f"NVFlare no longer has {path}: review simulation/nvflare_private.py"
    assert tuple(inspect.signature(getattr(cls, method)).parameters) == parameters
    assert getattr(executor, method) is not getattr(cls, method), "the override is gone"


@pytest.mark.parametrize("executor", [EdgeSimExecutor(), QuietEdgeModelExecutor("aggr_factory")])
def test_nvflare_registers_the_overridden_handlers_by_bound_method(executor):
    """EdgeTaskExecutor registers ``self._handle_edge_request`` in __init__: the subclass's method is what runs."""
    handlers = [h for entries in executor.get_event_handlers().values() for h, _ in entries]
    assert any(getattr(h, "__func__", None) is type(executor)._handle_edge_request for h in handlers)
    assert any(getattr(h, "__func__", None) is type(executor)._handle_edge_job_request for h in handlers)


def test_a_built_jobs_apps_hold_its_components_where_they_are_replaced():
    from nvflare.edge.controllers.sage import ScatterAndGatherForEdge
    from nvflare.edge.tools.edge_fed_buff_recipe import DeviceManagerConfig, EdgeFedBuffRecipe, ModelManagerConfig
    from torch import nn

    recipe = EdgeFedBuffRecipe("probe", nn.Linear(2, 2), ModelManagerConfig(), DeviceManagerConfig())
    sage = ScatterAndGatherForEdge(assess_interval=0.7, update_interval=0.9)
    instances = {
        "nvflare.job_config.api.FedJob": EdgeJob(name="probe", edge_method="edge"),
        "nvflare.recipe.spec.Recipe": recipe,
        "nvflare.edge.controllers.sage.ScatterAndGatherForEdge": sage,
    }
    assert set(instances) == set(NVFLARE_PRIVATE_ATTRIBUTES)
    for path, attributes in NVFLARE_PRIVATE_ATTRIBUTES.items():
        module_name, class_name = path.rsplit(".", 1)
        assert isinstance(instances[path], getattr(importlib.import_module(module_name), class_name))
        for attribute in attributes:
            assert hasattr(instances[path], attribute), f"{path}.{attribute} is gone"
    assert isinstance(recipe_job(recipe), EdgeJob)
    assert (sage._assess_interval, sage._update_interval) == (0.7, 0.9)  # noqa: SLF001 - what set_sync_interval sets
    set_sync_interval(sage, 0.25)
    assert (sage._assess_interval, sage._update_interval) == (0.25, 0.25)  # noqa: SLF001

    job = EdgeJob(name="probe", edge_method="edge")
    job.configure_simulation(UsersProcessor(), num_devices=3, num_workers=2)
    job.configure_client(NumDXOAggrFactory())
    clients = client_app_config(job)
    assert isinstance(clients.components["tpo_runner"], TPORunner)
    assert [type(e.executor) for e in clients.executors] == [EdgeModelExecutor]
    assert job._deploy_map[ALL_SITES].app_config is clients  # noqa: SLF001
    with pytest.raises(ValueError, match="no server app"):
        server_app_config(job)


@pytest.mark.parametrize("path, parameters", sorted(NVFLARE_PRIVATE_PATCHES.items()))
def test_patched_private_nvflare_methods_are_unchanged(path, parameters):
    module_name, class_name, method = path.rsplit(".", 2)
    cls = getattr(importlib.import_module(module_name), class_name)
    assert hasattr(cls, method), f"NVFlare no longer has {path}: review simulation/nvflare_private.py"
    original = ORIGINALS.get(f"{class_name}.{method}", getattr(cls, method))  # NVFlare's, even once replaced
    assert original.__module__ == module_name
    assert tuple(inspect.signature(original).parameters) == parameters


def test_finished_streams_are_removed_by_one_shared_thread_after_the_same_delay():
    """A real ``RxTask`` (NVFlare's receiving side of a stream): its delayed removal takes no thread of its own,
    happens after its delay, and a removal done earlier cancels it."""
    from nvflare.fuel.f3.streaming.byte_receiver import RxTask

    share_stream_cleanup_thread()
    assert RxTask._schedule_remove_task.__module__ == "simulation.nvflare_private"  # noqa: SLF001
    tasks = []
    for sid in (1, 2):
        task = RxTask.__new__(RxTask)
        task.origin, task.sid = "probe-origin", sid
        task.stop_lock, task.cleanup_timer, task.completed_task_ttl = threading.RLock(), None, 0.3
        RxTask.rx_task_map[(task.origin, sid)] = task
        tasks.append(task)
    threads = threading.active_count()
    for task in tasks:
        task._schedule_remove_task()  # noqa: SLF001 - what NVFlare calls when a stream is done
    tasks[1]._remove_task()  # noqa: SLF001 - removed at once (e.g. a failed stream): its scheduled removal is void
    assert threading.active_count() <= threads + 1  # at most the shared thread, started once
    assert ("probe-origin", 1) in RxTask.rx_task_map and ("probe-origin", 2) not in RxTask.rx_task_map
    time.sleep(0.6)
    assert ("probe-origin", 1) not in RxTask.rx_task_map
    assert STREAM_CLEANUP.wait_idle(1.0)
