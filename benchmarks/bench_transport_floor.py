"""The CPU that NVFlare's wire alone costs per asynchronous update, with nothing of ours around it: the floor under
``bench_protocol.py --null-training``'s FedBuff figures, and under issue 33's goals for them.

    python benchmarks/bench_transport_floor.py                 # the floor, at the traffic given by the flags
    python benchmarks/bench_transport_floor.py --beside-job    # the null FedBuff job first, then the floor at its
                                                               # traffic, side by side

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

It prints, over a ``--seconds`` window after a warm-up, the updates moved per second, the server's and the leaves'
CPU per update (``psutil``: user and system, all threads, of each process), and what issue 33's goals allow: the
server's CPU per update at most 0.5 ms, and 1,500 updates per second, which on this machine's cores means at most
``cores x 1000 / 1500`` ms of the leaves' and the server's CPU together per update.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
from nvflare.fuel.f3.cellnet.defs import MessageHeaderKey

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CHANNEL = "aux_communication"  # NVFlare's aux channel: the one a leaf's sync travels on (streamed)
TOPIC = "edgesim_bench_sync"
SERVER_GOAL_MS = 0.5
RATE_GOAL = 1500.0


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

    from simulation.nvflare_private import install_nvflare_fixes

    install_nvflare_fixes()

    return Cell(fqcn=fqcn, root_url=url, secure=False, credentials={}, create_internal_listener=False)


def run_leaf(url: str, index: int, args) -> None:
    """One leaf: sync after sync, checking the first reply's versions, until the server stops answering."""
    from nvflare.apis.shareable import Shareable
    from nvflare.fuel.f3.cellnet.defs import ReturnCode
    from nvflare.fuel.f3.message import Message

    from common.packed_weights import packed_bytes
    from common.process_settings import settle_process

    cell = make_cell(f"leaf-{index}", url)
    cell.start()
    diffs = model_blobs(args.model, args.diffs_per_sync, seed=index + 1)
    settle_process()  # as a job's leaf does once its simulator is built
    checked = False
    try:
        while True:
            request = Shareable()
            request["updates"] = diffs
            reply = cell.send_request(
                channel=CHANNEL, topic=TOPIC, target="server", request=Message(payload=request), timeout=60
            )
            if reply.get_header(MessageHeaderKey.RETURN_CODE, ReturnCode.OK) != ReturnCode.OK:
                break  # the server has stopped: the run is over
            if not checked:  # the versions arrive whole: as many as asked for, each the size a version is
                versions = reply.payload["versions"]
                sizes = {len(packed_bytes(version)) for version in versions}
                if len(versions) != versions_per_sync(args) or sizes != {args.blob_bytes}:
                    raise SystemExit(f"leaf {index}: the reply held {len(versions)} versions of sizes {sizes}")
                checked = True
            if reply.payload.get("done"):
                break
    finally:
        cell.stop()


