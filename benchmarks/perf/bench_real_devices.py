"""What a version costs with real devices: the same FedBuff job on a local hierarchy (1 relay, 2 leaves, NVFlare's
routing proxy), trained once by the leaves' simulated devices and once by NVFlare's own HTTP device client
(``run_device_simulator`` with ``processors.device_processor.RealDeviceProcessor``) through the proxy, side by side:
wall time per version, devices per second, time from submission to results, and the processes and memory of the
hierarchy plus the device client at their peak.

    python benchmarks/perf/bench_real_devices.py                       # 8 devices, 10 versions; 1 and 4 HTTP clients
    python benchmarks/perf/bench_real_devices.py --devices 16 --versions 20
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from benchmarks.lib.harness import REPO  # noqa: E402
from benchmarks.perf.bench_hierarchy import resident  # noqa: E402
from common.result_files import METRICS  # noqa: E402
from jobs.deploy import local, sessions  # noqa: E402
from jobs.deploy.device_proxy import device_client_config  # noqa: E402


def run(deployment, tmp: str, mode: str, devices: int, versions: int, clients_count: int = 1) -> dict:
    """One FedBuff job on ``deployment`` with ``mode`` devices (real ones in ``clients_count`` HTTP device clients);
    its figures."""
    out = os.path.join(tmp, f"out-{mode}-{clients_count}")
    name = f"edgesim_bench_{mode}_{clients_count}"
    clients: list[subprocess.Popen] = []
    for i in range(clients_count if mode == "real" else 0):  # each client: its own id prefix, devices / clients
        config = os.path.join(tmp, f"devices-{i}.json")
        with open(config, "w") as f:
            json.dump(
                device_client_config(
                    deployment.proxy_endpoint, name, devices // clients_count, ca_cert=deployment.proxy_ca
                ),
                f,
            )
        with open(os.path.join(tmp, f"devices-{i}.log"), "w") as log:
            clients.append(
                subprocess.Popen(
                    [sys.executable, "-m", "nvflare.edge.simulation.run_device_simulator", config],
                    cwd=REPO,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
    peak = [0, 0]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.5):
            procs = local.deployment_processes(deployment)
            for client in clients:
                procs += sessions.session_processes(client.pid)
            rss = resident(procs)
            if rss > peak[0]:
                peak[:] = [rss, len(procs)]

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    leaves = len(deployment.leaves)
    flags = [
        *deployment.job_flags,
        *("--method", "fedbuff", "--job-name", name, "--devices", mode),
        *("--devices-per-leaf", str(-(-devices // leaves)), "--device-selection-size", str(devices)),
        *("--max-model-version", str(versions), "--local-iters", "2", "--local-batch-size", "16"),
        *("--subset-size", "40", "--synthetic-size", "1500", "--output", out),
    ]
    submitted = time.time()
    try:
        job = subprocess.run(
            [sys.executable, "jobs/pt_job_fedrevive.py", *flags], cwd=REPO, capture_output=True, text=True
        )
    finally:
        seconds = time.time() - submitted
        done.set()
        sampler.join()
        for client in clients:
            os.killpg(client.pid, signal.SIGKILL)
            client.wait(30)
    if job.returncode:
        sys.exit(f"the {mode} job failed:\n{job.stdout[-2000:]}\n{job.stderr[-2000:]}")
    with open(os.path.join(out, METRICS)) as f:
        summary = json.load(f)["summary"]
    return {"job": seconds, "peak": peak, **summary}


def json_hop(model: str = "cifar10_convnet") -> tuple[float, float]:
    """A task's model as it crosses one JSON hop (the leaf's gRPC reply, the proxy, the device): (MB, seconds of
    ``json.dumps`` + ``json.loads``), the median of 5."""
    from common.device_wire import to_wire
    from processors.models import build_model

    weights = {k: v.detach().numpy() for k, v in build_model(model).state_dict().items()}
    times, size = [], 0
    for _ in range(5):
        started = time.perf_counter()
        text = json.dumps(to_wire(weights))
        json.loads(text)
        times.append(time.perf_counter() - started)
        size = len(text)
    return size / 1e6, sorted(times)[2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", type=int, default=8, help="devices in flight (K), and HTTP devices")
    parser.add_argument("--versions", type=int, default=10)
    parser.add_argument(
        "--clients",
        default="1,4",
        help="HTTP device clients sharing the devices, one real run each (NVFlare's client asks for one device's "
        "task at a time, 0.5 s apart: more clients, more tasks at once)",
    )
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench_real_devices_") as tmp:
        folder = os.path.join(tmp, "h")
        deployment = local.start(folder, 1, 2, proxy=True)
        try:
            idle = local.deployment_processes(deployment)
            idle_rss = resident(idle)
            counts = [int(c) for c in args.clients.split(",")]
            results = {"simulated": run(deployment, tmp, "simulated", args.devices, args.versions)}
            for n in counts:
                results[f"real, {n} client(s)"] = run(deployment, tmp, "real", args.devices, args.versions, n)
        finally:
            local.stop(folder)

    print(
        f"\nlocal hierarchy: server, 1 relay, 2 leaves, the routing proxy; idle {len(idle)} processes, "
        f"{idle_rss / 1e9:.2f} GB resident"
    )
    print(f"FedBuff, K = {args.devices}, B = 2, {args.versions} versions (2 local steps of batch 16, synthetic data)")
    megabytes, seconds = json_hop()
    print(
        f"one JSON hop of the model (cifar10_convnet): {megabytes:.2f} MB, {seconds * 1e3:.0f} ms to dump and load "
        "(a task and its result cross about 4 each way: leaf, proxy, device)\n"
    )
    sim = results["simulated"]
    rows = [
        ("seconds per version", "seconds_per_version", "{:.3f}"),
        ("devices per second", "devices_per_second", "{:.2f}"),
        ("submission to results (s)", "job", "{:.1f}"),
        ("failure rate", "failure_rate", "{:.3f}"),
    ]
    print(f"{'':28}" + "".join(f"{name:>22}" for name in results))
    for label, key, fmt in rows:
        cells = []
        for figures in results.values():
            a, b = sim.get(key) or 0.0, figures.get(key) or 0.0
            ratio = f" ({b / a:.2f}x)" if a and figures is not sim else ""
            cells.append(f"{fmt.format(b) + ratio:>22}")
        print(f"{label:28}" + "".join(cells))
    print(f"{'peak processes':28}" + "".join(f"{f['peak'][1]:>22}" for f in results.values()))
    print(f"{'peak resident (GB)':28}" + "".join(f"{f['peak'][0] / 1e9:>22.2f}" for f in results.values()))


if __name__ == "__main__":
    main()
