"""NVFlare's routing proxy for real devices (``jobs.deploy.device_proxy``) without a hierarchy: the LCP map written from a
deployment is the one NVFlare's ``Query`` reads, and the launcher serves NVFlare's proxy app on loopback, answers
a device with a JSON body even when its leaf cannot be reached, and ends with no process left behind."""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import replace

import psutil
import pytest
from nvflare.edge.constants import HttpHeaderKey

from common.ports import listen_ports
from jobs.deploy.device_proxy import sign_proxy_certificate, write_lcp_map
from jobs.deploy.local import Deployment, proxy_answers
from jobs.deploy.sessions import session_processes, stop_session
from tests.conftest import PYTHON, REPO


def a_deployment(folder: str, **extra) -> Deployment:
    """A deployment record as ``jobs.deploy.local.start`` saves it (nothing runs)."""
    return Deployment(
        folder=folder,
        prod_dir=os.path.join(folder, "edgesim", "prod_00"),
        admin_kit=os.path.join(folder, "edgesim", "prod_00", "admin@nvidia.com"),
        leaves=["C11", "C12", "C21"],
        ports={"server": 10001, "admin": 10002, "R1": 10003, "C11": 10004, "C12": 10005, "C21": 10006},
        sessions={},
        **extra,
    )


def self_signed_ca(path, state_dir=None) -> None:
    """A root CA certificate in PEM, like a deployment's ``rootCA.pem``; with ``state_dir``, also its key in a
    ``cert.json`` as NVFlare's provisioning keeps it."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "edgesim-test-ca")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    pem = cert.public_bytes(serialization.Encoding.PEM)
    path.write_bytes(pem)
    if state_dir is not None:
        key_pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()
        )
        (state_dir / "cert.json").write_text(json.dumps({"root_cert": pem.decode(), "root_pri_key": key_pem.decode()}))


def test_the_lcp_map_written_from_a_deployment_is_what_nvflares_query_reads(tmp_path):
    from nvflare.edge.web.service.query import Query

    deployment = a_deployment(str(tmp_path))
    path = tmp_path / "lcp_map.json"
    written = write_lcp_map(deployment, str(path))
    assert written == json.loads(path.read_text())
    assert Query(lcp_mapping_file=str(path)).lcp_list == [
        ("C11", "127.0.0.1:10004"),
        ("C12", "127.0.0.1:10005"),
        ("C21", "127.0.0.1:10006"),
    ]  # every leaf, at its edge service port, and no relay nor server


def test_a_deployment_json_without_a_proxy_field_still_loads(tmp_path):
    """``deployment.json`` files written before the proxy existed lack ``proxy_port``."""
    deployment = a_deployment(str(tmp_path))
    state = {k: v for k, v in vars(deployment).items() if k != "proxy_port"}
    (tmp_path / "deployment.json").write_text(json.dumps(state))
    loaded = Deployment.load(str(tmp_path))
    assert loaded.proxy_port is None and loaded.proxy_endpoint is None
    a_deployment(str(tmp_path), proxy_port=12345).save()
    assert Deployment.load(str(tmp_path)).proxy_endpoint == "http://127.0.0.1:12345/"


def start_proxy(tmp_path, *flags: str):
    """The launcher in a session of its own on a free loopback port, routing to a leaf whose port nothing listens
    on; (port, process, log path)."""
    unreachable, port = listen_ports(2)  # free now: nothing listens on the leaf's port
    deployment = replace(a_deployment(str(tmp_path)), leaves=["C11"], ports={"C11": unreachable})
    lcp_map = tmp_path / "lcp_map.json"
    write_lcp_map(deployment, str(lcp_map))
    ca = tmp_path / "rootCA.pem"
    if not ca.exists():
        self_signed_ca(ca)
    log_path = tmp_path / "proxy.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [PYTHON, "-m", "jobs.deploy.device_proxy", str(port), str(lcp_map), str(ca), *flags],
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    return port, proc, log_path


@contextlib.contextmanager
def running(started):
    """Yield ``start_proxy``'s triple; kill the proxy's session at the end whatever the test did."""
    port, proc, log_path = started
    try:
        yield port, proc, log_path
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)


@pytest.fixture
def proxy(tmp_path):
    with running(start_proxy(tmp_path)) as started:
        yield started


@pytest.fixture
def https_proxy(tmp_path):
    """The launcher serving HTTPS with a certificate signed by the deployment's root CA (``rootCA.pem``)."""
    self_signed_ca(tmp_path / "rootCA.pem", state_dir=tmp_path)
    cert, key = sign_proxy_certificate(str(tmp_path), str(tmp_path))
    with running(start_proxy(tmp_path, "--ssl-cert", cert, "--ssl-key", key)) as started:
        yield started


