"""The ring of shared memory bulk arrays travel in: fixed slots handed out lowest first, generations that make a
reused slot's old handle fail, no slot handed out again while a view of it is alive, a full ring and a ring that
cannot grow refused with the reason (no SIGBUS), memory only its user can map, and nothing left behind when the
process that owns it is killed."""

from __future__ import annotations

import gc
import os
import signal
import stat
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from common.shared_ring import (
    SLOT_HEADER,
    BulkUnavailable,
    SharedRing,
    StaleHandle,
    attach,
    file_handle,
    map_file,
)
from tests.conftest import REPO

PAGE = os.sysconf("SC_PAGE_SIZE")


def filled(ring: SharedRing, nbytes: int, value: int):
    slot = ring.acquire(nbytes)
    assert slot is not None, ring.refusal
    np.frombuffer(slot.data, dtype=np.uint8)[:] = value
    return slot


def test_slots_are_handed_out_lowest_first_and_a_reused_slot_fails_its_old_handle():
    ring = SharedRing("slots", max_bytes=4 * PAGE)
    a, b = filled(ring, 1000, 1), filled(ring, 1000, 2)
    assert (a.index, a.generation, b.index) == (0, 1, 1)
    assert ring.stride == PAGE and ring.max_slots == 4 and ring.slot_bytes == PAGE - SLOT_HEADER
    old = ring.handle(a, "layout")
    peer = attach(ring.locator())
    assert bytes(peer.copy(old)) == bytes([1]) * 1000
    assert peer.view(old).readonly and bytes(peer.view(old)) == bytes([1]) * 1000
    ring.release(a.index, a.generation)
    del a
    gc.collect()
    again = filled(ring, 500, 3)  # the lowest free slot, its generation bumped
    assert (again.index, again.generation) == (0, 2)
    with pytest.raises(StaleHandle, match="generation 2"):
        peer.copy(old)
    with pytest.raises(StaleHandle):
        peer.view(old)
    assert bytes(peer.copy(ring.handle(again, "layout"))) == bytes([3]) * 500
    ring.release(b.index, b.generation - 1)  # an older generation's release changes nothing
    assert ring.in_use == 2


def test_a_released_slot_is_not_handed_out_while_a_view_of_it_is_alive():
    ring = SharedRing("views", max_bytes=2 * PAGE)
    first = filled(ring, 100, 7)
    array = np.frombuffer(first.data, dtype=np.uint8)[10:20]  # a view of a view: it still holds the mapping
    ring.release(first.index, first.generation)
    del first
    gc.collect()
    assert filled(ring, 100, 8).index == 1  # slot 0 is still viewed here
    assert ring.acquire(100) is None and "all 2 slots" in ring.refusal
    assert not ring.has_room()
    assert bytes(array) == bytes([7]) * 10  # never overwritten
    del array
    gc.collect()
    assert ring.has_room() and ring.acquire(100).index == 0


def test_a_blob_larger_than_the_slots_is_refused_with_the_reason():
    ring = SharedRing("sizes", max_bytes=8 * PAGE)
    filled(ring, 2 * PAGE, 1)  # the first blob sets the stride
    assert ring.slot_bytes == 3 * PAGE - SLOT_HEADER
    assert ring.acquire(ring.slot_bytes + 1) is None and "exceeds the ring's slots" in ring.refusal


GROW_LIMITED = textwrap.dedent(
    """
    import resource, sys
    from common.shared_ring import SharedRing
    page = resource.getpagesize()
    resource.setrlimit(resource.RLIMIT_FSIZE, (4 * page, 4 * page))  # the memory may not grow past 4 pages
    ring = SharedRing("limited", max_bytes=64 * page)
    slots = [ring.acquire(page - 64) for _ in range(5)]
    print([s is not None for s in slots], ring.refusal, ring.has_room())
    """
)


