"""The product wheel ships the product only; the lab (local cluster, closed loop, load generator,
benchmarks) is its own dev-only wheel.

Both wheels are built for real (`pip wheel --no-deps --no-build-isolation`) from a copy of their
sources, so a test run never writes build/ or egg-info into the work tree.
"""

from __future__ import annotations

import configparser
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from .tools import REPO

LAB_PACKAGES = ("preheat_cluster", "preheat_lab")
LAB_SCRIPTS = {"preheat-cluster"}
_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")


def _build(src: Path, out: Path) -> zipfile.ZipFile:
    out.mkdir()
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                           "-w", str(out), str(src)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (wheel,) = out.glob("*.whl")
    return zipfile.ZipFile(wheel)


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> dict[str, zipfile.ZipFile]:
    tmp = tmp_path_factory.mktemp("wheels")
    product = tmp / "product"
    product.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, product / name)
    for tree in ("operator", "model-server"):
        shutil.copytree(REPO / tree, product / tree, ignore=_IGNORE)
    shutil.copytree(REPO / "lab", tmp / "lab", ignore=_IGNORE)
    return {"product": _build(product, tmp / "product-wheel"), "lab": _build(tmp / "lab", tmp / "lab-wheel")}


def _modules(wheel: zipfile.ZipFile) -> set[str]:
    return {n for n in wheel.namelist() if n.endswith(".py")}


def _console_scripts(wheel: zipfile.ZipFile) -> set[str]:
    (entry_points,) = [n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt")]
    parser = configparser.ConfigParser()
    parser.read_string(wheel.read(entry_points).decode())
    return set(parser["console_scripts"]) if parser.has_section("console_scripts") else set()


def _is_lab_code(path: str) -> bool:
    parts = path.split("/")
    return (parts[0] in LAB_PACKAGES or "closedloop" in parts or "loadgen" in parts
            or "bench" in Path(path).stem or "bench" in parts[:-1])


def test_product_wheel_holds_the_product_and_no_lab_code(wheels):
    modules = _modules(wheels["product"])
    tops = {m.split("/")[0] for m in modules}
    assert tops == {"preheat", "preheat_server"}, tops
    assert {"preheat/controller/handlers.py", "preheat/sim/run.py", "preheat_server/server.py"} <= modules
    lab_code = {m for m in modules if _is_lab_code(m)}
    assert not lab_code, f"lab code in the product wheel: {sorted(lab_code)}"


def test_product_wheel_has_no_lab_console_script(wheels):
    scripts = _console_scripts(wheels["product"])
    assert {"preheat", "preheat-server"} <= scripts
    assert not scripts & LAB_SCRIPTS, scripts


def test_lab_wheel_holds_the_cluster_closed_loop_load_generator_and_benchmarks(wheels):
    modules = _modules(wheels["lab"])
    assert {m.split("/")[0] for m in modules} == set(LAB_PACKAGES)
    for module in ("preheat_cluster/launcher.py", "preheat_cluster/realnode.py",
                   "preheat_lab/closedloop/experiment.py", "preheat_lab/loadgen/replay.py",
                   "preheat_lab/bench_scale.py", "preheat_lab/bench_cluster.py", "preheat_lab/bench_sim.py",
                   "preheat_lab/bench_forecast.py"):
        assert module in modules, module
    assert _console_scripts(wheels["lab"]) == LAB_SCRIPTS
