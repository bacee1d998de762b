"""Names shared by the device side, the leaves, the relays and the server: keys carried inside NVFlare's messages.

NVFlare's edge protocol (``nvflare.edge.mud``) carries one model and sums device updates per model version. Exact
simulated time needs more, added as extra keys of the same messages, which NVFlare's own code ignores:

* up (leaf -> relay -> server, in ``StateUpdateReport`` shareables): ``DEVICE_UPDATES``, each device's own update
  with the selection it answers and the version it trained; ``SELECTION_SUMS``, in synchronous runs, one summed
  update per selection and leaf instead (every device of a synchronous selection goes into the same version, so
  the sum, taken in device-id order, gives the same bits every run); ``DEVICE_RANGES``, the devices a leaf
  simulates, sent once as ranges (``prefix`` -> count), not as one entry per device on every sync; ``LEAF_PLANS``
  and ``LEAF_REPORTS``, each leaf's own worker plan and its per-device report lines (``common.leaf_outbox``);
  ``HELD_VERSIONS``, the model versions the child holds;
* down (server -> relay -> leaf, in ``StateUpdateReply`` shareables): ``MODELS``, the model versions the child's
  selected devices train that it does not hold (never a model it holds or does not need); ``SELECTION_VERSIONS``,
  the model version of each selection id; ``SELECTION_RELEASES``, the release each selection id came in (the server
  hands devices to the leaves in releases, ``scheduling.applier``, and a leaf trains a release's devices together,
  whatever their versions); ``AWAITED``, the devices whose update the server waits for now. When
  the server waits for an update that has not come, it wakes the children that have news (newly selected devices)
  and the one holding the awaited device with a ``WAKE_TOPIC`` aux message (``NEWS_FOR``, ``AWAITED``): a child
  with news syncs at once; a leaf sends an awaited device's result the moment it has it, and others' in batches.

A pack (several runs in one job, ``docs/packs.md``) numbers its runs 0, 1, ...: each ``DeviceUpdate`` and
``SelectionSum`` names its run (``run``; absent for run 0), and what a message says of run 1 and later (its
``HELD_VERSIONS`` up; its selection, ``MODELS``, ``SELECTION_VERSIONS``, ``SELECTION_RELEASES`` and ``AWAITED``
down) travels in that run's section under ``RUN_SECTIONS`` (``run_section``, ``sections_of``). A standalone job is
run 0: its messages keep the form they have without packs, key for key.

When a leaf and its parent share a machine and a user, the diffs and models inside these messages travel beside
them through shared memory (``BULK``: the handshake; a handle in place of each packed blob, ``common.shared_ring``;
``simulation.bulk_link``): the messages are the same otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, MutableMapping

from common.packed_weights import packed_or_none, unpacked

# result metadata naming the device, so leaves and the server can tell per-device updates apart
DEVICE_ID_META = "edgesim_device_id"

DEVICE_UPDATES = "edgesim_device_updates"  # list of DeviceUpdate dicts (objects in a leaf's report to itself)
SELECTION_SUMS = "edgesim_selection_sums"  # list of SelectionSum dicts
LEAVES_SEEN = "edgesim_leaves_seen"  # from a relay: {leaf below it: seconds since that leaf last reported}
DEVICE_RANGES = "edgesim_device_ranges"  # {prefix: [count, client name]}
LEAF_PLANS = "edgesim_leaf_plans"  # {leaf: its own worker plan (dict)}, sent once (common.leaf_outbox)
LEAF_REPORTS = "edgesim_leaf_reports"  # {leaf: [one dict per device report, in the leaf's order]}
LOCAL_REPORT = "edgesim_local_report"  # header: a leaf executor's report to its own updater
HELD_VERSIONS = "edgesim_held_versions"  # up: the model versions the child holds (the parent sends the others)
# both ways, beside the rest: the bulk link's word (``simulation.bulk_link``, ``common.bulk_parent``): up, a
# child's offer of its ring, or whether it maps its parent's; down, the parent's answer (its own ring, or why not)
BULK = "edgesim_bulk"
BULK_BELOW = "edgesim_bulk_below"  # up, from a relay: {leaf below it: how its bulk arrays travel}, when it changed
WAKE_TOPIC = "edgesim.wake"  # down, an aux message of its own: news for some children, or an awaited device
AWAITED = "edgesim_awaited"  # down (reply or wake): the devices whose update the server is waiting for now
NEWS_FOR = "edgesim_news_for"  # down (wake): the children with newly selected devices (they sync at once)
MODELS = "edgesim_models"  # {model version: its weights, packed (common.packed_weights)}
# a version's weights may carry the strategy's extra state for devices (ServerStrategy.device_extras) under this
# prefix; a device hands it to the method's DeviceObjective and leaves it out of its diff
DEVICE_EXTRA_PREFIX = "edgesim_extra/"
# up, the same way: a device's own reports travel in its diff under that prefix and reach the strategy as
# Update.reports (the diff the strategy sums holds the model only)
LABEL_COUNTS = "label_counts"  # a device's label histogram (float32, one count per class), when its method asks
# the other reports a device can send (processors.reports computes them; a method names those it wants)
LOSS = "loss"  # the loss its last local step minimised (a float32 scalar)
LOSS_SQUARED = "loss_squared"  # the mean of its last step's squared per-sample cross-entropies (Oort's utility)
STEPS = "steps"  # local steps it took
SAMPLES = "samples"  # samples it trained on, counted over its steps (FedScale's trained_size)
DATA_SIZE = "data_size"  # samples it holds (its weight when its method weights by samples)
DEVICE_REPORTS = (LOSS, LOSS_SQUARED, STEPS, SAMPLES, LABEL_COUNTS, DATA_SIZE)
SELECTION_VERSIONS = "edgesim_selection_versions"  # {selection id: model version}
SELECTION_RELEASES = "edgesim_selection_releases"  # {selection id: the release it came in}
# down, in a pack only: [the run's releases so far, whether it has ended], from the same view as the selection: a
# leaf trains release n of every run together once each run has made n releases or ended (``docs/packs.md``)
RELEASES = "edgesim_releases"
# both ways, in a pack only: {run (1, 2, ...): its section, a dict of the keys above that concern one run}; run 0's
# keys stay where a standalone job has them, in the message itself
RUN_SECTIONS = "edgesim_run_sections"
# a failed device's result (a zero-weight update) carries why it failed, cut to this many characters: the server
# names the last one when it stops a run whose devices keep failing (``scheduling.failure_streak``)
MAX_ERROR_CHARS = 300
DEVICE_ERROR_META = "edgesim_device_error"  # the same text in a failed result's DXO meta (NVFlare's edge requests)

# The server's global model (aggregation.global_model) goes by NVFlare's edge name for it, "model_manager", in two
# places older runs wrote: its component id in a job's config (NVFlare's BuffModelManager has the same id) and its
# key in a checkpoint (scheduling.checkpoint). Everywhere else in the code it is the global model.
GLOBAL_MODEL_ALIAS = "model_manager"

# A new version's announcement (GLOBAL_WEIGHTS_UPDATED, aggregation.global_model): the server's global model sets
# NVFlare's AppConstants.GLOBAL_MODEL and CURRENT_ROUND (sticky, for NVFlare's components) and, for its run's own
# readers (the evaluator), the keys below, all NOT sticky. NVFlare keeps one value of a sticky key per engine, read
# by every context: in a pack, where several runs' global models announce on one server, a run's evaluator reading
# the sticky ones took the other run's version and weights when it announced in between.
# The version's number and its weights (name -> array)
NEW_VERSION = "edgesim.new_version"
NEW_WEIGHTS = "edgesim.new_weights"
# the simulated time at which the version was made
SIM_TIME = "edgesim.sim_time"
# the method's own word on where it stands ("" for none), shown in progress lines
METHOD_STATUS = "edgesim.method_status"
# the fleet as the version was made, ``ExactSchedule.fleet()`` (devices online, updates, failed): set by the applier
# (scheduling.applier) on the context the version is then announced on
FLEET = "edgesim.fleet"
# the server's work up to this version, ``aggregation.global_model.ServerWork.record()``
# (wall seconds in the strategy's add_update and make_version, and when the version was made), for the record
SERVER_WORK = "edgesim.server_work"
# with differential privacy: the accountant's inputs after the version
# (``aggregation.server_privacy.ServerPrivacy.inputs``)
PRIVACY = "edgesim.privacy"


def short_error(text: str) -> str:
    """A device's error as it travels: one line, at most ``MAX_ERROR_CHARS`` characters."""
    line = " ".join(str(text).split())
    return line if len(line) <= MAX_ERROR_CHARS else line[: MAX_ERROR_CHARS - 3] + "..."


