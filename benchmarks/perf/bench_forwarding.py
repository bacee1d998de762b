"""Cost of per-device forwarding (our leaves, every method) vs NVFlare's summing leaf aggregation (a micro-benchmark).

A leaf collects the WEIGHT_DIFFs of N devices for one model version and emits one message to its parent.
NVFlare's ``ModelUpdateDXOAggregator`` sums them: one model-sized payload whatever N is. Our leaf updater
(``simulation.versioned_updater``) forwards each device's update (``DeviceUpdate``: device, selection, base version,
diff): N model-sized payloads. Exact simulated time needs that for every method: the server applies each update at
its own arrival time, and sums in that order (the same bits every run).

For each N this runs both on the same N device diffs (random float32 arrays shaped like the model's
``state_dict``, one DXO Shareable per device, as the leaf receives them) and measures, per emission:
- bytes: the real serialized size of what the aggregator emits (``fobs.dumps`` of the Shareable, NVFlare's
  wire serializer with its numpy decomposer), and the numpy payload (``nbytes`` summed over all arrays);
- leaf seconds: ``accept`` x N + ``aggregate``;
- wire seconds: ``fobs.dumps`` on the leaf + ``fobs.loads`` on the parent.
Median over ``--repeats``. No NVFlare job runs: the network transfer itself and the server's model manager are
not in the numbers (bytes / bandwidth gives the transfer time for a given link).

N is the number of device updates a leaf holds when it reports: about ``concurrency / leaves`` for synchronous
FedAvg, and a few for FedBuff / FedRevive. Bytes per model version are B x the per-update size for forwarding,
against at most one model per leaf message for summing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np


def make_device_shareables(template: dict[str, tuple], n: int, seed: int) -> list:
    from nvflare.apis.dxo import DXO, DataKind

    from common.protocol import DEVICE_ID_META

    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        diff = {k: rng.standard_normal(shape, dtype=np.float32) * 1e-3 for k, shape in template.items()}
        dxo = DXO(data_kind=DataKind.WEIGHT_DIFF, data={"dict": diff})
        dxo.set_meta_prop(DEVICE_ID_META, f"site-1#{i}")
        out.append(dxo.to_shareable())
    return out


def payload_nbytes(obj) -> int:
    """numpy bytes in a (nested) dict / list payload (a packed diff: its blob)."""
    from common.packed_weights import is_packed, packed_bytes

    if is_packed(obj):
        return len(packed_bytes(obj))
    if isinstance(obj, np.ndarray):
        return obj.nbytes
    if isinstance(obj, dict):
        return sum(payload_nbytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(payload_nbytes(v) for v in obj)
    return 0


class ForwardingLeaf:
    """Our leaf path with the interface of an NVFlare aggregator: each accepted device result becomes a
    ``DeviceUpdate`` in the leaf updater (what ``EdgeSimExecutor.accept_device_result`` does), and ``aggregate``
    is the updater's report to its parent."""

    def __init__(self):
        from nvflare.apis.fl_context import FLContext
        from nvflare.edge.mud import BaseState

        from simulation.versioned_updater import VersionedUpdater

        self.updater = VersionedUpdater()
        self.updater.start_task(BaseState(0, None, 0, {}).to_shareable(), FLContext())

    def accept(self, shareable, fl_ctx) -> bool:
        from nvflare.apis.dxo import from_shareable
        from nvflare.edge.mud import StateUpdateReport

        from common.protocol import DEVICE_ID_META, DEVICE_UPDATES, LOCAL_REPORT, DeviceUpdate

        dxo = from_shareable(shareable)
        report = StateUpdateReport(0, 0, None, None).to_shareable()
        report.set_header(LOCAL_REPORT, True)
        report[DEVICE_UPDATES] = [DeviceUpdate(dxo.get_meta_prop(DEVICE_ID_META), 1, 1, dxo.data["dict"]).to_dict()]
        return self.updater.process_child_update(report, fl_ctx)[0]

    def aggregate(self, fl_ctx):
        return self.updater.prepare_update_for_parent(fl_ctx)


def measure(aggregator_cls, template: dict, n: int, repeats: int, seed: int) -> dict:
    from nvflare.apis.dxo import from_shareable
    from nvflare.apis.fl_context import FLContext
    from nvflare.fuel.utils import fobs

    fl_ctx = FLContext()
    leaf, wire, sizes, payload = [], [], set(), set()
    for r in range(repeats):
        shareables = make_device_shareables(template, n, seed + r)  # fresh: the summing aggregator adds in place
        agg = aggregator_cls()
        started = time.perf_counter()
        for s in shareables:
            agg.accept(s, fl_ctx)
        emitted = agg.aggregate(fl_ctx)
        leaf.append(time.perf_counter() - started)
        started = time.perf_counter()
        blob = fobs.dumps(emitted)
        fobs.loads(blob)
        wire.append(time.perf_counter() - started)
        sizes.add(len(blob))
        payload.add(
            payload_nbytes(dict(emitted))
            if isinstance(agg, ForwardingLeaf)
            else payload_nbytes(from_shareable(emitted).data)
        )
    return {
        "bytes": max(sizes),
        "payload_bytes": max(payload),
        "leaf_s": statistics.median(leaf),
        "wire_s": statistics.median(wire),
    }


def format_table(rows: list[dict]) -> str:
    head = (
        "| updates per emission | summing bytes | forwarding bytes | bytes ratio | summing leaf+wire ms | "
        "forwarding leaf+wire ms | time ratio |"
    )
    lines = [head, "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        s, f = r["summing"], r["forwarding"]
        ts, tf = (s["leaf_s"] + s["wire_s"]) * 1e3, (f["leaf_s"] + f["wire_s"]) * 1e3
        lines.append(
            f"| {r['n']} | {s['bytes']:,} | {f['bytes']:,} | {f['bytes'] / s['bytes']:.2f}x | "
            f"{ts:.2f} ({s['leaf_s'] * 1e3:.2f} + {s['wire_s'] * 1e3:.2f}) | "
            f"{tf:.2f} ({f['leaf_s'] * 1e3:.2f} + {f['wire_s'] * 1e3:.2f}) | {tf / ts:.2f}x |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="cifar10_convnet", choices=["cifar10_convnet", "resnet18"])
    p.add_argument("--updates", default="1,2,5,10,20", help="comma-separated device updates per leaf emission")
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    import torch
    from nvflare.app_common.decomposers import numpy_decomposers
    from nvflare.edge.aggregators.model_update_dxo import ModelUpdateDXOAggregator

    from processors.models import build_model

    numpy_decomposers.register()
    torch.set_num_threads(1)
    template = {k: tuple(v.shape) for k, v in build_model(args.model).state_dict().items()}
    model_bytes = sum(int(np.prod(s)) * 4 for s in template.values())
    print(
        f"[bench_forwarding] {args.model}: {len(template)} tensors, {model_bytes:,} bytes as float32; "
        f"median of {args.repeats}"
    )
    rows = []
    for n in (int(v) for v in args.updates.split(",") if v.strip()):
        rows.append(
            {
                "n": n,
                "summing": measure(ModelUpdateDXOAggregator, template, n, args.repeats, args.seed),
                "forwarding": measure(ForwardingLeaf, template, n, args.repeats, args.seed),
            }
        )
        s, f = rows[-1]["summing"], rows[-1]["forwarding"]
        print(
            f"  N={n}: numpy payload summing {s['payload_bytes']:,} B, forwarding {f['payload_bytes']:,} B", flush=True
        )
    print()
    print(format_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
