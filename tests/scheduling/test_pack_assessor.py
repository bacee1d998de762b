"""A pack's server (``scheduling.pack_assessor``): two runs of different methods and seeds in one job, their
devices on the same two leaves, each run's trace equal to the reference (standalone) trace and its model equal
to the standalone run's, bit for bit. NVFlare-job free, as ``tests/scheduling/test_exact_assessor.py``: the
assessors, real global models and persistors run on a stand-in engine; each leaf is the real leaf updater
(``simulation.versioned_updater``, keyed by run) whose devices "train" at once (a diff made of the device, the
version and the run's scale), so the whole protocol of a pack travels, run sections included."""

from __future__ import annotations

import json
import random
import time

import numpy as np
from nvflare.apis.event_type import EventType
from nvflare.apis.fl_context import FLContext
from nvflare.edge.assessor import Assessment
from nvflare.edge.mud import BaseState, StateUpdateReport

from aggregation.global_model import GlobalModel
from common.delays import DELAY_PRESETS
from common.protocol import (
    DEVICE_RANGES,
    DEVICE_UPDATES,
    LOCAL_REPORT,
    RELEASES,
    RUN_SECTIONS,
    DeviceUpdate,
)
from scheduling.event_reference import make_schedule, reference_trace
from scheduling.exact_assessor import ExactTimeAssessor
from scheduling.pack_assessor import PackAssessor
from simulation.bulk_link import LeafBulk
from simulation.versioned_updater import VersionedUpdater
from tests.fakes.engine import EventEngine, child_reports
from tests.scheduling.test_exact_assessor import LEAVES, MEAN, ZeroPersistor, device_diff

# two runs: FedBuff-like (B=2, one hole) and FedAvg-like (synchronous rounds of 8), other seeds, other lengths
RUNS = [
    dict(selection_size=8, updates_per_version=2, min_hole_to_fill=1, max_model_version=20, seed=4),
    dict(selection_size=8, updates_per_version=8, min_hole_to_fill=8, max_model_version=6, seed=9),
]
SCALES = [1.0, -3.0]  # each run's devices' diffs, scaled: a diff of the wrong run would show in the model


class UpdaterLeaf:
    """A leaf: the real ``VersionedUpdater`` between the server and devices that train at once. Each sync it takes
    the server's reply, hands out every run's new tasks, and reports a random part of the trained ones (the rest
    later), so the server sees the updates out of order and bunched."""

    def __init__(self, name: str, scales: list[float], bulk: str | None = None):
        self.name, self.scales = name, scales
        link = LeafBulk(bulk, log=lambda _: None) if bulk else None  # its bulk link (None: the wire, unsaid)
        self.updater = VersionedUpdater(sum_selections=False, bulk=link)
        self.updater.start_task(BaseState(0, None, 0, {}).to_shareable(), FLContext())
        self.trained: list[DeviceUpdate] = []
        self.first = True

    def sync(self, assessor, engine: EventEngine, rng: random.Random) -> None:
        local = StateUpdateReport(0, 0, None, None).to_shareable()
        local.set_header(LOCAL_REPORT, True)
        if self.first:
            local[DEVICE_RANGES] = {self.name: [LEAVES[self.name], self.name]}
            self.first = False
        rng.shuffle(self.trained)
        n = rng.randint(0, len(self.trained))
        local[DEVICE_UPDATES], self.trained = self.trained[:n], self.trained[n:]
        self.updater.process_child_update(local, FLContext())
        report = self.updater.prepare_update_for_parent(FLContext())
        reply = child_reports(assessor, engine, self.name, report)
        self.updater.process_parent_update_reply(reply, FLContext())
        prefix = self.name + "#"
        work = {0: self.updater.take_tasks(prefix)} | self.updater.take_run_tasks(prefix)
        for run, (tasks, models) in work.items():
            for device, sid, version, _release in tasks:
                assert models[version].data["w"].shape == (3,)
                # the model a device got goes into its diff: a wrong version, or another run's, changes the result
                weights = np.asarray(models[version].data["w"], np.float32)
                diff = {"w": device_diff(device, version) * np.float32(self.scales[run]) + np.float32(0.25) * weights}
                self.trained.append(DeviceUpdate(device, sid, version, diff, run=run))