def reports_of(diff: dict | None) -> dict:
    """A device's reports in its diff (the entries under ``DEVICE_EXTRA_PREFIX``), by name; {} for none."""
    n = len(DEVICE_EXTRA_PREFIX)
    return {k[n:]: v for k, v in (diff or {}).items() if k.startswith(DEVICE_EXTRA_PREFIX)}


class DeviceUpdate:
    """One device's answer to one selection: its diff from the version it trained. It travels up as a dict of plain
    values with the diff packed into one blob (``common.packed_weights``).

    Attributes:
        device: the device id.
        selection_id: the selection it answers (unique per selection event).
        base_version: the model version it trained (from its task's cookie).
        diff: parameter name -> float32 array, trained minus received.
        count: 1, or 0 for a device whose training failed for good (its diff is zeros and counts nothing).
        error: why it failed, when the device (or its leaf) said so (``short_error``); "" for an update that
            counted, and for a failure the server decided (offline, silent past its timeout, its leaf lost).
        upload_bytes: the bytes a real device sent for its update (encoded, or dense), as its leaf measured them;
            0 for a simulated device (the schedule knows its encoded size).
        run: the run of a pack it belongs to (0: a standalone job's, and a pack's first; it then travels unsaid).
    """

    __slots__ = ("device", "selection_id", "base_version", "diff", "count", "group", "error", "upload_bytes", "run")

    def __init__(
        self,
        device: str,
        selection_id: int,
        base_version: int,
        diff: dict | None,
        count: int = 1,
        group: SelectionSum | None = None,
        error: str = "",
        upload_bytes: int = 0,
        run: int = 0,
    ):
        self.device = device
        self.selection_id = selection_id
        self.base_version = base_version
        self.diff = diff  # None when the diff travels summed with its selection's (``group``)
        self.count = count
        self.group = group
        self.error = error
        self.upload_bytes = upload_bytes
        self.run = run

    def to_dict(self, pack: Callable[[dict | None], dict | None] = packed_or_none) -> dict:
        """As it travels; ``pack``: how its diff does (packed for the wire, or a handle of shared memory)."""
        d = {
            "device": self.device,
            "selection_id": self.selection_id,
            "base_version": self.base_version,
            "diff": pack(self.diff),
            "count": self.count,
        }
        if self.error:  # only a failed device's: an update that counted carries no extra key
            d["error"] = self.error
        if self.upload_bytes:  # only a real device's
            d["upload_bytes"] = self.upload_bytes
        if self.run:  # only a pack's later runs: run 0 travels as a standalone job's update always did
            d["run"] = self.run
        return d

    @classmethod
    def from_dict(cls, d: dict) -> DeviceUpdate:
        diff = unpacked(d["diff"], writable=False)  # only ever read (summed, blended): no copy
        count = int(d.get("count", 1))
        error, size = d.get("error", ""), int(d.get("upload_bytes", 0))
        return cls(
            d["device"],
            int(d["selection_id"]),
            int(d["base_version"]),
            diff,
            count,
            error=error,
            upload_bytes=size,
            run=int(d.get("run", 0)),
        )


