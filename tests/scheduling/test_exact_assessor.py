"""The server applies updates in simulated arrival order however late, out of order or bunched the leaves report
them: its trace and its model equal the reference's. NVFlare-job free: the assessor, a real model manager and a
persistor run on a stand-in engine, and scripted leaves report through the assessor's NVFlare interface."""

from __future__ import annotations

import json
import random
import time

import numpy as np
import pytest
from nvflare.apis.event_type import EventType
from nvflare.app_common.abstract.learnable_persistor import LearnablePersistor
from nvflare.app_common.abstract.model import make_model_learnable
from nvflare.app_common.app_constant import AppConstants
from nvflare.app_common.app_event_type import AppEventType
from nvflare.edge.assessor import Assessment
from nvflare.edge.mud import PropKey, StateUpdateReport

from aggregation.global_model import GlobalModel
from common.delays import DELAY_PRESETS
from common.packed_maps import unpacked_map
from common.protocol import (
    BULK,
    DEVICE_RANGES,
    DEVICE_UPDATES,
    HELD_VERSIONS,
    MODELS,
    SELECTION_RELEASES,
    SELECTION_SUMS,
    SELECTION_VERSIONS,
    SIM_TIME,
    WAKE_TOPIC,
    DeviceUpdate,
    SelectionSum,
)
from common.shared_ring import is_handle
from scheduling.event_reference import make_schedule, reference_trace
from scheduling.exact_assessor import ExactTimeAssessor
from simulation.bulk_link import LeafBulk
from tests.fakes.engine import EventEngine, child_reports

LEAVES = {"site-1": 12, "site-2": 12}

MEAN = "aggregation.buffered_mean:BufferedMean"


class ZeroPersistor(LearnablePersistor):
    def load(self, fl_ctx):
        return make_model_learnable({"w": np.zeros(3, np.float32)}, {})

    def save(self, learnable, fl_ctx):
        pass


def device_diff(device: str, version: int) -> np.ndarray:
    """A deterministic diff per device and base version (what training would give, without training)."""
    index = int(device.split("#")[1]) + (100 if device.startswith("site-2") else 0)
    return np.array([index, version, 1.0], np.float32) / 100


class ScriptedLeaf:
    """Holds what the server told it; trains (instantly) any subset of its selected devices and reports them.
    ``bulk``: its diffs up and versions down go through its bulk link (``simulation.bulk_link``) as a leaf's do;
    None: plain dicts, no word on shared memory."""

    def __init__(self, name: str, sums: bool = False, bulk: str | None = None):
        self.name, self.version, self.selection_version, self.sums = name, 0, 0, sums
        self.bulk = LeafBulk(bulk, log=lambda _: None) if bulk else None
        self.handles = 0  # diffs sent and versions received as handles of shared memory
        self.selection: dict[str, int] = {}
        self.versions: dict[int, int] = {}
        self.models: set[int] = set()
        self.reported: set[tuple[str, int]] = set()
        self.held: list[dict] = []  # reported device updates not yet sent up as a sum
        self.sent_models = 0  # models the server sent it
        self.releases: dict[tuple[str, int], int] = {}  # (device, selection id) -> the release it came in

    def report(self, assessor: ExactTimeAssessor, engine: EventEngine, rng: random.Random, first=False) -> None:
        todo = [(d, s) for d, s in self.selection.items() if (d, s) not in self.reported]
        rng.shuffle(todo)
        batch = todo[: rng.randint(0, len(todo))]  # some, in any order; the rest later
        shareable = StateUpdateReport(self.version, self.selection_version, None, None).to_shareable()
        shareable[HELD_VERSIONS] = sorted(self.models)  # the server sends only the versions it lacks
        word = self.bulk.report_word() if self.bulk is not None else None
        if word:
            shareable[BULK] = word
        if first:
            shareable[DEVICE_RANGES] = {self.name: [LEAVES[self.name], self.name]}
        updates = []
        for device, sid in batch:
            base = self.versions[sid]
            assert base in self.models, "the server did not send a version a selected device needs"
            updates.append(
                {
                    "device": device,
                    "selection_id": sid,
                    "base_version": base,
                    "diff": {"w": device_diff(device, base)},
                    "count": 1,
                }
            )
            self.reported.add((device, sid))
        if self.sums:  # a synchronous leaf: one sum per selection once all its devices of it have reported
            self.held += updates
            sums = []
            for sid in sorted({u["selection_id"] for u in self.held}):
                mine = [u for u in self.held if u["selection_id"] == sid]
                if {u["device"] for u in mine} >= {d for d, s in self.selection.items() if s == sid}:
                    summed = SelectionSum.of([DeviceUpdate.from_dict(u) for u in mine])
                    sums.append(summed.to_dict(self.bulk.pack_diff) if self.bulk is not None else summed.to_dict())
                    self.held = [u for u in self.held if u["selection_id"] != sid]
            shareable[SELECTION_SUMS] = sums
        else:
            shareable[DEVICE_UPDATES] = updates
        if self.bulk is not None:
            for entry in shareable.get(DEVICE_UPDATES) or ():
                entry["diff"] = self.bulk.pack_diff(entry["diff"])
            self.handles += sum(is_handle(e["diff"]) for e in (shareable.get(DEVICE_UPDATES) or ()))
            self.handles += sum(is_handle(e["diff"]) for e in (shareable.get(SELECTION_SUMS) or ()))
        reply = child_reports(assessor, engine, self.name, shareable)
        if self.bulk is not None:
            self.bulk.on_reply(reply.get(BULK))
        version = reply.get_header(PropKey.MODEL_VERSION)
        if version:
            for v, value in (reply.get(MODELS) or {}).items():
                if self.bulk is not None:  # the bits the server keeps, wherever they came from
                    weights = self.bulk.weights(v, value)
                    assert weights["w"].tobytes() == assessor.global_model.weights_of(v)["w"].tobytes()
                    self.handles += is_handle(value)
            self.models.update(reply.get(MODELS) or {})  # what it holds: only what was sent
            self.sent_models += len(reply.get(MODELS) or {})
            self.version = version
        if PropKey.DEVICE_SELECTION in reply:
            self.selection = unpacked_map(reply[PropKey.DEVICE_SELECTION])
            self.selection_version = reply.get_header(PropKey.DEVICE_SELECTION_VERSION)
        self.versions = unpacked_map(reply.get(SELECTION_VERSIONS)) or {}
        releases = unpacked_map(reply.get(SELECTION_RELEASES)) or {}
        for device, sid in self.selection.items():
            assert sid in releases, "every device a leaf is told of came in a release"
            assert self.releases.setdefault((device, sid), releases[sid]) == releases[sid], "a release never changes"


