"""A leaf below a relay shares memory with the server: its offer waits until the relay's own link is settled, it
maps the server's versions through the very handles the relay got, its diffs are the relay's own copies once read
(and go up through the relay's ring, the same bits), the relay reports held what its children hold, and the
server hears of each leaf's choice."""

from __future__ import annotations

import numpy as np
from nvflare.apis.shareable import Shareable
from nvflare.edge.mud import StateUpdateReport

from aggregation.version_store import VersionStore
from common.bulk_parent import BulkLinks
from common.protocol import BULK, BULK_BELOW, DEVICE_UPDATES, HELD_VERSIONS, DeviceUpdate
from common.shared_ring import is_handle
from simulation.bulk_link import LeafBulk
from simulation.bulk_relay import RelayBulk


class Server:
    """The server's global model as the links use it: its versions in a shared store."""

    bulk_error = ""

    def __init__(self):
        self.store = VersionStore(1 << 20, shared=True)

    def bulk_locator(self):
        return self.store.ring().locator()

    def model_handle(self, version: int, child: str):
        return self.store.handle(version, child)


def arrays(seed: int) -> dict[str, np.ndarray]:
    return {"w": np.random.default_rng(seed).standard_normal((16, 16)).astype(np.float32)}


def child_report(leaf: LeafBulk, held: set[int], updates: list[dict] = ()) -> Shareable:
    report = StateUpdateReport(0, 0, None, None).to_shareable()
    word = leaf.report_word()
    if word:
        report[BULK] = word
    report[HELD_VERSIONS] = sorted(held)
    report[DEVICE_UPDATES] = list(updates)
    return report


def test_a_leaf_below_a_relay_maps_the_servers_versions_and_its_diffs_reach_the_server_whole():
    quiet = dict(log=lambda _: None)
    server, server_links = Server(), BulkLinks("auto", **quiet)
    relay_own, leaf = LeafBulk("auto", **quiet), LeafBulk("auto", **quiet)
    relay = RelayBulk(relay_own, "auto")

    # the leaf offers before the relay's own link is settled: it is asked to offer again
    assert relay.on_child_report("C11", child_report(leaf, set())) == {"later": True}
    leaf.on_reply({"later": True})
    # the relay settles its link with the server (two reports)
    relay_own.on_reply(server_links.on_report("R1", relay_own.report_word(), server))
    server_links.on_report("R1", relay_own.report_word(), server)
    assert server_links.choices == {"R1": "shm"}
    # the leaf offers again: the relay answers with the server's own ring
    answer = relay.on_child_report("C11", child_report(leaf, set()))
    assert answer == {"ring": server.bulk_locator()}
    leaf.on_reply(answer)
    assert leaf.up and relay.on_child_report("C11", child_report(leaf, set())) is None
    assert relay.links.choices == {"C11": "shm"}

    # down: the server sends version 3 to the relay as a handle; the relay passes the same handle on
    server.store.put(3, arrays(3))
    sent = server_links.model("R1", 3, server, packed=lambda v: None)
    relay.keep(3, sent)
    value = relay.child_model("C11", 3, models={})
    assert value == sent and is_handle(value)
    weights = leaf.weights(3, value)
    assert weights["w"].tobytes() == arrays(3)["w"].tobytes()

    # up: the leaf's diff, copied out of its ring by the relay, goes up through the relay's ring, bit for bit
    entry = DeviceUpdate("C11#0", 5, 3, arrays(7)).to_dict(leaf.pack_diff)
    report = child_report(leaf, {3}, [entry])
    relay.on_child_report("C11", report)
    leaf.on_reply(None)  # the relay's reply: the leaf's slot is free again
    (forwarded,) = relay_own.next_batch(report[DEVICE_UPDATES], max_bytes=1 << 20)
    assert is_handle(forwarded["diff"])
    received = DeviceUpdate.from_dict(server_links.resolve("R1", forwarded))
    assert received.diff["w"].tobytes() == arrays(7)["w"].tobytes()

    # the relay reports held what its leaf holds, and the leaf's choice goes up with it
    up = StateUpdateReport(0, 0, None, None).to_shareable()
    assert relay.add_to_report(up, set()) == {3}
    assert up[BULK_BELOW] == {"C11": "shm"}
    server_links.note_below(up[BULK_BELOW])
    assert server_links.choices == {"R1": "shm", "C11": "shm"}


def test_a_relay_on_the_wire_keeps_its_children_on_the_wire_saying_why():
    quiet = dict(log=lambda _: None)
    relay_own, leaf = LeafBulk("auto", **quiet), LeafBulk("auto", **quiet)
    relay = RelayBulk(relay_own, "auto")
    relay_own.report_word()
    relay_own.on_reply(None)  # its parent does not share memory
    answer = relay.on_child_report("C12", child_report(leaf, set()))
    assert "refused" in answer and "the relay shares no memory with its parent" in answer["refused"]
    leaf.on_reply(answer)
    assert not leaf.up and relay.links.choices["C12"].startswith("wire: the relay shares no memory")


def test_a_relay_whose_parent_takes_diffs_only_keeps_its_children_on_the_wire_saying_why():
    """A pack's server answers the relay's offer with no ring of versions: the relay sends its own diffs through
    shared memory, and has no versions' ring to pass on, so a child's offer is refused with that reason."""
    quiet = dict(log=lambda _: None)
    relay_own, leaf = LeafBulk("auto", **quiet), LeafBulk("auto", **quiet)
    relay = RelayBulk(relay_own, "auto")
    relay_own.report_word()
    relay_own.on_reply({"ring": None})
    assert relay_own.up and relay.bulk_locator() is None and not relay.bulk_pending
    answer = relay.on_child_report("C12", child_report(leaf, set()))
    assert answer == {"refused": "the relay's versions come on NVFlare's wire"}
    leaf.on_reply(answer)
    assert not leaf.up and relay.links.choices["C12"] == "wire: the relay's versions come on NVFlare's wire"
