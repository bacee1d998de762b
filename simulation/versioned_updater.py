"""A leaf's (or relay's) view of the run: the model versions its selected devices train, and what goes up.

NVFlare's ``EdgeModelUpdater`` holds one model (the newest) and sums device diffs per model version. On exact
simulated time a device trains the version that was current when the server selected it, and the server applies
each device's update on its own (``scheduling.exact_assessor``), so ``VersionedUpdater``:

* keeps every model version its selected devices train (the reply's ``MODELS``), until the parent has their
  updates, and tells the parent which it holds (``HELD_VERSIONS``), so a model travels to a node once, and only
  when one of its devices trains it (never the newest model just because it is new);
* knows which version each selection id trains (``SELECTION_VERSIONS``) and which release of the server it came
  in (``SELECTION_RELEASES``), hands a leaf's newly selected devices their tasks in one call (``take_tasks``) and
  lets a waiter know when its state changed (``wait_changed``);
* asks its node to sync at once (``on_work``) when something waits to go up: a device's update, a child's report,
  a synchronous selection's complete sum;
* forwards each device's update unchanged (``DEVICE_UPDATES``) instead of summing them: the server needs each
  one's device, selection and base version, and sums in the schedule's order (the same bits every run). In a
  synchronous run (``sum_selections``) every device of a selection goes into the same version, so the leaf sends
  one sum per selection instead, once all its devices of that selection have reported, added in device-id order
  (``SELECTION_SUMS``): the same bits every run, and one model-sized message instead of one per device; in a
  pack, per run (a synchronous run's selections summed, a buffered run's updates forwarded);
* sends each diff packed (``common.packed_weights``: its blob a datum beside the message body), at most
  ``MAX_SYNC_BYTES`` of them per sync, the rest in the next sync at once; or, through its bulk link
  (``simulation.bulk_link``, when the parent shares its machine), written once into its ring of shared memory, as
  many per sync as the ring holds (``simulation.bulk_relay`` as a relay);
* registers its devices once, as ranges (``DEVICE_RANGES``), instead of re-sending every device on every sync;
* sends up what the leaf's device runner put in its outbox (``common.leaf_outbox``: the leaf's plan, its
  per-device report lines), and as a relay forwards its children's.

As a relay it does the same for its children: merges what they send up, and replies to each with the versions it
lacks. The node's state is a ``VersionedState``, NVFlare's ``BaseState`` plus the held models.

In a pack (several runs in one job, ``docs/packs.md``) that state is run 0's, as in a standalone job; each later
run's versions, selection and releases are a ``RunTables`` of their own, filled from that run's section of the
replies (``common.protocol.RUN_SECTIONS``; its models always on the wire), and the tasks and updates name their run.

Over 400 lines: one NVFlare ``Updater`` whose up path (reports, sums) and down path (versions, selections) share
one lock and one state; split, each half would reach into the other's.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable, Sequence

from nvflare.apis.dxo import DXO
from nvflare.apis.fl_context import FLContext
from nvflare.apis.shareable import Shareable
from nvflare.edge.mud import BaseState, PropKey, StateUpdateReply, StateUpdateReport
from nvflare.edge.updater import Updater

from common.leaf_outbox import OUTBOX_PROP
from common.packed_maps import pack_map, unpacked_map
from common.packed_weights import pack, packed_or_none, unpack
from common.protocol import (
    AWAITED,
    BULK,
    DEVICE_RANGES,
    DEVICE_UPDATES,
    HELD_VERSIONS,
    LEAF_PLANS,
    LEAF_REPORTS,
    LEAVES_SEEN,
    LOCAL_REPORT,
    MODELS,
    RELEASES,
    RUN_SECTIONS,
    SELECTION_RELEASES,
    SELECTION_SUMS,
    SELECTION_VERSIONS,
    DeviceUpdate,
    SelectionSum,
    run_section,
    sections_of,
)
from simulation.bulk_link import LeafBulk, wire_bytes
from simulation.bulk_relay import RelayBulk
from simulation.run_tables import RunTables, first_missing, tasks_of, unpack_version, weights_dxo
from simulation.sync_times import SyncTimes

# a sync carries at most this many bytes of diffs (more go up in the next sync, at once): a message past glibc's
# largest mmap threshold (32 MB) is a fresh mapping, zero-filled page by page, in the leaf and in the server
MAX_SYNC_BYTES = 16 * 1024 * 1024


def _device_of(u: DeviceUpdate | dict) -> str:
    return u.device if isinstance(u, DeviceUpdate) else u["device"]


DEFER_SYNC = "edgesim_defer_sync"  # header of a local report whose sender asks for the sync itself


class VersionedState(BaseState):
    """``BaseState`` (newest model, selection) plus every model version a selected device may still fetch.

    Attributes (beyond ``BaseState``'s):
        models: model version -> WEIGHTS DXO.
        selection_versions: selection id -> the model version its devices train.
        fetched: (device, selection id) pairs whose task was handed out; shared by every copy of the state.
    """

    def __init__(self, base: BaseState, models: dict[int, DXO], selection_versions: dict[int, int], fetched: set):
        super().__init__(0, None, 0, {})  # the validated constructor; the real values are set below
        self.model_version, self.model = base.model_version, base.model
        self.device_selection_version, self.device_selection = base.device_selection_version, base.device_selection
        self.models = models
        self.selection_versions = selection_versions
        self.fetched = fetched


class VersionedUpdater(Updater):
    """Args:
    sum_selections: a synchronous run: send one sum per selection (see the module docstring); a pack of
        synchronous and buffered runs: one flag per run (``sums``).
    """

    def __init__(
        self,
        sum_selections: bool | Sequence[bool] = False,
        on_work: Callable[[], None] | None = None,
        bulk: LeafBulk | None = None,
    ):
        super().__init__()
        self.sum_selections = sum_selections
        self.bulk = bulk  # the node's bulk link to its parent (``simulation.bulk_link``); None: the wire, unsaid
        self.relay: RelayBulk | None = None  # as a relay, its links to its children (``simulation.bulk_relay``)
        self.on_work = on_work  # called when something waits to go up (the node then syncs at once)
        self._buckets: dict[tuple[int, int], list[DeviceUpdate]] = {}  # (run, selection id) -> its device updates
        self._sums: list[SelectionSum | dict] = []  # complete selection sums to send up (a child's: as it sent them)
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # the state changed (selection or models): stamp + 1
        self.stamp = 0
        self.awaited: set[str] = set()  # devices whose update the parent waits for now (it says so)
        self._models: dict[int, DXO] = {}
        self._selection_versions: dict[int, int] = {}
        self._selection_releases: dict[int, int] = {}  # selection id -> the server's release it came in
        self._fetched: set[tuple[str, int]] = set()
        self._pending: list[DeviceUpdate | dict] = []  # device updates to send up (a child's: as it sent them)
        self._ranges: dict[str, list] = {}  # prefix -> [count, leaf], every range known here
        self._ranges_unsent: dict[str, list] = {}
        self._ranges_sent: dict[str, list] = {}  # in the last report, until its reply confirms it
        self._devices_unsent: dict = {}  # single devices (mud.Device) not yet sent up
        self._children_seen: dict[str, float] = {}  # child -> wall time of its last report (as a relay)
        self._below_seen: dict[str, tuple[float, float]] = {}  # leaf below a child -> (its age, when we heard)
        self._leaf_plans: dict[str, dict] = {}  # to send up: leaf -> its plan
        self._leaf_reports: dict[str, list] = {}  # to send up: leaf -> its report lines
        self.syncs = SyncTimes()  # each sync's round trip, summed up in the log at the task's end
        self.runs: dict[int, RunTables] = {}  # a pack's runs after the first (run 0's is the state itself)
        self.releases: tuple[int, bool] | None = None  # run 0's releases so far and whether it ended (a pack's)

    # -- state --------------------------------------------------------------------------------------------------
    def start_task(self, task_data: Shareable, fl_ctx: FLContext):
        self.current_state = VersionedState(BaseState.from_shareable(task_data), {}, {}, self._fetched)
        return self.current_state

    def sums(self, run: int) -> bool:
        """Whether this leaf sums ``run``'s selections (a synchronous run's) rather than sending each update."""
        flags = self.sum_selections
        return flags if isinstance(flags, bool) else bool(flags[run])

    def sums_any(self) -> bool:
        """Whether any run's selections are summed here."""
        flags = self.sum_selections
        return flags if isinstance(flags, bool) else any(flags)

    def mark_fetched(self, device_id: str, selection_id: int) -> None:
        """The leaf handed ``device_id`` its task for ``selection_id``: its version is no longer needed here."""
        with self._lock:
            self._fetched.add((device_id, selection_id))

    def _needed(self, selection: dict) -> set[int]:
        """The versions this node's selected devices train: kept until the parent has the devices' updates (the
        parent's selection leaves a device out once its update arrived), so nothing is ever sent twice."""
        return {self._selection_versions[sid] for sid in set(selection.values()) if sid in self._selection_versions}

    # -- up: report to the parent -------------------------------------------------------------------------------
    def _complete_sums(self) -> None:
        """Move every selection whose devices (of this node's selection) have all reported into ``_sums``."""
        for run, sid in list(self._buckets):
            selection = self.runs[run].selection if run else self.current_state.device_selection
            reported = {u.device for u in self._buckets[run, sid]}
            expected = {d for d, s in selection.items() if s == sid}
            if reported >= expected:
                self._sums.append(SelectionSum.of(self._buckets.pop((run, sid))))

    def _next_batch(self) -> list[dict]:
        """The pending updates to send now, as they travel (``LeafBulk.next_batch``); the rest stay pending."""
        if self.bulk is not None:
            sent = self.bulk.next_batch(self._pending, MAX_SYNC_BYTES)
        else:
            sent, total = [], 0
            for u in self._pending:
                total += wire_bytes(u)
                if total > MAX_SYNC_BYTES and sent:
                    break
                sent.append(u.to_dict() if isinstance(u, DeviceUpdate) else u)
        self._pending = self._pending[len(sent) :]
        return sent

    def _sums_to_send(self) -> list[dict]:
        pack = self.bulk.pack_diff if self.bulk is not None else packed_or_none
        return [s.to_dict(pack) if isinstance(s, SelectionSum) else s for s in self._sums]

    def prepare_update_for_parent(self, fl_ctx: FLContext) -> Shareable | None:
        self.syncs.sent()
        try:
            return self._prepare_update(fl_ctx)
        finally:
            if self._pending and self.on_work is not None:  # what did not fit goes up in the next sync, at once
                self.on_work()

    def _prepare_update(self, fl_ctx: FLContext) -> Shareable:
        with self._lock:
            self._complete_sums()
            state = self.current_state
            report = StateUpdateReport(
                state.model_version, state.device_selection_version, None, self._devices_unsent or None
            ).to_shareable()
            self._devices_unsent = {}
            held = set(self._models)
            if self.relay is not None:  # the versions its children hold too, and their links' choices
                held = self.relay.add_to_report(report, held)
            report[HELD_VERSIONS] = self.bulk.held(held) if self.bulk is not None else sorted(held)
            word = self.bulk.report_word() if self.bulk is not None else None
            if word:
                report[BULK] = word
            for run, tables in self.runs.items():  # a pack's later runs: each its own section
                held_of = (lambda models, r=run: self.bulk.held(models, r)) if self.bulk is not None else sorted
                run_section(report, run).update(tables.report(held_of))
            if self._ranges_unsent:
                report[DEVICE_RANGES] = dict(self._ranges_unsent)
                self._ranges_sent, self._ranges_unsent = self._ranges_unsent, {}
            if self._pending:  # this leaf's own updates are packed here, once (or written into shared memory)
                report[DEVICE_UPDATES] = self._next_batch()
            if self._sums:
                report[SELECTION_SUMS], self._sums = self._sums_to_send(), []
            outbox = fl_ctx.get_prop(OUTBOX_PROP) if fl_ctx is not None else None
            if outbox is not None:  # a leaf
                plans, lines = outbox.take()
                self._merge_leaf_info(plans, lines)
            if self._leaf_plans:
                report[LEAF_PLANS], self._leaf_plans = self._leaf_plans, {}
            if self._leaf_reports:
                report[LEAF_REPORTS], self._leaf_reports = self._leaf_reports, {}
            if self._children_seen:  # a relay: when each leaf below it last reported, for the server's watch
                now = time.time()
                seen = {leaf: age + now - heard for leaf, (age, heard) in self._below_seen.items()}
                seen |= {child: now - t for child, t in self._children_seen.items()}
                report[LEAVES_SEEN] = seen
            return report

    # -- down: the parent's reply -------------------------------------------------------------------------------
    def process_parent_update_reply(self, reply: Shareable, fl_ctx: FLContext) -> bool:
        """Take the parent's word: the current version, this node's selection and the versions it trains, the
        models it lacked. True if the selection or the models changed (children and devices may have work)."""
        self.syncs.replied()
        r = StateUpdateReply.from_shareable(reply)
        with self._lock:
            self._ranges_sent = {}  # the parent has them
            if self.bulk is not None:  # the last report's diffs are the parent's now
                self.bulk.on_reply(reply.get(BULK))
            state = copy.copy(self.current_state)
            models = {}
            for v, p in (reply.get(MODELS) or {}).items():
                if self.relay is not None:  # its handle goes on to the children that map the same memory
                    self.relay.keep(v, p)
                weights = self.bulk.weights(v, p) if self.bulk is not None else unpack(p)
                if weights is not None:  # else the link is on the wire now: the parent sends it again
                    models[v] = weights_dxo(v, weights)
            self._models.update(models)
            if r.model is not None:  # a parent that sends the current model itself (as NVFlare's do)
                self._models[r.model_version] = r.model
                state.model = r.model
            changed = bool(models) or r.model is not None
            if r.model_version and r.model_version > (state.model_version or 0):
                state.model_version = r.model_version
            if r.device_selection_version != state.device_selection_version and PropKey.DEVICE_SELECTION in reply:
                state.device_selection_version = r.device_selection_version
                state.device_selection = unpacked_map(reply[PropKey.DEVICE_SELECTION]) or {}
                changed = True
            if SELECTION_VERSIONS in reply:
                self._selection_versions = dict(unpacked_map(reply[SELECTION_VERSIONS]))
            if SELECTION_RELEASES in reply:
                self._selection_releases = dict(unpacked_map(reply[SELECTION_RELEASES]))
            self.awaited = set(reply.get(AWAITED) or ())
            if RELEASES in reply and tuple(reply[RELEASES]) != self.releases:
                self.releases = (int(reply[RELEASES][0]), bool(reply[RELEASES][1]))
                changed = True
            for run, section in sections_of(reply).items():
                if run:
                    weights = (
                        (lambda v, p, r=run: self.bulk.weights(v, p, r)) if self.bulk is not None else unpack_version
                    )
                    changed = self.runs.setdefault(run, RunTables()).take(section, weights) or changed
            selection = state.device_selection
            self._fetched.intersection_update(selection.items())
            keep = self._needed(selection)
            self._models = {v: m for v, m in self._models.items() if v in keep}
            # the executor's task dicts, one per version (versions never change, so a cached one stays valid)
            state.converted_models = {v: c for v, c in state.converted_models.items() if v in keep}
            state.models, state.selection_versions, state.fetched = (
                self._models,
                self._selection_versions,
                self._fetched,
            )
            self.current_state = state
            if changed:
                self.stamp += 1
                self._changed.notify_all()
            return changed

    def holds_update_of(self, devices: set[str]) -> bool:
        """Whether an update of one of ``devices`` waits here to go up (alone, or in a complete selection sum)."""
        with self._lock:
            self._complete_sums()
            pending = {_device_of(u) for u in self._pending}  # of any run: at worst a sync more
            summed = {d for s in self._sums for d in (s.devices if isinstance(s, SelectionSum) else s["devices"])}
            return bool(devices & (pending | summed))

    def is_awaited(self, run: int, device: str) -> bool:
        """Whether the parent waits for ``device``'s update of ``run`` now (it said so)."""
        with self._lock:
            if not run:
                return device in self.awaited
            tables = self.runs.get(run)
            return tables is not None and device in tables.awaited

    def has_sums(self) -> bool:
        """Whether a complete selection sum waits to go up."""
        with self._lock:
            self._complete_sums()
            return bool(self._sums)

    def wait_changed(self, stamp: int, timeout: float) -> tuple[int, VersionedState | None]:
        """Wait until the state's stamp differs from ``stamp`` (or ``timeout`` passes); the stamp and the state."""
        with self._changed:
            if self.stamp == stamp:
                self._changed.wait(timeout)
            return self.stamp, self.current_state

    def take_tasks(self, prefix: str) -> tuple[list[tuple[str, int, int, int | None]], dict[int, DXO]]:
        """Hand out the tasks of ``prefix``'s selected devices not handed out yet whose model is here:
        ``[(device, selection id, version, release)]`` in device-id order (release None: the parent did not say),
        and those versions' models."""
        with self._lock:
            state = self.current_state
            if state is None:
                return [], {}
            tasks = tasks_of(
                prefix,
                state.device_selection,
                self._fetched,
                self._selection_versions,
                self._selection_releases,
                self._models,
            )
            return tasks, {t[2]: self._models[t[2]] for t in tasks}

    def releases_complete(self, prefix: str, runs: int) -> int:
        """In a pack of ``runs`` runs, the highest release n such that ``prefix``'s tasks of release n or earlier are
        all known here, of every run: each run has made n releases (``RELEASES``) or ended, and none of its
        selected devices of such a release still waits for its model. The leaf trains release n of every run
        together once it is complete (``simulation.leaf_channels.GatewayChannel``); 0: none yet."""
        with self._lock:
            state = self.current_state
            if state is None:
                return 0
            tables = [
                (
                    self.releases,
                    state.device_selection,
                    self._fetched,
                    self._selection_versions,
                    self._selection_releases,
                    self._models,
                )
            ]
            for run in range(1, runs):
                t = self.runs.get(run)
                if t is None:
                    return 0
                tables.append(
                    (t.releases, t.selection, t.fetched, t.selection_versions, t.selection_releases, t.models)
                )
            bound = float("inf")
            for releases, *rest in tables:
                if releases is None:
                    return 0
                if not releases[1]:
                    bound = min(bound, releases[0])
                bound = min(bound, first_missing(prefix, *rest) - 1)
            return int(min(bound, 2**62))

    def take_run_tasks(self, prefix: str) -> dict[int, tuple[list[tuple[str, int, int, int | None]], dict[int, DXO]]]:
        """``take_tasks`` for each of a pack's later runs: run -> (its tasks, their versions' models); runs with
        no new task left out."""
        with self._lock:
            out = {}
            for run, t in sorted(self.runs.items()):
                tasks = tasks_of(prefix, t.selection, t.fetched, t.selection_versions, t.selection_releases, t.models)
                if tasks:
                    out[run] = tasks, {task[2]: t.models[task[2]] for task in tasks}
            return out

    # -- from children (a relay), or from this leaf's executor --------------------------------------------------
    def process_child_update(self, update: Shareable, fl_ctx: FLContext) -> tuple[bool, Shareable | None]:
        report = StateUpdateReport.from_shareable(update)
        local = bool(update.get_header(LOCAL_REPORT))
        peer = fl_ctx.get_peer_context() if fl_ctx is not None and not local else None
        child = peer.get_identity_name() if peer is not None else ""
        word = None
        if child and self.bulk is not None:  # a relay: its child's diffs copied out of its ring, its word taken
            if self.relay is None:
                self.relay = RelayBulk(self.bulk, self.bulk.mode)
            word = self.relay.on_child_report(child, update)
        with self._lock:
            summing = local and self.sums_any()
            unsummed = False  # a buffered run's update of this leaf, in a pack beside a synchronous run
            if summing:
                for entry in update.get(DEVICE_UPDATES) or ():
                    u = entry if isinstance(entry, DeviceUpdate) else DeviceUpdate.from_dict(entry)
                    if self.sums(u.run):
                        self._buckets.setdefault((u.run, u.selection_id), []).append(u)
                    else:
                        self._pending.append(entry)
                        unsummed = True
            else:
                self._pending.extend(update.get(DEVICE_UPDATES) or ())
            self._sums.extend(update.get(SELECTION_SUMS) or ())  # from children: forwarded as they are
            for prefix, entry in (update.get(DEVICE_RANGES) or {}).items():
                if self._ranges.get(prefix) != list(entry):
                    self._ranges[prefix] = self._ranges_unsent[prefix] = list(entry)
            self._devices_unsent.update(report.available_devices or {})
            self._merge_leaf_info(update.get(LEAF_PLANS) or {}, update.get(LEAF_REPORTS) or {})
            work = bool(update.get(DEVICE_UPDATES) or update.get(SELECTION_SUMS) or update.get(DEVICE_RANGES))
            if summing:
                self._complete_sums()
                # a synchronous run has work to send once a selection's sum is complete
                work = bool(self._sums) or unsummed
        if work and self.on_work is not None and not update.get_header(DEFER_SYNC):
            self.on_work()
        with self._lock:
            if local:
                return True, None
            if peer is not None:
                now = time.time()
                below = update.get(LEAVES_SEEN) or {}
                if not below:  # a leaf child
                    self._children_seen[peer.get_identity_name()] = now
                for leaf, age in below.items():
                    self._below_seen[leaf] = (float(age), now)
            reply = self._reply_to_child(report, set(update.get(HELD_VERSIONS) or ()), child)
            if reply is not None and self.runs:  # a pack's later runs: each child's section of each
                sections = update.get(RUN_SECTIONS) or {}
                for run, tables in self.runs.items():
                    run_section(reply, run).update(tables.reply(sections.get(run) or {}))
            if word and reply is not None:
                reply[BULK] = word
            return True, reply

    def _merge_leaf_info(self, plans: dict, lines: dict) -> None:
        self._leaf_plans.update(plans)
        for leaf, entries in lines.items():
            self._leaf_reports.setdefault(leaf, []).extend(entries)

    def _reply_to_child(self, report: StateUpdateReport, held: set[int], child: str = "") -> Shareable | None:
        state = self.current_state
        if state is None or not state.model_version:
            return StateUpdateReply(0, None, 0, None).to_shareable()
        changed = report.current_device_selection_version != state.device_selection_version
        reply = StateUpdateReply(state.model_version, None, state.device_selection_version, None).to_shareable()
        if changed:
            reply[PropKey.DEVICE_SELECTION] = pack_map(state.device_selection)  # even when empty
        needed = set(self._selection_versions.values()) - held
        if needed:
            relay, models = self.relay, self._models
            reply[MODELS] = {
                v: relay.child_model(child, v, models) if relay is not None else pack(models[v].data)
                for v in sorted(needed)
                if v in models
            }
        reply[SELECTION_VERSIONS] = pack_map(self._selection_versions)
        if self._selection_releases:
            reply[SELECTION_RELEASES] = pack_map(self._selection_releases)
        if self.releases is not None:
            reply[RELEASES] = list(self.releases)
        return reply

    def end_task(self, fl_ctx: FLContext) -> None:
        super().end_task(fl_ctx)
        if self.syncs.count:  # benchmarks/perf/bench_protocol.py reads this line
            self.log_info(fl_ctx, self.syncs.summary())
        with self._lock:
            self._models, self._pending, self._buckets, self._sums = {}, [], {}, []
            self.runs = {}
