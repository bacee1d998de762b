"""The private NVFlare methods the leaf executor overrides still exist with the signatures it overrides.

If an NVFlare upgrade renamed one, the override would silently stop being called and every device request would
again render whole models as text; this test fails first, naming the method."""

import importlib
import inspect

import pytest

from aggregation.leaf_executor import NVFLARE_PRIVATE_OVERRIDES, EdgeSimExecutor


@pytest.mark.parametrize("path, parameters", sorted(NVFLARE_PRIVATE_OVERRIDES.items()))
def test_overridden_private_nvflare_method_is_unchanged(path, parameters):
    module_name, class_name, method = path.rsplit(".", 2)
    cls = getattr(importlib.import_module(module_name), class_name)
    assert hasattr(cls, method), f"NVFlare no longer has {path}: review aggregation/leaf_executor.py"
    assert tuple(inspect.signature(getattr(cls, method)).parameters) == parameters
    assert getattr(EdgeSimExecutor, method) is not getattr(cls, method), "the override is gone"


def test_nvflare_registers_the_overridden_handlers_by_bound_method():
    """EdgeTaskExecutor registers ``self._handle_edge_request`` in __init__: the subclass's method is what runs."""
    executor = EdgeSimExecutor()
    handlers = [h for entries in executor.get_event_handlers().values() for h, _ in entries]
    assert any(getattr(h, "__func__", None) is EdgeSimExecutor._handle_edge_request for h in handlers)
    assert any(getattr(h, "__func__", None) is EdgeSimExecutor._handle_edge_job_request for h in handlers)
