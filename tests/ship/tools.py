"""Helpers shared by the ship tests: where helm/kubectl/promtool are, rendering the chart, kubectl."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "manifests" / "chart" / "preheat"
CRD = REPO / "crds" / "inferenceendpoint.yaml"
DASHBOARD = REPO / "manifests" / "dashboards" / "preheat.json"
RULES = REPO / "manifests" / "alerts" / "preheat-rules.yaml"
RULE_TESTS = REPO / "manifests" / "alerts" / "tests" / "preheat-rules.test.yaml"
CACHE_BIN = Path(os.environ.get("PREHEAT_CACHE", Path.home() / ".cache" / "preheat")) / "bin"


def find_tool(name: str, bin_dir: Path | None = None) -> str:
    """The cluster's own build of a tool first (same version CI uses), else PATH.

    Missing tools are a skip with the reason in the summary (pytest -ra), never a silent pass:
    `make test` builds them first (`make binaries`).
    """
    for d in (bin_dir, CACHE_BIN):
        if d is not None and (Path(d) / name).is_file():
            return str(Path(d) / name)
    found = shutil.which(name)
    if found:
        return found
    pytest.skip(f"{name} is not installed: run `make binaries prometheus` (make test does)")


def run(
    argv: list[str],
    *,
    env: dict[str, str] | None = None,
    check: bool = True,
    input: str | None = None,
    timeout: float = 180,
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, input=input, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(argv)} exited {proc.returncode}\nstdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
        )
    return proc


def helm_template(
    helm: str,
    *sets: str,
    namespace: str = "preheat-system",
    release: str = "preheat",
    include_crds: bool = False,
) -> list[dict[str, Any]]:
    """Render the chart and return its objects (empty documents dropped)."""
    argv = [helm, "template", release, str(CHART), "--namespace", namespace]
    if include_crds:
        argv.append("--include-crds")
    for s in sets:
        argv += ["--set", s]
    out = run(argv).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def by_kind(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o.get("kind") == kind]


def one(objs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = by_kind(objs, kind)
    assert len(found) == 1, f"expected one {kind}, got {[o['metadata']['name'] for o in found]}"
    return found[0]


class Kube:
    """kubectl and helm against one cluster's kubeconfig."""

    def __init__(self, kubeconfig: Path, kubectl: str, helm: str):
        self.kubeconfig = Path(kubeconfig)
        self.kubectl_bin = kubectl
        self.helm_bin = helm
        self.env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
        # Helm keeps its caches and registry config under HOME; keep them out of the user's.
        self.env.setdefault("HELM_CACHE_HOME", str(Path(kubeconfig).parent / "helm-cache"))
        self.env.setdefault("HELM_CONFIG_HOME", str(Path(kubeconfig).parent / "helm-config"))
        self.env.setdefault("HELM_DATA_HOME", str(Path(kubeconfig).parent / "helm-data"))

    def kubectl(
        self, *args: str, check: bool = True, input: str | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        return run(
            [self.kubectl_bin, "--kubeconfig", str(self.kubeconfig), *args],
            env=self.env,
            check=check,
            input=input,
            timeout=timeout,
        )

    def helm(self, *args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return run(
            [self.helm_bin, "--kubeconfig", str(self.kubeconfig), *args],
            env=self.env,
            check=check,
            timeout=timeout,
        )

    def get_json(self, *args: str) -> dict[str, Any]:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def exists(self, *args: str) -> bool:
        proc = self.kubectl("get", *args, "--ignore-not-found", "-o", "name", check=False)
        return proc.returncode == 0 and bool(proc.stdout.strip())


def _script_module(name: str) -> Any:
    import importlib.util

    path = REPO / "manifests" / "dashboards" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"preheat_{name}", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def dashboard_builder() -> Any:
    """manifests/dashboards/build_dashboard.py as a module (it is a script, not a package)."""
    return _script_module("build_dashboard")


def dashboard_renderer() -> Any:
    """manifests/dashboards/render_png.py as a module."""
    return _script_module("render_png")