class Server:
    """The server's cell: answers each sync with the versions, and counts the diffs it received whole."""

    def __init__(self, args):
        from common.packed_weights import packed_bytes

        self.args = args
        self.versions = model_blobs(args.model, versions_per_sync(args), seed=0)
        self.blob_bytes = len(packed_bytes(self.versions[0]))
        self.received = 0
        self.synced: set[str] = set()  # the leaves heard from
        self.done = False
        self.error = ""
        self.lock = threading.Lock()

    def on_sync(self, request):
        from nvflare.apis.shareable import Shareable
        from nvflare.fuel.f3.message import Message

        from common.packed_weights import packed_bytes

        updates = request.payload["updates"]
        with self.lock:
            if len(self.synced) < self.args.leaves:  # a first sync: check what came
                sizes = {len(packed_bytes(update)) for update in updates}
                if len(updates) != self.args.diffs_per_sync or sizes != {self.blob_bytes}:
                    self.error = f"a sync held {len(updates)} diffs of sizes {sizes}"
                self.synced.add(request.get_header(MessageHeaderKey.ORIGIN))
            self.received += len(updates)
        reply = Shareable()
        reply["versions"] = self.versions
        reply["done"] = self.done
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
        *("--leaf", url, "--blob-bytes", str(server.blob_bytes), "--model", args.model),
        *("--diffs-per-sync", str(args.diffs_per_sync), "--versions-per-update", repr(args.versions_per_update)),
    ]
    leaves = [
        subprocess.Popen([sys.executable, __file__, *leaf_argv, "--leaf-index", str(i)]) for i in range(args.leaves)
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
        for leaf in leaves:
            leaf.wait(timeout=60)
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
    return {
        "updates": updates,
        "updates_per_s": updates / (t1 - t0),
        "server_ms": 1000 * used[0] / updates,
        "leaves_ms": 1000 * sum(used[1:]) / updates,
        "versions_per_sync": len(server.versions),
        "blob_bytes": server.blob_bytes,
    }


def protocol_line() -> re.Pattern:
    """The server's ``protocol:`` log line (``PROTOCOL_SUMMARY``), its counts captured by name."""
    from scheduling.exact_assessor import PROTOCOL_SUMMARY

    return re.compile(re.escape(PROTOCOL_SUMMARY).replace(r"\{", "{").replace(r"\}", "}").format(
        reports=r"(?P<reports>\d+)", wakes=r"\d+", applied=r"(?P<applied>\d+)", models=r"(?P<models>\d+)"
    ))  # fmt: skip


def job_beside(args) -> dict:
    """``bench_protocol.py --null-training``'s FedBuff run (paper delays), measured as that benchmark measures it,
    and its traffic from its server's log."""
    from benchmarks import bench_protocol

    job = argparse.Namespace(
        leaves=args.leaves, devices_per_leaf=1000, selection=None, versions=5, fedbuff_versions=args.job_versions,
        synthetic_size=4000, seed=1, null_training=True, only="fedbuff-paper", baseline_rev="",
    )  # fmt: skip
    work = tempfile.mkdtemp(prefix="bench_transport_floor_")
    run = bench_protocol.measure(job, work)["this commit"]["FedBuff, paper delays"]
    traffic = bench_protocol.last_in_server_log(run["out"], protocol_line())
    if traffic is None:
        raise SystemExit(f"bench_transport_floor: no 'protocol:' line in the job's server log under {run['out']}")
    reports, applied, models = (int(traffic[key]) for key in ("reports", "applied", "models"))
    return run | {"diffs_per_sync": max(1, round(applied / reports)), "versions_per_update": models / applied}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--leaves", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=8.0, help="the measured window")
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument(
        "--diffs-per-sync", type=int, default=46, help="diffs per leaf request (the null FedBuff job's mean)"
    )
    parser.add_argument(
        "--versions-per-update", type=float, default=0.78, help="versions sent down per diff (the job's)"
    )
    parser.add_argument("--model", default="cifar10_convnet")
    parser.add_argument("--beside-job", action="store_true", help="run the null FedBuff job first, at its traffic")
    parser.add_argument("--job-versions", type=int, default=3000, help="the job's versions (--beside-job)")
    parser.add_argument("--leaf", help=argparse.SUPPRESS)  # a leaf's process: the server's URL
    parser.add_argument("--leaf-index", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--blob-bytes", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.leaf:
        run_leaf(args.leaf, args.leaf_index, args)
        return
    if args.leaves < 1 or args.seconds <= 0 or args.diffs_per_sync < 1 or args.versions_per_update < 0:
        parser.exit(2, "bench_transport_floor: --leaves, --seconds and --diffs-per-sync must be positive\n")
    from benchmarks.bench_protocol import all_busy_rate

    cores = os.cpu_count() or 1
    job = job_beside(args) if args.beside_job else None
    if job:
        args.diffs_per_sync, args.versions_per_update = job["diffs_per_sync"], job["versions_per_update"]
        print(
            f"the job's traffic: {args.diffs_per_sync} diffs per report, {args.versions_per_update:.2f} versions per update"
        )
    floor = run_server(args)
    print(
        f"NVFlare's transport alone: {args.leaves} leaves, {args.diffs_per_sync} diffs up and "
        f"{floor['versions_per_sync']} versions down per sync, each {floor['blob_bytes'] / 1000:.0f} kB "
        f"({args.model}), {floor['updates']} updates in {args.seconds:g} s, {cores} cores"
    )
    columns = {"transport alone": floor}
    if job:
        ms = job["cpu_ms"]
        columns = {"the job": {"updates_per_s": job["devices_per_second"], "server_ms": ms["server"],
                               "leaves_ms": ms["leaves"]}} | columns  # fmt: skip
        columns["job - transport"] = {k: columns["the job"][k] - floor[k] for k in ("server_ms", "leaves_ms")}
    print(f"{'':26}" + "".join(f"{name:>17}" for name in columns) + f"{'goal':>17}")

    def row(label: str, value, goal: str = "") -> None:
        print(f"{label:26}" + "".join(f"{value(c):>17}" for c in columns.values()) + f"{goal:>17}")

    def total(c: dict) -> float:
        return c["server_ms"] + c["leaves_ms"]

    row("updates/s", lambda c: f"{c['updates_per_s']:.1f}" if "updates_per_s" in c else "", f"{RATE_GOAL:.0f}")
    row("server CPU ms per update", lambda c: f"{c['server_ms']:.3f}", f"{SERVER_GOAL_MS:.3f}")
    row("leaves CPU ms per update", lambda c: f"{c['leaves_ms']:.3f}")
    row("all CPU ms per update", lambda c: f"{total(c):.3f}", f"{cores * 1000 / RATE_GOAL:.3f}")

    def all_busy(c: dict) -> str:  # a measured column's ceiling with every core busy (bench_protocol's)
        return f"{all_busy_rate(c['leaves_ms'], c['server_ms']):.0f}" if "updates_per_s" in c else ""

    row("/s all busy", all_busy, f"{RATE_GOAL:.0f}")


if __name__ == "__main__":
    main()