class SelectionSum:
    """The summed updates of one leaf's devices of one selection (synchronous runs).

    Attributes:
        selection_id: the selection they answer.
        base_version: the model version they trained.
        devices: device id -> its count (1, or 0 for a device whose training failed).
        diff: the sum of their diffs, added in device-id order.
        count: the sum of their counts.
        errors: device id -> why it failed, for its failed devices that said so (``DeviceUpdate.error``).
        upload_bytes: device id -> the bytes it sent, for real devices (``DeviceUpdate.upload_bytes``).
        run: the run of a pack they belong to (``DeviceUpdate.run``).
    """

    def __init__(
        self,
        selection_id: int,
        base_version: int,
        devices: dict[str, int],
        diff: dict,
        count: int,
        errors: dict[str, str] | None = None,
        upload_bytes: dict[str, int] | None = None,
        run: int = 0,
    ):
        self.selection_id = selection_id
        self.base_version = base_version
        self.devices = devices
        self.diff = diff
        self.count = count
        self.errors = errors or {}
        self.upload_bytes = upload_bytes or {}
        self.run = run

    @classmethod
    def of(cls, updates: list[DeviceUpdate]) -> SelectionSum:
        """Sum one selection's device updates (of one run) in device-id order."""
        ordered = sorted(updates, key=lambda u: u.device)
        diff = {k: v.copy() for k, v in ordered[0].diff.items()}
        for u in ordered[1:]:
            for k, v in u.diff.items():
                if k in diff:
                    diff[k] += v
                else:  # a report a failed device (the first) did not send
                    diff[k] = v.copy()
        first = ordered[0]
        return cls(
            first.selection_id,
            first.base_version,
            {u.device: u.count for u in ordered},
            diff,
            sum(u.count for u in ordered),
            {u.device: u.error for u in ordered if u.error},
            {u.device: u.upload_bytes for u in ordered if u.upload_bytes},
            first.run,
        )

    def device_updates(self) -> list[DeviceUpdate]:
        """One entry per device, each pointing at this sum (the server applies devices one by one, in its order)."""
        return [
            DeviceUpdate(
                d,
                self.selection_id,
                self.base_version,
                None,
                c,
                group=self,
                error=self.errors.get(d, ""),
                upload_bytes=self.upload_bytes.get(d, 0),
                run=self.run,
            )
            for d, c in self.devices.items()
        ]

    def to_dict(self, pack: Callable[[dict | None], dict | None] = packed_or_none) -> dict:
        """As it travels (``pack``: as ``DeviceUpdate.to_dict``'s)."""
        d = {
            "selection_id": self.selection_id,
            "base_version": self.base_version,
            "devices": self.devices,
            "diff": pack(self.diff),
            "count": self.count,
        }
        if self.errors:
            d["errors"] = self.errors
        if self.upload_bytes:
            d["upload_bytes"] = self.upload_bytes
        if self.run:
            d["run"] = self.run
        return d

    @classmethod
    def from_dict(cls, d: dict) -> SelectionSum:
        diff = unpacked(d["diff"], writable=False)
        return cls(
            int(d["selection_id"]),
            int(d["base_version"]),
            dict(d["devices"]),
            diff,
            int(d["count"]),
            dict(d.get("errors") or {}),
            {str(k): int(v) for k, v in (d.get("upload_bytes") or {}).items()},
            int(d.get("run", 0)),
        )