def drive(
    assessor, components: dict, scales: list[float], seed: int = 0, bulk: dict[str, str] | None = None
) -> EventEngine:
    """Run ``assessor`` with the two leaves to its end; ``bulk``: each leaf's ``--bulk`` (None: no bulk link)."""
    engine = EventEngine(components | {"wf_assessor": assessor})
    engine.fire_event(EventType.START_RUN, engine.new_context())
    rng = random.Random(seed)
    leaves = [UpdaterLeaf(name, scales, (bulk or {}).get(name)) for name in LEAVES]
    for leaf in leaves:
        leaf.sync(assessor, engine, rng)
    deadline = time.time() + 60
    while assessor.assess(engine.new_context()) != Assessment.WORKFLOW_DONE:
        assert time.time() < deadline, "the runs must end"
        rng.choice(leaves).sync(assessor, engine, rng)
        time.sleep(0.0005)  # the appliers apply on their own threads
    engine.fire_event(EventType.END_RUN, engine.new_context())
    return engine


def standalone(tmp_path, run: dict, scale: float) -> GlobalModel:
    manager = GlobalModel(MEAN, strategy_args={"global_lr": 0.5})
    opts = {k: v for k, v in run.items() if k != "seed"}
    assessor = ExactTimeAssessor(
        "persistor",
        "global_model",
        num_leaves=2,
        delays=DELAY_PRESETS["paper"].to_dict(),
        seed=run["seed"],
        results_dir=str(tmp_path),
        bulk="wire",
        **opts,
    )
    drive(assessor, {"persistor": ZeroPersistor(), "global_model": manager}, [scale], seed=1)
    assert assessor.outcome["status"] == "completed", assessor.outcome
    return manager


def trace_of(folder) -> list[dict]:
    return [json.loads(line) for line in (folder / "events.jsonl").read_text().splitlines()]


def pack_of(
    tmp_path, models_bulk: tuple[str, ...] = ("auto", "auto"), version_mb: float = 256.0, **kwargs
) -> tuple[PackAssessor, dict]:
    """A pack of ``RUNS`` (FedBuff-like and FedAvg-like), and its server components by id; ``models_bulk``: each
    run's global model's ``bulk`` (``wire``: it keeps no ring of versions); ``version_mb``: their rings' MiB."""
    components, runs = {}, []
    for i, run in enumerate(RUNS):
        components[f"persistor.r{i}"] = ZeroPersistor()
        components[f"global_model.r{i}"] = GlobalModel(
            MEAN, strategy_args={"global_lr": 0.5}, bulk=models_bulk[i], version_memory_mb=version_mb
        )
        runs.append(
            run
            | dict(
                persistor_id=f"persistor.r{i}",
                global_model_id=f"global_model.r{i}",
                delays=DELAY_PRESETS["paper"].to_dict(),
                results_dir=str(tmp_path / f"run{i}"),
            )
        )
    return PackAssessor(runs, num_leaves=2, **kwargs), components


def test_each_run_of_a_pack_has_its_standalone_trace_and_model(tmp_path):
    pack, components = pack_of(tmp_path, bulk="wire")
    sections = []
    original = pack.process_child_update

    def watched(update, fl_ctx):  # the later run's part travels in its section, both ways
        ok, reply = original(update, fl_ctx)
        sections.append((1 in (update.get(RUN_SECTIONS) or {}), 1 in (reply.get(RUN_SECTIONS) or {})))
        return ok, reply

    pack.process_child_update = watched
    drive(pack, components, SCALES)
    assert [s.outcome["status"] for s in pack.servers] == ["completed", "completed"]
    assert any(up for up, _ in sections) and any(down for _, down in sections)
    runs_match_their_standalone_runs(tmp_path, components)