def test_a_ring_that_cannot_grow_refuses_the_next_slot_with_the_reason_instead_of_failing_later():
    """A file-size limit stands for Docker's 64 MB /dev/shm or a memory limit: the ring's pages are reserved as it
    grows, so the refusal comes at once, as a None and a reason, not as a SIGBUS when a page is touched."""
    out = subprocess.run([sys.executable, "-c", GROW_LIMITED], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("[True, True, True, False, False] shared memory cannot grow past")
    assert out.stdout.strip().endswith("False")


def test_only_its_user_can_map_it_and_only_the_ring_named():
    ring = SharedRing("owner", max_bytes=PAGE)
    locator = ring.locator()
    mode = os.stat(f"/proc/self/fd/{locator['fd']}").st_mode
    assert stat.S_IMODE(mode) == 0o600
    assert not [name for name in os.listdir("/dev/shm") if "edgesim" in name]  # never named there
    with pytest.raises(BulkUnavailable, match="nonce"):
        attach(locator | {"nonce": "0" * 32})
    with pytest.raises(BulkUnavailable, match="another machine"):
        attach(locator | {"boot": "another-boot-id"})
    with pytest.raises(BulkUnavailable, match="cannot open"):
        attach(locator | {"fd": 10**6})
    os.fchmod(locator["fd"], 0o644)  # as if another user could read it
    with pytest.raises(BulkUnavailable, match="not this user's alone"):
        attach(locator)


def test_a_spilled_file_is_mapped_read_only_and_only_when_it_is_its_users_alone(tmp_path):
    path = tmp_path / "3.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, bytes(range(256)))
    os.close(fd)
    view = map_file(file_handle(str(path), 256, "layout"))
    os.remove(path)  # a mapping outlives the file's name
    assert view.readonly and bytes(view) == bytes(range(256))
    path.write_bytes(b"x" * 256)
    os.chmod(path, 0o644)
    with pytest.raises(BulkUnavailable, match="not this user's alone"):
        map_file(file_handle(str(path), 256, "layout"))


OWNER = textwrap.dedent(
    """
    import json, sys, time
    import numpy as np
    from common.shared_ring import SharedRing
    ring = SharedRing(sys.argv[1], max_bytes=1 << 20)
    slot = ring.acquire(4096)
    np.frombuffer(slot.data, dtype=np.uint8)[:] = 9
    print(json.dumps([ring.locator(), ring.handle(slot, "layout")]), flush=True)
    time.sleep(600)
    """
)


def holders(label: str) -> list[str]:
    """Every process of this machine that holds the ring ``label`` open or mapped."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        links = []
        try:
            with open(f"/proc/{pid}/maps") as f:
                links.append(f.read())
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    links.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
                except OSError:  # closed meanwhile (listdir's own)
                    pass
        except OSError:  # the process ended
            continue
        if any(f"edgesim-{label}" in link for link in links):
            found.append(pid)
    return found


def test_a_ring_whose_owner_is_killed_leaves_nothing_once_its_last_reader_lets_go():
    """kill -9 of the owner (a leaf, or the server): a peer's mapping stays readable until it goes, then no
    process holds the memory, and there never was a name in /dev/shm to clean up."""
    label = f"killed-{os.getpid()}"
    shm_before = set(os.listdir("/dev/shm"))
    owner = subprocess.Popen([sys.executable, "-c", OWNER, label], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        import json

        locator, handle = json.loads(owner.stdout.readline())
        peer = attach(locator)
        view = peer.view(handle)
        assert holders(label) == sorted({str(owner.pid), str(os.getpid())}, key=int)
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait(timeout=30)
    assert bytes(view[:4]) == b"\t\t\t\t"  # what this process mapped stays valid
    with pytest.raises(BulkUnavailable):  # the owner's ring can no longer be opened
        attach(locator)
    del view
    peer.close()
    gc.collect()
    assert holders(label) == []
    assert set(os.listdir("/dev/shm")) == shm_before
