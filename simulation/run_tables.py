"""A node's tables of one run of a pack (several runs in one job, ``docs/packs.md``) after the first: the model
versions its selected devices train, its selection, each selection id's version and release, the tasks handed out
and the devices the parent awaits. ``simulation.versioned_updater`` keeps run 0's in its own state, exactly as in a
standalone job, and one ``RunTables`` per later run, filled from that run's section of each reply
(``common.protocol.RUN_SECTIONS``); a later run's models come as run 0's do, packed or as handles of that run's
ring in shared memory (the node's bulk link, ``simulation.bulk_link``, maps them).
"""

from __future__ import annotations

from collections.abc import Callable

from nvflare.apis.dxo import DXO, DataKind
from nvflare.edge.constants import MsgKey
from nvflare.edge.mud import PropKey

from common.packed_maps import pack_map, unpacked_map
from common.packed_weights import pack, unpack
from common.protocol import AWAITED, HELD_VERSIONS, MODELS, RELEASES, SELECTION_RELEASES, SELECTION_VERSIONS


def unpack_version(version: int, value: dict) -> dict:
    """A model version off the wire: its arrays, unpacked (a copy of its own)."""
    return unpack(value)


def weights_dxo(version: int, weights: dict) -> DXO:
    """The WEIGHTS DXO of a model version, as a device's task carries it."""
    dxo = DXO(DataKind.WEIGHTS, data=weights)
    dxo.set_meta_prop(MsgKey.MODEL_VERSION, version)
    return dxo


def first_missing(
    prefix: str,
    selection: dict[str, int],
    fetched: set,
    versions: dict[int, int],
    releases: dict[int, int],
    models: dict,
) -> float:
    """The lowest release of ``prefix``'s selected devices not handed out yet whose model is not here yet (inf:
    none): the lock-step waits for it (``releases_complete``)."""
    lowest = float("inf")
    for device, sid in selection.items():
        if device.startswith(prefix) and (device, sid) not in fetched and versions.get(sid) not in models:
            lowest = min(lowest, releases.get(sid, 0))
    return lowest


def tasks_of(
    prefix: str,
    selection: dict[str, int],
    fetched: set[tuple[str, int]],
    versions: dict[int, int],
    releases: dict[int, int],
    models: dict[int, DXO],
) -> list[tuple[str, int, int, int | None]]:
    """The tasks of ``prefix``'s selected devices not handed out yet whose model is here, in device-id order,
    marked handed out in ``fetched``. A release goes out whole: while one of its devices here waits for its model
    (a version whose shared-memory link was not readable yet comes again in a later reply), none of that release's
    devices is handed out, so the leaf's groups, cut by release, never depend on when a model arrives."""
    incomplete = {
        releases[sid]
        for device, sid in selection.items()
        if device.startswith(prefix)
        and (device, sid) not in fetched
        and versions.get(sid) not in models
        and releases.get(sid) is not None
    }
    tasks = []
    for device, sid in sorted(selection.items()):
        if not device.startswith(prefix) or (device, sid) in fetched:
            continue
        version = versions.get(sid)
        if version not in models:  # not here yet: a later reply brings it (and a new stamp)
            continue
        if releases.get(sid) in incomplete:  # with the rest of its release, once every model of it is here
            continue
        tasks.append((device, sid, version, releases.get(sid)))
        fetched.add((device, sid))
    return tasks


class RunTables:
    """What a node holds of one run of a pack after the first (run 0's is the node's ``VersionedState``): the
    model versions its selected devices train, its selection (and its version), each selection id's version and
    release, the tasks handed out and the devices the parent awaits."""

    def __init__(self) -> None:
        self.models: dict[int, DXO] = {}
        self.selection: dict[str, int] = {}
        self.selection_version = 0
        self.selection_versions: dict[int, int] = {}
        self.selection_releases: dict[int, int] = {}
        self.fetched: set[tuple[str, int]] = set()
        self.awaited: set[str] = set()
        self.releases: tuple[int, bool] | None = None  # the run's releases so far and whether it ended (``RELEASES``)

    def take(self, section: dict, weights: Callable[[int, dict], dict | None] = unpack_version) -> bool:
        """Take the parent's word on this run (its section of a reply); True if the selection or models changed.
        ``weights(version, value)``: a model as it came, unpacked or mapped (None: not readable, it comes again)."""
        models = {}
        for v, p in (section.get(MODELS) or {}).items():
            arrays = weights(v, p)
            if arrays is not None:
                models[v] = weights_dxo(v, arrays)
        self.models.update(models)
        changed = bool(models)
        version = section.get(PropKey.DEVICE_SELECTION_VERSION, self.selection_version)
        if version != self.selection_version and PropKey.DEVICE_SELECTION in section:
            self.selection_version = version
            self.selection = unpacked_map(section[PropKey.DEVICE_SELECTION]) or {}
            changed = True
        if SELECTION_VERSIONS in section:
            self.selection_versions = dict(unpacked_map(section[SELECTION_VERSIONS]))
        if SELECTION_RELEASES in section:
            self.selection_releases = dict(unpacked_map(section[SELECTION_RELEASES]))
        self.awaited = set(section.get(AWAITED) or ())
        if RELEASES in section and tuple(section[RELEASES]) != self.releases:
            self.releases = (int(section[RELEASES][0]), bool(section[RELEASES][1]))
            changed = True
        self.fetched.intersection_update(self.selection.items())
        keep = {self.selection_versions[s] for s in set(self.selection.values()) if s in self.selection_versions}
        self.models = {v: m for v, m in self.models.items() if v in keep}
        return changed

    def report(self, held: Callable[[set[int]], list[int]] = sorted) -> dict:
        """This run's section of a report: the versions held (``held``: with those still viewed in shared memory),
        the selection version known."""
        return {HELD_VERSIONS: held(set(self.models)), PropKey.DEVICE_SELECTION_VERSION: self.selection_version}

    def reply(self, section: dict) -> dict:
        """A child's section of the reply (``section``: the child's section of its report), as a relay answers."""
        out: dict = {PropKey.DEVICE_SELECTION_VERSION: self.selection_version}
        if section.get(PropKey.DEVICE_SELECTION_VERSION) != self.selection_version:
            out[PropKey.DEVICE_SELECTION] = pack_map(self.selection)
        needed = set(self.selection_versions.values()) - set(section.get(HELD_VERSIONS) or ())
        models = {v: pack(self.models[v].data) for v in sorted(needed) if v in self.models}
        if models:
            out[MODELS] = models
        out[AWAITED] = sorted(self.awaited)
        out[SELECTION_VERSIONS] = pack_map(self.selection_versions)
        out[SELECTION_RELEASES] = pack_map(self.selection_releases)
        if self.releases is not None:
            out[RELEASES] = list(self.releases)
        return out
