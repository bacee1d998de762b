"""Text tasks: next-character prediction on token ids, and the seeded generated text the tests and
``--dataset synthetic-text`` train on.

A text task's ``Dataset`` (``processors.data.sources``) holds int64 inputs N x L, each row the ids of L characters
(LEAF's Shakespeare windows: L = 80), and int64 labels, the id of the character that follows. Ids index LEAF's
80-symbol alphabet (``ALL_LETTERS``, ``models/utils/language_utils.py`` in LEAF). Such inputs are used as they are:
no standardisation, no augmentation, no image shape.

The generated text is a seeded first-order Markov chain over ``GENERATED_SYMBOLS`` (lower-case letters, space and
a little punctuation): each symbol is followed by one of ``SUCCESSORS`` symbols of its own, with weights drawn per
symbol. The next character thus depends on the last one, which a char-LSTM learns within a few dozen steps, while
the most frequent character alone (the frequency baseline) predicts few of them.
"""

from __future__ import annotations

import numpy as np
import torch

ALL_LETTERS = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
VOCAB_SIZE = len(ALL_LETTERS)  # 80
WINDOW = 80  # LEAF's Shakespeare sequence length
GENERATED_SYMBOLS = " .,abcdefghijklmnopqrstuvwxyz"
SUCCESSORS = 3


SPACE_ID = ALL_LETTERS.index(" ")  # what the file readers make of a character outside the alphabet
_CODES = np.array([ord(c) for c in ALL_LETTERS], dtype=np.int64)
_ORDER = np.argsort(_CODES)
_SORTED_CODES = _CODES[_ORDER]


def token_ids(text: str, unknown: int | None = None) -> np.ndarray:
    """The ids (int64) of ``text``'s characters: each one's position in ``ALL_LETTERS``. A character outside it is
    ``unknown``'s id, or a ``ValueError`` when ``unknown`` is None (the generated text must not hold one). LEAF's
    own lookup gives -1; the readers of LEAF's, TFF's and Hugging Face's files pass ``SPACE_ID``, so a stray
    character can never index outside an embedding."""
    codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32).astype(np.int64)
    position = np.searchsorted(_SORTED_CODES, codes).clip(0, len(_CODES) - 1)
    found = _SORTED_CODES[position] == codes
    if unknown is None and not found.all():
        raise ValueError(f"character {text[int(np.argmin(found))]!r} is not in LEAF's 80-symbol alphabet")
    return np.where(found, _ORDER[position], unknown if unknown is not None else 0).astype(np.int64)


def windows(ids: np.ndarray, window: int = WINDOW, short_ok: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Every ``window``-long run of ``ids`` (N x window) and the id that follows each (N), as LEAF cuts a role's
    text: one sample per position. Fewer than ``window + 1`` ids make no sample: a ``ValueError``, or with
    ``short_ok`` (a file's short user) empty arrays."""
    n = len(ids) - window
    if n < 1:
        if short_ok:
            return np.zeros((0, window), np.int64), np.zeros(0, np.int64)
        raise ValueError(f"{len(ids)} characters make no {window}-character window with a next character")
    x = np.lib.stride_tricks.sliding_window_view(ids[:-1], window)[:n]
    return np.ascontiguousarray(x), ids[window:].copy()


def markov_chain(seed: int) -> np.ndarray:
    """The generated text's transition matrix over ``GENERATED_SYMBOLS`` (rows sum to 1; ``SUCCESSORS`` non-zero
    entries each, none of them the symbol itself)."""
    rng = np.random.default_rng([seed, 7])  # its own stream: the chain does not depend on how much text is drawn
    k = len(GENERATED_SYMBOLS)
    chain = np.zeros((k, k))
    for s in range(k):
        nexts = rng.choice([t for t in range(k) if t != s], size=SUCCESSORS, replace=False)
        chain[s, nexts] = rng.dirichlet(np.ones(SUCCESSORS))
    return chain


def generate_text(length: int, seed: int, stream: int = 0) -> str:
    """``length`` characters of the seeded chain (``stream`` draws an independent text from the same chain)."""
    chain = markov_chain(seed)
    rng = np.random.default_rng([seed, 11, stream])
    cumulative = chain.cumsum(1)
    draws = rng.random(length)
    state = int(rng.integers(len(GENERATED_SYMBOLS)))
    out = np.empty(length, dtype=np.int64)
    for i, u in enumerate(draws):
        state = min(int(np.searchsorted(cumulative[state], u, side="right")), len(GENERATED_SYMBOLS) - 1)
        out[i] = state
    return "".join(GENERATED_SYMBOLS[i] for i in out)


def make_synthetic_text(
    n_train: int, n_test: int, seed: int, window: int = WINDOW
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``n_train`` and ``n_test`` next-character samples (int64 windows and next ids) of two independent texts
    of the seeded chain."""
    splits = []
    for stream, n in enumerate((n_train, n_test)):
        x, y = windows(token_ids(generate_text(n + window, seed, stream)), window)
        splits += [torch.from_numpy(x), torch.from_numpy(y)]
    return tuple(splits)
