"""A leaf's (or relay's) view of the run: the model versions its selected devices train, and what goes up.

NVFlare's ``EdgeModelUpdater`` holds one model (the newest) and sums device diffs per model version. On exact
simulated time a device trains the version that was current when the server selected it, and the server applies
each device's update on its own (``scheduling.exact_assessor``), so ``VersionedUpdater``:

* keeps every model version its selected devices still need (the reply's ``MODELS`` and the current version),
  and forgets a version once no selected device of this node still has to fetch it;
* knows which version each selection id trains (``SELECTION_VERSIONS``);
* forwards each device's update unchanged (``DEVICE_UPDATES``) instead of summing them: the server needs each
  one's device, selection and base version, and sums in the schedule's order (the same bits every run). In a
  synchronous run (``sum_selections``) every device of a selection goes into the same version, so the leaf sends
  one sum per selection instead, once all its devices of that selection have reported, added in device-id order
  (``SELECTION_SUMS``): the same bits every run, and one model-sized message instead of one per device;
* registers its devices once, as ranges (``DEVICE_RANGES``), instead of re-sending every device on every sync;
* sends up what the leaf's device runner put in its outbox (``common.leaf_outbox``: the leaf's plan, its
  per-device report lines), and as a relay forwards its children's.

As a relay it does the same for its children: merges what they send up, and replies to each with the versions it
lacks. The node's state is a ``VersionedState``, NVFlare's ``BaseState`` plus the held models.
"""

from __future__ import annotations

import copy
import threading
import time

from nvflare.apis.dxo import DXO
from nvflare.apis.fl_context import FLContext
from nvflare.apis.shareable import Shareable
from nvflare.edge.mud import BaseState, PropKey, StateUpdateReply, StateUpdateReport
from nvflare.edge.updater import Updater

