"""The device side of a ``--devices real`` job: NVFlare's ``DeviceTaskProcessor`` for a device that reaches the
leaves over HTTP, through NVFlare's routing proxy.

NVFlare's HTTP device client runs it (``python -m nvflare.edge.simulation.run_device_simulator CONFIG``, with
``"processor": {"path": "processors.device_processor.RealDeviceProcessor"}`` in CONFIG; ``docs/real-devices.md``).
Each task is a JSON-safe WEIGHTS DXO (nested lists, ``common.device_wire``) whose metadata says how the job trains
(``DEVICE_SETTINGS_META``: model, data, optimiser, seed, the method's device hook). The device trains exactly as a
simulated device of the same id would (``processors.task_processor.TrainingTaskProcessor.train``: its own data
partition, its own seeded batch order) and answers with its WEIGHT_DIFF as lists. A phone app does the same with
its own data: it must return ``{"kind": "WEIGHT_DIFF", "data": {"dict": {name: nested list}, "count": 1},
"meta": {}}``, with the keys of the task's weights. The reports its method asks for (the settings' ``reports``:
its last loss, steps, label histogram; ``processors.reports``) go in the same dict, each under
``"edgesim_extra/" + name`` (a number, or a list for the histogram); this processor sends them as a simulated
device does, at the cost of reading the last step's loss.

A method with a training rule that keeps state (SCAFFOLD's ``c_i``, ``processors.device_rule``): the settings
name the rule, and the state lives on the device, never on the leaf: this processor keeps it under ``state_dir``
(one folder per job's settings, one ``.npz`` per device, ``processors.device_state``), so it survives the
client's restarts. A phone app keeps the same arrays in its app's private storage (a file per job), reads them
before a task (zeros before its first) and replaces them after it, once the result has been sent.

A job with ``--compress`` (the settings' ``compression``): the device compresses its diff after clipping and local
noise, as a simulated device does, and sends the encoded update under ``"edgesim_compressed"`` beside the reports
(``processors.compress.CompressionHost.encode_one``; ``docs/communication.md``); with error feedback it keeps its
residual under ``state_dir``'s ``error_feedback/``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os

from nvflare.apis.dxo import DXO, DataKind, from_dict
from nvflare.edge.simulation.device_task_processor import DeviceTaskProcessor
from nvflare.edge.web.models.job_response import JobResponse
from nvflare.edge.web.models.task_response import TaskResponse

from common.device_wire import DEVICE_SETTINGS_META, to_wire
from common.finite import nonfinite_reason, zeroed
from common.protocol import DEVICE_ERROR_META, DEVICE_EXTRA_PREFIX, DEVICE_ID_META, short_error
from common.result_files import ERROR_FEEDBACK
from processors.compress import COMPRESSED
from processors.task_processor import TrainingTaskProcessor
from processors.task_wire import received_model

STATE_DIR = "~/.cache/edgesim-flare/device_state"  # where a device keeps a training rule's state by default


@functools.lru_cache(maxsize=4)
def _trainer(
    settings_json: str, compute_device: str, data_root: str, state_dir: str = STATE_DIR
) -> TrainingTaskProcessor:
    """One trainer per job settings in this process (its data and models are cached per process)."""
    settings = json.loads(settings_json)
    training = dict(settings["training"])
    data = dict(settings["data"])
    if compute_device:
        training["compute_device"] = compute_device
    if data_root:
        data["data_root"] = data_root
    folder = hashlib.sha256(settings_json.encode()).hexdigest()[:16]
    compression = settings.get("compression")
    if compression and compression.get("error_feedback"):  # its residual, beside a rule's state, on the device
        state = {"dir": os.path.join(os.path.expanduser(state_dir), ERROR_FEEDBACK, folder), "memory_mb": 16.0}
        compression = dict(compression) | {"state": state | {"durable": True, "fresh": False}}
    return TrainingTaskProcessor(
        data=data,
        training=training,
        seed=settings["seed"],
        objective=settings.get("objective", ""),
        objective_args=settings.get("objective_args") or {},
        reports=settings.get("reports") or (),
        weighting=settings.get("weighting", "devices"),
        rule=settings.get("rule", ""),
        rule_args=settings.get("rule_args") or {},
        privacy=own_noise(settings.get("privacy")),
        device_state={  # the device's own, across its tasks and restarts: one folder per job's settings
            "dir": os.path.join(os.path.expanduser(state_dir), folder),
            "memory_mb": 16.0,
            "durable": True,
            "fresh": False,
        },
        compression=compression,
    )


def own_noise(privacy: dict | None) -> dict | None:
    """A task's privacy settings as this device follows them: local DP's noise always from the device's own
    entropy (``secure``), whatever the task says: a seed or key the task carried is known to the server, the party
    local DP protects against (``docs/privacy.md``)."""
    if not privacy or privacy.get("dp") != "local":
        return privacy
    return {k: v for k, v in privacy.items() if k != "noise_key"} | {"noise": "secure"}


def task_settings(task: TaskResponse) -> dict:
    """The job's training settings a task carries; a clear error for a task of another kind of job."""
    dxo = from_dict(task.task_data)
    settings = dxo.get_meta_prop(DEVICE_SETTINGS_META)
    if not isinstance(settings, dict):
        raise ValueError(
            "the task carries no edgesim training settings: run the job with --devices real (or give this "
            "device a processor for that job)"
        )
    return settings


