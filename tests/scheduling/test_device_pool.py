"""The device pool: ranges never listed, uniform seeded sampling among idle devices, at any pool size."""

from __future__ import annotations

import collections
import tracemalloc

import numpy as np

from scheduling.device_pool import DevicePool


def pool_of(ranges: dict[str, int], seed: int = 0) -> DevicePool:
    pool = DevicePool(seed)
    for leaf, n in ranges.items():
        pool.register_range(leaf, n, leaf)
    return pool


def test_sampling_is_uniform_over_idle_devices_of_every_leaf():
    counts = collections.Counter()
    pool = pool_of({"site-1": 10, "site-2": 30})
    for _ in range(4000):
        chosen = pool.sample(4)
        counts.update(d.split("#")[0] for d in chosen)
        for d in chosen:
            pool.release(d)
    share = counts["site-1"] / sum(counts.values())
    assert abs(share - 0.25) < 0.02  # 10 of 40 devices


def test_busy_and_retired_devices_are_never_sampled_and_the_exact_draw_takes_over_when_few_are_idle():
    pool = pool_of({"site-1": 6})
    first = pool.sample(4)  # 4 of 6 busy: the next draw comes from the idle list
    assert len(set(first)) == 4
    assert set(pool.sample(5)) == {f"site-1#{i}" for i in range(6)} - set(first)
    assert pool.sample(1) == []  # nobody idle
    pool.release(first[0], retire=True)
    pool.release(first[1])
    assert pool.sample(3) == [first[1]]


def test_the_same_seed_and_state_give_the_same_draws_whatever_the_registration_order():
    a = pool_of({"site-1": 50, "site-2": 50}, seed=7)
    b = DevicePool(7)
    b.register_range("site-2", 50, "site-2")
    b.register_range("site-1", 50, "site-1")
    assert [a.sample(5) for _ in range(5)] == [b.sample(5) for _ in range(5)]
    c = pool_of({"site-1": 50, "site-2": 50}, seed=8)
    assert pool_of({"site-1": 50, "site-2": 50}, seed=7).sample(10) != c.sample(10)


def test_a_million_devices_per_leaf_cost_no_memory_and_no_work_per_idle_device(monkeypatch):
    lookups = collections.Counter()
    real = DevicePool.device_at

    def counted(self, index):
        lookups["device_at"] += 1
        return real(self, index)

    monkeypatch.setattr(DevicePool, "device_at", counted)
    tracemalloc.start()
    pool = pool_of({"site-1": 1_000_000, "site-2": 1_000_000})
    for _ in range(200):
        for d in pool.sample(10):
            pool.release(d)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(pool) == 2_000_000 and "site-2#999999" in pool and "site-2#1000000" not in pool
    assert peak < 5 * 2**20, peak  # kilobytes, not the megabytes a listed pool of 2M ids would take
    assert lookups["device_at"] < 2_100, lookups  # about one index per device drawn, none per idle device


def test_state_round_trip_continues_the_same_draws():
    pool = pool_of({"site-1": 100}, seed=3)
    pool.sample(7)
    copy = pool_of({}, seed=99)
    copy.load_state_dict(pool.state_dict())
    assert copy.sample(9) == pool.sample(9)


def test_a_removed_leaf_is_never_sampled_and_its_busy_devices_are_returned():
    pool = pool_of({"site-1": 3, "site-2": 3})
    busy = pool.sample(6)
    assert pool.remove_leaf("site-2") == sorted(d for d in busy if d.startswith("site-2"))
    for d in busy:
        pool.release(d)
    assert len(pool) == 3 and {d.split("#")[0] for d in pool.sample(3)} == {"site-1"}


def test_the_exact_draws_kept_mask_gives_the_draws_of_a_pool_built_afresh_each_time():
    """The exact draw keeps its mask of busy and retired devices up to date instead of rebuilding it: a pool
    restored from the same state before every draw (a fresh mask each time) draws the same devices."""
    import random

    pool, steps = pool_of({"site-1": 40, "site-2": 25, "x": 1}, seed=3), random.Random(1)
    for step in range(300):
        fresh = DevicePool(0)
        fresh.load_state_dict(pool.state_dict())
        count = steps.randint(1, 6)
        assert pool.sample(count) == fresh.sample(count), step
        for device in steps.sample(sorted(pool.busy), k=min(len(pool.busy), steps.randint(0, 7))):
            pool.release(device, retire=steps.random() < 0.02)
        if step == 150:
            pool.register_range("site-3", 10, "site-3")  # membership changes: indices are recomputed


def test_the_last_idle_device_is_taken_without_a_draw_as_numpys_choice_does():
    """An asynchronous run that selects every device asks for the one idle device at each update: the pool takes
    it without calling numpy, which must draw nothing for a choice of one out of one (else the bits would move)."""
    rng = np.random.default_rng(3)
    before = rng.bit_generator.state
    assert rng.choice(np.array([7]), size=1, replace=False).tolist() == [7]
    assert rng.bit_generator.state == before
    pool = DevicePool(seed=5)
    pool.register_range("site-1", 4, "site-1")
    taken = pool.sample(4)
    pool.release(taken[2])
    state = pool.rng.bit_generator.state
    assert pool.sample(1) == [taken[2]]
    assert pool.rng.bit_generator.state == state
