"""TFF's StackOverflow next-word task: ``stackoverflow_train.h5`` / ``stackoverflow_test.h5`` (``examples/<client>/
tokens``, one space-separated sentence per sample) and TFF's vocabulary file ``stackoverflow.word_count`` beside them.

The ids are TFF's (``tff.simulation.baselines.stackoverflow``'s word-prediction preprocessing): the vocabulary is
the first ``VOCAB_SIZE`` words of ``stackoverflow.word_count`` (lines ``word count``, most frequent first); pad is
0, the vocabulary's words 1..V, out-of-vocabulary ``V + 1`` (one OOV bucket), beginning-of-sentence ``V + 2``,
end-of-sentence ``V + 3``: ``V + 4`` ids in all. A sentence keeps its first ``SEQUENCE_LENGTH`` (20) words, becomes
BOS, its word ids, and EOS when it was shorter than 20 words (as TFF's ``to_ids``).

TFF trains on every position of a sentence at once (inputs ``s[:-1]``, targets ``s[1:]``, the loss masked at pad).
This project's text tasks have one label a sample (``processors.data.text``), so each position becomes a sample:
input = the ``SEQUENCE_LENGTH`` ids before it (left-padded with pad's 0 at a sentence's start), label = its id.
The predictions are TFF's, one a sample; the loss is averaged over positions instead of per sentence.

Memory: 168 bytes a position, so the full training file (about 135 million sentences, 342,477 clients) does not fit
in memory as windows. It is therefore read per client (``LazyClientWindows``): loading reads the clients' names and
sentence counts only (HDF5 metadata, no tokens), and a client's windows are built when a device first trains it (or
the schedule asks its size), from that client's ``tokens`` alone, and kept in a small LRU cache
(``CACHE_USERS`` clients per process; their sizes are kept for good, 8 bytes a client). So memory grows with the
users trained, not the file. The test file (about 16 million sentences in TFF's) is read in part: the server
evaluates every version on at most ``TEST_SENTENCES`` (10,000) of its sentences, as the per-round validation of
Reddi et al.'s "Adaptive Federated Optimization" (``--so_nwp_num_validation_examples=10000``, from the test data).
Which ones (``test_selection``): every sentence when the file holds no more; otherwise whole clients in one seeded
order, the same on every machine and in every run whatever ``--seed``, until 10,000, the last client's first
sentences only. Only those clients' tokens are read (the others' sentence counts are HDF5 metadata).
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict

import numpy as np

from common.seeds import stable_seed
from processors.data.spec import DatasetError

VOCAB_SIZE = 10_000  # TFF's baseline vocabulary (its ``vocab_size``)
SEQUENCE_LENGTH = 20  # TFF's baseline ``sequence_length``
WORD_COUNT = "stackoverflow.word_count"  # TFF's name (``load_word_counts``)
PAD_ID = 0
OOV_ID = VOCAB_SIZE + 1
BOS_ID = VOCAB_SIZE + 2
EOS_ID = VOCAB_SIZE + 3
NUM_IDS = VOCAB_SIZE + 4  # the model's output size: pad, V words, OOV, BOS, EOS
CACHE_USERS = 32  # clients whose windows a process keeps (LRU): a few groups' worth of devices
TEST_SENTENCES = 10_000  # test sentences evaluated at most (the module docstring)


def word_count_file(train_path: str) -> str:
    """Where TFF's vocabulary file goes: beside the ``.h5`` files."""
    return os.path.join(os.path.dirname(train_path), WORD_COUNT)


def is_stackoverflow(train_path: str) -> bool:
    """Whether a TFF file's name is StackOverflow's (TFF's ``stackoverflow_{train,test,held_out}.h5``)."""
    return os.path.basename(train_path).startswith("stackoverflow")


def check_word_count(train_path: str) -> None:
    """``DatasetError`` in one line saying where the vocabulary file goes, when it is missing."""
    path = word_count_file(train_path)
    if not os.path.isfile(path):
        raise DatasetError(
            f"--dataset {train_path}: no vocabulary file {path}; put TFF's {WORD_COUNT} (from "
            "stackoverflow.word_count.tar.bz2, extracted) beside the .h5 files (docs/datasets.md)"
        )


def load_vocab(train_path: str, size: int = VOCAB_SIZE) -> dict[str, int]:
    """The first ``size`` words of the word-count file and their ids 1..size (TFF's ``create_vocab`` order)."""
    check_word_count(train_path)
    vocab: dict[str, int] = {}
    with open(word_count_file(train_path), encoding="utf-8") as f:
        for line in f:
            parts = line.split()
            if not parts:
                continue
            if parts[0] not in vocab:
                vocab[parts[0]] = len(vocab) + 1
            if len(vocab) == size:
                break
    if not vocab:
        raise DatasetError(f"--dataset {train_path}: {word_count_file(train_path)} holds no words")
    return vocab


