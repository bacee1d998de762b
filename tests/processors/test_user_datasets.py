"""The per-user formats (LEAF JSON, TFF HDF5, a Hugging Face dataset) read from small files written in exactly
those formats, and the natural partition: each device is one user, by a seeded map that is the same in every
process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from common.choices import ConfigError
from processors.data.config import DataConfig
from processors.data.partition import device_indices, natural_user, range_offsets
from processors.data.sources import DatasetError, load_dataset
from processors.data.text import ALL_LETTERS
from processors.data.users import gini, group_by_user, partition_stats
from tests.conftest import REPO
from tests.fakes.user_formats import (
    TEXT,
    load_user_dataset,
    write_leaf_femnist,
    write_leaf_shakespeare,
    write_tff_emnist,
    write_tff_shakespeare,
)

pytestmark = pytest.mark.usefixtures("no_data_cache")
_load = load_user_dataset


def test_leaf_femnist_reads_users_images_and_their_test_samples(tmp_path):
    names = write_leaf_femnist(tmp_path, users=9, files=2)
    data = _load("femnist", tmp_path)
    assert data.x_train.dtype == torch.uint8 and data.input_shape == (1, 28, 28) and data.num_classes == 62
    assert data.users.names == tuple(sorted(names))
    for u, name in enumerate(data.users.names):  # each user's samples are its own: the file's labels, in order
        folder = tmp_path / "femnist" / "data" / "train"
        doc = next(d for d in (json.load(open(folder / f)) for f in os.listdir(folder)) if name in d["users"])
        idx = data.users.train_range(u)
        assert data.y_train[idx].tolist() == doc["user_data"][name]["y"]
        pixels = np.asarray(doc["user_data"][name]["x"][0], dtype=np.float32).reshape(28, 28)
        assert np.array_equal(data.x_train[idx[0], 0].numpy(), np.rint(pixels * np.float32(255)).astype(np.uint8))
    assert data.users.test_offsets[-1] == len(data.y_test)  # LEAF's test files hold the same users
    assert data.mean is not None and 0.5 < data.mean[0] < 1.0  # standardised with its own (white) statistics


def test_leaf_shakespeare_becomes_token_ids_in_leafs_alphabet(tmp_path):
    write_leaf_shakespeare(tmp_path, users=4)
    data = _load("shakespeare", tmp_path)
    assert data.x_train.dtype == torch.int64 and data.input_shape == (80,) and data.num_classes == 80
    assert len(ALL_LETTERS) == 80
    first = "".join(ALL_LETTERS[i] for i in data.x_train[0].tolist())
    start = TEXT.index(first)
    assert ALL_LETTERS[int(data.y_train[0])] == TEXT[start + 80]  # the label is the next character
    assert torch.equal(data.prepare(data.x_train[:3]), data.x_train[:3])  # token ids are never normalised


def test_tff_emnist_and_shakespeare_files(tmp_path):
    path = write_tff_emnist(tmp_path / "emnist", clients=7)
    data = _load(path, tmp_path)
    assert data.input_shape == (1, 28, 28) and data.x_train.dtype == torch.uint8 and data.num_classes == 62
    assert data.users.count == 7 and data.users.train_offsets[-1] == len(data.y_train)
    import h5py

    with h5py.File(path) as f:  # client by client, in sorted order, each with its own labels
        for u, name in enumerate(data.users.names):
            assert data.y_train[data.users.train_range(u)].tolist() == f["examples"][name]["label"][()].tolist()

    text = _load(write_tff_shakespeare(tmp_path / "shakespeare", clients=3), tmp_path)
    assert text.x_train.dtype == torch.int64 and text.input_shape == (80,) and text.num_classes == 80
    window = text.x_train[1].tolist()
    assert window[1:] == text.x_train[0].tolist()[1:] or window[:-1] == text.x_train[0].tolist()[1:]
    assert text.y_train[0] == text.x_train[1][-1]  # stride 1: the next window ends with the label


def test_missing_files_are_refused_before_start_saying_where_they_go(tmp_path, capsys, monkeypatch):
    with pytest.raises(ConfigError, match=r"femnist/data/train.*preprocess.sh"):
        DataConfig(dataset="femnist", data_root=str(tmp_path)).validate()
    with pytest.raises(ConfigError, match=r"fed_emnist_test.h5"):
        (tmp_path / "fed_emnist_train.h5").write_bytes(b"")
        DataConfig(dataset=str(tmp_path / "fed_emnist_train.h5")).validate()
    with pytest.raises(ConfigError, match="has no users"):
        DataConfig(dataset="synthetic", partition="natural")
    from jobs.pt_job_fedavg import main
    from jobs.run import driver

    monkeypatch.setattr(driver, "make_env", lambda *_a, **_k: pytest.fail("NVFlare started for missing files"))
    with pytest.raises(SystemExit) as exit_info:
        main(["--dataset", "femnist", "--data-root", str(tmp_path), "--output", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "no LEAF .json files" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_each_device_is_one_user_by_a_global_seeded_map(tmp_path):
    """The map is one permutation over the users, indexed by the device's place in the whole pool: devices of
    different leaves never share a user while the pool is no larger than the users, a larger pool spreads them
    evenly, and the same device is the same user in every call and process."""
    from scheduling.device_pool import DevicePool

    write_leaf_femnist(tmp_path, users=10)
    data = _load("femnist", tmp_path, partition="natural")
    users = data.users
    labels = data.y_train.numpy()

    def user_of(key: str, offsets: dict, seed: int = 0) -> int:
        idx = device_indices(labels, key, 350, 0.5, seed, 62, partition="natural", users=users, offsets=offsets)
        (u,) = {int(np.searchsorted(users.train_offsets, i, side="right") - 1) for i in idx}
        assert np.array_equal(idx, users.train_range(u))  # all of that user's samples, nothing else
        return u

    def pool(leaves: int, per_leaf: int) -> tuple[list[str], dict]:
        names = [f"site-{leaf + 1}" for leaf in range(leaves)]
        return [f"{n}#{i}" for n in names for i in range(per_leaf)], range_offsets(names, per_leaf)

    devices, offsets = pool(2, 5)  # pool = users: every user once, across the two leaves
    assert offsets == {"site-1": 0, "site-2": 5}
    assert sorted(user_of(d, offsets) for d in devices) == list(range(10))
    devices, offsets = pool(3, 3)  # smaller: distinct users
    assert len({user_of(d, offsets) for d in devices}) == 9
    devices, offsets = pool(3, 9)  # larger (27): every user on 2 or 3 devices
    counts = np.bincount([user_of(d, offsets) for d in devices], minlength=10)
    assert set(counts.tolist()) <= {2, 3} and counts.sum() == 27
    server = DevicePool(0)  # the offsets number devices as the server's pool does: leaves in name order
    for name in ("site-3", "site-1", "site-2"):
        server.register_range(name, 9, name)
    assert all(server.index_of(d) == offsets[d.split("#")[0]] + int(d.split("#")[1]) for d in devices)
    assert [user_of(d, offsets) for d in devices] != [user_of(d, offsets, seed=1) for d in devices]
    assert [user_of(d, offsets) for d in devices] == [user_of(d, offsets) for d in devices]
    assert 0 <= user_of("phone-abc", offsets) < 10  # a real device without an index
    offsets = range_offsets([f"site-{leaf}" for leaf in range(1, 5)], 2500)
    keys = [f"site-{leaf}#{i}" for leaf in (1, 3) for i in range(0, 2500, 251)]
    code = (
        "from processors.data.partition import natural_user, range_offsets;"
        "o = range_offsets([f'site-{l}' for l in range(1, 5)], 2500);"
        f"print([natural_user(k, 5, 3550, o) for k in {keys!r}])"
    )
    other = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    mine = [natural_user(k, 5, 3550, offsets) for k in keys]
    assert other.stdout.strip() == str(mine) and len(set(mine)) == len(mine)


def test_the_job_passes_the_global_layout_only_with_natural_partitions(tmp_path):
    """The leaves' task processors, the server's work function and ``--dry-run`` map devices by the same offsets;
    other partitions' task processors keep their arguments (and the job config its bytes)."""
    from jobs.api import make_config
    from jobs.run.components import make_assessor, make_task_processor

    write_leaf_femnist(tmp_path, users=10)
    options = dict(num_leaf_nodes=3, devices_per_leaf=4, device_selection_size=2, data_root=str(tmp_path))
    cfg = make_config("fedavg", data="femnist", partition="natural", local_epochs=1, **options)
    expected = {"site-1": 0, "site-2": 4, "site-3": 8}
    assert make_task_processor(cfg, None, 0).device_offsets == expected

    class Timeouts:
        leaf_timeout = 60.0

    assert make_assessor(cfg, Timeouts(), "p", "m", "").work["offsets"] == expected
    plain = make_config("fedavg", local_epochs=1, num_leaf_nodes=3, devices_per_leaf=4, device_selection_size=2)
    assert make_task_processor(plain, None, 0).device_offsets is None
    assert "offsets" not in make_assessor(plain, Timeouts(), "p", "m", "").work