def run_section(message: MutableMapping, run: int) -> MutableMapping:
    """Where ``message`` (a report or a reply) holds what concerns ``run``: the message itself for run 0 (as a
    standalone job's), else that run's section under ``RUN_SECTIONS``, added when missing."""
    if not run:
        return message
    sections = message.get(RUN_SECTIONS)
    if sections is None:
        sections = message[RUN_SECTIONS] = {}
    return sections.setdefault(run, {})


def sections_of(message: Mapping) -> dict[int, Mapping]:
    """Every run's part of ``message``, by run: run 0's is the message itself, then each section it carries."""
    return {0: message} | {int(run): section for run, section in (message.get(RUN_SECTIONS) or {}).items()}


# fired by the server's assessor when it ends the run; fl_ctx[RUN_OUTCOME] is {"status", "reason", "version",
# "sim_seconds"} with status "completed" (the last version, or the time budget), "stopped" (the reason says why) or
# "pruned" (one run of a pack ended on request: scheduling.pack_assessor)
RUN_OUTCOME = "edgesim.run_outcome"

# fired by a pack's server when a run that waited for a place begins inside the running job (``--runs-at-once``),
# on a context marked with that run (``common.run_scope``); fl_ctx[RUN_JOINED] is {"offset": its releases' start
# on the leaves' lock-step}
RUN_JOINED = "edgesim.run_joined"

# fired by the server's assessor at START_RUN when it resumes from a checkpoint; fl_ctx[RUN_RESUMED] is the
# checkpoint's meta: {"version", "sim_seconds", "applied", "wall_seconds"}
RUN_RESUMED = "edgesim.run_resumed"
# fired by the server's assessor just before it writes a checkpoint; fl_ctx[CHECKPOINT_DUE] is its version. A
# component whose record of a version up to it is still pending finishes that record first: a run killed after
# the checkpoint resumes past those versions, and could not make their records again.
CHECKPOINT_DUE = "edgesim.checkpoint_due"

# fired by the server's assessor when a report carries leaf information (``LEAF_PLANS`` / ``LEAF_REPORTS``);
# fl_ctx[LEAF_INFO] is {"plans": {leaf: plan}, "reports": {leaf: [report line, ...]}, "bulk": {child: its bulk
# link, "shm" or "wire: why"}} (each part only when it changed)
LEAF_INFO = "edgesim.leaf_info"
