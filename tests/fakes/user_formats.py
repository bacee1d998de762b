"""Small files in exactly the real per-user formats: LEAF's JSON (FEMNIST, Shakespeare), TFF's HDF5 client files
(EMNIST, Shakespeare, StackOverflow), and ``load_user_dataset``, which loads one as a job would. Users hold unequal amounts of data, and each
user's samples are learnable (a class-specific pattern), so a job trained on them can beat chance."""

from __future__ import annotations

import json
import os

import numpy as np

TEXT = (
    "To be, or not to be, that is the question: Whether 'tis nobler in the mind to suffer the slings and "
    "arrows of outrageous fortune, or to take arms against a sea of troubles and by opposing end them. "
)


def digit_images(rng: np.random.Generator, labels: np.ndarray, classes: int = 62) -> np.ndarray:
    """28 x 28 float pixels in [0, 1]: background 1.0 (LEAF's and TFF's white), a class-specific dark block."""
    images = np.ones((len(labels), 28, 28), dtype=np.float32)
    for i, label in enumerate(labels):
        row, col = divmod(int(label) % 16, 4)
        images[i, 2 + 6 * (row % 4) : 8 + 6 * (row % 4), 2 + 6 * col : 8 + 6 * col] = 0.1
    images += rng.normal(scale=0.05, size=images.shape).astype(np.float32)
    return np.clip(images, 0.0, 1.0)


def user_sizes(users: int, seed: int) -> list[int]:
    """Unequal sample counts, as real users have (a few large, many small)."""
    rng = np.random.default_rng(seed)
    return [int(n) for n in np.clip(rng.lognormal(3.0, 0.7, users), 6, 200)]


def write_leaf_femnist(root, users: int = 12, seed: int = 0, classes: int = 8, files: int = 2) -> list[str]:
    """``root/femnist/data/{train,test}/*.json`` as LEAF's scripts leave them; the users' names."""
    rng = np.random.default_rng(seed)
    names = [f"f{idx:04d}_{rng.integers(10, 99)}" for idx in range(users)]
    sizes = user_sizes(users, seed)
    for split, share in (("train", 0.9), ("test", 0.1)):
        folder = os.path.join(root, "femnist", "data", split)
        os.makedirs(folder, exist_ok=True)
        for part in range(files):
            mine = names[part::files]
            doc = {"users": mine, "num_samples": [], "user_data": {}}
            for name in mine:
                n = max(1, int(round(sizes[names.index(name)] * share)))
                y = rng.integers(0, classes, n)
                x = digit_images(rng, y).reshape(n, 784)
                doc["num_samples"].append(n)
                doc["user_data"][name] = {"x": x.round(4).tolist(), "y": y.tolist()}
            with open(os.path.join(folder, f"all_data_{part}_niid_0_keep_0_{split}_9.json"), "w") as f:
                json.dump(doc, f)
    return names


def write_leaf_shakespeare(root, users: int = 6, seed: int = 0) -> list[str]:
    """``root/shakespeare/data/{train,test}/*.json``: 80-character windows and the next character."""
    rng = np.random.default_rng(seed)
    names = [f"THE_TRAGEDY_OF_HAMLET_ROLE{idx}" for idx in range(users)]
    for split in ("train", "test"):
        folder = os.path.join(root, "shakespeare", "data", split)
        os.makedirs(folder, exist_ok=True)
        doc = {"users": names, "num_samples": [], "user_data": {}}
        for name in names:
            n = int(rng.integers(5, 30)) if split == "train" else 3
            starts = rng.integers(0, len(TEXT) - 81, n)
            x = [TEXT[s : s + 80] for s in starts]
            y = [TEXT[s + 80] for s in starts]
            doc["num_samples"].append(n)
            doc["user_data"][name] = {"x": x, "y": y}
        with open(os.path.join(folder, f"all_data_niid_0_keep_0_{split}_9.json"), "w") as f:
            json.dump(doc, f)
    return names