def runs_match_their_standalone_runs(tmp_path, components: dict) -> None:
    """Each run of the pack driven in ``tmp_path``: its trace the reference's, its model the standalone run's."""
    for i, run in enumerate(RUNS):
        kw = {k: v for k, v in run.items() if k != "seed"}
        expected = reference_trace(make_schedule(DELAY_PRESETS["paper"], run["seed"], LEAVES, **kw))
        assert trace_of(tmp_path / f"run{i}") == expected, f"run {i}'s trace is its standalone trace"
        alone = standalone(tmp_path / f"alone{i}", run, SCALES[i])
        assert trace_of(tmp_path / f"alone{i}") == expected
        packed = components[f"global_model.r{i}"]
        assert packed.current_version == alone.current_version == run["max_model_version"]
        assert packed.current_weights["w"].tobytes() == alone.current_weights["w"].tobytes(), f"run {i}'s model"


def test_a_pack_ends_when_its_last_run_has_ended(tmp_path):
    """The shorter run ends first; the job goes on until the longer one is done, and each keeps its outcome."""
    components, runs = {}, []
    for i, run in enumerate(RUNS):
        components[f"p{i}"] = ZeroPersistor()
        components[f"g{i}"] = GlobalModel(MEAN)
        runs.append(run | dict(persistor_id=f"p{i}", global_model_id=f"g{i}", results_dir=str(tmp_path / str(i))))
    pack = PackAssessor(runs, num_leaves=2)
    seen = []
    original = pack.assess

    def watched(fl_ctx):
        verdict = original(fl_ctx)
        seen.append((verdict, tuple(s.outcome is not None for s in pack.servers)))
        return verdict

    pack.assess = watched
    drive(pack, components, SCALES)
    assert (Assessment.CONTINUE, (False, True)) in seen, "the short run ended while the long one went on"
    assert seen[-1] == (Assessment.WORKFLOW_DONE, (True, True))
    assert [s.outcome["version"] for s in pack.servers] == [20, 6]


def test_a_waiting_run_joins_when_a_place_is_free_after_every_release_so_far_with_its_standalone_trace(tmp_path):
    """``at_once``: two runs go, the third waits. Until it joins, every reply says it makes no release and has ended
    (so a leaf's lock-step never waits for it); it joins once the short run ends, its releases numbered from the
    most any run had made (a leaf's next lock-step release, never one behind it); and its trace and model are its
    standalone run's, bit for bit, its schedule starting at simulated time 0 as its own job's would."""
    waiting = dict(selection_size=8, updates_per_version=2, min_hole_to_fill=1, max_model_version=8, seed=11)
    order = [RUNS[1], RUNS[0], waiting]  # the short FedAvg-like run first: its end frees the place
    scales = [SCALES[1], SCALES[0], 2.0]
    components, runs = {}, []
    for i, run in enumerate(order):
        components[f"p{i}"] = ZeroPersistor()
        components[f"g{i}"] = GlobalModel(MEAN, strategy_args={"global_lr": 0.5})
        runs.append(
            run
            | dict(
                persistor_id=f"p{i}",
                global_model_id=f"g{i}",
                delays=DELAY_PRESETS["paper"].to_dict(),
                results_dir=str(tmp_path / f"run{i}"),
            )
        )
    pack = PackAssessor(runs, num_leaves=2, at_once=2)
    said: list[tuple[list, list, bool]] = []  # each reply: run 0's and 1's RELEASES, run 2's, run 0 ended
    original = pack.process_child_update

    def watched(update, fl_ctx):
        ok, reply = original(update, fl_ctx)
        sections = reply.get(RUN_SECTIONS) or {}
        if RELEASES in reply:
            said.append(([reply[RELEASES], sections[1][RELEASES]], sections[2][RELEASES], pack.servers[0].outcome))
        return ok, reply

    pack.process_child_update = watched
    drive(pack, components, scales)
    assert [s.outcome["status"] for s in pack.servers] == ["completed"] * 3
    before = [s for s in said if s[1] == [0, True]]
    after = [s for s in said if s[1] != [0, True]]
    assert before and after and said.index(after[0]) == len(before), "waiting, then joined: never back"
    assert all(not s[2] or s[2]["status"] == "completed" for s in before)
    assert after[0][2] is not None, "it joined only once the short run had ended"
    made = max(r[0] for s in before for r in s[0])
    assert after[0][1][0] >= made, "its releases start after every release a leaf was told of"
    assert pack.offsets[2] >= made
    kw = {k: v for k, v in waiting.items() if k != "seed"}
    expected = reference_trace(make_schedule(DELAY_PRESETS["paper"], waiting["seed"], LEAVES, **kw))
    assert trace_of(tmp_path / "run2") == expected, "the joined run's trace is its standalone trace"
    alone = standalone(tmp_path / "alone", waiting, 2.0)
    joined = components["g2"]
    assert joined.current_version == alone.current_version == 8
    assert joined.current_weights["w"].tobytes() == alone.current_weights["w"].tobytes()


