"""The per-machine cache of generated arrays: the same bits as making them, keyed by every parameter, written
whole or not at all, and never needed (a cache that cannot be written or read is skipped)."""

import os

import numpy as np
import torch

from processors.data import cache
from processors.data.cache import NO_CACHE_ENV, cache_name, cached_arrays
from processors.data.sources import NPZ_KEYS, cached_synthetic, make_synthetic


def test_a_cached_synthetic_set_has_the_bits_of_a_made_one(tmp_path):
    made = make_synthetic(300, 100, 4, 0.5)
    first = cached_synthetic(300, 100, 4, 0.5, str(tmp_path))  # made and stored
    again = cached_synthetic(300, 100, 4, 0.5, str(tmp_path))  # read back
    assert len(os.listdir(tmp_path / "synthetic")) == 1
    for data in (first, again):
        for k in NPZ_KEYS:
            ours, theirs = getattr(data, k), getattr(made, k)
            assert ours.dtype == theirs.dtype and ours.is_contiguous() and torch.equal(ours, theirs)
        assert (data.num_classes, data.mean, data.std) == (made.num_classes, made.mean, made.std)


def test_every_parameter_is_in_the_key(tmp_path):
    base = {"n_train": 300, "n_test": 100, "seed": 4, "difficulty": 0.5}
    names = {cache_name("synthetic", 1, base)}
    for k, v in {"n_train": 301, "n_test": 101, "seed": 5, "difficulty": 0.25}.items():
        names.add(cache_name("synthetic", 1, base | {k: v}))
    names.add(cache_name("synthetic", 2, base))
    assert len(names) == 6
    assert cache_name("synthetic", 1, dict(reversed(base.items()))) in names  # the order of the key is not


def test_a_damaged_file_is_made_again_and_replaced(tmp_path):
    made = {"a": np.arange(5)}
    path = tmp_path / cache_name("k", 1, {"n": 1})
    path.write_bytes(b"not a zip")
    assert np.array_equal(cached_arrays(str(tmp_path), "k", 1, {"n": 1}, lambda: made)["a"], made["a"])
    with np.load(path) as npz:
        assert np.array_equal(npz["a"], made["a"])
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left behind


def test_an_unwritable_cache_still_gives_the_arrays(tmp_path, monkeypatch):
    def refuse(*_args, **_kwargs):
        raise PermissionError("read-only")

    monkeypatch.setattr(cache.tempfile, "mkstemp", refuse)
    assert cached_arrays(str(tmp_path), "k", 1, {"n": 1}, lambda: {"a": np.ones(2)})["a"].tolist() == [1.0, 1.0]


def test_the_cache_can_be_turned_off(tmp_path, monkeypatch):
    monkeypatch.setenv(NO_CACHE_ENV, "1")
    calls = []
    for _ in range(2):
        cached_arrays(str(tmp_path), "k", 1, {"n": 1}, lambda: calls.append(1) or {"a": np.ones(1)})
    assert len(calls) == 2 and not any(tmp_path.iterdir())
