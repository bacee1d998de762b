"""common/startup_gc.py: the cyclic collector is off for a process's start-up and on again once it is built."""

import gc

import pytest

from common import startup_gc


@pytest.fixture
def collector_restored():
    enabled = gc.isenabled()
    yield
    (gc.enable if enabled else gc.disable)()


def test_the_collector_pauses_for_start_up_and_resumes_with_the_objects_made_frozen(collector_restored):
    frozen = gc.get_freeze_count()  # another test's leaf may have frozen its objects already
    startup_gc.pause()
    assert not gc.isenabled()
    made = [[i] for i in range(1000)]  # the start-up's objects
    startup_gc.resume()
    assert gc.isenabled() and gc.get_freeze_count() == frozen
    startup_gc.pause()
    startup_gc.resume(freeze=True)  # a leaf: what was made so far is out of the collector's reach
    assert gc.isenabled() and gc.get_freeze_count() >= frozen + len(made)
