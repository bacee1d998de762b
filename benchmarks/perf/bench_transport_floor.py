"""The CPU that NVFlare's wire alone costs per asynchronous update, with nothing of ours around it: the floor under
``bench_protocol.py --null-training``'s FedBuff figures, and under issue 33's goals for them.

    python benchmarks/perf/bench_transport_floor.py                 # the floor, at the traffic given by the flags
    python benchmarks/perf/bench_transport_floor.py --beside-job    # the null FedBuff job first, then the floor at its
                                                               # traffic, side by side
    python benchmarks/perf/bench_transport_floor.py --bulk shm,wire --model resnet18   # both ways, side by side

What a null-training FedBuff update moves is the method's: one diff from a leaf up to the server, and some new
versions from the server down (each version goes to the leaves whose devices start from it). Here a real NVFlare
``Cell`` (the server, this process) and ``--leaves`` real ``Cell`` processes (the leaves) move that, the way the
job's leaves and server do: each leaf sends a request on NVFlare's aux channel (streamed, FOBS-encoded, every diff
one ``common.packed_weights`` datum, ``--diffs-per-sync`` of them), and the server answers with
``--versions-per-update`` x that many versions, packed the same way; the processes take the settings a job's do
(``install_nvflare_fixes``, ``settle_process``). No selection, no schedule, no applier, no training, no NVFlare job
around the cells: what is left is NVFlare's transport (FOBS, streaming, framing, its threads) and the kernel's
loopback sockets. The first sync of each leaf, and the first reply, are checked: every diff and version arrives
whole.

``--beside-job`` first runs ``bench_protocol.py --null-training``'s FedBuff job (paper delays, 2 leaves x 1,000
devices, K = 2,000, B = 2) and reads its traffic from the server's ``protocol:`` log line (updates applied per report
from a child, models sent per update applied), then measures the floor at that traffic.

``--bulk shm`` moves the same bytes as a job with shared memory does (``docs/deployment.md``): each leaf offers
its ring in its first sync and maps the server's (``simulation.bulk_link``, ``common.bulk_parent``, the job's
own code), writes each diff into a slot of its ring and sends the handle; the server copies each diff out as it
reads the sync, and answers with handles of the versions it keeps in its ring (``aggregation.version_store``),
which the leaf maps. ``--bulk shm,wire`` measures both, one after the other, with their ratios.

It prints, over a ``--seconds`` window after a warm-up, the updates moved per second, the server's and the leaves'
CPU per update (``psutil``: user and system, all threads, of each process), the cores the server's process used,
the leaves' sync round trips (p50 and p99, each from the request sent to its reply taken), and what issue 33's
goals allow: the server's CPU per update at most 0.5 ms, and 1,500 updates per second, which on this machine's
cores means at most ``cores x 1000 / 1500`` ms of the leaves' and the server's CPU together per update.
``--model resnet18`` moves the paper's ResNet-18 (44.7 MB per diff and per version) at its job's traffic (2 diffs
per sync, 0.76 versions per update).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
from nvflare.fuel.f3.cellnet.defs import MessageHeaderKey

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from benchmarks.perf.protocol_runs import last_in_server_log, measure  # noqa: E402
from benchmarks.perf.transport_report import print_report  # noqa: E402

CHANNEL = "aux_communication"  # NVFlare's aux channel: the one a leaf's sync travels on (streamed)
TOPIC = "edgesim_bench_sync"


def versions_per_sync(args) -> int:
    """The versions the server's reply carries: ``--versions-per-update`` x ``--diffs-per-sync``."""
    return round(args.versions_per_update * args.diffs_per_sync)


def model_blobs(model: str, count: int, seed: int) -> list[dict]:
    """``count`` packed ``{name: array}`` dicts shaped like ``model``'s state (distinct values, float32)."""
    from common.packed_weights import pack
    from processors.models import build_model

    shapes = {name: tuple(value.shape) for name, value in build_model(model).state_dict().items()}
    rng = np.random.default_rng(seed)
    return [
        pack({name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()})
        for _ in range(count)
    ]


def make_cell(fqcn: str, url: str):
    """A real NVFlare cell, with the fixes a job's processes install (``install_nvflare_fixes``: no payload
    rendering in the cell, one thread for finished streams)."""
    from nvflare.fuel.f3.cellnet.cell import Cell

    from common.nvflare_private import install_nvflare_fixes

    install_nvflare_fixes()

    return Cell(fqcn=fqcn, root_url=url, secure=False, credentials={}, create_internal_listener=False)


