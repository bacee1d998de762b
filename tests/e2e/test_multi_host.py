"""The hierarchy across hosts: network namespaces stand in for machines (server, relay, two leaves, and the admin
who submits), each with its own address on a bridge inside a namespace of its own; nothing listens outside the
namespaces the test creates, and all of them are removed afterwards. The kits come from ``python -m jobs.deploy
provision --host NAME=ADDRESS ...``, each site is started inside its host with ``start-site``, the admin waits for
the leaves and submits a FedBuff job from its own host, and ``shutdown`` stops every site through the admin API.
The job's ``events.jsonl`` equals the exact reference schedule, as on one machine. The namespaces share one
kernel, so C11 finds it can share memory with the server (``--bulk auto``: its diffs and versions go through shared
memory, its messages still through the relay's cells), while C12 is started with ``EDGESIM_BULK=wire`` and keeps
NVFlare's wire: the schedule is the same either way."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time

import pytest

from common.delays import DELAY_PRESETS
from jobs.deploy import exposure, multi_host, provisioning
from scheduling.event_reference import make_schedule, reference_trace
from tests.conftest import PYTHON, REPO

SITES = ["server", "R1", "C11", "C12", "admin"]
TAG = f"es{os.getpid() % 100000}"  # namespace and link names of this test run (interface names: <= 15 characters)
SUBNET = f"10.{200 + os.getpid() % 50}.{os.getpid() // 50 % 250}"


def ip(*args: str, ns: str | None = None) -> None:
    prefix = ["ip", "netns", "exec", ns] if ns else []
    subprocess.run([*prefix, "ip", *args], check=True, capture_output=True, text=True)


def namespaces_available() -> bool:
    """Root, ``ip`` and network namespaces (a probe namespace is made and removed)."""
    if os.geteuid() != 0 or not shutil.which("ip"):
        return False
    probe = f"{TAG}probe"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True).returncode == 0
    if made:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return made


pytestmark = pytest.mark.skipif(
    not namespaces_available(), reason="needs root and network namespaces (ip netns) to stand in for hosts"
)


def ns_of(site: str) -> str:
    return f"{TAG}{site}"


def kill_namespace_processes(ns: str) -> list[int]:
    """SIGKILL whatever still runs in ``ns``; the pids found."""
    found = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
    for pid in found:
        subprocess.run(["kill", "-9", pid], capture_output=True)
    return [int(p) for p in found]


@pytest.fixture(scope="module")
def hosts():
    """One namespace per host, linked through a bridge in a switch namespace; {site: address}."""
    switch = ns_of("sw")
    made = []
    try:
        ip("netns", "add", switch)
        made.append(switch)
        ip("link", "add", "br0", "type", "bridge", ns=switch)
        ip("link", "set", "br0", "up", ns=switch)
        addresses = {}
        for i, site in enumerate(SITES, start=1):
            ns = ns_of(site)
            ip("netns", "add", ns)
            made.append(ns)
            inner, outer = f"{TAG}{i}a", f"{TAG}{i}b"
            ip("link", "add", inner, "type", "veth", "peer", "name", outer)
            ip("link", "set", inner, "netns", ns)
            ip("link", "set", outer, "netns", switch)
            ip("link", "set", outer, "master", "br0", ns=switch)
            ip("link", "set", outer, "up", ns=switch)
            addresses[site] = f"{SUBNET}.{i}"
            ip("addr", "add", f"{addresses[site]}/24", "dev", inner, ns=ns)
            ip("link", "set", inner, "up", ns=ns)
            ip("link", "set", "lo", "up", ns=ns)
        yield addresses
    finally:
        for ns in made:
            kill_namespace_processes(ns)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def in_host(site: str, *cmd: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["ip", "netns", "exec", ns_of(site), *cmd], cwd=REPO, capture_output=True, text=True, timeout=timeout
    )


SCAN = "import json; from jobs.deploy.exposure import listening_sockets; print(json.dumps(listening_sockets()))"


def check_what_each_host_opens(hosts: dict[str, str]) -> None:
    """Every listening socket of each host (its namespace holds only its site) has a row of the documented table
    for that site, on that row's address: the site's own address, or loopback."""
    sites = {s: a for s, a in hosts.items() if s != "admin"}
    _, ports, _ = provisioning.project_dict(1, 2, multi_host.fixed_ports(1, 2), sites)
    table = exposure.documented(ports, sites)
    for site in [*sites, "admin"]:
        scan = in_host(site, PYTHON, "-c", SCAN, timeout=60)
        assert scan.returncode == 0, scan.stderr
        found = [tuple(s) for s in json.loads(scan.stdout)]
        assert found or site == "admin", f"{site} listens on nothing: the scan is blind"
        print(f"{site} listens on {sorted(found)}")  # pytest -s: what each host opens
        wrong = exposure.undocumented(found, [row for row in table if row.site == site])
        assert not wrong, f"{site} listens where docs/deployment.md does not say: {wrong}"


def test_a_fedbuff_job_across_hosts_applies_the_exact_reference_schedule_and_shutdown_stops_every_site(hosts, tmp_path):
    folder = tmp_path / "kits"
    pairs = [f"--host={site}={address}" for site, address in hosts.items() if site != "admin"]
    prov = subprocess.run(
        [PYTHON, "-m", "jobs.deploy", "provision", str(folder), "--relays", "1", "--leaves", "2", *pairs],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert prov.returncode == 0, prov.stdout + prov.stderr
    assert f"R1      {hosts['R1']}:" in prov.stdout  # what listens where, on the relay's own address
    prod = folder / "edgesim" / "prod_00"
    kit = str(prod / "admin@nvidia.com")
    try:
        for site in ("server", "R1", "C11", "C12"):  # each on its own host; C12 keeps NVFlare's wire for bulk arrays
            env = ["env", "EDGESIM_BULK=wire"] if site == "C12" else []
            started = in_host(site, *env, PYTHON, "-m", "jobs.deploy", "start-site", str(prod / site), timeout=60)
            assert started.returncode == 0, started.stdout + started.stderr
        waited = in_host("admin", PYTHON, "-m", "jobs.deploy", "wait", "--startup-kit", kit, "--leaves", "C11,C12")
        assert waited.returncode == 0, waited.stdout + waited.stderr + (prod / "R1" / "console.log").read_text()[-2000:]
        check_what_each_host_opens(hosts)
        out = tmp_path / "out"
        flags = (
            "--env prod --username admin@nvidia.com --num-leaf-nodes 2 --devices-per-leaf 4 "
            "--device-selection-size 8 --synthetic-size 1500 --subset-size 40 --local-iters 2 --local-batch-size 16 "
            "--seed 4 --method fedbuff --delays paper --max-model-version 6"
        ).split()
        job = in_host(
            "admin", PYTHON, "jobs/pt_job_fedrevive.py", *flags, "--startup-kit", kit, "--output", str(out), timeout=400
        )
        assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
        trace = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
        schedule = make_schedule(
            DELAY_PRESETS["paper"],
            4,
            {"C11": 4, "C12": 4},
            selection_size=8,
            updates_per_version=2,
            min_hole_to_fill=1,
            max_model_version=6,
        )
        assert trace == reference_trace(schedule)
        assert json.loads((out / "metrics.json").read_text())["bulk"] == {
            "C11": "shm",
            "C12": "wire: EDGESIM_BULK=wire in this site's environment",
        }
        # a prod --dry-run names the project's leaves: its trace is the prod run's
        dry = in_host(
            "admin",
            PYTHON,
            "jobs/pt_job_fedrevive.py",
            *flags,
            "--startup-kit",
            kit,
            "--dry-run",
            "--output",
            str(tmp_path / "dry"),
            timeout=120,
        )
        assert dry.returncode == 0, dry.stdout[-3000:] + dry.stderr[-3000:]
        assert [json.loads(line) for line in (tmp_path / "dry" / "events.jsonl").read_text().splitlines()] == trace
        # the job store stayed inside the server's kit, not NVFlare's shared /tmp/nvflare
        assert any((prod / "server" / "storage" / "jobs-storage").iterdir())
        down = in_host("admin", PYTHON, "-m", "jobs.deploy", "shutdown", "--startup-kit", kit, timeout=60)
        assert down.returncode == 0, down.stdout + down.stderr
        deadline = time.time() + 120  # the shutdown is sent, not waited for: the sites then take seconds to exit
        left = {}
        while time.time() < deadline:
            left = {
                site: subprocess.run(
                    ["ip", "netns", "pids", ns_of(site)], capture_output=True, text=True
                ).stdout.split()
                for site in ("server", "R1", "C11", "C12")
            }
            if not any(left.values()):
                break
            time.sleep(1.0)
        assert not any(left.values()), f"processes left after shutdown: {left}"
    finally:
        for site in ("server", "R1", "C11", "C12"):
            kill_namespace_processes(ns_of(site))
