"""The local Prometheus' configuration: pods discovered through the local API server by annotation,
plus a file_sd job for processes that run on the host (an operator started by a test)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import yaml

DEFAULT_SCRAPE_INTERVAL = "5s"


def scrape_interval() -> str:
    """`PREHEAT_SCRAPE_INTERVAL` (a Prometheus duration such as `5s`), default 5 s for tests."""
    return os.environ.get("PREHEAT_SCRAPE_INTERVAL", DEFAULT_SCRAPE_INTERVAL)


def render_config(
    *, api_server: str, ca_file: Path, cert_file: Path, key_file: Path, file_sd_dir: Path,
    interval: str | None = None,
) -> dict:
    """The prometheus.yml content as a dict (pure: unit-tested without Prometheus)."""
    interval = interval or scrape_interval()
    pod_relabel = [
        # Annotation-based scraping, the convention of the community Helm chart.
        {"source_labels": ["__meta_kubernetes_pod_annotation_prometheus_io_scrape"], "action": "keep",
         "regex": "true"},
        # A pod that has finished or not started has no process to scrape.
        {"source_labels": ["__meta_kubernetes_pod_phase"], "action": "drop",
         "regex": "Pending|Succeeded|Failed|Unknown"},
        {"source_labels": ["__meta_kubernetes_pod_annotation_prometheus_io_path"], "action": "replace",
         "target_label": "__metrics_path__", "regex": "(.+)"},
        {"source_labels": ["__meta_kubernetes_pod_ip", "__meta_kubernetes_pod_annotation_prometheus_io_port"],
         "action": "replace", "regex": "(.+);(\\d+)", "replacement": "$1:$2", "target_label": "__address__"},
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {"source_labels": ["__meta_kubernetes_pod_label_preheat_dev_endpoint"], "target_label": "endpoint"},
        {"source_labels": ["__meta_kubernetes_pod_label_preheat_dev_role"], "target_label": "role"},
        {"source_labels": ["__meta_kubernetes_pod_node_name"], "target_label": "node"},
    ]
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval,
                   "scrape_timeout": interval if _seconds(interval) < 3 else "3s"},
        "scrape_configs": [
            {
                "job_name": "kubernetes-pods",
                # Operator metrics carry their own namespace/endpoint labels (the InferenceEndpoint's);
                # those must win over the operator pod's target labels.
                "honor_labels": True,
                "kubernetes_sd_configs": [
                    {"role": "pod", "api_server": api_server,
                     "tls_config": {"ca_file": str(ca_file), "cert_file": str(cert_file),
                                    "key_file": str(key_file)}}
                ],
                "relabel_configs": pod_relabel,
            },
            {
                "job_name": "host-processes",
                "honor_labels": True,
                "file_sd_configs": [{"files": [str(file_sd_dir / "*.json")], "refresh_interval": "5s"}],
            },
        ],
    }


def _seconds(duration: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    for u in ("ms", "s", "m", "h"):
        if duration.endswith(u) and duration[: -len(u)].replace(".", "", 1).isdigit():
            return float(duration[: -len(u)]) * units[u]
    raise ValueError(f"PREHEAT_SCRAPE_INTERVAL must be a duration such as 5s, got {duration!r}")


def write_config(path: Path, config: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(config, sort_keys=False))
    tmp.replace(path)


def write_file_sd_target(file_sd_dir: Path, name: str, address: str, labels: dict[str, str]) -> Path:
    """Register a host process for scraping; Prometheus picks the file up within seconds (inotify)."""
    if not name or "/" in name or name.startswith("."):
        raise ValueError(f"scrape target name must be a plain file name, got {name!r}")
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"scrape target address must be HOST:PORT, got {address!r}")
    file_sd_dir.mkdir(parents=True, exist_ok=True)
    path = file_sd_dir / f"{name}.json"
    tmp = file_sd_dir / f".{name}.json.tmp"
    tmp.write_text(json.dumps([{"targets": [address], "labels": {"instance_name": name, **labels}}]))
    tmp.replace(path)
    return path


def remove_file_sd_target(file_sd_dir: Path, name: str) -> None:
    (file_sd_dir / f"{name}.json").unlink(missing_ok=True)