def test_a_pack_starts_once_every_runs_pool_has_every_leaf_not_when_a_resumed_runs_restored_pool_has(tmp_path):
    """A resumed run's pool comes back from its checkpoint with every leaf's devices; a new run's (one that never
    began before the pack was stopped) holds only the leaves heard in this job. Started on the resumed pool alone,
    the new run would draw its first selection from one leaf's devices: another schedule than its own job's."""
    components, runs = {}, []
    for i, run in enumerate(RUNS):
        components[f"p{i}"] = ZeroPersistor()
        components[f"g{i}"] = GlobalModel(MEAN, strategy_args={"global_lr": 0.5})
        delays = DELAY_PRESETS["paper"].to_dict()
        runs.append(run | dict(persistor_id=f"p{i}", global_model_id=f"g{i}", delays=delays, results_dir=str(tmp_path)))
    pack = PackAssessor(runs, num_leaves=2)
    engine = EventEngine(components | {"wf_assessor": pack})
    engine.fire_event(EventType.START_RUN, engine.new_context())
    for name, count in LEAVES.items():  # what a resume restores into run 0's pool
        pack.servers[0].schedule.pool.register_range(name, count, name)
    first, second = (UpdaterLeaf(name, SCALES) for name in LEAVES)
    first.sync(pack, engine, random.Random(0))
    assert not pack.started and not pack.offsets, "one leaf heard: run 1's pool lacks the other's devices"
    second.sync(pack, engine, random.Random(0))
    assert pack.started and sorted(pack.offsets) == [0, 1]


