"""TFF's HDF5 client files (``tff.simulation.datasets``' downloads, extracted): ``examples/<client>/<feature>``.

``--dataset PATH/NAME_train.h5`` reads that file and ``NAME_test.h5`` beside it (TFF's names:
``fed_emnist_train.h5``, ``fed_emnist_digitsonly_train.h5``, ``shakespeare_train.h5``). The features decide the
task:

* EMNIST (``pixels`` 28 x 28 floats in [0, 1], ``label``): uint8 images N x 1 x 28 x 28, as LEAF's FEMNIST
  (``processors.data.leaf``); 62 classes (10 for ``fed_emnist_digitsonly_*.h5``, by its name).
* Shakespeare (``snippets``: a client's lines, bytes): the client's snippets joined by newlines, then every
  80-character window and the character after it, as LEAF makes Shakespeare's samples (stride 1), in LEAF's
  alphabet: int64 token ids N x 80 and int64 labels, 80 classes. Memory: 640 bytes a window.
* StackOverflow (``tokens``: a client's sentences, space-separated words; ``title``, ``tags`` and the rest are not
  read): next-word windows of 20 word ids in TFF's vocabulary (``stackoverflow.word_count`` beside the files) and
  the next word's id, ``processors.data.stackoverflow``: int64 N x 20 and int64 labels, 10004 classes. The
  training file is read per client, on first use (``stackoverflow.LazyClientWindows``: it does not fit in memory),
  so only ``--partition natural`` can split it; of the test file, at most 10,000 sentences are read and evaluated
  (``stackoverflow.test_selection``).

Each client is one user of the natural partition (``processors.data.users``); clients are sorted by id.
"""

from __future__ import annotations

import os

import numpy as np
import torch

from processors.data.dataset import Dataset
from processors.data.formats import cached_grouped, group_arrays, pixels_to_uint8, tff_test_file, to_dataset
from processors.data.spec import DatasetError
from processors.data.stackoverflow import (
    NUM_IDS,
    SEQUENCE_LENGTH,
    TEST_SENTENCES,
    LazyClientWindows,
    check_word_count,
    client_windows,
    decode,
    is_stackoverflow,
    load_vocab,
    test_selection,
    word_count_file,
)
from processors.data.text import SPACE_ID, token_ids, windows
from processors.data.users import UserSplit, group_by_user

TFF_FORMAT = 1  # raise whenever the parsed arrays change: older cached parses are not read
EMNIST_CLASSES = 62
SHAKESPEARE_CLASSES = 80
WINDOW = 80


def _task(examples, path: str) -> str:
    first = next(iter(examples.values()), None)
    features = set(first.keys()) if first is not None else set()
    if {"pixels", "label"} <= features:
        return "emnist"
    if "snippets" in features:
        return "shakespeare"
    if "tokens" in features:
        return "stackoverflow"
    raise DatasetError(
        f"--dataset {path}: examples/<client> holds {sorted(features)}; expected EMNIST's pixels and label, "
        "Shakespeare's snippets or StackOverflow's tokens"
    )


def _open(path: str):
    import h5py

    try:
        f = h5py.File(path, "r")
    except OSError as ex:
        raise DatasetError(f"--dataset {path}: not an HDF5 file ({ex})") from ex
    if "examples" not in f:
        f.close()
        raise DatasetError(f"--dataset {path}: no examples/ group; TFF's files hold examples/<client>/<feature>")
    return f


def file_task(path: str) -> str:
    """Which task a TFF file holds, from its first client's feature names (no data read)."""
    with _open(path) as f:
        return _task(f["examples"], path)


def client_sentences(path: str) -> tuple[tuple[str, ...], np.ndarray]:
    """StackOverflow's clients with at least one sentence, sorted, and their sentence counts: HDF5 shapes only,
    no token read."""
    with _open(path) as f:
        examples = f["examples"]
        counts = {c: int(examples[c]["tokens"].shape[0]) for c in sorted(examples.keys())}
    held = {c: n for c, n in counts.items() if n > 0}
    if not held:
        raise DatasetError(f"--dataset {path}: its clients hold no samples")
    return tuple(held), np.asarray(list(held.values()), dtype=np.int64)