def write_tff_emnist(folder, clients: int = 10, seed: int = 0, classes: int = 8) -> str:
    """``fed_emnist_train.h5`` and ``fed_emnist_test.h5`` in TFF's layout; the train file's path."""
    import h5py

    rng = np.random.default_rng(seed)
    sizes = user_sizes(clients, seed + 1)
    os.makedirs(folder, exist_ok=True)
    for split, share in (("train", 0.9), ("test", 0.1)):
        with h5py.File(os.path.join(folder, f"fed_emnist_{split}.h5"), "w") as f:
            examples = f.create_group("examples")
            for c in range(clients):
                n = max(1, int(round(sizes[c] * share)))
                label = rng.integers(0, classes, n).astype(np.int32)
                group = examples.create_group(f"f{c:04d}_{c % 7:02d}")
                group.create_dataset("label", data=label)
                group.create_dataset("pixels", data=digit_images(rng, label))
    return os.path.join(folder, "fed_emnist_train.h5")


def write_tff_shakespeare(folder, clients: int = 4, seed: int = 0) -> str:
    """``shakespeare_train.h5`` and ``shakespeare_test.h5``: each client's ``snippets`` (bytes lines)."""
    import h5py

    rng = np.random.default_rng(seed)
    os.makedirs(folder, exist_ok=True)
    for split in ("train", "test"):
        with h5py.File(os.path.join(folder, f"shakespeare_{split}.h5"), "w") as f:
            examples = f.create_group("examples")
            for c in range(clients):
                lines = [TEXT[s : s + int(rng.integers(20, 90))] for s in rng.integers(0, 100, 4)]
                group = examples.create_group(f"ROLE_{c}")
                group.create_dataset("snippets", data=lines, dtype=h5py.string_dtype("utf-8"))
    return os.path.join(folder, "shakespeare_train.h5")


SO_WORDS = ["the", "to", "i", "a", "is", "in", "and", "it", "of", "python", "list", "error", "how", "do"]


def write_tff_stackoverflow(folder, clients: int = 5, seed: int = 0, vocab: list[str] | None = None) -> str:
    """``stackoverflow_train.h5``, ``stackoverflow_test.h5`` (each client's ``tokens``, ``title``, ``tags``, ``type``:
    bytes strings, one a sample) and ``stackoverflow.word_count`` (``word count`` lines, most frequent first) in
    TFF's layout; the train file's path. A sentence walks the word list cyclically from a random word (so the next
    word follows from the last one), runs 1 to 25 words (some over TFF's 20) and has a few words replaced by ones
    the word-count file lacks (OOV)."""
    import h5py

    rng = np.random.default_rng(seed)
    words = SO_WORDS + ["zzrare", "qqunseen"]  # the last two are not in the word-count file
    counted = vocab if vocab is not None else SO_WORDS
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "stackoverflow.word_count"), "w") as f:
        for rank, word in enumerate(counted):
            f.write(f"{word} {1000 - 10 * rank}\n")
    for split in ("train", "test"):
        with h5py.File(os.path.join(folder, f"stackoverflow_{split}.h5"), "w") as f:
            examples = f.create_group("examples")
            for c in range(clients):
                n = int(rng.integers(1, 6)) if split == "train" else 2
                sentences = []
                for _ in range(n):
                    start, length = int(rng.integers(len(words))), int(rng.integers(1, 26))
                    walk = [words[(start + i) % len(words)] for i in range(length)]
                    walk = [w if rng.random() > 0.1 else "qqunseen" for w in walk]
                    sentences.append(" ".join(walk))
                group = examples.create_group(f"{1000 + 37 * c:08d}")
                strings = h5py.string_dtype("utf-8")
                group.create_dataset("tokens", data=sentences, dtype=strings)
                group.create_dataset("title", data=[s[:12] for s in sentences], dtype=strings)
                group.create_dataset("tags", data=["python|list"] * n, dtype=strings)
                group.create_dataset("type", data=["question"] * n, dtype=strings)
    return os.path.join(folder, "stackoverflow_train.h5")


def load_user_dataset(dataset, root, **config):
    """The dataset ``--dataset DATASET --data-root ROOT`` (and ``DataConfig`` fields) loads, in this process."""
    from processors.data.config import DataConfig
    from processors.data.sources import load_dataset

    return load_dataset(DataConfig(dataset=str(dataset), data_root=str(root), **config).spec(0))