def test_with_on_leaf_loss_continue_every_run_goes_on_without_a_lost_leaf_and_a_waiting_run_begins_without_it(
    tmp_path,
):
    """``on_leaf_loss="continue"``: site-2 goes silent once both running runs have made versions. Both go on and
    complete: its devices in flight fail (updates of no weight), and none of them is selected again. The run waiting
    for a place begins after the loss on site-1 alone: its trace is the reference trace of a fleet of site-1 only."""
    waiting = dict(selection_size=4, updates_per_version=2, min_hole_to_fill=1, max_model_version=8, seed=11)
    order = [RUNS[1], RUNS[0], waiting]  # the short FedAvg-like run first: its end frees the place
    components, runs = {}, []
    for i, run in enumerate(order):
        components[f"p{i}"] = ZeroPersistor()
        components[f"g{i}"] = GlobalModel(MEAN, strategy_args={"global_lr": 0.5})
        delays = DELAY_PRESETS["paper"].to_dict()
        runs.append(
            run
            | dict(persistor_id=f"p{i}", global_model_id=f"g{i}", delays=delays, results_dir=str(tmp_path / f"run{i}"))
        )
    pack = PackAssessor(runs, num_leaves=2, at_once=2, leaf_timeout=1.0, on_leaf_loss="continue")
    engine = EventEngine(components | {"wf_assessor": pack})
    engine.fire_event(EventType.START_RUN, engine.new_context())
    rng = random.Random(0)
    first, second = (UpdaterLeaf(name, [SCALES[1], SCALES[0], 2.0]) for name in LEAVES)
    deadline = time.time() + 60
    while not (pack.started and min(pack.servers[r].schedule.version for r in (0, 1)) >= 2):
        assert time.time() < deadline
        rng.choice([first, second]).sync(pack, engine, rng)
        assert pack.assess(engine.new_context()) == Assessment.CONTINUE
    assert 2 not in pack.offsets, "the third run still waits when site-2 goes silent"
    while pack.assess(engine.new_context()) != Assessment.WORKFLOW_DONE:
        assert time.time() < deadline, "the runs must end"
        first.sync(pack, engine, rng)
        time.sleep(0.0005)
    engine.fire_event(EventType.END_RUN, engine.new_context())
    assert "site-2" in pack.leaves.lost
    assert [s.outcome["status"] for s in pack.servers] == ["completed"] * 3, [s.outcome for s in pack.servers]
    for run in (0, 1):
        events = trace_of(tmp_path / f"run{run}")
        failed = [e for e in events if e.get("failed")]
        assert failed and all(e["device"].startswith("site-2#") for e in failed), run
        lost_at = max(e["base_version"] for e in failed)
        later = [e for e in events if e["base_version"] > lost_at]
        assert later and not any(e["device"].startswith("site-2#") for e in later), run
    kw = {k: v for k, v in waiting.items() if k != "seed"}
    site_1 = {"site-1": LEAVES["site-1"]}
    expected = reference_trace(make_schedule(DELAY_PRESETS["paper"], waiting["seed"], site_1, **kw))
    assert trace_of(tmp_path / "run2") == expected, "the waiting run began on the living leaf alone"


def test_each_runs_global_model_spills_its_versions_to_a_folder_of_its_own_in_the_shared_app_folder(tmp_path):
    """The runs of a pack share the server app's folder and number their versions alike. A ResNet-18 pack's runs
    once spilled to one ``spilled_versions/`` folder: run 1's version 3 overwrote run 0's file, and the first run
    to end removed the folder under the others ("mmap length is greater than file size", then "No such file").
    Each global model now spills to a folder of its own: its old versions read back as made, after the other ends."""
    from nvflare.apis.fl_constant import FLContextKey

    engine = EventEngine({})
    ctx = engine.new_context()
    ctx.set_prop(FLContextKey.APP_ROOT, str(tmp_path), private=True, sticky=False)
    models = [GlobalModel(MEAN, strategy_args={"global_lr": 1.0}, bulk="wire", version_memory_mb=1e-5) for _ in SCALES]
    for scale, model in zip(SCALES, models, strict=True):
        model.start({"w": np.zeros(3, np.float32)}, 1, ctx)
        for version in range(2, 6):  # a version is 12 bytes: every one but the newest is spilled
            diff = {"w": np.full(3, scale * version, np.float32)}
            model.add_update(DeviceUpdate("site-1#0", version, version - 1, diff), 0, ctx)
            model.make_version(version, float(version), ctx)
    folders = sorted(p.name for p in tmp_path.iterdir())
    assert len(folders) == 2 and all(f.startswith("spilled_versions-") for f in folders), folders
    models[1].start({"w": np.zeros(3, np.float32)}, 1, ctx)  # run 1 begins anew: its spilled versions removed
    expected = np.float32(SCALES[0]) * np.float32(2 + 3)  # run 0's version 3: the initial zeros plus its diffs
    assert np.asarray(models[0].weights_of(3)["w"]).tolist() == [expected] * 3
