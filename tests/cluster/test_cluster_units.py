"""Unit tests of the local cluster's pieces that need no API server: PKI, Prometheus config, where the
peers listen, and the lightweight server (a real HTTP server on loopback)."""

from __future__ import annotations

import ipaddress
import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from preheat_cluster import default_bin_dir
from preheat_cluster.pki import ensure_pki
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


def test_peers_listen_where_pods_and_the_aggregation_layer_reach_this_host(tmp_path) -> None:
    """The peers (prometheus-adapter) run on this host and listen on an address an EndpointSlice can name
    (loopback addresses are refused): the one the API server advertises, inside the cluster's namespace."""
    from preheat_cluster.launcher import LocalCluster
    from preheat_cluster.peers import peer_address
    from preheat_cluster.realnode import API_SERVER_IP, NODE_NET

    addr = ipaddress.ip_address(peer_address(LocalCluster(state_dir=tmp_path)))
    assert str(addr) == API_SERVER_IP and addr in NODE_NET and not addr.is_loopback


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
