"""The selection's maps travel packed and come back equal, through NVFlare's own serialiser."""

import numpy as np
from nvflare.apis.shareable import Shareable
from nvflare.fuel.utils import fobs

from common.packed_maps import PACKED_MAP, pack_map, unpacked_map


def test_maps_come_back_equal_through_fobs():
    selection = {f"site-1#{i}": 5000 + i for i in range(300)}
    versions = {np.int64(5000 + i): 300 + i // 2 for i in range(300)}  # numpy keys come back as ints
    message = Shareable()
    message["selection"], message["versions"], message["empty"] = pack_map(selection), pack_map(versions), pack_map({})
    received = fobs.loads(fobs.dumps(message))
    assert PACKED_MAP in received["selection"] and PACKED_MAP in received["versions"]
    assert unpacked_map(received["selection"]) == selection
    back = unpacked_map(received["versions"])
    assert back == {int(k): v for k, v in versions.items()} and all(type(k) is int for k in back)
    assert unpacked_map(received["empty"]) == {}


def test_what_cannot_be_packed_travels_as_it_is():
    for mapping in ({"a\nb": 1, "c": 2}, {"a": 1.5}, {"a": 1, 2: 3}, {"a": None}):
        assert pack_map(mapping) is mapping and unpacked_map(mapping) is mapping
    assert unpacked_map(None) is None
