"""A leaf's bulk link and the server's: shared memory only after each side proved it maps the other's ring, the
choice said once and recorded with its reason, a site or a run that turns it off, a diff readable once on the
server whatever its leaf does with its slot afterwards, and a report that stops at a full ring instead of putting
its diffs on the wire."""

from __future__ import annotations

import numpy as np
import pytest
from nvflare.apis.fl_context import FLContext
from nvflare.edge.mud import BaseState, StateUpdateReply

from aggregation.version_store import VersionStore
from common.bulk_parent import BulkError, BulkLinks
from common.packed_weights import pack
from common.protocol import BULK, DEVICE_UPDATES, DeviceUpdate
from common.shared_ring import HANDLE, is_handle
from simulation.bulk_link import SITE_OVERRIDE, LeafBulk
from simulation.versioned_updater import VersionedUpdater


class Model:
    """The server's global model as the links use it: its versions in a shared store."""

    def __init__(self, shared: bool = True):
        self.store = VersionStore(1 << 20, shared=shared)

    def bulk_locator(self):
        ring = self.store.ring()
        return ring.locator() if ring is not None else None

    bulk_error = ""

    def model_handle(self, version: int, child: str):
        return self.store.handle(version, child)


def diff(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"w": rng.standard_normal((32, 32)).astype(np.float32), "b": rng.standard_normal(32).astype(np.float32)}


def handshake(leaf: LeafBulk, links: BulkLinks, model: Model, child: str = "site-1") -> None:
    """The first two reports and their replies, as a leaf and the server exchange them."""
    leaf.on_reply(links.on_report(child, leaf.report_word(), model))
    links.on_report(child, leaf.report_word(), model)


def test_both_sides_map_each_others_ring_before_anything_goes_through_shared_memory():
    said, model = [], Model()
    leaf, links = LeafBulk("auto", log=said.append), BulkLinks("auto", log=said.append)
    offer = leaf.report_word()
    assert set(offer) == {"offer"} and offer["offer"]["kind"] == "memfd"
    assert not is_handle(leaf.pack_diff(diff(0)))  # offered, not answered: the wire still
    answer = links.on_report("site-1", offer, model)
    assert set(answer) == {"ring"} and links.choices == {}  # the server mapped it; the leaf has not said yet
    leaf.on_reply(answer)
    assert leaf.up and leaf.report_word() == {"ready": True}
    assert links.on_report("site-1", {"ready": True}, model) is None
    assert links.choices == {"site-1": "shm"} and links.ready("site-1")
    assert said == [
        "bulk arrays: shared memory with the parent (diffs up, versions down)",
        "bulk arrays of site-1: shared memory (diffs up, versions down)",
    ]
    assert leaf.report_word() is None  # said once


def test_a_diff_is_the_servers_own_copy_once_read_whatever_the_leaf_does_with_its_slot():
    model = Model()
    leaf, links = LeafBulk("auto", log=lambda _: None), BulkLinks("auto", log=lambda _: None)
    handshake(leaf, links, model)
    entry = DeviceUpdate("site-1#3", 7, 1, diff(3)).to_dict(leaf.pack_diff)
    assert is_handle(entry["diff"]) and entry["diff"][HANDLE] == "memfd"
    received = DeviceUpdate.from_dict(links.resolve("site-1", entry))
    leaf.on_reply(None)  # the reply came: the slot is the leaf's again
    again = DeviceUpdate("site-1#4", 7, 1, diff(4)).to_dict(leaf.pack_diff)
    assert again["diff"]["slot"] == entry["diff"]["slot"]  # the same slot, a new generation
    assert {k: a.tobytes() for k, a in received.diff.items()} == {k: a.tobytes() for k, a in diff(3).items()}
    with pytest.raises(BulkError, match="generation"):  # the old handle cannot be read as the new blob
        links.resolve("site-1", entry)


def test_a_report_whose_diff_cannot_be_read_gives_the_updates_before_it_and_why_and_keeps_the_error():
    model = Model()
    leaf, links = LeafBulk("auto", log=lambda _: None), BulkLinks("auto", log=lambda _: None)
    handshake(leaf, links, model)
    stale = DeviceUpdate("site-1#3", 7, 1, diff(3)).to_dict(leaf.pack_diff)
    leaf.on_reply(None)  # the leaf takes its slot back and writes another diff in it: the first handle is stale
    fresh = DeviceUpdate("site-1#4", 7, 1, diff(4)).to_dict(leaf.pack_diff)
    updates, why = links.updates_of("site-1", {DEVICE_UPDATES: [fresh, stale, fresh]})
    assert [u.device for u in updates] == ["site-1#4"]  # the rest of the report is dropped
    assert updates[0].diff["w"].tobytes() == diff(4)["w"].tobytes()
    assert "generation" in why and links.error == why
    later, none = links.updates_of("site-1", {DEVICE_UPDATES: [fresh]})
    assert none == "" and [u.device for u in later] == ["site-1#4"]
    assert links.error == why  # a later readable report does not undo the loss: the run still stops


