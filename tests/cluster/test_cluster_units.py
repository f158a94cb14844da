"""Unit tests of the local cluster's pieces that need no API server: PKI, Prometheus config, the image
map, `$(VAR)` expansion, downward API, mount-path rewriting, pod IPs, probe semantics, and the
lightweight server (a real HTTP server on loopback)."""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from preheat_cluster import default_bin_dir, podnet
from preheat_cluster.node_agent import IpAllocator, ProbeState, run_probe
from preheat_cluster.pki import ensure_pki
from preheat_cluster.podspec import (
    ContainerConfigError,
    ImageMap,
    ImageNotMapped,
    env_key,
    expand,
    field_ref,
    normalise_image,
    parse_quantity,
    resource_field_ref,
    rewrite_paths,
)
from preheat_cluster.prometheus import render_config, write_config, write_file_sd_target

REPO = Path(__file__).resolve().parents[2]


def test_pki_issues_certs_chained_to_one_ca_with_the_right_identities(tmp_path: Path) -> None:
    pki = ensure_pki(tmp_path / "pki")
    ca = x509.load_pem_x509_certificate(pki.ca_crt.read_bytes())
    api = x509.load_pem_x509_certificate(pki.crt("apiserver").read_bytes())
    admin = x509.load_pem_x509_certificate(pki.crt("admin").read_bytes())
    api.verify_directly_issued_by(ca)
    admin.verify_directly_issued_by(ca)
    sans = api.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    # In-cluster clients connect to KUBERNETES_SERVICE_HOST=127.0.0.1 and verify the name.
    assert "127.0.0.1" in [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)]
    assert "kubernetes.default.svc" in sans.get_values_for_type(x509.DNSName)
    # The admin identity is in system:masters, and it is a client cert, not a serving one.
    assert admin.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value == "system:masters"
    assert ExtendedKeyUsageOID.CLIENT_AUTH in admin.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    # Idempotent: a second call keeps the same CA (a running cluster must not see its CA change).
    before = pki.ca_crt.read_bytes()
    ensure_pki(tmp_path / "pki")
    assert pki.ca_crt.read_bytes() == before