class RealDeviceProcessor(DeviceTaskProcessor):
    """Args:
    compute_device: this device's torch device (``cpu``, ``cuda:0``); "": the job's ``--compute-device``.
    data_root: where this device finds a downloaded dataset; "": the job's ``--data-root``.
    ca_cert: a CA certificate (PEM) the device trusts for an HTTPS proxy, e.g. the deployment's ``rootCA.pem``
        (``python -m jobs.deploy up --proxy`` signs the proxy's certificate with it); "": the system's CAs.
    state_dir: where this device keeps a method's per-device state (a training rule's, e.g. SCAFFOLD's ``c_i``).
    """

    def __init__(
        self,
        compute_device: str = "",
        data_root: str = "",
        ca_cert: str = "",
        state_dir: str = STATE_DIR,
    ):
        DeviceTaskProcessor.__init__(self)
        self.state_dir = state_dir
        self.compute_device = compute_device
        self.data_root = data_root
        if ca_cert:
            # NVFlare's HTTP client (nvflare/edge/simulation/feg_api.py) calls requests.post without ``verify``:
            # requests then trusts the bundle this variable names. NVFlare makes the processor before a device's
            # first request, so every request of this client process verifies the proxy against ``ca_cert``.
            if not os.path.isfile(ca_cert):
                raise ValueError(f"ca_cert {ca_cert}: no such file (give the deployment's rootCA.pem)")
            os.environ["REQUESTS_CA_BUNDLE"] = ca_cert

    def setup(self, job: JobResponse) -> None:
        pass

    def shutdown(self) -> None:
        pass

    def process_task(self, task: TaskResponse) -> dict:
        settings = task_settings(task)
        trainer = _trainer(json.dumps(settings, sort_keys=True), self.compute_device, self.data_root, self.state_dir)
        version, weights = received_model(task)
        device_id = self.device.device_id
        wire: dict = {}
        diff = trainer.train(device_id, weights, version, wire=wire)
        # NaN or inf never leaves the device: it reports itself failed, with the reason (``common.finite``)
        problem = nonfinite_reason(diff, "refused on the device")
        if wire and not problem:  # compressed: the encoded update, and only the reports as they are
            reports = {k: v for k, v in diff.items() if k.startswith(DEVICE_EXTRA_PREFIX)}
            result = DXO(data_kind=DataKind.WEIGHT_DIFF, data={"dict": to_wire(reports), COMPRESSED: wire})
        else:
            result = DXO(data_kind=DataKind.WEIGHT_DIFF, data={"dict": to_wire(zeroed(diff) if problem else diff)})
        result.data["count"] = 0 if problem else 1
        result.set_meta_prop(DEVICE_ID_META, device_id)
        if problem:
            result.set_meta_prop(DEVICE_ERROR_META, short_error(problem))
        return result.to_dict()
