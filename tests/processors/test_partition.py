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


# -- the references' partition (--partition references) -------------------------------------------------------
GOLDEN_DEVICE_0 = [122, 242, 258, 259, 297]  # at fc36ad7, before the references partition existed
UNEVEN = np.repeat(np.arange(10), [300, 250, 200, 150, 100, 90, 80, 70, 60, 50])  # 1,350 images, uneven classes


def references_shards(n: int, size: int = 35, seed: int = 0, prefix: str = "site-1") -> list[np.ndarray]:
    return [device_indices(UNEVEN, f"{prefix}#{i}", size, 0.5, seed, partition="references") for i in range(n)]


def test_references_partition_rounds_counts_to_exactly_the_subset_size():
    for shard in references_shards(60, size=37):
        assert len(shard) == 37


def test_references_partition_deals_each_class_pool_before_reusing_it():
    shards = references_shards(30)  # 1,050 samples: some pools run out and are dealt again
    labels = UNEVEN[np.concatenate(shards)]
    dealt = np.bincount(np.concatenate(shards), minlength=len(UNEVEN))
    for c in range(10):
        pool = np.flatnonzero(UNEVEN == c)
        uses = dealt[pool]
        # dealt in order, reshuffled only when the next count no longer fits: no image of a class is used twice
        # before every image of it was used once, so the uses of a class's images differ by at most one round
        # (plus one for the images of a round cut short, left undealt when the pool was reshuffled)
        assert uses.max() - uses.min() <= 2, (c, np.bincount(uses))
        assert (labels == c).sum() == uses.sum()
    first = np.concatenate(references_shards(3))
    assert len(np.unique(first)) == len(first)  # the first shards are disjoint


def test_references_partition_differs_from_a_multinomial_per_device():
    # the per-device draw reuses images at random: over the same 30 devices some image is used 3+ times while
    # another of its class is unused; the dealt pools never do that
    drawn = np.concatenate([device_indices(UNEVEN, f"site-1#{i}", 35, 0.5, 0) for i in range(30)])
    uses = np.bincount(drawn, minlength=len(UNEVEN))
    assert uses.max() - uses.min() > 2


def test_references_partition_is_the_same_whichever_device_asks_first_and_in_another_process():
    forward = references_shards(8, seed=5, prefix="site-2")
    from processors.data import partition

    partition._dealer.cache_clear()
    backward = [device_indices(UNEVEN, f"site-2#{i}", 35, 0.5, 5, partition="references") for i in reversed(range(8))]
    assert all(np.array_equal(a, b) for a, b in zip(forward, reversed(backward), strict=True))
    code = (
        "import json, numpy as np; from processors.data.partition import device_indices;"
        "u = np.repeat(np.arange(10), [300, 250, 200, 150, 100, 90, 80, 70, 60, 50]);"
        "print(json.dumps(device_indices(u, 'site-2#7', 35, 0.5, 5, partition='references').tolist()))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env={"PYTHONHASHSEED": "random"}
    ).stdout
    assert json.loads(out) == forward[7].tolist()


def test_references_partition_is_label_skewed_and_the_default_keeps_its_bits():
    skew = [np.bincount(UNEVEN[s], minlength=10).max() for s in references_shards(20)]
    assert np.mean(skew) > 10  # of 35 (about 13 expected: Dirichlet 0.5 concentrates; IID: about 8)
    # the default partition is unchanged by the option's existence (golden: the first indices of a seeded device)
    assert device_indices(LABELS, "site-1#0", 350, 0.5, seed=0)[:5].tolist() == GOLDEN_DEVICE_0