from common.leaf_outbox import OUTBOX_PROP
from common.protocol import (
    DEVICE_RANGES,
    DEVICE_UPDATES,
    LEAF_PLANS,
    LEAF_REPORTS,
    LEAVES_SEEN,
    LOCAL_REPORT,
    MODELS,
    SELECTION_SUMS,
    SELECTION_VERSIONS,
    DeviceUpdate,
    SelectionSum,
)


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
    sum_selections: a synchronous run: send one sum per selection (see the module docstring).
    """

    def __init__(self, sum_selections: bool = False):
        super().__init__()
        self.sum_selections = sum_selections
        self._buckets: dict[int, list[DeviceUpdate]] = {}  # selection id -> its reported device updates
        self._sums: list[dict] = []  # complete selection sums to send up
        self._lock = threading.Lock()
        self._models: dict[int, DXO] = {}
        self._selection_versions: dict[int, int] = {}
        self._fetched: set[tuple[str, int]] = set()
        self._pending: list[dict] = []  # device updates to send up
        self._ranges: dict[str, list] = {}  # prefix -> [count, leaf], every range known here
        self._ranges_unsent: dict[str, list] = {}
        self._ranges_sent: dict[str, list] = {}  # in the last report, until its reply confirms it
        self._devices_unsent: dict = {}  # single devices (mud.Device) not yet sent up
        self._children_seen: dict[str, float] = {}  # child -> wall time of its last report (as a relay)
        self._below_seen: dict[str, tuple[float, float]] = {}  # leaf below a child -> (its age, when we heard)
        self._leaf_plans: dict[str, dict] = {}  # to send up: leaf -> its plan
        self._leaf_reports: dict[str, list] = {}  # to send up: leaf -> its report lines

    # -- state --------------------------------------------------------------------------------------------------
    def start_task(self, task_data: Shareable, fl_ctx: FLContext):
        self.current_state = VersionedState(BaseState.from_shareable(task_data), {}, {}, self._fetched)
        return self.current_state

    def mark_fetched(self, device_id: str, selection_id: int) -> None:
        """The leaf handed ``device_id`` its task for ``selection_id``: its version is no longer needed here."""
        with self._lock:
            self._fetched.add((device_id, selection_id))

    def _needed(self, selection: dict) -> set[int]:
        return {
            self._selection_versions[sid]
            for d, sid in selection.items()
            if (d, sid) not in self._fetched and sid in self._selection_versions
        }

    # -- up: report to the parent -------------------------------------------------------------------------------
    def _complete_sums(self) -> None:
        """Move every selection whose devices (of this node's selection) have all reported into ``_sums``."""
        selection = self.current_state.device_selection
        for sid in list(self._buckets):
            reported = {u.device for u in self._buckets[sid]}
            expected = {d for d, s in selection.items() if s == sid}
            if reported >= expected:
                self._sums.append(SelectionSum.of(self._buckets.pop(sid)).to_dict())

    def prepare_update_for_parent(self, fl_ctx: FLContext) -> Shareable | None:
        with self._lock:
            self._complete_sums()
            state = self.current_state
            report = StateUpdateReport(
                state.model_version, state.device_selection_version, None, self._devices_unsent or None
            ).to_shareable()
            self._devices_unsent = {}
            if self._ranges_unsent:
                report[DEVICE_RANGES] = dict(self._ranges_unsent)
                self._ranges_sent, self._ranges_unsent = self._ranges_unsent, {}
            if self._pending:
                report[DEVICE_UPDATES], self._pending = self._pending, []
            if self._sums:
                report[SELECTION_SUMS], self._sums = self._sums, []
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
    def process_parent_update_reply(self, reply: Shareable, fl_ctx: FLContext) -> None:
        r = StateUpdateReply.from_shareable(reply)
        with self._lock:
            self._ranges_sent = {}  # the parent has them
            state = copy.copy(self.current_state)
            self._models.update(reply.get(MODELS) or {})
            if r.model_version != state.model_version and r.model is not None:
                state.model_version, state.model = r.model_version, r.model
                self._models[r.model_version] = r.model
            if r.device_selection_version != state.device_selection_version and PropKey.DEVICE_SELECTION in reply:
                state.device_selection_version = r.device_selection_version
                state.device_selection = reply[PropKey.DEVICE_SELECTION] or {}
            if SELECTION_VERSIONS in reply:
                self._selection_versions = dict(reply[SELECTION_VERSIONS])
            selection = state.device_selection
            self._fetched.intersection_update(selection.items())
            keep = self._needed(selection) | {state.model_version}
            self._models = {v: m for v, m in self._models.items() if v in keep}
            # the executor's task dicts, one per version (versions never change, so a cached one stays valid)
            state.converted_models = {v: c for v, c in state.converted_models.items() if v in keep}
            state.models, state.selection_versions, state.fetched = (
                self._models,
                self._selection_versions,
                self._fetched,
            )
            self.current_state = state

    # -- from children (a relay), or from this leaf's executor --------------------------------------------------
    def process_child_update(self, update: Shareable, fl_ctx: FLContext) -> tuple[bool, Shareable | None]:
        report = StateUpdateReport.from_shareable(update)
        with self._lock:
            local = bool(update.get_header(LOCAL_REPORT))
            if self.sum_selections and local:
                for entry in update.get(DEVICE_UPDATES) or ():
                    u = DeviceUpdate.from_dict(entry)
                    self._buckets.setdefault(u.selection_id, []).append(u)
            else:
                self._pending.extend(update.get(DEVICE_UPDATES) or ())
            self._sums.extend(update.get(SELECTION_SUMS) or ())  # from children: forwarded as they are
            for prefix, entry in (update.get(DEVICE_RANGES) or {}).items():
                if self._ranges.get(prefix) != list(entry):
                    self._ranges[prefix] = self._ranges_unsent[prefix] = list(entry)
            self._devices_unsent.update(report.available_devices or {})
            self._merge_leaf_info(update.get(LEAF_PLANS) or {}, update.get(LEAF_REPORTS) or {})
            if local:
                return True, None
            peer = fl_ctx.get_peer_context() if fl_ctx is not None else None
            if peer is not None:
                now = time.time()
                below = update.get(LEAVES_SEEN) or {}
                if not below:  # a leaf child
                    self._children_seen[peer.get_identity_name()] = now
                for leaf, age in below.items():
                    self._below_seen[leaf] = (float(age), now)
            return True, self._reply_to_child(report)

    def _merge_leaf_info(self, plans: dict, lines: dict) -> None:
        self._leaf_plans.update(plans)
        for leaf, entries in lines.items():
            self._leaf_reports.setdefault(leaf, []).extend(entries)

    def _reply_to_child(self, report: StateUpdateReport) -> Shareable | None:
        state = self.current_state
        if state is None or not state.model_version:
            return StateUpdateReply(0, None, 0, None).to_shareable()
        child_version = report.current_model_version or 0
        model = state.model if child_version != state.model_version else None
        changed = report.current_device_selection_version != state.device_selection_version
        reply = StateUpdateReply(
            state.model_version, model, state.device_selection_version, state.device_selection if changed else None
        ).to_shareable()
        if changed:
            reply[PropKey.DEVICE_SELECTION] = state.device_selection  # even when empty
        needed = {v for v in set(self._selection_versions.values()) if v > child_version} - {state.model_version}
        if needed:
            reply[MODELS] = {v: self._models[v] for v in sorted(needed) if v in self._models}
        reply[SELECTION_VERSIONS] = dict(self._selection_versions)
        return reply

    def end_task(self, fl_ctx: FLContext) -> None:
        super().end_task(fl_ctx)
        with self._lock:
            self._models, self._pending, self._buckets, self._sums = {}, [], {}, []
