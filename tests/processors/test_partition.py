"""Device data partition: deterministic per device across processes, skewed under Dirichlet, IID otherwise."""

import json
import subprocess
import sys

import numpy as np

from common.seeds import stable_seed
from processors.data.partition import device_indices

LABELS = np.repeat(np.arange(10), 500)


def test_same_device_gets_same_indices_in_another_process():
    here = device_indices(LABELS, "site-1#7", 350, 0.5, seed=3)
    code = (
        "import json, numpy as np; from processors.data.partition import device_indices;"
        "print(json.dumps(device_indices(np.repeat(np.arange(10), 500), 'site-1#7', 350, 0.5, seed=3).tolist()))"
    )
    # a fresh interpreter has a different string-hash salt: the partition must not depend on it
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "random", "PATH": ""},
    ).stdout
    assert json.loads(out) == here.tolist()


def test_different_devices_and_seeds_get_different_data():
    a = device_indices(LABELS, "site-1#0", 350, 0.5, seed=0)
    assert not np.array_equal(a, device_indices(LABELS, "site-1#1", 350, 0.5, seed=0))
    assert not np.array_equal(a, device_indices(LABELS, "site-1#0", 350, 0.5, seed=1))


def test_dirichlet_partition_is_label_skewed_and_iid_is_not():
    skew = [np.bincount(LABELS[device_indices(LABELS, f"d{i}", 350, 0.1, 0)], minlength=10).max() for i in range(20)]
    iid = [np.bincount(LABELS[device_indices(LABELS, f"d{i}", 350, None, 0)], minlength=10).max() for i in range(20)]
    assert np.mean(skew) > 150  # most of a device's samples come from one or two classes
    assert np.mean(iid) < 60  # about 35 per class


def test_subset_size_is_respected():
    assert len(device_indices(LABELS, "x", 350, 0.5, 0)) == 350
    assert len(device_indices(LABELS, "x", 350, None, 0)) == 350


def test_stable_seed_is_fixed_across_runs():
    assert (
        stable_seed("partition", 0, "site-1#0") == 10073569167654124714
    )  # golden value: changing it changes every partition
