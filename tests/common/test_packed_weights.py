"""Weights and diffs travel packed into one blob: the same arrays come back, bit for bit, through NVFlare's own
serialiser, whatever their dtypes and shapes."""

import numpy as np
from nvflare.fuel.utils import fobs
from nvflare.fuel.utils.fobs.datum import Datum

from common.packed_weights import is_packed, pack, packed_or_none, unpack, unpacked


def test_a_packed_dict_comes_back_bit_for_bit_through_fobs():
    rng = np.random.default_rng(0)
    weights = {
        "conv.weight": rng.standard_normal((6, 3, 5, 5)).astype(np.float32),
        "bn.num_batches_tracked": np.array(7, dtype=np.int64),  # a 0-d counter
        "fc.bias": np.array([np.nan, -0.0, 1e-38], dtype=np.float32),
        "empty": np.zeros((0, 4), np.float32),
        "half": rng.standard_normal(5).astype(np.float16),
    }
    wire = fobs.loads(fobs.dumps({"diff": pack(weights)}))["diff"]
    assert is_packed(wire)
    back = unpack(wire)
    assert list(back) == list(weights)
    for name, array in weights.items():
        assert back[name].dtype == array.dtype and back[name].shape == array.shape
        assert back[name].tobytes() == array.tobytes()
        assert back[name].flags.writeable
    back["conv.weight"] += 1  # a view of its own copy, not of the received message


def test_packing_is_idempotent_and_plain_dicts_pass():
    weights = {"w": np.ones(3, np.float32)}
    packed = pack(weights)
    assert packed_or_none(packed) is packed and packed_or_none(None) is None
    assert unpacked(weights) is weights and unpacked(packed)["w"].tobytes() == weights["w"].tobytes()


def test_the_blob_travels_beside_the_message_body_and_through_a_relay_unchanged():
    weights = {"w": np.arange(70_000, dtype=np.float32), "b": np.ones(3, np.float32)}
    sent = fobs.dumps({"updates": [{"diff": pack(weights)}]})
    at_relay = fobs.loads(sent)["updates"]  # a relay forwards its children's entries as they came
    assert isinstance(at_relay[0]["diff"]["data"], Datum)  # a section of its own, not inside msgpack's body
    at_server = fobs.loads(fobs.dumps({"updates": at_relay}))["updates"][0]["diff"]
    back = unpack(at_server, writable=False)
    assert {k: a.tobytes() for k, a in back.items()} == {k: a.tobytes() for k, a in weights.items()}
    assert not back["w"].flags.writeable  # read-only views of the received bytes: no copy


def test_a_blob_packed_the_older_way_still_unpacks():
    weights = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "n": np.array(4, np.int64)}
    older = {  # as a checkpoint written before the layout became one string holds a received diff
        "edgesim_packed": 1,
        "names": list(weights),
        "dtypes": [a.dtype.str for a in weights.values()],
        "shapes": [list(a.shape) for a in weights.values()],
        "data": b"".join(a.tobytes() for a in weights.values()),
    }
    back = unpack(older, writable=False)
    assert {k: (a.shape, a.tobytes()) for k, a in back.items()} == {
        k: (a.shape, a.tobytes()) for k, a in weights.items()
    }