def test_a_version_is_mapped_by_the_leaf_and_reported_held_while_it_views_it():
    model = Model()
    leaf, links = LeafBulk("auto", log=lambda _: None), BulkLinks("auto", log=lambda _: None)
    handshake(leaf, links, model)
    model.store.put(5, diff(5))
    value = links.model("site-1", 5, model, packed=lambda v: pytest.fail("sent packed"))
    weights = leaf.weights(5, value)
    assert not weights["w"].flags.writeable and weights["w"].tobytes() == diff(5)["w"].tobytes()
    assert leaf.held(set()) == [5]  # viewed here, so the server keeps it
    del weights
    assert leaf.held({6}) == [6]


@pytest.mark.parametrize(
    "leaf_mode, server_mode, env, choice",
    [
        ("wire", "auto", "", "wire: --bulk wire"),
        ("auto", "wire", "", "wire: --bulk wire"),
        ("auto", "auto", "wire", f"wire: {SITE_OVERRIDE}=wire in this site's environment"),
    ],
)
def test_a_run_or_a_site_that_turns_it_off_keeps_the_wire_and_says_why(
    monkeypatch, leaf_mode, server_mode, env, choice
):
    monkeypatch.setenv(SITE_OVERRIDE, env)
    model = Model()
    leaf, links = LeafBulk(leaf_mode, log=lambda _: None), BulkLinks(server_mode, log=lambda _: None)
    for _ in range(3):
        reply = links.on_report("site-1", leaf.report_word(), model)
        leaf.on_reply(reply)
    assert links.choices == {"site-1": choice} and not leaf.up and not links.ready("site-1")
    assert not is_handle(leaf.pack_diff(diff(0)))
    assert links.required_failure == ""


def test_with_bulk_shm_a_leaf_that_cannot_share_memory_is_the_runs_failure():
    links = BulkLinks("shm", log=lambda _: None)
    links.on_report("site-2", {"ready": False, "reason": "the parent's ring cannot be mapped here: x"}, Model())
    assert links.required_failure == (
        "--bulk shm, but site-2 cannot share memory with the server (the parent's ring cannot be mapped here: x)"
    )


def test_a_parent_without_versions_in_shared_memory_takes_diffs_through_it_and_sends_versions_on_the_wire():
    """A pack's server (``versions=False``): it maps the leaf's ring and answers with no ring of its own, so the
    leaf's diffs go up as handles, each version comes packed; a handle that came anyway puts the link on the wire
    (the server sends the version again), said once."""
    said = []
    leaf, links = LeafBulk("auto", log=said.append), BulkLinks("auto", log=said.append, versions=False)
    answer = links.on_report("site-1", leaf.report_word(), None)
    assert answer == {"ring": None}
    leaf.on_reply(answer)
    assert leaf.up and links.on_report("site-1", leaf.report_word(), None) is None
    assert links.choices == {"site-1": "shm"}
    entry = DeviceUpdate("site-1#3", 7, 1, diff(3)).to_dict(leaf.pack_diff)
    assert is_handle(entry["diff"])
    received = DeviceUpdate.from_dict(links.resolve("site-1", entry))
    assert received.diff["w"].tobytes() == diff(3)["w"].tobytes()
    weights = leaf.weights(5, pack(diff(5)))
    assert weights["w"].tobytes() == diff(5)["w"].tobytes() and leaf.held(set()) == []
    model = Model()
    model.store.put(6, diff(6))
    assert leaf.weights(6, model.model_handle(6, "site-1")) is None and not leaf.up
    assert said == [
        "bulk arrays: shared memory with the parent (diffs up; versions on NVFlare's wire)",
        "bulk arrays of site-1: shared memory (diffs up; versions on NVFlare's wire)",
        "bulk arrays: back on the wire: version 6 could not be mapped: a handle came before the parent's ring was "
        "mapped",
    ]


def test_a_parent_that_never_answers_the_offer_leaves_the_leaf_on_the_wire():
    """NVFlare's own parent, or a relay: its reply has no word on shared memory."""
    said = []
    leaf = LeafBulk("auto", log=said.append)
    leaf.report_word()
    leaf.on_reply(None)
    assert not leaf.up and leaf.report_word()["ready"] is False
    assert said == ["bulk arrays: NVFlare's wire (the parent does not share memory (it did not answer the offer))"]


def test_a_report_takes_as_many_diffs_as_the_ring_holds_and_the_rest_go_in_the_next_one():
    model = Model()
    bulk = LeafBulk("auto", log=lambda _: None, ring_bytes=3 * 8192)  # three slots of one diff each
    links = BulkLinks("auto", log=lambda _: None)
    handshake(bulk, links, model)
    updater = VersionedUpdater(bulk=bulk)
    updater.start_task(BaseState(0, None, 0, {}).to_shareable(), FLContext())
    updater._pending = [DeviceUpdate(f"site-1#{i}", 1, 1, diff(i)) for i in range(5)]
    first = updater.prepare_update_for_parent(FLContext())
    assert [is_handle(e["diff"]) for e in first[DEVICE_UPDATES]] == [True, True, True]
    updater.process_parent_update_reply(StateUpdateReply(0, None, 0, None).to_shareable(), FLContext())  # frees them
    second = updater.prepare_update_for_parent(FLContext())
    assert [e["device"] for e in second[DEVICE_UPDATES]] == ["site-1#3", "site-1#4"]
    assert all(is_handle(e["diff"]) for e in second[DEVICE_UPDATES]) and BULK not in second
