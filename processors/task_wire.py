"""What a device's task carries in and its result carries out, as NVFlare's DXOs: the version's weights (and the
server's extra state for devices that came with them), and the device's WEIGHT_DIFF with its id (and a failed
device's error)."""

from __future__ import annotations

import numpy as np
import torch
from nvflare.apis.dxo import DXO, DataKind, from_dict
from nvflare.edge.constants import MsgKey
from nvflare.edge.web.models.task_response import TaskResponse

from common.privacy import CLIP_NORM
from common.protocol import DEVICE_ERROR_META, DEVICE_EXTRA_PREFIX, DEVICE_ID_META


def received_model(task: TaskResponse) -> tuple[int, dict]:
    """(model version, weights) of a task: the WEIGHTS DXO NVFlare's leaf executor hands a device."""
    model = from_dict(task.task_data)
    if not isinstance(model, DXO) or model.data_kind != DataKind.WEIGHTS or not isinstance(model.data, dict):
        raise ValueError("expected a task holding a WEIGHTS DXO with a dict of weights")
    return int(model.get_meta_prop(MsgKey.MODEL_VERSION, 0) or 0), model.data


def device_extras(params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The server's extra state for devices that came with a version's weights (``common.protocol``), by name,
    for the method's hooks: the version's clip norm (differential privacy, ``processors.privatize``) is not theirs."""
    n = len(DEVICE_EXTRA_PREFIX)
    return {k[n:]: v for k, v in params.items() if k.startswith(DEVICE_EXTRA_PREFIX) and k[n:] != CLIP_NORM}


def weight_diff_result(
    device_id: str, diff: dict[str, np.ndarray], count: int = 1, stock_lists: bool = False, error: str = ""
) -> dict:
    """A device's result: its WEIGHT_DIFF DXO (as a dict), with its id in the metadata (and a failed device's
    ``error``). ``stock_lists``: weights as Python lists, the format of NVFlare's example (the stock baseline)."""
    if stock_lists:
        diff = {k: v.tolist() for k, v in diff.items()}
    result = DXO(data_kind=DataKind.WEIGHT_DIFF, data={"dict": diff, "count": count})
    result.set_meta_prop(DEVICE_ID_META, device_id)
    if error:
        result.set_meta_prop(DEVICE_ERROR_META, error)
    return result.to_dict()
