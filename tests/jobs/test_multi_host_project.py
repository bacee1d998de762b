"""The project for several hosts puts every host where NVFlare reads it, with fixed ports, mutual TLS to the relays
and each leaf's edge API on its own address; bad ``--host`` pairs are refused naming the fix. Provisioning only:
the hierarchy itself runs across namespaces in ``tests/e2e/test_multi_host.py``."""

from __future__ import annotations

import json

import pytest

from jobs.deploy import multi_host
from jobs.deploy.cli import main

HOSTS = ["server=10.9.0.1", "R1=10.9.0.2", "C11=10.9.0.3", "C12=10.9.0.4"]


def test_the_kits_carry_each_sites_host_fixed_ports_and_mutual_tls(tmp_path, capsys):
    assert main(["provision", str(tmp_path / "k"), *(f"--host={h}" for h in HOSTS), "--base-port", "9100"]) == 0
    prod = tmp_path / "k" / "edgesim" / "prod_00"
    relay = json.loads((prod / "C11" / "local" / "relay__resources.json").read_text())["relay_config"]
    assert relay["address"] == "10.9.0.2:9102" and relay["connection_security"] == "mtls"
    listener = json.loads((prod / "R1" / "local" / "comm_config.json").read_text())["internal"]["resources"]
    assert listener == {"host": "10.9.0.2", "port": 9102, "connection_security": "mtls", "listen_host": "10.9.0.2"}
    server = json.loads((prod / "server" / "startup" / "fed_server.json").read_text())["servers"][0]
    assert server["admin_host"] == "10.9.0.1" and server["admin_port"] == 9101
    # the internal listeners (a site's own job processes connect) on loopback, at fixed ports after the others
    for site, port in {"server": 9105, "C11": 9106, "C12": 9107}.items():
        internal = json.loads((prod / site / "local" / "comm_config.json").read_text())["internal"]["resources"]
        assert internal == {
            "host": "127.0.0.1",
            "listen_host": "127.0.0.1",
            "port": port,
            "connection_security": "clear",
        }
    sites = json.loads((prod / "admin@nvidia.com" / "local" / "edgesim_sites.json").read_text())
    assert sites == {"relays": ["R1"], "leaves": ["C11", "C12"]}
    admin = json.loads((prod / "admin@nvidia.com" / "startup" / "fed_admin.json").read_text())
    assert admin["admin"]["host"] == "10.9.0.1" and admin["admin"]["port"] == 9101
    edge = json.loads((prod / "C12" / "local" / "edge__p_resources.json").read_text())
    assert {"host": "10.9.0.4", "port": 9104} in [c["args"] for c in edge["components"]]
    assert "default_host: 10.9.0.2" in (tmp_path / "k" / "project.yml").read_text()
    out = capsys.readouterr().out
    assert "C12     10.9.0.4:9104  edge API" in out and "C12     127.0.0.1:9107  internal cell" in out
    assert "server  0.0.0.0:9100  NVFlare cell" in out  # NVFlare binds it so off loopback (docs/deployment.md)


@pytest.mark.parametrize(
    "pairs, message",
    [
        (HOSTS[:3], "no --host for C12"),
        ([*HOSTS, "C13=10.9.0.5"], "no site 'C13' in this project"),
        ([*HOSTS[:3], "C12"], "give NAME=HOST"),
        ([*HOSTS, "R1=10.9.0.9"], "--host R1 is given twice"),
    ],
)
def test_bad_host_pairs_are_refused_naming_the_fix(pairs, message):
    with pytest.raises(ValueError, match=message):
        multi_host.parse_hosts(pairs, 1, 2)