def test_iid_and_dirichlet_names_keep_the_device_partitions_bits():
    labels = np.repeat(np.arange(10), 300)
    device = device_indices(labels, "site-1#3", 100, 0.5, 7, 10, partition="device")
    assert np.array_equal(device_indices(labels, "site-1#3", 100, 0.5, 7, 10, partition="dirichlet"), device)
    iid = device_indices(labels, "site-1#3", 100, 0.0, 7, 10, partition="device")
    assert np.array_equal(device_indices(labels, "site-1#3", 100, 0.5, 7, 10, partition="iid"), iid)


def test_partition_statistics_and_grouping():
    order, test_order, split = group_by_user(np.array(["b", "a", "b", "c"]), np.array(["c", "z", "a"]))
    assert split.names == ("a", "b", "c") and order.tolist() == [1, 0, 2, 3]
    assert split.train_offsets.tolist() == [0, 1, 3, 4] and split.test_offsets.tolist() == [0, 1, 1, 2]
    assert test_order.tolist() == [2, 0, 1]  # the unknown user's test sample last
    assert gini(np.array([5, 5, 5])) == 0.0 and gini(np.array([0, 0, 9])) == pytest.approx(2 / 3)
    stats = partition_stats(split, pool=6)
    assert stats["users"] == 3 and stats["samples_per_user"] == {"min": 1, "median": 1.0, "max": 2, "gini": 0.1667}
    assert stats["devices_per_user"] == 2.0 and stats["test_users"] == 2