@pytest.mark.cluster  # needs the cluster's own promtool (Debian's lacks Kubernetes SD)
def test_prometheus_config_passes_promtool_and_relabels_pod_metadata(tmp_path: Path) -> None:
    pki = ensure_pki(tmp_path / "pki")
    cfg = render_config(api_server="https://127.0.0.1:6443", ca_file=pki.ca_crt, cert_file=pki.crt("admin"),
                        key_file=pki.key("admin"), file_sd_dir=tmp_path / "sd", interval="7s")
    path = tmp_path / "prometheus.yml"
    write_config(path, cfg)
    promtool = default_bin_dir() / "promtool"
    if not promtool.exists():
        pytest.fail(f"{promtool} not found: run `bash cluster/build-binaries.sh prometheus`")
    r = subprocess.run([promtool, "check", "config", str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    loaded = yaml.safe_load(path.read_text())
    assert loaded["global"]["scrape_interval"] == "7s"
    pods = loaded["scrape_configs"][0]
    targets = {r.get("target_label") for r in pods["relabel_configs"]}
    assert {"namespace", "pod", "endpoint", "role", "__address__", "__metrics_path__"} <= targets
    assert pods["honor_labels"] is True


def test_scrape_interval_comes_from_the_environment(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PREHEAT_SCRAPE_INTERVAL", "2s")
    cfg = render_config(api_server="https://x", ca_file=tmp_path, cert_file=tmp_path, key_file=tmp_path,
                        file_sd_dir=tmp_path)
    assert cfg["global"]["scrape_interval"] == "2s"


def test_file_sd_target_is_written_atomically_and_bad_names_are_refused(tmp_path: Path) -> None:
    p = write_file_sd_target(tmp_path, "operator", "127.0.0.1:9090", {"job_role": "operator"})
    assert json.loads(p.read_text()) == [
        {"targets": ["127.0.0.1:9090"], "labels": {"instance_name": "operator", "job_role": "operator"}}]
    with pytest.raises(ValueError, match="HOST:PORT"):
        write_file_sd_target(tmp_path, "x", "no-port", {})
    with pytest.raises(ValueError, match="plain file name"):
        write_file_sd_target(tmp_path, "../evil", "127.0.0.1:1", {})


@pytest.fixture
def image_map() -> ImageMap:
    return ImageMap.load(REPO / "cluster" / "image-map.yaml")


def test_image_map_has_docker_semantics(image_map: ImageMap) -> None:
    venv = Path(sys.executable).parent
    # Neither command nor args: ENTRYPOINT + CMD.
    assert image_map.argv("preheat/model-server:0.1", None, None) == [str(venv / "preheat-server"), "--model", "tiny"]
    # args replace CMD, keep ENTRYPOINT; any registry prefix and tag.
    assert image_map.argv("ghcr.io/acme/preheat/model-server-cuda:v2", None, ["--model", "small"]) == [
        str(venv / "preheat-server"), "--model", "small"]
    # command replaces ENTRYPOINT and drops CMD.
    assert image_map.argv("preheat/operator", ["preheat", "operator", "--verbose"], None)[1:] == ["operator", "--verbose"]
    # Generic images run the container's command; python means the agent's interpreter.
    assert image_map.argv("docker.io/library/python:3.11-slim", ["python", "-m", "http.server"], None) == [
        sys.executable, "-m", "http.server"]
    assert image_map.argv("python:3.12-slim", None, ["python3", "-c", "pass"]) == [sys.executable, "-c", "pass"]


def test_unmapped_image_names_the_known_ones(image_map: ImageMap) -> None:
    with pytest.raises(ImageNotMapped, match=r"'nginx:1.27'.*preheat/model-server"):
        image_map.argv("nginx:1.27", None, None)
    # A generic image is matched with its tag: python:3.9 is not listed.
    with pytest.raises(ImageNotMapped):
        image_map.argv("python:3.9", ["python"], None)


def test_normalise_image_strips_registry_defaults_and_digest() -> None:
    assert normalise_image("docker.io/library/python:3.11-slim@sha256:abc") == ("python", "3.11-slim")
    assert normalise_image("localhost:5000/preheat/operator") == ("localhost:5000/preheat/operator", "latest")


def test_var_expansion_follows_kubernetes_rules() -> None:
    env = {"POD_IP": "127.10.0.7", "PORT": "8000"}
    assert expand("--host=$(POD_IP) --port $(PORT)", env) == "--host=127.10.0.7 --port 8000"
    assert expand("$(UNDEFINED) stays", env) == "$(UNDEFINED) stays"
    assert expand("$$(POD_IP) is escaped", env) == "$(POD_IP) is escaped"
    assert expand("cost $5", env) == "cost $5"


def test_downward_api_field_refs() -> None:
    pod = {"metadata": {"name": "p", "namespace": "ns", "uid": "u", "labels": {"preheat.dev/role": "warm"}},
           "spec": {"nodeName": "n0"}, "status": {"podIP": "127.10.0.2", "podIPs": [{"ip": "127.10.0.2"}]}}
    assert field_ref(pod, "metadata.name") == "p"
    assert field_ref(pod, "spec.serviceAccountName") == "default"
    assert field_ref(pod, "metadata.labels['preheat.dev/role']") == "warm"
    assert field_ref(pod, "status.podIPs") == "127.10.0.2"
    with pytest.raises(ContainerConfigError, match="not supported"):
        field_ref(pod, "spec.containers[0].image")


def test_resource_field_ref_rounds_up_like_the_kubelet() -> None:
    c = {"resources": {"limits": {"cpu": "1500m", "memory": "1Gi"}}}
    assert resource_field_ref(c, {"resource": "limits.cpu"}, {}) == "2"
    assert resource_field_ref(c, {"resource": "limits.memory", "divisor": "1Mi"}, {}) == "1024"
    assert resource_field_ref({}, {"resource": "limits.cpu"}, {"cpu": "64"}) == "64"
    assert parse_quantity("250m") == pytest.approx(0.25)
    with pytest.raises(ContainerConfigError):
        parse_quantity("lots")


def test_mount_paths_are_rewritten_whole_components_only() -> None:
    mounts = {"/etc/preheat": "/pods/a/volumes/cfg", "/etc/preheat/extra": "/pods/a/volumes/extra"}
    assert rewrite_paths("--config=/etc/preheat/c.yaml", mounts) == "--config=/pods/a/volumes/cfg/c.yaml"
    assert rewrite_paths("/etc/preheat/extra/x", mounts) == "/pods/a/volumes/extra/x"
    assert rewrite_paths("/etc/preheatx/y", mounts) == "/etc/preheatx/y"
    # A pod dir that itself lies under another mount point (a checkout under /tmp, a /tmp emptyDir) is
    # rewritten once, never again.
    nested = {"/model-store": "/tmp/ci/.cluster/pods/p/volumes/model-store", "/tmp": "/tmp/ci/.cluster/pods/p/volumes/tmp"}
    assert rewrite_paths("/model-store/model", nested) == "/tmp/ci/.cluster/pods/p/volumes/model-store/model"
    assert rewrite_paths("--x=/tmp/a,/model-store/b", nested) == (
        "--x=/tmp/ci/.cluster/pods/p/volumes/tmp/a,/tmp/ci/.cluster/pods/p/volumes/model-store/b")
    assert env_key("/var/run/secrets/kubernetes.io/serviceaccount") == (
        "PREHEAT_MOUNT_VAR_RUN_SECRETS_KUBERNETES_IO_SERVICEACCOUNT")


def test_pod_ips_are_distinct_and_not_reused_while_live() -> None:
    alloc = IpAllocator("198.18.32.0/20")
    ips = [alloc.allocate() for _ in range(600)]
    assert len(set(ips)) == 600
    net = ipaddress.ip_network("198.18.32.0/20")
    assert all(ipaddress.ip_address(ip) in net and not ip.endswith((".0", ".255")) for ip in ips)
    alloc.release(ips[0])
    # A released address is not handed out again straight away (a late client could still reach it).
    assert alloc.allocate() not in ips


def test_pod_cidr_blocks_are_claimed_once_per_cluster(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        d.mkdir()
        # A live cluster: its state lists a running process (this one).
        (d / "state.json").write_text(json.dumps({"pids": {"etcd": os.getpid()}}))
    ca, cb = podnet.claim_block(a), podnet.claim_block(b)
    try:
        assert ca != cb
        assert podnet.claim_block(a) == ca  # idempotent for the same cluster
        assert ipaddress.ip_network(ca).subnet_of(podnet.ANYIP_RANGE)
    finally:
        podnet.release_block(a, ca)
        podnet.release_block(b, cb)


def test_probe_thresholds_follow_the_kubelet() -> None:
    spec = {"periodSeconds": 1, "failureThreshold": 3, "successThreshold": 2}
    readiness = ProbeState("readiness", spec, started_at=0.0, result=False)
    assert not readiness.record(True, "")  # one success is not enough with successThreshold 2
    assert readiness.record(True, "") and readiness.result
    assert not readiness.record(False, "x") and not readiness.record(False, "x")
    assert readiness.record(False, "x") and not readiness.result  # third consecutive failure flips
    delayed = ProbeState("liveness", {"initialDelaySeconds": 5}, started_at=100.0, result=True)
    assert delayed.next_at == 105.0 and delayed.period == 10.0


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        code = 200 if self.path == "/ok" else 503
        self.send_response(code)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *a) -> None:
        pass


def test_probe_handlers_against_real_sockets_and_processes(tmp_path: Path) -> None:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    port = srv.server_address[1]
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        kw = {"pod_ip": "127.0.0.1", "ports": {"http": port}, "env": {"PATH": "/usr/bin:/bin"}, "cwd": str(tmp_path)}
        assert run_probe({"httpGet": {"path": "/ok", "port": "http"}}, **kw)[0]
        ok, msg = run_probe({"httpGet": {"path": "/bad", "port": port}}, **kw)
        assert not ok and "503" in msg
        assert run_probe({"tcpSocket": {"port": port}}, **kw)[0]
        assert run_probe({"exec": {"command": ["python3", "-c", "import sys; sys.exit(0)"]}}, **kw)[0]
        ok, msg = run_probe({"exec": {"command": ["python3", "-c", "import sys; sys.exit(3)"]}}, **kw)
        assert not ok and "exit code 3" in msg
        ok, msg = run_probe({"exec": {"command": ["sleep", "5"]}, "timeoutSeconds": 1}, **kw)
        assert not ok and "timed out" in msg
        ok, msg = run_probe({"httpGet": {"port": "nope"}}, **kw)
        assert not ok and "named port" in msg
    finally:
        srv.shutdown()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    assert not run_probe({"tcpSocket": {"port": closed}}, pod_ip="127.0.0.1", ports={}, env={}, cwd=str(tmp_path))[0]


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except urllib.error.URLError as e:
        return 0, str(e)


def test_lightweight_server_health_metrics_and_drain(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "preheat_cluster.lightweight_server", "--port", str(port),
                             "--startup-delay-s", "1.5", "--model", "ignored"],
                            env={"POD_IP": "127.0.0.1", "PATH": "/usr/bin:/bin"},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(100):
            if _get(base + "/health/live")[0] == 200:
                break
            time.sleep(0.1)
        # Loading: live but not ready, and a request is counted as received then rejected.
        code, body = _get(base + "/health/ready")
        assert code == 503 and "loading" in body
        for _ in range(100):
            if _get(base + "/health/ready")[0] == 200:
                break
            time.sleep(0.1)
        req = urllib.request.Request(base + "/v1/completions", data=b'{"prompt": "x"}', method="POST")
        for _ in range(3):
            with urllib.request.urlopen(req, timeout=5) as r:
                assert r.status == 200
        bad = urllib.request.Request(base + "/v1/completions", data=b"{not json", method="POST")
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(bad, timeout=5)
        assert e.value.code == 400
        _, metrics = _get(base + "/metrics")
        assert 'preheat:requests_received_total{model_name="lightweight"} 4.0' in metrics
        assert 'preheat:requests_total{model_name="lightweight",outcome="success"} 3.0' in metrics
        assert 'preheat:server_state{model_name="lightweight",state="ready"} 1.0' in metrics
        proc.terminate()
        assert proc.wait(timeout=10) == 0
    finally:
        proc.kill()
        proc.wait()


def test_peer_address_is_in_the_pod_block_and_never_a_pod_address(tmp_path) -> None:
    """The peers (prometheus-adapter) listen on an address the EndpointSlice can name (the pod block,
    not loopback) that the node agent never hands a pod."""
    from preheat_cluster.launcher import LocalCluster
    from preheat_cluster.peers import peer_address

    cidr = "198.18.16.0/20"
    cluster = LocalCluster(state_dir=tmp_path)
    (tmp_path / "state.json").write_text(json.dumps({"pod_cidr": cidr}))
    addr = peer_address(cluster)
    assert ipaddress.ip_address(addr) in ipaddress.ip_network(cidr)
    ips = IpAllocator(cidr)
    handed = {ips.allocate() for _ in range(len(ips._hosts))}
    assert addr not in handed and len(handed) == len(ips._hosts)


def test_front_proxy_ca_signs_only_the_proxy_client_cert(tmp_path) -> None:
    """The aggregation layer's trust root is separate from the cluster CA (the Kubernetes docs' advice)."""
    from preheat_cluster.pki import ensure_front_proxy

    pki = ensure_pki(tmp_path / "pki")
    ca_path, crt_path, _ = ensure_front_proxy(pki)
    ca = x509.load_pem_x509_certificate(ca_path.read_bytes())
    crt = x509.load_pem_x509_certificate(crt_path.read_bytes())
    cluster_ca = x509.load_pem_x509_certificate(pki.ca_crt.read_bytes())
    assert crt.issuer == ca.subject != cluster_ca.subject
    assert crt.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "front-proxy-client"
    eku = crt.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    crt.verify_directly_issued_by(ca)
    assert ensure_front_proxy(pki)[1].read_bytes() == crt_path.read_bytes()  # idempotent
