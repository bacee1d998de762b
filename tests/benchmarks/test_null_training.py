"""The protocol ceiling's trainer: plugged in through the engine's ``trainer`` option, no special case elsewhere."""

import numpy as np
import pytest

from benchmarks.lib.null_training import NULL_TRAINER, NullTrainer
from common.choices import ConfigError
from common.protocol import DEVICE_EXTRA_PREFIX
from jobs.api import make_config
from jobs.run.components import make_task_processor
from processors.models import build_model
from processors.task_processor import TrainingTaskProcessor


def test_the_job_builds_the_trainer_it_names_and_ours_by_default():
    options = dict(num_leaf_nodes=1, devices_per_leaf=4, device_selection_size=2, synthetic_size=200)
    assert type(make_task_processor(make_config("fedavg", **options), None)) is TrainingTaskProcessor
    null = make_task_processor(make_config("fedavg", trainer=NULL_TRAINER, **options), None)
    assert isinstance(null, NullTrainer)
    weights = {k: v.numpy() for k, v in build_model("cifar10_convnet").state_dict().items()}
    weights[DEVICE_EXTRA_PREFIX + "state"] = np.zeros(3, np.float32)
    diffs = null.train_devices(["site-1#0", "site-1#1", "site-1#2"], [weights] * 3, [1, 1, 2])
    assert len(diffs) == 3 and all(set(d) == set(weights) - {DEVICE_EXTRA_PREFIX + "state"} for d in diffs)
    for name, array in diffs[0].items():
        assert array.shape == weights[name].shape and array.dtype == np.float32 and np.any(array)
        assert not array.flags.writeable  # a consumer that wrote into one device's diff would corrupt the next
        assert all(d[name] is array for d in diffs[1:])
    assert null.train("site-1#3", weights, 3).keys() == diffs[0].keys()


def test_the_null_trainer_trains_one_device_as_the_per_device_engine_calls_it():
    """A group of one goes to ``train`` with its selection id (``TrainingTaskProcessor.train_devices``): the null
    trainer takes it, so ``null_training.py`` runs without ``--engine vectorized``."""
    options = dict(num_leaf_nodes=1, devices_per_leaf=4, device_selection_size=2, synthetic_size=200)
    null = make_task_processor(make_config("fedavg", trainer=NULL_TRAINER, **options), None)
    weights = {k: v.numpy() for k, v in build_model("cifar10_convnet").state_dict().items()}
    (diff,) = null.train_devices(["site-1#0"], [weights], [1], [7])
    assert diff.keys() == weights.keys() and all(diff[k].shape == weights[k].shape for k in weights)


@pytest.mark.parametrize(
    "trainer, message",
    [("no_such_module:Thing", "cannot import"), ("processors.models:build_model", "subclass of"), ("x", "import path")],
)
def test_a_trainer_that_is_no_task_processor_is_refused(trainer, message):
    with pytest.raises(ConfigError, match=message):
        make_config("fedavg", trainer=trainer, num_leaf_nodes=1, devices_per_leaf=4, device_selection_size=2)
