"""The README's CRD reference is the schema the API server enforces, not a hand-kept copy."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _crd_reference():
    spec = importlib.util.spec_from_file_location("crd_reference", ROOT / "scripts" / "crd_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_crd_reference_matches_the_crd():
    ref = _crd_reference()
    readme = (ROOT / "README.md").read_text()
    start, end = readme.index(ref.BEGIN), readme.index(ref.END) + len(ref.END)
    assert readme[start:end] == ref.render(), "run: .venv/bin/python scripts/crd_reference.py --write README.md"


def test_readme_lists_every_field_of_the_spec():
    rendered = _crd_reference().render()
    for field in ("spec.scaling.warmPool.min", "spec.scaling.mode", "spec.model.precision",
                  "status.coldStartSeconds", "status.forecastSignal"):
        assert f"`{field}`" in rendered


def test_readme_starts_with_the_two_commands():
    head = "\n".join((ROOT / "README.md").read_text().splitlines()[:15])
    assert "make demo" in head and "make test" in head
    assert "make test" in (ROOT / ".ci" / "run").read_text()
