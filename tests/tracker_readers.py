"""Trackers read back with their own clients, for the tests of ``jobs.tracking``: MLflow's runs through
``MlflowClient``, and W&B's offline runs through W&B's own record schema (``wandb.proto``), since W&B reads its
offline files only to upload them.

A W&B offline run is ``wandb/offline-run-*/run-ID.wandb``: W&B's 7-byte header (``:W&B``, a magic number, a
version), then LevelDB's log format (32 KiB blocks; each record a 7-byte header of checksum, length and type, the
type saying whether it is a whole record or its first, middle or last piece), each record one ``Record`` message.
"""

from __future__ import annotations

import glob
import json
import os
import struct

BLOCK = 32768
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def wandb_records(path: str) -> list:
    """The ``wandb_internal_pb2.Record`` messages of one ``.wandb`` file, in order."""
    from wandb.proto import wandb_internal_pb2 as pb

    with open(path, "rb") as f:
        data = f.read()
    assert data[:4] == b":W&B", data[:HEADER]
    pos, pieces, pending = HEADER, [], b""
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # a block's tail too short for a header is padding
            pos += left
            continue
        _checksum, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        body, pos = data[pos + HEADER : pos + HEADER + length], pos + HEADER + length
        if kind == FULL:
            pieces.append(body)
        elif kind == FIRST:
            pending = body
        elif kind == MIDDLE:
            pending += body
        elif kind == LAST:
            pieces.append(pending + body)
        else:
            break
    records = []
    for piece in pieces:
        record = pb.Record()
        record.ParseFromString(piece)
        records.append(record)
    return records


def _items(items) -> dict:
    return {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in items}


def wandb_runs(wandb_dir: str) -> dict[str, dict]:
    """Every offline run under ``wandb_dir`` (W&B's ``wandb/`` folder), by run id: its ``folders`` (a resumed run
    has one per attempt, in order), ``name``, ``config``, ``group``, ``history`` rows, ``summary``, ``tags``, ``artifacts`` (name ->
    files) and ``exit_codes``."""
    runs: dict[str, dict] = {}
    # in the order they were written: attempts of a resumed run one after the other (a folder's name holds its start
    # to the second only)
    for path in sorted(glob.glob(os.path.join(wandb_dir, "offline-run-*", "run-*.wandb")), key=os.path.getmtime):
        run_id = os.path.basename(path)[len("run-") : -len(".wandb")]
        run = runs.setdefault(
            run_id,
            {"folders": [], "config": {}, "history": [], "summary": {}, "tags": [], "artifacts": {}, "exit_codes": []},
        )
        run["folders"].append(os.path.dirname(path))
        for r in wandb_records(path):
            kind = r.WhichOneof("record_type")
            if kind == "run":
                run["name"], run["group"] = r.run.display_name, r.run.run_group
                run["config"] |= _items(r.run.config.update)
                run["tags"] = list(r.run.tags)
            elif kind == "config":
                run["config"] |= _items(r.config.update)
            elif kind == "history":
                run["history"].append(_items(r.history.item))
            elif kind == "summary":
                run["summary"] |= {k: v for k, v in _items(r.summary.update).items() if k}
            elif kind == "artifact":
                run["artifacts"][r.artifact.name] = sorted(e.path for e in r.artifact.manifest.contents)
            elif kind == "exit":
                run["exit_codes"].append(r.exit.exit_code)
    return runs


def mlflow_runs(uri: str, experiment: str = "edgesim-flare") -> list:
    """Every run of ``experiment`` in the MLflow store ``uri`` (``mlflow.entities.Run``), oldest first."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return []
    return sorted(client.search_runs([found.experiment_id]), key=lambda r: r.info.start_time)


def mlflow_series(uri: str, run_id: str, key: str) -> list[tuple[int, float]]:
    """A metric's (step, value) points, by step."""
    from mlflow.tracking import MlflowClient

    return sorted((m.step, m.value) for m in MlflowClient(tracking_uri=uri).get_metric_history(run_id, key))


def mlflow_artifacts(uri: str, run_id: str) -> list[str]:
    from mlflow.tracking import MlflowClient

    return sorted(a.path for a in MlflowClient(tracking_uri=uri).list_artifacts(run_id))
