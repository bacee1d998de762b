"""An admin's mistakes cost one line naming the fix and exit 2, before anything is sent or made: a ``--username``
the kit was not made for, a folder that is no admin kit, a server that does not answer (its host and port
named, no ``--output`` folder left), ``wait`` for a leaf the project lacks or a job for a leaf count it does
not have, ``shutdown`` of a stopped deployment. A prod ``--dry-run`` names the project's leaves. The kits are
really provisioned (for hosts on loopback); no site is started."""

from __future__ import annotations

import json
import os
import time

import pytest

from common.ports import listen_ports
from jobs.deploy import multi_host
from jobs.deploy.cli import main as deploy
from jobs.pt_job_fedavg import main as fedavg
from jobs.run import driver

SMALL = ["--num-leaf-nodes", "2", "--synthetic-size", "1500", "--subset-size", "40", "--max-model-version", "2"]


@pytest.fixture(scope="module")
def kit(tmp_path_factory) -> str:
    """An admin kit whose server's ports are free now: nothing answers there."""
    folder = tmp_path_factory.mktemp("kits")
    hosts = {"server": "127.0.0.1", "R1": "127.0.0.1", "C11": "127.0.0.1", "C12": "127.0.0.1"}
    base = listen_ports(1)[0]
    made = multi_host.provision(str(folder / "k"), 1, 2, hosts, base_port=base)
    return made["admin_kit"]


@pytest.fixture(autouse=True)
def nothing_submitted(monkeypatch):
    def boom(*_a, **_k):
        raise AssertionError("an NVFlare environment was made: the mistake was not caught first")

    monkeypatch.setattr(driver, "make_env", boom)


def one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    return lines[0]


def job_refused(argv: list[str], capsys) -> str:
    """Run the FedAvg job with ``argv``: it must end with exit 2; its one stderr line."""
    try:
        code = fedavg(argv)
    except SystemExit as ex:  # the parser's refusal
        code = ex.code
    assert code == 2
    return one_line(capsys.readouterr().err)


def test_a_username_the_kit_was_not_made_for_is_named_with_the_right_one(kit, tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["--env", "prod", "--startup-kit", kit, "--username", "admin@nvidia.co", "--output", str(out), *SMALL]
    line = job_refused(argv, capsys)
    assert "--username admin@nvidia.co does not match" in line and "use --username admin@nvidia.com" in line
    assert not out.exists()


def test_a_folder_that_is_no_admin_kit_is_refused(kit, tmp_path, capsys):
    site_kit = os.path.join(os.path.dirname(kit), "C11")  # a leaf's kit, not the admin's
    argv = ["--env", "prod", "--startup-kit", site_kit, "--username", "admin@nvidia.com", *SMALL]
    assert "is not an admin's startup kit (no startup/fed_admin.json)" in job_refused(argv, capsys)
    for command in (["wait", "--startup-kit", site_kit, "--leaves", "C11"], ["shutdown", "--startup-kit", site_kit]):
        assert deploy(command) == 2
        assert one_line(capsys.readouterr().err).startswith(f"error: --startup-kit {site_kit} is not an admin's")


def test_a_server_that_does_not_answer_is_named_and_no_output_folder_is_left(kit, tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["--env", "prod", "--startup-kit", kit, "--username", "admin@nvidia.com", "--output", str(out), *SMALL]
    line = job_refused(argv, capsys)
    with open(os.path.join(kit, "startup", "fed_admin.json")) as f:
        admin_port = json.load(f)["admin"]["port"]
    assert f"the server's admin port 127.0.0.1:{admin_port}" in line and "does not answer" in line
    assert not out.exists()


def test_wait_for_a_leaf_the_project_lacks_is_refused_at_once(kit, capsys):
    started = time.time()
    assert deploy(["wait", "--startup-kit", kit, "--leaves", "C11,C13", "--timeout", "60"]) == 2
    assert one_line(capsys.readouterr().err) == "error: --leaves: no leaf C13 in this project; its leaves are C11,C12"
    assert time.time() - started < 5


def test_shutdown_of_a_stopped_deployment_says_so_at_once(kit, capsys):
    started = time.time()
    assert deploy(["shutdown", "--startup-kit", kit]) == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith("error: nothing shut down: the server's admin port 127.0.0.1:") and "does not answer" in line
    assert time.time() - started < 5


def test_a_leaf_count_the_deployment_does_not_have_is_refused(kit, capsys):
    argv = ["--env", "prod", "--startup-kit", kit, "--username", "admin@nvidia.com", *SMALL, "--num-leaf-nodes", "3"]
    line = job_refused(argv, capsys)
    assert line == "error: --num-leaf-nodes 3: the deployment has 2 leaves (C11,C12): use --num-leaf-nodes 2"


def test_a_prod_dry_run_names_the_deployments_leaves_as_the_prod_run_does(kit, tmp_path, capsys):
    out = tmp_path / "dry"
    argv = ["--env", "prod", "--startup-kit", kit, "--username", "admin@nvidia.com", *SMALL, "--dry-run"]
    assert fedavg([*argv, "--output", str(out)]) == 0  # no server needed: nothing is sent
    devices = {json.loads(line)["device"] for line in (out / "events.jsonl").read_text().splitlines()}
    assert devices and {d.partition("#")[0] for d in devices} == {"C11", "C12"}


def test_down_of_a_stopped_local_deployment_ends_at_once(kit, tmp_path, capsys):
    from jobs.deploy.local import Deployment

    prod = os.path.dirname(kit)
    Deployment(str(tmp_path), prod, kit, ["C11", "C12"], {}, {"server": 2**22}).save()  # no such session
    started = time.time()
    assert deploy(["down", str(tmp_path)]) == 0
    assert "stopped" in capsys.readouterr().out
    assert time.time() - started < 5  # no admin login to a server that is not there, no retries