def run_scripted(
    tmp_path,
    kw: dict,
    sums: bool = False,
    seed: int = 0,
    delays=DELAY_PRESETS["paper"],
    bulk: str | None = None,
    version_mb: float = 256.0,
) -> tuple:
    """A run of the assessor with two scripted leaves reporting at random (``seed``); the manager, the leaves.
    ``bulk``: the run's ``--bulk``, on the server and the leaves (None: the server's default, leaves that say
    nothing of shared memory); ``version_mb``: its ``--version-memory-mb``."""
    manager = GlobalModel(MEAN, strategy_args={"global_lr": 0.5}, bulk=bulk or "auto", version_memory_mb=version_mb)
    assessor = ExactTimeAssessor(
        "persistor",
        "global_model",
        num_leaves=2,
        delays=delays.to_dict(),
        seed=4,
        results_dir=str(tmp_path),
        bulk=bulk or "auto",
        **kw,
    )
    engine = EventEngine({"persistor": ZeroPersistor(), "global_model": manager, "wf_assessor": assessor})
    engine.fire_event(EventType.START_RUN, engine.new_context())
    rng = random.Random(seed)
    leaves = [ScriptedLeaf("site-1", sums, bulk), ScriptedLeaf("site-2", sums, bulk)]
    leaves[0].report(assessor, engine, rng, first=True)
    assert manager.current_version == 0, "no selection before every leaf registered its devices"
    leaves[1].report(assessor, engine, rng, first=True)
    deadline = time.time() + 60
    while assessor.assess(engine.new_context()) != Assessment.WORKFLOW_DONE and time.time() < deadline:
        rng.choice(leaves).report(assessor, engine, rng)
        time.sleep(0.0005)  # the server applies on its own thread
    assert assessor.outcome["status"] == "completed", assessor.outcome
    engine.fire_event(EventType.END_RUN, engine.new_context())
    return manager, leaves, engine


