"""A device update's diff crosses NVFlare's FOBS wire as a datum beside the message body, and comes back bit for
bit, through a relay too."""

import numpy as np
from nvflare.apis.shareable import Shareable
from nvflare.fuel.utils import fobs

from common.packed_weights import pack, packed_bytes
from common.protocol import DEVICE_UPDATES, SELECTION_SUMS, DeviceUpdate, SelectionSum


def diff(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "conv.w": rng.standard_normal((8, 3, 3, 3)).astype(np.float32),
        "fc.w": rng.standard_normal((4, 6)).astype(np.float32).T,  # not C-contiguous
        "fc.b": rng.standard_normal(10),
        "steps": np.array(3, dtype=np.int64),  # a 0-d report
    }


def cross(message: Shareable) -> Shareable:
    """What the receiver of an aux message gets (the cell serialises with a buffer list)."""
    return fobs.loads(fobs.dumps(message, buffer_list=True))


def test_update_blobs_travel_beside_the_body_and_come_back_bit_for_bit():
    updates = [DeviceUpdate(f"site-1#{i}", 7, 3, diff(i)) for i in range(3)] + [DeviceUpdate("site-1#9", 8, 3, None, 0)]
    message = Shareable()
    message[DEVICE_UPDATES] = [u.to_dict() for u in updates]
    message[SELECTION_SUMS] = [SelectionSum.of(updates[:2]).to_dict()]
    body_only = Shareable()  # the same blobs as bytes inside the message body
    body_only[DEVICE_UPDATES] = [{"diff": bytes(packed_bytes(pack(u.diff)))} for u in updates[:3]]
    blob = sum(a.nbytes for u in updates[:3] for a in u.diff.values())
    # the blobs are not copied into the body (the buffer list's second entry, after its header)
    assert len(fobs.dumps(message, buffer_list=True)[1]) < blob < len(fobs.dumps(body_only, buffer_list=True)[1])
    relayed = cross(cross(message))  # a relay forwards the entries as it got them
    got = [DeviceUpdate.from_dict(d) for d in relayed[DEVICE_UPDATES]]
    assert [(u.device, u.selection_id, u.base_version, u.count) for u in got] == [
        (u.device, u.selection_id, u.base_version, u.count) for u in updates
    ]
    for sent, back in zip(updates[:3], got[:3], strict=True):
        assert sent.diff.keys() == back.diff.keys()
        for k in sent.diff:
            assert back.diff[k].dtype == sent.diff[k].dtype
            assert back.diff[k].tobytes() == sent.diff[k].tobytes()
    assert got[3].diff is None
    (total,) = [SelectionSum.from_dict(d) for d in relayed[SELECTION_SUMS]]
    assert total.diff["fc.b"].tobytes() == (updates[0].diff["fc.b"] + updates[1].diff["fc.b"]).tobytes()