def run_leaf(url: str, index: int, args) -> None:
    """One leaf: sync after sync, checking the first reply's versions, until the server stops answering; prints its
    sync round trips (JSON) when it ends."""
    from nvflare.apis.shareable import Shareable
    from nvflare.fuel.f3.cellnet.defs import ReturnCode
    from nvflare.fuel.f3.message import Message

    from common.packed_weights import packed_bytes, unpack
    from common.process_settings import settle_process
    from simulation.bulk_link import LeafBulk
    from simulation.sync_times import SyncTimes

    cell = make_cell(f"leaf-{index}", url)
    cell.start()
    diffs = model_blobs(args.model, args.diffs_per_sync, seed=index + 1)
    bulk = LeafBulk(args.bulk, log=lambda line: print(f"leaf {index}: {line}", file=sys.stderr))
    if args.bulk == "shm":  # the diffs as a trainer gives them: arrays, written into the ring's slots once
        diffs = [unpack(d) for d in diffs]
    settle_process()  # as a job's leaf does once its simulator is built
    checked, syncs = False, SyncTimes()
    try:
        while True:
            request = Shareable()
            word = bulk.report_word() if args.bulk == "shm" else None
            if word:
                request["bulk"] = word
            request["updates"] = [bulk.pack_diff(d) for d in diffs] if args.bulk == "shm" else diffs
            syncs.sent()
            reply = cell.send_request(
                channel=CHANNEL,
                topic=TOPIC,
                target="server",
                request=Message(payload=request),
                timeout=60,
            )
            syncs.replied()
            if reply.get_header(MessageHeaderKey.RETURN_CODE, ReturnCode.OK) != ReturnCode.OK:
                break  # the server has stopped: the run is over
            if args.bulk == "shm":
                bulk.on_reply(reply.payload.get("bulk"))
            versions = reply.payload["versions"]
            mapped = [bulk.weights(v, value) for v, value in enumerate(versions)] if bulk.up else versions
            if not checked and (not word or bulk.up):  # the versions arrive whole: as many as asked, each whole
                sizes = {sum(a.nbytes for a in m.values()) if bulk.up else len(packed_bytes(m)) for m in mapped}
                if len(versions) != versions_per_sync(args) or sizes != {args.blob_bytes}:
                    raise SystemExit(f"leaf {index}: the reply held {len(versions)} versions of sizes {sizes}")
                checked = True
            if reply.payload.get("done"):
                break
    finally:
        cell.stop()
    print(json.dumps({"round_trips": syncs.round_trips}), flush=True)


class Server:
    """The server's cell: answers each sync with the versions, and counts the diffs it received whole. With
    ``--bulk shm`` the versions are kept in its ring and sent as handles, and the diffs are copied out of the
    leaves' rings, by the job's own code."""

    def __init__(self, args):
        from aggregation.version_store import VersionStore
        from common.bulk_parent import BulkLinks
        from common.packed_weights import packed_bytes, unpack

        self.args = args
        self.versions = model_blobs(args.model, versions_per_sync(args), seed=0)
        self.blob_bytes = len(packed_bytes(self.versions[0]))
        self.store = VersionStore(2 * self.blob_bytes * len(self.versions) + 2**20, shared=args.bulk == "shm")
        for v, packed in enumerate(self.versions):
            self.store.put(v, unpack(packed))
        self.links = BulkLinks(args.bulk, log=lambda line: None)
        self.received = 0
        self.synced: set[str] = set()  # the leaves heard from
        self.done = False
        self.error = ""
        self.lock = threading.Lock()

    # what the links ask of the server's global model (``aggregation.global_model.GlobalModel``)
    bulk_error = ""

    def bulk_locator(self) -> dict | None:
        ring = self.store.ring()
        return ring.locator() if ring is not None else None

    def model_handle(self, version: int, child: str) -> dict | None:
        return self.store.handle(version, child)

    def on_sync(self, request):
        from nvflare.apis.shareable import Shareable
        from nvflare.fuel.f3.message import Message

        from common.packed_weights import packed_bytes

        leaf = request.get_header(MessageHeaderKey.ORIGIN)
        word = self.links.on_report(leaf, request.payload.get("bulk"), self) if self.args.bulk == "shm" else None
        updates = [self.links.resolve(leaf, {"diff": u})["diff"] for u in request.payload["updates"]]
        with self.lock:
            if leaf not in self.synced and (self.args.bulk != "shm" or self.links.ready(leaf)):  # check what came
                sizes = {len(packed_bytes(update)) for update in updates}
                if len(updates) != self.args.diffs_per_sync or sizes != {self.blob_bytes}:
                    self.error = f"a sync held {len(updates)} diffs of sizes {sizes}"
                self.synced.add(leaf)
            self.received += len(updates)
        self.store.held(leaf, set())  # a leaf drops the versions it mapped before its next sync
        reply = Shareable()
        reply["versions"] = [self.links.model(leaf, v, self, self.store.packed) for v in range(len(self.versions))]
        reply["done"] = self.done
        if word:
            reply["bulk"] = word
        return Message(payload=reply)


