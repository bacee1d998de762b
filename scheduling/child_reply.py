"""What the server says to a child (a leaf, or a relay above leaves) when it reports: the devices it registers
join the pool, and the reply carries, from the applier's last published view, the current version, the child's
part of the selection, the version and release of each of its selection ids, the devices the server waits for,
and every model version its devices train that it does not hold yet. The selection's maps travel packed
(``common.packed_maps``: NVFlare's serialiser walks a plain dict entry by entry)."""

from __future__ import annotations

from collections.abc import Callable

from nvflare.apis.shareable import Shareable
from nvflare.edge.mud import PropKey, StateUpdateReply, StateUpdateReport

from common.packed_maps import pack_map
from common.protocol import AWAITED, DEVICE_RANGES, MODELS, RELEASES, SELECTION_RELEASES, SELECTION_VERSIONS
from scheduling.applier import UpdateApplier
from scheduling.device_pool import DevicePool


def register_devices(pool: DevicePool, update: Shareable, report: StateUpdateReport, lost: set[str]) -> None:
    """Add the devices a report announces (ranges of simulated devices, or real devices one by one) to ``pool``,
    except those of a leaf already counted ``lost``."""
    for prefix, (count, leaf) in (update.get(DEVICE_RANGES) or {}).items():
        if leaf not in lost:
            pool.register_range(prefix, int(count), leaf)
    for device_id, device in (report.available_devices or {}).items():
        if device.client_name not in lost:
            pool.register(device_id, device.client_name)


def reply_to(
    applier: UpdateApplier,
    leaves: set[str],
    report: StateUpdateReport,
    held: set[int],
    model: Callable[[int], dict] | None = None,
    release_offset: int | None = None,
) -> Shareable:
    """What a child whose subtree holds ``leaves`` needs, from the applier's view (``held``: the versions it said
    it holds). The newest model itself travels only when a device of the child trains it; ``model`` gives a
    version as this child is sent it (packed, or a handle of shared memory: ``common.bulk_parent``; default
    packed). A version the run forgot since the view was taken (its last device's update has come) is left out.
    ``release_offset``: a pack's reply also says how many releases the run made and whether it ended (``RELEASES``,
    from the same view), for the leaves' lock-step (``simulation.leaf_channels.GatewayChannel``); the run's releases
    are numbered from it there (a run that joined a running pack: its release 1 is the lock-step's ``offset + 1``)."""
    view = applier.child_view(leaves)
    if not view.version:
        return StateUpdateReply(0, None, 0, None).to_shareable()
    mine, versions = view.selection, view.selection_versions
    changed = report.current_device_selection_version != view.selection_version
    reply = StateUpdateReply(view.version, None, view.selection_version, None).to_shareable()
    if changed:
        reply[PropKey.DEVICE_SELECTION] = pack_map(mine)  # even when empty: the child's devices are all done
    needed = set(versions.values()) - held
    if needed:
        model = model or applier.model
        models = {}
        for v in sorted(needed):
            try:
                models[v] = model(v)
            except KeyError:  # forgotten since the view: no device of the child trains it any more
                continue
        reply[MODELS] = models
    reply[AWAITED] = list(view.awaited)
    reply[SELECTION_VERSIONS] = pack_map(versions)
    if release_offset:
        reply[SELECTION_RELEASES] = pack_map({sid: r + release_offset for sid, r in view.selection_releases.items()})
    else:
        reply[SELECTION_RELEASES] = pack_map(view.selection_releases)
    if release_offset is not None:
        reply[RELEASES] = [view.releases + release_offset, view.ended]
    return reply
