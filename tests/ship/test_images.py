"""The Dockerfiles as text: docs/ARCHITECTURE.md's table says what each image runs, and the images are
pinned, non-root and read-only-root-fs friendly. `make images` builds them and the real nodes run them
(tests/cluster/test_real_node.py, the Helm tests)."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from .tools import REPO

DOCKERFILES = {
    "preheat/operator": REPO / "operator" / "Dockerfile",
    "preheat/model-server": REPO / "model-server" / "Dockerfile",
    "preheat/model-server-cuda": REPO / "model-server" / "Dockerfile.cuda",
}


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def final_stage(path: Path) -> list[tuple[str, str]]:
    ins = instructions(path)
    last_from = max(i for i, (w, _) in enumerate(ins) if w == "FROM")
    return ins[last_from:]


def exec_form(value: str) -> list[str]:
    """ENTRYPOINT/CMD must be JSON exec form: shell form would run under /bin/sh -c and swallow signals."""
    parsed = json.loads(value)
    assert isinstance(parsed, list) and all(isinstance(a, str) for a in parsed), value
    return parsed


def entrypoint_and_cmd(path: Path) -> tuple[list[str], list[str]]:
    stage = final_stage(path)
    entry = [exec_form(v) for w, v in stage if w == "ENTRYPOINT"]
    cmd = [exec_form(v) for w, v in stage if w == "CMD"]
    assert len(entry) == 1, f"{path}: one ENTRYPOINT in the final stage"
    return entry[0], cmd[-1] if cmd else []


def build_args(path: Path) -> dict[str, str]:
    out = {}
    for w, v in instructions(path):
        if w == "ARG" and "=" in v:
            k, _, default = v.partition("=")
            out[k] = default
    return out


def base_images(path: Path) -> list[str]:
    args = build_args(path)
    refs = []
    for w, v in instructions(path):
        if w == "FROM":
            ref = shlex.split(v)[0]
            ref = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], ref)
            refs.append(ref)
    return refs


def test_architecture_table_matches_dockerfiles() -> None:
    # docs/ARCHITECTURE.md is the contract; both it and the Dockerfiles must say the same.
    table = (REPO / "docs" / "ARCHITECTURE.md").read_text()
    for image, path in DOCKERFILES.items():
        entrypoint, cmd = entrypoint_and_cmd(path)
        row = f"| `{image}` | `{' '.join(entrypoint)}` | {f'`{shlex.join(cmd)}`' if cmd else '(none)'} |"
        assert row in table, f"ARCHITECTURE.md has no row {row!r}"


@pytest.mark.parametrize("image", sorted(DOCKERFILES))
def test_images_are_pinned_non_root_and_read_only_friendly(image: str) -> None:
    path = DOCKERFILES[image]
    for ref in base_images(path):
        name = ref.split("@")[0]
        tag = name.rsplit(":", 1)[1] if ":" in name.rsplit("/", 1)[-1] else ""
        # An exact version (digits and dots, e.g. 3.11.13-slim-bookworm) or a digest; never latest.
        assert "@sha256:" in ref or re.match(r"^\d+\.\d+\.\d+", tag), f"{path}: base {ref!r} is not pinned"
    stage = final_stage(path)
    users = [v for w, v in stage if w == "USER"]
    assert users and users[-1].split(":")[0].isdigit() and users[-1].split(":")[0] != "0", (
        f"{path}: the final stage must switch to a numeric non-root USER (runAsNonRoot can verify it)"
    )
    env = " ".join(v for w, v in stage if w == "ENV")
    # Read-only root filesystem: no .pyc writes, HOME on the /tmp emptyDir.
    assert "PYTHONDONTWRITEBYTECODE=1" in env and "HOME=/tmp" in env
    # Small layers: the runtime stage copies a built venv, it does not install with pip.
    assert not any(w == "RUN" and "pip install" in v for w, v in stage), f"{path}: pip in the runtime stage"
    if image == "preheat/operator":
        assert not any("torch" in v for _, v in instructions(path)), "the operator image has no torch"


def test_dockerignore_keeps_the_context_small() -> None:
    ignored = set((REPO / ".dockerignore").read_text().split())
    assert {".git", ".venv", ".cluster", "tests"} <= ignored
    # Everything the Dockerfiles COPY must stay in the context.
    for path in DOCKERFILES.values():
        for w, v in instructions(path):
            if w == "COPY" and "--from" not in v:
                for src in shlex.split(v)[:-1]:
                    top = src.rstrip("/").split("/")[0]
                    assert top not in ignored, f"{path} copies {src} but .dockerignore drops {top}"