def run_server(args) -> dict:
    """Start the server's cell and the leaves; measure every process's CPU over one window once all leaves sync."""
    import psutil

    from common.ports import listen_ports
    from common.process_settings import settle_process

    url = f"tcp://127.0.0.1:{listen_ports(1)[0]}"  # outside the ephemeral range: no outgoing socket takes it
    cell = make_cell("server", url)
    server = Server(args)
    args.blob_bytes = server.blob_bytes
    settle_process()  # as a job's server does at its first selection
    cell.register_request_cb(channel=CHANNEL, topic=TOPIC, cb=server.on_sync)
    cell.start()
    leaf_argv = [
        *("--leaf", url, "--blob-bytes", str(server.blob_bytes), "--model", args.model, "--bulk", args.bulk),
        *("--diffs-per-sync", str(args.diffs_per_sync), "--versions-per-update", repr(args.versions_per_update)),
    ]
    leaves = [
        subprocess.Popen([sys.executable, __file__, *leaf_argv, "--leaf-index", str(i)], stdout=subprocess.PIPE)
        for i in range(args.leaves)
    ]
    processes = [psutil.Process()] + [psutil.Process(leaf.pid) for leaf in leaves]

    def cpu() -> list[float]:
        return [sum(p.cpu_times()[:2]) for p in processes]  # user and system, all threads

    try:
        deadline = time.monotonic() + 120
        while len(server.synced) < args.leaves:
            if server.error or time.monotonic() > deadline or any(leaf.poll() is not None for leaf in leaves):
                raise SystemExit(f"bench_transport_floor: {server.error or 'a leaf ended or never synced'}")
            time.sleep(0.05)
        time.sleep(args.warmup)
        cpu0, received0, t0 = cpu(), server.received, time.monotonic()
        time.sleep(args.seconds)
        cpu1, received1, t1 = cpu(), server.received, time.monotonic()
        server.done = True
        outputs = [leaf.communicate(timeout=60)[0] for leaf in leaves]
    finally:
        for leaf in leaves:
            if leaf.poll() is None:
                leaf.kill()
        cell.stop()
    failed = [f"leaf {i} exited {leaf.returncode}" for i, leaf in enumerate(leaves) if leaf.returncode]
    updates = received1 - received0
    if failed or not updates:
        raise SystemExit(f"bench_transport_floor: {', '.join(failed) or 'no update in the window'} (see above)")
    used = [b - a for a, b in zip(cpu0, cpu1, strict=True)]
    round_trips = sorted(t for out in outputs for t in json.loads(out.strip().splitlines()[-1])["round_trips"])
    return {
        "updates": updates,
        "updates_per_s": updates / (t1 - t0),
        "server_ms": 1000 * used[0] / updates,
        "leaves_ms": 1000 * sum(used[1:]) / updates,
        "server_cores": used[0] / (t1 - t0),
        "sync_p50_ms": 1000 * round_trips[len(round_trips) // 2],
        "sync_p99_ms": 1000 * round_trips[min(len(round_trips) - 1, int(0.99 * len(round_trips)))],
        "versions_per_sync": len(server.versions),
        "blob_bytes": server.blob_bytes,
        "bulk": server.links.choices,
    }


def protocol_line() -> re.Pattern:
    """The server's ``protocol:`` log line (``PROTOCOL_SUMMARY``), its counts captured by name."""
    from scheduling.exact_assessor import PROTOCOL_SUMMARY

    return re.compile(re.escape(PROTOCOL_SUMMARY).replace(r"\{", "{").replace(r"\}", "}").format(
        reports=r"(?P<reports>\d+)", wakes=r"\d+", applied=r"(?P<applied>\d+)", models=r"(?P<models>\d+)"
    ))  # fmt: skip


def job_beside(args) -> dict:
    """``bench_protocol.py --null-training``'s FedBuff run (paper delays), measured as that benchmark measures it,
    with the first ``--bulk`` mode, and its traffic from its server's log."""
    job = argparse.Namespace(
        leaves=args.leaves, devices_per_leaf=None, selection=None, versions=5, fedbuff_versions=args.job_versions,
        synthetic_size=4000, seed=1, null_training=True, only="fedbuff-paper", baseline_rev="", model=args.model,
        bulk=args.modes[0], repeat=1,
    )  # fmt: skip
    work = tempfile.mkdtemp(prefix="bench_transport_floor_")
    measured = measure(job, work)
    run = next(iter(measured.values()))["FedBuff, paper delays"]
    traffic = last_in_server_log(run["out"], protocol_line())
    if traffic is None:
        raise SystemExit(f"bench_transport_floor: no 'protocol:' line in the job's server log under {run['out']}")
    reports, applied, models = (int(traffic[key]) for key in ("reports", "applied", "models"))
    return run | {"diffs_per_sync": max(1, round(applied / reports)), "versions_per_update": models / applied}


def measured_floor(args, mode: str) -> dict:
    """``run_server``'s figures for ``--bulk mode``: in this process for one mode, else in a process of its own (the
    server's; NVFlare keeps a process's cells by name)."""
    if len(args.modes) == 1:
        args.bulk = mode
        return run_server(args)
    argv = [sys.executable, __file__, "--measure", "--bulk", mode, "--model", args.model, "--leaves", str(args.leaves)]
    argv += [
        "--seconds",
        repr(args.seconds),
        "--warmup",
        repr(args.warmup),
        "--diffs-per-sync",
        str(args.diffs_per_sync),
    ]
    argv += ["--versions-per-update", repr(args.versions_per_update)]
    done = subprocess.run(argv, stdout=subprocess.PIPE, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"bench_transport_floor: the --bulk {mode} measurement failed (exit {done.returncode})")
    return json.loads(done.stdout.strip().splitlines()[-1])


TRAFFIC = {  # a model's traffic in the null FedBuff job (diffs per sync, versions per update): its default here
    "cifar10_convnet": (46, 0.78),  # 2 x 1,000 devices, K = 2,000
    "resnet18": (2, 0.76),  # 2 x 50 devices, K = 20: two diffs per sync (a leaf's ring), 152 versions per 200 updates
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--leaves", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=8.0, help="the measured window")
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--diffs-per-sync", type=int, default=None, help="diffs per leaf request (default: the job's)")
    parser.add_argument("--versions-per-update", type=float, default=None, help="versions per diff (the job's)")
    parser.add_argument("--model", default="cifar10_convnet", choices=sorted(TRAFFIC))
    parser.add_argument("--bulk", default="wire", help="wire, shm, or both (shm,wire): how diffs and versions move")
    parser.add_argument("--beside-job", action="store_true", help="run the null FedBuff job first, at its traffic")
    parser.add_argument("--job-versions", type=int, default=3000, help="the job's versions (--beside-job)")
    parser.add_argument("--leaf", help=argparse.SUPPRESS)  # a leaf's process: the server's URL
    parser.add_argument("--leaf-index", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--blob-bytes", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)  # one mode's server: JSON out
    args = parser.parse_args()
    diffs, versions = TRAFFIC[args.model]
    args.diffs_per_sync = diffs if args.diffs_per_sync is None else args.diffs_per_sync
    args.versions_per_update = versions if args.versions_per_update is None else args.versions_per_update
    if args.leaf:
        run_leaf(args.leaf, args.leaf_index, args)
        return
    if args.measure:  # NVFlare keeps a process's cells by name: each mode's server runs in a process of its own
        print(json.dumps(run_server(args)))
        return
    args.modes = [m for m in args.bulk.split(",") if m]
    if args.leaves < 1 or args.seconds <= 0 or args.diffs_per_sync < 1 or args.versions_per_update < 0:
        parser.exit(2, "bench_transport_floor: --leaves, --seconds and --diffs-per-sync must be positive\n")
    if not args.modes or set(args.modes) - {"shm", "wire"}:
        parser.exit(2, f"bench_transport_floor: --bulk {args.bulk}: give wire, shm, or shm,wire\n")
    job = job_beside(args) if args.beside_job else None
    if job:  # the floor at the job's traffic
        args.diffs_per_sync, args.versions_per_update = job["diffs_per_sync"], job["versions_per_update"]
    print_report(args, {mode: measured_floor(args, mode) for mode in args.modes}, job)


if __name__ == "__main__":
    main()