def wait_until_up(port: int, proc: subprocess.Popen, log_path, timeout: float = 20.0, scheme: str = "http") -> None:
    deadline = time.time() + timeout
    while not proxy_answers(f"{scheme}://127.0.0.1:{port}/"):
        assert proc.poll() is None, f"the proxy exited: {log_path.read_text()[-2000:]}"
        assert time.time() < deadline, f"the proxy did not answer: {log_path.read_text()[-2000:]}"
        time.sleep(0.2)


def post_job_request(port: int) -> tuple[int, dict]:
    """A device's job request, as NVFlare's device SDKs send it; (HTTP status, JSON body)."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/job",
        data=json.dumps({"job_name": "edgesim", "capabilities": {"methods": ["cnn"]}}).encode(),
        method="POST",
        headers={"Content-Type": "application/json", HttpHeaderKey.DEVICE_ID: "device-1"},
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # straight to loopback
    try:
        with opener.open(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as ex:
        return ex.code, json.loads(ex.read())


def test_the_proxy_answers_a_device_with_json_even_when_its_leaf_is_unreachable(proxy):
    port, proc, log_path = proxy
    wait_until_up(port, proc, log_path)
    status, body = post_job_request(port)
    # the proxy routed the request to the only leaf, the gRPC call failed, and it tells the device to retry
    assert (status, body.get("status")) == (200, "RETRY"), body
    assert "exception querying grpc service" in log_path.read_text()


def test_the_proxy_listens_on_loopback_only_by_default(proxy):
    port, proc, log_path = proxy
    wait_until_up(port, proc, log_path)
    listening = {
        c.laddr for c in psutil.Process(proc.pid).net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN
    }
    assert {(a.ip, a.port) for a in listening} == {("127.0.0.1", port)}


def test_sigterm_stops_the_proxy_and_leaves_no_process_of_its_session(proxy):
    port, proc, log_path = proxy
    wait_until_up(port, proc, log_path)
    stop_session(proc.pid, grace=5.0)  # what ``jobs.deploy down`` does to the proxy
    assert proc.wait(5) is not None
    assert not session_processes(proc.pid)
    assert not proxy_answers(f"http://127.0.0.1:{port}/", timeout=1.0)


def test_an_https_proxy_is_trusted_by_nvflares_http_client_given_the_root_ca(https_proxy, tmp_path, monkeypatch):
    from nvflare.edge.simulation.feg_api import FegApi
    from nvflare.edge.web.models.device_info import DeviceInfo
    from nvflare.edge.web.models.job_request import JobRequest
    from nvflare.edge.web.models.user_info import UserInfo

    from processors.device_processor import RealDeviceProcessor

    port, proc, log_path = https_proxy
    wait_until_up(port, proc, log_path, scheme="https")
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", "")  # recorded, so the processor's setting is undone afterwards
    monkeypatch.delenv("REQUESTS_CA_BUNDLE")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")  # straight to loopback, whatever proxy the environment names
    api = FegApi(f"https://127.0.0.1:{port}/", DeviceInfo("device-1", "flare_mobile", "1.0"), UserInfo("u", "u"))
    request = JobRequest(
        "edgesim", DeviceInfo("device-1", "flare_mobile", "1.0"), UserInfo("u", "u"), {"methods": ["cnn"]}
    )
    with pytest.raises(Exception, match="CERTIFICATE_VERIFY_FAILED"):
        api.get_job(request)  # the system's CAs do not know the deployment's
    RealDeviceProcessor(ca_cert=str(tmp_path / "rootCA.pem"))  # what the device client's config makes
    assert os.environ["REQUESTS_CA_BUNDLE"] == str(tmp_path / "rootCA.pem")
    answer = api.get_job(request)  # verified against rootCA.pem; the leaf is unreachable: retry
    assert answer.status == "RETRY", answer
