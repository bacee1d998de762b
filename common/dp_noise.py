"""Differential privacy's Gaussian noise, from one of two sources (``--dp-noise``; the threat model:
``docs/privacy.md``).

``secure`` (the default): a ChaCha20 stream (``randomgen.ChaCha``, 20 rounds) keyed with 256 bits from the
operating system's CSPRNG (``secrets``), drawn through numpy's ``Generator``. The key is never written anywhere, so
nobody, the run's author included, can regenerate the noise, and a resumed run continues with fresh entropy. Each
value is the sum of four draws of half the standard deviation, as Opacus's ``secure_mode`` does against
floating-point attacks on a single Gaussian draw (Mironov 2012 showed the low bits of one draw leak).

``seeded``: for simulation only, where repeatable runs are the promise. Each draw comes from
``stable_seed(key, *labels)``, ``key`` being the digest of the run's whole configuration
(``jobs.privacy``), so two runs share noise only when they are the same command: a sweep's trials, other
seeds and other noise multipliers draw independent noise. It protects nothing against anyone who knows the command.

Drawing ahead (``draw_ahead``): the server knows the shapes and labels of the next version's noise as soon as it
has made a version, and only its standard deviation later. It draws the unscaled noise then, on a background thread
(numpy's generators fill arrays without the GIL), while the devices train; ``arrays`` then only scales it. Secure
noise of ResNet-18's 11 M parameters takes seconds to draw: this keeps it off the path from an aggregate to its
version. The values are those ``arrays`` would draw at once (the same draws, the same float32 operations).
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Sequence

import numpy as np

from common.seeds import stable_seed

SECURE, SEEDED = "secure", "seeded"
SECURE_DRAWS = 4  # summed, each of standard deviation stddev / 2 (Opacus's secure_mode)


def secure_generator() -> np.random.Generator:
    """A numpy generator over ChaCha20 keyed from the OS's entropy (nothing about it is recorded)."""
    from randomgen import ChaCha

    return np.random.Generator(ChaCha(key=secrets.randbits(256), counter=0, rounds=20))


class GaussianNoise:
    """Args:
    source: ``secure`` or ``seeded`` (see the module docstring).
    key: the run's noise key (``seeded`` only): the digest of its configuration.
    """

    def __init__(self, source: str, key: str | None = None):
        if source not in (SECURE, SEEDED):
            raise ValueError(f"noise source {source!r}: use {SECURE} or {SEEDED}")
        if source == SEEDED and not key:
            raise ValueError("seeded noise needs the run's noise key (jobs.privacy.resolve_privacy)")
        self.source = source
        self.key = key if source == SEEDED else None
        self._secure: np.random.Generator | None = None
        self._lock = threading.Lock()  # one secure stream per process, drawn from by any thread
        self._ahead: tuple[tuple, threading.Thread, list] | None = None  # (shapes and labels, drawer, its arrays)

    @property
    def seeded(self) -> bool:
        return self.source == SEEDED

    def arrays(self, shapes: Sequence[tuple[int, ...]], stddev: float, *labels: object) -> list[np.ndarray]:
        """One float32 array of N(0, stddev^2) per shape, in order. ``labels`` name the draw (e.g. ``"server",
        version``): seeded noise is a function of the key and the labels; secure noise ignores them. A draw of
        these shapes and labels started by ``draw_ahead`` is waited for and scaled, not drawn again."""
        shapes = [tuple(shape) for shape in shapes]
        unscaled = self._taken_ahead(shapes, labels)
        if unscaled is None:
            unscaled = self._unscaled(shapes, labels)
        # seeded: each array is N(0, 1); secure: the sum of SECURE_DRAWS of them, each to be scaled by stddev / 2
        scale = np.float32(stddev) if self.seeded else np.float32(stddev / 2)
        return [values * scale for values in unscaled]

    def draw_ahead(self, shapes: Sequence[tuple[int, ...]], *labels: object) -> None:
        """Start drawing, on a background thread, what ``arrays(shapes, stddev, *labels)`` will need (any
        ``stddev``); a draw started earlier and not taken yet is dropped."""
        shapes = [tuple(shape) for shape in shapes]
        out: list = []
        drawer = threading.Thread(
            target=lambda: out.extend(self._unscaled(shapes, labels)), name="dp-noise-ahead", daemon=True
        )
        self._ahead = ((tuple(shapes), labels), drawer, out)
        drawer.start()

    def _taken_ahead(self, shapes: list[tuple[int, ...]], labels: tuple) -> list[np.ndarray] | None:
        if self._ahead is None or self._ahead[0] != (tuple(shapes), labels):
            return None  # another draw (e.g. adaptive clipping's count) leaves the one ahead waiting
        (_, drawer, out), self._ahead = self._ahead, None
        drawer.join()
        return out if len(out) == len(shapes) else None  # a drawer that failed: draw again, here

    def _unscaled(self, shapes: list[tuple[int, ...]], labels: tuple) -> list[np.ndarray]:
        if self.seeded:
            rng = np.random.default_rng(stable_seed("dp", self.key, *labels))
            return [rng.standard_normal(shape, dtype=np.float32) for shape in shapes]
        with self._lock:
            if self._secure is None:
                self._secure = secure_generator()
            out = []
            for shape in shapes:
                total = self._secure.standard_normal(shape, dtype=np.float32)
                for _ in range(SECURE_DRAWS - 1):
                    total += self._secure.standard_normal(shape, dtype=np.float32)
                out.append(total)
            return out

    def scalar(self, stddev: float, *labels: object) -> float:
        """One draw of N(0, stddev^2), as a Python float (adaptive clipping's count)."""
        if self.seeded:
            return float(np.random.default_rng(stable_seed("dp", self.key, *labels)).normal(0.0, stddev))
        return float(self.arrays([(1,)], 1.0)[0][0]) * stddev
