"""Writing result files so that a reader (or a crash) never sees half of one."""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Iterator

WRITING = ".writing-"  # the prefix of a writer's folder (a killed writer's is cleared by the next run's start)


@contextlib.contextmanager
def replacing(path: str) -> Iterator[str]:
    """A temporary path to write ``path``'s new content to, renamed over ``path`` when the block ends without error
    (removed otherwise).

    Each writer (process and thread) has a folder of its own beside ``path``, so two threads writing ``path`` at once
    never share a temporary file nor rename it from under each other (which lands last is the caller's to order).
    The file keeps the name ``NAME.tmp``: ``torch.save`` names its archive after the file (``NAME/data.pkl``), so the
    bytes of a saved model do not depend on who wrote it."""
    folder, name = os.path.split(path)
    own = os.path.join(folder, f"{WRITING}{os.getpid()}-{threading.get_ident()}")
    os.makedirs(own, exist_ok=True)
    tmp = os.path.join(own, f"{name}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    finally:
        with contextlib.suppress(OSError):
            os.rmdir(own)


def write_json_atomic(path: str, payload: dict) -> None:
    """Write ``payload`` to a temporary file beside ``path``, then rename it over ``path``."""
    with replacing(path) as tmp, open(tmp, "w") as f:
        json.dump(payload, f, indent=2)


class JsonlWriter:
    """Appends one JSON object per line to a file kept open (thread-safe), flushing each line unless told not to
    (a writer of many lines a second flushes when it has a moment: ``flush``)."""

    def __init__(self, path: str):
        self.path = path
        self._lock = threading.Lock()
        self._file = open(path, "a")  # noqa: SIM115 - kept open for the writer's lifetime, closed in close()

    def write(self, record: dict, flush: bool = True) -> None:
        line = json.dumps(record) + "\n"
        with self._lock:
            self._file.write(line)
            if flush:
                self._file.flush()

    def write_many(self, records: list[dict]) -> None:
        """Several lines, one flush."""
        text = "".join(json.dumps(r) + "\n" for r in records)
        with self._lock:
            self._file.write(text)
            self._file.flush()

    def flush(self) -> None:
        with self._lock:
            self._file.flush()

    def truncate(self, lines: int) -> None:
        """Keep only the first ``lines`` lines (a resumed run rewrites what came after its checkpoint)."""
        with self._lock:
            self._file.close()
            with open(self.path) as f:
                kept = [line for _, line in zip(range(lines), f, strict=False)]
            with open(self.path, "w") as f:
                f.writelines(kept)
            self._file = open(self.path, "a")  # noqa: SIM115

    def close(self) -> None:
        with self._lock:
            self._file.close()