def sentence_ids(sentence: str, vocab: dict[str, int]) -> np.ndarray:
    """BOS, the first ``SEQUENCE_LENGTH`` words' ids (OOV for any other word), EOS if the sentence was shorter."""
    words = sentence.split(" ")[:SEQUENCE_LENGTH]  # TFF splits on single spaces
    ids = [BOS_ID] + [vocab.get(w, OOV_ID) for w in words]
    if len(words) < SEQUENCE_LENGTH:
        ids.append(EOS_ID)
    return np.asarray(ids, dtype=np.int64)


def sentence_windows(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each position after BOS: the ``SEQUENCE_LENGTH`` ids before it (left-padded with 0) and its id."""
    padded = np.concatenate([np.full(SEQUENCE_LENGTH - 1, PAD_ID, np.int64), ids])
    x = np.lib.stride_tricks.sliding_window_view(padded[:-1], SEQUENCE_LENGTH)
    return np.ascontiguousarray(x), ids[1:].copy()


def client_windows(tokens, vocab: dict[str, int]) -> tuple[np.ndarray, np.ndarray]:
    """A client's samples (its ``tokens`` dataset: bytes or str sentences) as next-word windows and labels."""
    xs, ys = [], []
    for s in tokens:
        x, y = sentence_windows(sentence_ids(decode(s), vocab))
        xs.append(x)
        ys.append(y)
    if not xs:
        return np.zeros((0, SEQUENCE_LENGTH), np.int64), np.zeros(0, np.int64)
    return np.concatenate(xs), np.concatenate(ys)


def test_selection(names: tuple[str, ...], counts: np.ndarray, cap: int | None = None) -> dict[str, int]:
    """The test clients evaluated, sorted, and how many of their first sentences each: all of them when ``counts``
    (each client's sentences) sum to at most ``cap`` (default ``TEST_SENTENCES``); otherwise whole clients in a
    seeded order fixed for the file's clients (not the run's seed: every run evaluates on the same sentences)
    until ``cap`` sentences, the last client cut to fit."""
    cap = TEST_SENTENCES if cap is None else cap
    counts = np.asarray(counts, dtype=np.int64)
    if int(counts.sum()) <= cap:
        return {name: int(n) for name, n in zip(names, counts, strict=True)}
    order = np.random.default_rng(stable_seed("stackoverflow-test")).permutation(len(names))
    reached = np.cumsum(counts[order])
    last = int(np.searchsorted(reached, cap))  # the first client at which the running total reaches cap
    take = {names[i]: int(counts[i]) for i in order[: last + 1]}
    take[names[order[last]]] -= int(reached[last]) - cap
    return dict(sorted(take.items()))


def decode(sentence) -> str:
    return sentence.decode("utf-8") if isinstance(sentence, bytes) else str(sentence)


class LazyClientWindows:
    """The training clients of one StackOverflow file, their windows built per client on first use (the module
    docstring): a ``processors.data.users.LazyUsers``. ``names``: the clients, sorted; ``sentences``: each one's
    sentence count (from the HDF5 shapes); ``vocab``: the word ids; ``test_sentences``: the test sentences
    evaluated and the test file's (``test_selection``). Thread-safe: a leaf's workers share it."""

    def __init__(
        self,
        path: str,
        names: tuple[str, ...],
        sentences: np.ndarray,
        vocab: dict[str, int],
        test_sentences: tuple[int, int] = (0, 0),
    ):
        self.path, self.names, self.sentences, self.vocab = path, names, sentences, vocab
        self.test_sentences = test_sentences
        self.reads = 0  # clients whose tokens were read, for the tests and the docs' claim
        self._cache: OrderedDict[int, tuple[np.ndarray, np.ndarray]] = OrderedDict()
        self._sizes: dict[int, int] = {}
        self._lock = threading.Lock()

    def arrays(self, user: int) -> tuple[np.ndarray, np.ndarray]:
        with self._lock:
            cached = self._cache.get(user)
            if cached is not None:
                self._cache.move_to_end(user)
                return cached
        import h5py

        with h5py.File(self.path, "r") as f:
            tokens = f["examples"][self.names[user]]["tokens"][()]
        built = client_windows(tokens, self.vocab)
        with self._lock:
            self.reads += 1
            self._sizes[user] = len(built[1])
            self._cache[user] = built
            while len(self._cache) > CACHE_USERS:
                self._cache.popitem(last=False)
        return built

    def size(self, user: int) -> int:
        with self._lock:
            known = self._sizes.get(user)
        return known if known is not None else len(self.arrays(user)[1])

    def unit_counts(self) -> tuple[str, np.ndarray]:
        return "sentences", self.sentences

    def test_record(self) -> dict:
        evaluated, in_file = self.test_sentences
        return {"test_sentences": evaluated, "test_sentences_in_file": in_file}
