"""A pack's bulk links to its leaves (``scheduling.pack_assessor``'s part; ``common.bulk_parent`` for one run).

A leaf has one ring for its diffs whatever their run, so diffs up need nothing per run: each handle is copied out
of the leaf's ring as its report is read. Versions down do: each run's global model keeps its versions in a ring of
its own, so the answer to a leaf's offer names run 0's as a standalone job's does (``ring``) and every later run's
in ``runs``, and a version goes down as a handle of its run's ring (``LeafBulk`` maps each; the run's section of a
report says which it still holds). When a run's model keeps no ring (``--bulk wire`` on the server, or no shared
memory), the answer is ``{"ring": None}``: diffs up only, every version on NVFlare's wire.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from common.bulk_parent import BulkLinks


class PackLinks(BulkLinks):
    """Args:
    mode: the runs' ``--bulk``: ``auto``, ``shm`` or ``wire``.
    log: logs one line (a leaf's choice).
    servers: the pack's ``RunServer``s, run 0 first (their global models, once the job has started).
    """

    def __init__(self, mode: str, log: Callable[[str], None], servers: list):
        super().__init__(mode, log)
        self.servers = servers

    def take(self, child: str, word: dict | None) -> dict | None:
        """Take a leaf's word on its link (``BULK``); the reply's word (None: nothing to say)."""
        first = self.servers[0].global_model
        if not word or "offer" not in word:
            return self.on_report(child, word, first)
        rings = [server.global_model.bulk_locator() for server in self.servers]
        self.versions = all(ring is not None for ring in rings)  # made at the job's start: every leaf hears the same
        answer = self.on_report(child, word, first)
        if answer and answer.get("ring") is not None:
            answer = answer | {"runs": {run: ring for run, ring in enumerate(rings) if run}}
        return answer

    def model_of(self, child: str, server) -> Callable[[int], dict]:
        """How a version of ``server``'s run goes to ``child``: a handle of the run's ring, or packed."""
        return functools.partial(self._model_of, child, server)

    def _model_of(self, child: str, server, version: int) -> dict:
        return self.model(child, version, server.global_model, server.applier.model)
