"""Datasets whose samples belong to users: the per-user layout every natural-partition source yields, and the
partition's statistics ``metrics.json`` records.

A source that knows each sample's user (LEAF's ``user_data``, TFF's ``examples/<client>``, a Hugging Face
dataset's user-id column) hands ``group_by_user`` one user id per sample. The samples are then reordered so that
each user's are contiguous, users in sorted-name order (so the user list, and with it the device-to-user map of
``processors.data.partition``, does not depend on file order), and ``UserSplit`` keeps the offsets: user ``u``'s
training samples are ``x_train[train_offsets[u]:train_offsets[u + 1]]``. Finding a device's samples is then two
array reads, whatever the number of users. Users with no training sample are dropped (a device must train on
something); their test samples, and test samples of users absent from the training split, follow the grouped ones
in ``x_test`` and count for the global accuracy only.

A source too large to hold (TFF's StackOverflow) gives its training samples per user instead (``UserSplit.lazy``,
a ``LazyUsers``): the split then has no training offsets, and a user's samples are built on first use
(``processors.data.stackoverflow.LazyClientWindows``), so memory grows with the users trained, not the file.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np


class LazyUsers(Protocol):
    """Training samples built per user, on first use (``UserSplit.lazy``)."""

    def arrays(self, user: int) -> tuple[np.ndarray, np.ndarray]:
        """User ``user``'s training inputs and labels."""
        ...

    def size(self, user: int) -> int:
        """How many training samples user ``user`` holds."""
        ...

    def unit_counts(self) -> tuple[str, np.ndarray]:
        """What the source can count per user without building samples (e.g. ``sentences``), and the counts."""
        ...

    def test_record(self) -> dict:
        """What ``metrics.json`` says of the test split the server evaluates on (e.g. a part of the file)."""
        ...


@dataclass(frozen=True, eq=False)  # eq=False: hashed by identity (a Dataset holding it stays hashable)
class UserSplit:
    """Attributes:
    names: the users, sorted.
    train_offsets: ``len(names) + 1`` int64 offsets into the training split (user ``u``: ``[o[u], o[u + 1])``).
    test_offsets: the same into the test split, or None when the format has no per-user test data.
    lazy: the users' training samples, built per user (then ``train_offsets`` is None and the dataset's
        ``x_train`` is empty); None when they are all in ``x_train``.
    """

    names: tuple[str, ...]
    train_offsets: np.ndarray | None
    test_offsets: np.ndarray | None = None
    lazy: LazyUsers | None = None

    @property
    def count(self) -> int:
        return len(self.names)

    def train_range(self, user: int) -> np.ndarray:
        """The training-sample indices of user ``user`` (an index into ``names``): into ``x_train``, or with
        ``lazy`` into the user's own ``lazy.arrays(user)``."""
        if self.lazy is not None:
            return np.arange(self.lazy.size(user))
        return np.arange(self.train_offsets[user], self.train_offsets[user + 1])

    def train_size(self, user: int) -> int:
        """How many training samples user ``user`` holds."""
        if self.lazy is not None:
            return self.lazy.size(user)
        return int(self.train_offsets[user + 1] - self.train_offsets[user])

    def train_sizes(self) -> np.ndarray:
        return np.diff(self.train_offsets)


def group_by_user(
    train_users: np.ndarray, test_users: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray | None, UserSplit]:
    """The order to put each split's samples in (one permutation per split) and the resulting ``UserSplit``.

    ``train_users``/``test_users``: one user id per sample (any type ``str()`` names). The sort is stable, so a
    user's samples keep their file order."""
    train_names = np.asarray([str(u) for u in train_users])
    names, train_inverse = np.unique(train_names, return_inverse=True)  # sorted names
    train_order = np.argsort(train_inverse, kind="stable")
    train_offsets = np.concatenate([[0], np.cumsum(np.bincount(train_inverse, minlength=len(names)))])
    test_order = test_offsets = None
    if test_users is not None:
        test_names = np.asarray([str(u) for u in test_users])
        position = np.searchsorted(names, test_names)
        known = (position < len(names)) & (names[np.minimum(position, len(names) - 1)] == test_names)
        rank = np.where(known, position, len(names))  # unknown users after every known one
        test_order = np.argsort(rank, kind="stable")
        test_offsets = np.concatenate([[0], np.cumsum(np.bincount(rank[known], minlength=len(names)))])
    split = UserSplit(
        tuple(str(n) for n in names),
        train_offsets.astype(np.int64),
        None if test_offsets is None else test_offsets.astype(np.int64),
    )
    return train_order, test_order, split


def gini(values: np.ndarray) -> float:
    """The Gini coefficient of non-negative values: 0 when all are equal, towards 1 when one holds everything."""
    x = np.sort(np.asarray(values, dtype=np.float64))
    n, total = len(x), x.sum()
    if n == 0 or total <= 0:
        return 0.0
    return float(2.0 * np.sum(np.arange(1, n + 1) * x) / (n * total) - (n + 1) / n)


def partition_stats(users: UserSplit, pool: int | None = None) -> dict:
    """What ``metrics.json`` records of a natural partition: users, samples per user (min, median, max, Gini), the
    test users, and with the pool size, devices per user. A lazy source's samples are not counted (that would
    build every user's): its own unit's (``LazyUsers.unit_counts``, e.g. ``sentences_per_user``) instead, and
    what it says of its test split (``LazyUsers.test_record``)."""
    unit, sizes = ("samples", users.train_sizes()) if users.lazy is None else users.lazy.unit_counts()
    stats = {
        "partition": "natural",
        "users": users.count,
        f"train_{unit}": int(sizes.sum()),
        f"{unit}_per_user": {
            "min": int(sizes.min()),
            "median": float(np.median(sizes)),
            "max": int(sizes.max()),
            "gini": round(gini(sizes), 4),
        },
    }
    if users.test_offsets is not None:
        test_sizes = np.diff(users.test_offsets)
        stats["test_users"] = int((test_sizes > 0).sum())
    if users.lazy is not None:
        stats |= users.lazy.test_record()
    if pool is not None:
        stats["devices"] = int(pool)
        stats["devices_per_user"] = round(pool / users.count, 4)
    return stats