def test_a_hugging_face_dataset_split_by_flower_natural_ids(tmp_path):
    datasets = pytest.importorskip("datasets")
    pytest.importorskip("flwr_datasets")
    rng = np.random.default_rng(0)
    writers = rng.integers(0, 5, 120)
    labels = rng.integers(0, 4, 120)
    images = (rng.random((120, 28, 28)) * 255).astype(np.uint8)
    features = datasets.Features(
        {
            "image": datasets.Array2D((28, 28), "uint8"),
            "character": datasets.ClassLabel(num_classes=6),
            "writer_id": datasets.Value("string"),
        }
    )
    table = {"image": list(images), "character": labels.tolist(), "writer_id": [f"w{w}" for w in writers]}
    datasets.Dataset.from_dict(table, features=features).save_to_disk(str(tmp_path / "hf_femnist"))
    data = _load(f"hf:{tmp_path / 'hf_femnist'}", tmp_path)
    assert (
        data.num_classes == 6
        and data.input_shape == (1, 28, 28)
        and data.users.names == tuple(f"w{i}" for i in range(5))
    )
    for u in range(5):
        mine = np.flatnonzero(writers == u)
        cut = len(mine) - len(mine) // 10  # the last tenth of each user's rows is its test data
        assert data.y_train[data.users.train_range(u)].tolist() == labels[mine[:cut]].tolist()
        assert np.array_equal(data.x_train[data.users.train_range(u)][:, 0].numpy(), images[mine[:cut]])
    with pytest.raises(DatasetError, match="no user column"):
        _load(f"hf:{tmp_path / 'hf_femnist'}?user=nope", tmp_path)


def test_per_user_accuracy_is_the_global_one_and_each_users_own():
    from evaluation.per_user import per_user_accuracy
    from processors.training import evaluate

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3))
    x, y = torch.randn(2500, 4), torch.randint(0, 3, (2500,))
    offsets = np.array([0, 700, 700, 2400])  # the second user has no test sample; 100 samples of nobody's
    accuracy, loss, spread = per_user_accuracy(model, x, y, offsets, lambda b: b)
    assert (accuracy, loss) == evaluate(model, x, y, prepare=lambda b: b)
    assert loss == pytest.approx(torch.nn.functional.cross_entropy(model(x), y).item(), rel=1e-5)
    hits = (model(x).argmax(1) == y).numpy()
    own = [hits[:700].mean(), hits[700:2400].mean()]
    assert spread["users"] == 2 and spread["min"] == round(min(own), 5) and spread["max"] == round(max(own), 5)


def test_local_epochs_on_natural_partitions_give_each_device_its_users_work(tmp_path):
    """The schedule's work function (``processors.local_work.device_work``) reads a natural partition's users:
    a device's work per task is its own user's sample count x epochs, so users of unequal size take unequal
    simulated time (``common.delays``)."""
    from processors.local_work import device_work

    write_leaf_femnist(tmp_path, users=10)
    data_cfg = DataConfig(dataset="femnist", data_root=str(tmp_path), partition="natural")
    data = load_dataset(data_cfg.spec(0))
    work = device_work(data_cfg.to_dict(), {"local_epochs": 2, "local_batch_size": 8}, 0)
    keys = [f"site-1#{i}" for i in range(10)]
    held = [len(device_indices(data.y_train.numpy(), k, 350, 0.5, 0, 62, "natural", data.users)) for k in keys]
    assert [work(k) for k in keys] == [2.0 * n for n in held]  # every sample, every epoch (tail batch kept)
    assert len(set(held)) > 1  # the generated writers hold unequal amounts
