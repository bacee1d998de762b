"""A pack's shared memory with its leaves (``scheduling.pack_links``): every run's diffs up through each leaf's ring
and every run's versions down through the run's own ring, each run still its standalone run bit for bit; the
fallback to the wire for versions, and the faults that must stop every run (``--bulk shm`` refused by a leaf, a
diff the server cannot read). On the stand-in engine and real leaf updaters of ``test_pack_assessor``."""

from __future__ import annotations

import pytest

from common.protocol import BULK, DEVICE_UPDATES, MODELS, RUN_SECTIONS
from common.shared_ring import HANDLE, is_handle
from tests.scheduling.test_exact_assessor import LEAVES
from tests.scheduling.test_pack_assessor import RUNS, SCALES, drive, pack_of, runs_match_their_standalone_runs


@pytest.mark.parametrize("ring_of_run_1", [True, False])
def test_a_packs_leaves_share_memory_with_every_run_and_each_run_keeps_its_standalone_model(tmp_path, ring_of_run_1):
    """``--bulk auto``: each leaf offers its ring and the pack's server maps it. Every diff of every run then comes
    up as a handle of the leaf's ring, copied out for its run's applier. Each run's global model keeps its versions
    in a ring of its own, named in the answer (run 0's as ``ring``, run 1's in ``runs``), and every version of both
    runs goes down as a handle of its run's ring. When run 1's model keeps no ring, the answer says so
    (``{"ring": None}``: diffs up only) and every version travels packed. Either way each run's trace and model are
    its standalone run's, bit for bit."""
    # rings of a few slots: a version a leaf holds no more must be released (its lease ended) for the next to fit
    pack, components = pack_of(tmp_path, ("auto", "auto" if ring_of_run_1 else "wire"), version_mb=0.03)
    diffs: list[tuple[int, bool]] = []  # each diff that came up: its run, and whether it came as a handle
    versions: list[tuple[int, bool]] = []  # each version that went down: its run, and whether it went as a handle
    answers, kinds = [], set()
    original = pack.process_child_update

    def watched(update, fl_ctx):
        diffs.extend((e.get("run", 0), is_handle(e.get("diff"))) for e in update.get(DEVICE_UPDATES) or ())
        ok, reply = original(update, fl_ctx)
        answers.append(reply.get(BULK))
        for run, part in [(0, reply), *(reply.get(RUN_SECTIONS) or {}).items()]:
            for value in (part.get(MODELS) or {}).values():
                versions.append((run, is_handle(value)))
                kinds.add(value[HANDLE] if is_handle(value) else "packed")
        return ok, reply

    pack.process_child_update = watched
    drive(pack, components, SCALES, bulk={leaf: "auto" for leaf in LEAVES})
    assert [s.outcome["status"] for s in pack.servers] == ["completed", "completed"]
    assert pack.links.choices == {"site-1": "shm", "site-2": "shm"}
    said = [a for a in answers if a]  # one answer to each leaf's offer
    assert {run for run, _ in diffs} == {0, 1} and all(handle for _, handle in diffs), diffs
    assert {run for run, _ in versions} == {0, 1}
    if ring_of_run_1:
        rings = [components[f"global_model.r{i}"].bulk_locator() for i in range(2)]
        assert said == [{"ring": rings[0], "runs": {1: rings[1]}}] * 2 and rings[0] != rings[1]
        assert {run for run, handle in versions if handle} == {0, 1}, versions
        # packed only before a leaf has said it maps the rings: its first reply, for each run
        assert sum(not handle for _, handle in versions) <= 4, versions
        # each in a slot of its run's ring, none spilled to a file: a version no leaf holds frees its slot
        assert kinds == {"packed", "memfd"}, kinds
    else:
        assert said == [{"ring": None}] * 2
        assert not any(handle for _, handle in versions), versions
    runs_match_their_standalone_runs(tmp_path, components)


def test_with_bulk_shm_a_leaf_that_cannot_share_memory_stops_every_run_of_the_pack(tmp_path):
    pack, components = pack_of(tmp_path, bulk="shm")
    drive(pack, components, SCALES, bulk={"site-1": "auto", "site-2": "wire"})
    why = "--bulk shm, but site-2 cannot share memory with the server (--bulk wire)"
    assert [(s.outcome["status"], s.outcome["reason"]) for s in pack.servers] == [("stopped", why)] * 2


def test_a_diff_the_server_cannot_read_from_a_leafs_shared_memory_stops_every_run_of_the_pack(tmp_path):
    """An update lost would make every run inexact: once site-1's ring is unmapped on the server (as for a lost
    leaf) while site-1 still sends its diffs as handles of it, no run goes on."""
    pack, components = pack_of(tmp_path)
    reports = {"site-1": 0}
    original = pack.process_child_update

    def unmapped_after_a_while(update, fl_ctx):
        child = fl_ctx.get_peer_context().get_identity_name()
        if child == "site-1" and pack.started:
            reports["site-1"] += 1
            if reports["site-1"] == 5:
                pack.links.forget("site-1")
        return original(update, fl_ctx)

    pack.process_child_update = unmapped_after_a_while
    drive(pack, components, SCALES, bulk={"site-1": "auto", "site-2": "auto"})
    why = "site-1 sent a diff as a handle of shared memory the server never mapped"
    assert [(s.outcome["status"], s.outcome["reason"]) for s in pack.servers] == [("stopped", why)] * 2
    assert all(s.outcome["version"] < run["max_model_version"] for s, run in zip(pack.servers, RUNS, strict=True))