def read_clients(
    path: str, vocab_from: str | None = None, take: dict[str, int] | None = None
) -> tuple[str, np.ndarray, np.ndarray, np.ndarray]:
    """(task, inputs, labels, each sample's client) of one TFF file; StackOverflow's vocabulary file is the one
    beside ``vocab_from`` (the train file; default ``path``). ``take``: StackOverflow only, the clients to read and
    how many of their first sentences each (``stackoverflow.test_selection``); default every sentence of every
    client."""
    with _open(path) as f:
        examples = f["examples"]
        task = _task(examples, path)
        vocab = load_vocab(vocab_from or path) if task == "stackoverflow" else None
        xs, ys, users = [], [], []
        for client in sorted(examples.keys() if take is None else take):
            group = examples[client]
            if task == "emnist":
                x, y = pixels_to_uint8(group["pixels"][()]), np.asarray(group["label"][()], dtype=np.int64)
            elif vocab is not None:
                tokens = group["tokens"]
                x, y = client_windows(tokens[()] if take is None else tokens[: take[client]], vocab)
            else:
                lines = [decode(s) for s in group["snippets"][()]]
                x, y = windows(token_ids("\n".join(lines), unknown=SPACE_ID), WINDOW, short_ok=True)
            if len(y):
                xs.append(x)
                ys.append(y)
                users.append(np.full(len(y), client))
    if not xs:
        raise DatasetError(f"--dataset {path}: its clients hold no samples")
    return task, np.concatenate(xs), np.concatenate(ys), np.concatenate(users)


def load_tff(path: str, data_root: str) -> Dataset:
    """A TFF client file and its test file, grouped by client; parsed once per machine."""
    test_path = tff_test_file(path)
    sources = [path, test_path]
    if is_stackoverflow(path):  # TFF's name: its vocabulary must be there too
        check_word_count(path)
    if os.path.isfile(word_count_file(path)):  # a changed vocabulary parses the files again
        sources.append(word_count_file(path))
    if file_task(path) == "stackoverflow":
        return load_stackoverflow(path, test_path, data_root, sources)

    def make() -> dict[str, np.ndarray]:
        task, x_train, y_train, u_train = read_clients(path)
        test_task, x_test, y_test, u_test = read_clients(test_path, vocab_from=path)
        if test_task != task:
            raise DatasetError(f"--dataset {path}: the test file {test_path} holds {test_task}, not {task}")
        return group_arrays(x_train, y_train, u_train, x_test, y_test, u_test)

    arrays = cached_grouped(data_root, "tff", TFF_FORMAT, sources, make)
    if arrays["x_train"].dtype == np.int64:  # token ids: Shakespeare's 80 characters, StackOverflow's 20 words
        classes = NUM_IDS if arrays["x_train"].shape[1] != WINDOW else SHAKESPEARE_CLASSES
    else:  # EMNIST: 62 classes, TFF's digits-only file (its name says so) 10
        classes = 10 if "digitsonly" in os.path.basename(path) else EMNIST_CLASSES
    return to_dataset(arrays, classes, f"--dataset {path}")


def load_stackoverflow(path: str, test_path: str, data_root: str, sources: list[str]) -> Dataset:
    """StackOverflow: the training clients' windows built per client on first use (no ``x_train``; the users'
    ``lazy``), the evaluated part of the test file (``stackoverflow.test_selection``) grouped by client as the other
    formats' (parsed once per machine)."""
    vocab = load_vocab(path)

    def make() -> dict[str, np.ndarray]:
        names, sentences = client_sentences(path)
        test_task = file_task(test_path)
        if test_task != "stackoverflow":
            raise DatasetError(f"--dataset {path}: the test file {test_path} holds {test_task}, not stackoverflow")
        test_names, test_counts = client_sentences(test_path)  # HDF5 metadata: which clients, how many sentences
        take = test_selection(test_names, test_counts)
        _, x_test, y_test, u_test = read_clients(test_path, vocab_from=path, take=take)
        _, test_order, split = group_by_user(np.asarray(names), u_test)  # test offsets in the clients' order
        return {
            "names": np.asarray(names, dtype=str),
            "sentences": sentences,
            "x_test": x_test[test_order],
            "y_test": y_test[test_order],
            "test_offsets": split.test_offsets,
            "test_sentences": np.asarray([sum(take.values()), int(test_counts.sum())], dtype=np.int64),
        }

    extra = f"test sentences {TEST_SENTENCES}"  # another cap parses the test file again
    arrays = cached_grouped(data_root, "tff-stackoverflow", TFF_FORMAT, sources, make, extra)
    names = tuple(str(n) for n in arrays["names"])
    evaluated, in_file = (int(n) for n in arrays["test_sentences"])
    sentences = np.asarray(arrays["sentences"], dtype=np.int64)
    lazy = LazyClientWindows(path, names, sentences, vocab, (evaluated, in_file))
    users = UserSplit(names, None, np.asarray(arrays["test_offsets"], dtype=np.int64), lazy)
    return Dataset(
        torch.zeros((0, SEQUENCE_LENGTH), dtype=torch.int64),  # per user: users.lazy
        torch.zeros(0, dtype=torch.int64),
        torch.from_numpy(np.ascontiguousarray(arrays["x_test"])),
        torch.from_numpy(np.ascontiguousarray(arrays["y_test"], dtype=np.int64)),
        NUM_IDS,
        None,
        None,
        users,
    )