@pytest.mark.parametrize(
    "b, hole, sums, bulk, version_mb",
    [(2, 1, False, None, 256), (1, 1, False, None, 256), (8, 8, False, None, 256), (8, 8, True, None, 256)]
    + [(2, 1, False, "auto", 256), (2, 1, False, "auto", 0.01), (8, 8, True, "auto", 256), (2, 1, False, "wire", 256)],
)
def test_reports_in_any_order_give_the_reference_trace_and_model(tmp_path, b, hole, sums, bulk, version_mb):
    """Also with the leaves' bulk links (``auto``: diffs and versions through shared memory, with a ring of two
    slots at 0.01 MB, the other versions in files; ``wire``): the same trace and the same bits."""
    kw = dict(selection_size=8, updates_per_version=b, min_hole_to_fill=hole, max_model_version=25)
    manager, leaves, engine = run_scripted(tmp_path, kw, sums, bulk=bulk, version_mb=version_mb)
    assessor = engine.get_component("wf_assessor")
    if bulk == "auto":  # shared memory carried diffs and versions, both ways
        assert assessor.links.choices == {"site-1": "shm", "site-2": "shm"}
        assert all(leaf.handles > 10 for leaf in leaves)
        assert (manager.peak_kept[2] > 0) == (version_mb < 1)  # versions in files past a full ring
    elif bulk == "wire":
        assert set(assessor.links.choices.values()) == {"wire: --bulk wire"}
        assert not any(leaf.handles for leaf in leaves)
    expected = reference_trace(make_schedule(DELAY_PRESETS["paper"], 4, LEAVES, **kw))
    trace = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert trace == expected
    # the model: each version the mean of its B diffs, x 0.5, added in the order their devices are applied (a
    # leaf's sum, itself added in device-id order, when the first of its devices is applied)
    weights = np.zeros(3, np.float32)
    for version in range(2, 26):
        records = [r for r in expected if r["version"] == version]
        parts: dict[tuple, list] = {}
        for r in records:
            key = (r["device"].split("#")[0], r["base_version"]) if sums else (r["device"],)
            parts.setdefault(key, []).append(r)
        terms = []
        for group in parts.values():
            ordered = sorted(group, key=lambda r: r["device"])
            term = device_diff(ordered[0]["device"], ordered[0]["base_version"]).copy()
            for r in ordered[1:]:
                term += device_diff(r["device"], r["base_version"])
            terms.append(term)
        total = terms[0].copy()
        for t in terms[1:]:
            total += t
        weights = weights + np.float32(0.5 / len(records)) * total
    assert manager.current_version == 25
    np.testing.assert_array_equal(manager.current_weights["w"], weights)
    # the applier, waiting for an update that has not come, woke the leaves with news (and only leaves)
    woken = [set(targets) for targets, topic in engine.aux_sent if topic == WAKE_TOPIC]
    assert woken and set().union(*woken) <= set(LEAVES)
    # a model travels to a leaf once, and only when one of its devices trains it: never more often than versions
    assert all(leaf.sent_models <= len({r["base_version"] for r in expected}) for leaf in leaves)


def test_the_global_model_announces_each_version_with_its_simulated_time():
    seen = []

    class Listener(ZeroPersistor):
        def handle_event(self, event_type, fl_ctx):
            if event_type == AppEventType.GLOBAL_WEIGHTS_UPDATED:
                seen.append((fl_ctx.get_prop(AppConstants.CURRENT_ROUND), fl_ctx.get_prop(SIM_TIME)))

    manager = GlobalModel(MEAN)
    engine = EventEngine({"m": manager, "l": Listener()})
    ctx = engine.new_context()
    manager.start({"w": np.zeros(1)}, 1, ctx)
    manager.make_version(2, 2.5, ctx)
    assert seen == [(1, 0.0), (2, 2.5)]


def reference_releases(kw: dict) -> set[frozenset]:
    """The releases the schedule alone implies (devices selected since the last release go out together when the
    update due next is one of them): each a set of (device, selection id)."""
    schedule = make_schedule(DELAY_PRESETS["paper"], 4, LEAVES, **kw)
    held = {(d.device, d.selection_id) for d in schedule.start()}
    releases = []
    while not schedule.done:
        due = schedule.next_due()
        if (due.device, due.selection_id) in held:
            releases.append(frozenset(held))
            held = set()
        _, selected = schedule.apply(due.device)
        held |= {(d.device, d.selection_id) for d in selected}
    return set(releases)


@pytest.mark.parametrize("b, hole", [(2, 1), (8, 8)])
def test_releases_are_the_schedules_whatever_the_leaves_timing_and_mix_versions_in_async_runs(tmp_path, b, hole):
    """Devices reach the leaves in releases that the schedule alone decides: runs whose leaves report at different
    moments see the same releases. An asynchronous release holds devices of several selections (versions); a
    synchronous round is one release of one selection."""
    kw = dict(selection_size=8, updates_per_version=b, min_hole_to_fill=hole, max_model_version=25)
    seen = []
    for seed in (0, 1):
        _, leaves, _ = run_scripted(tmp_path / str(seed), kw, seed=seed)
        parts: dict[tuple[str, int], set] = {}  # (leaf, release) -> its devices there
        for leaf in leaves:
            for key, release in leaf.releases.items():
                parts.setdefault((leaf.name, release), set()).add(key)
        seen.append({frozenset(keys) for keys in parts.values()})
    expected = reference_releases(kw)
    per_leaf = {frozenset(k for k in r if k[0].startswith(f"{leaf}#")) for r in expected for leaf in LEAVES} - {
        frozenset()
    }
    # each leaf's part of each release is the schedule's (a leaf may not hear of the last ones before the end)
    assert seen[0] <= per_leaf and seen[1] <= per_leaf and len(seen[0]) >= len(per_leaf) - 4
    sids_per_release = [len({sid for _, sid in release}) for release in expected]
    if hole == 1:
        assert max(sids_per_release) > 1  # several versions in one release: trained together
        assert len(expected) < 25 * b // 2  # far fewer releases than updates (each selected one device)
    else:
        assert set(sids_per_release) == {1}
