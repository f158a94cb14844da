"""The kind e2e cannot run here (no Docker): check its script and manifests as far as possible without
it, and that its Prometheus scrapes exactly like the local cluster's so the same suite holds there."""

from __future__ import annotations

from pathlib import Path

import yaml
from preheat_cluster.prometheus import render_config

from .tools import REPO, find_tool, run

E2E = REPO / "e2e"


def test_script_parses_and_passes_shellcheck() -> None:
    script = E2E / "run-kind-e2e.sh"
    run(["bash", "-n", str(script)])
    run([find_tool("shellcheck"), "--severity=style", str(script)])


def test_kind_config_and_prometheus_manifest_are_valid_yaml() -> None:
    kind = yaml.safe_load((E2E / "kind-config.yaml").read_text())
    assert kind["kind"] == "Cluster" and kind["apiVersion"] == "kind.x-k8s.io/v1alpha4"
    # The NodePort the script reads Prometheus on is mapped to the host.
    ports = [m["containerPort"] for n in kind["nodes"] for m in n.get("extraPortMappings", [])]
    docs = [d for d in yaml.safe_load_all((E2E / "prometheus.yaml").read_text()) if d]
    svc = next(d for d in docs if d["kind"] == "Service")
    assert svc["spec"]["ports"][0]["nodePort"] in ports


def test_kind_prometheus_scrapes_like_the_local_cluster() -> None:
    docs = [d for d in yaml.safe_load_all((E2E / "prometheus.yaml").read_text()) if d]
    cm = next(d for d in docs if d["kind"] == "ConfigMap")
    kind_job = yaml.safe_load(cm["data"]["prometheus.yml"])["scrape_configs"][0]
    local = render_config(
        api_server="https://127.0.0.1:1",
        ca_file=Path("ca"),
        cert_file=Path("c"),
        key_file=Path("k"),
        file_sd_dir=Path("sd"),
    )
    local_job = next(j for j in local["scrape_configs"] if j["job_name"] == kind_job["job_name"])
    assert kind_job["honor_labels"] == local_job["honor_labels"] is True
    assert kind_job["relabel_configs"] == local_job["relabel_configs"]
