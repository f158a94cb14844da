"""Pure translations from a pod spec to what a local process needs: the argv (through the image map),
`$(VAR)` expansion, downward-API values, and mount-path rewriting. No I/O beyond reading the map file,
so all of it is unit-tested without an API server."""

from __future__ import annotations

import math
import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml


class ImageNotMapped(Exception):
    """The image has no entry in the image map; the pod stays Waiting with reason ImageNotMapped."""


class ContainerConfigError(Exception):
    """Something the container needs is missing or unsupported (kubelet: CreateContainerConfigError)."""


def _venv_bin() -> Path:
    return Path(sys.executable).parent


_PYTHON_NAMES = re.compile(r"^(?:/usr(?:/local)?/bin/)?python(?:3(?:\.\d+)?)?$")


def normalise_image(image: str) -> tuple[str, str]:
    """`docker.io/library/python:3.11-slim@sha256:..` → ('python', '3.11-slim')."""
    ref = image.split("@", 1)[0]
    repo, tag = ref, "latest"
    last = ref.rsplit("/", 1)[-1]
    if ":" in last:
        repo, tag = ref.rsplit(":", 1)
    for prefix in ("docker.io/library/", "docker.io/", "index.docker.io/library/", "library/"):
        if repo.startswith(prefix):
            repo = repo[len(prefix):]
            break
    return repo, tag


@dataclass(frozen=True)
class ImageEntry:
    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...]
    generic: bool


class ImageMap:
    """The image map file (`cluster/image-map.yaml`): image repository → local entrypoint and cmd."""

    def __init__(self, data: dict):
        self.images: dict[str, ImageEntry] = {}
        for repo, e in (data.get("images") or {}).items():
            self.images[repo] = ImageEntry(tuple(e.get("entrypoint") or ()), tuple(e.get("cmd") or ()), False)
        self.generic: dict[str, ImageEntry] = {}
        for ref, e in (data.get("generic") or {}).items():
            e = e or {}
            self.generic[ref] = ImageEntry(tuple(e.get("entrypoint") or ()), tuple(e.get("cmd") or ()), True)

    @classmethod
    def load(cls, path: Path) -> ImageMap:
        return cls(yaml.safe_load(Path(path).read_text()) or {})

    def lookup(self, image: str) -> ImageEntry:
        repo, tag = normalise_image(image)
        for key in (f"{repo}:{tag}", repo):
            if key in self.generic:
                return self.generic[key]
        for key, entry in self.images.items():
            if repo == key or repo.endswith("/" + key):
                return entry
        raise ImageNotMapped(
            f"image {image!r} has no entry in the node agent's image map; known images: "
            f"{sorted(self.images)}, generic: {sorted(self.generic)}")

    def argv(self, image: str, command: list[str] | None, args: list[str] | None) -> list[str]:
        """Docker semantics: `command` replaces ENTRYPOINT, `args` replace CMD (args alone keep it)."""
        entry = self.lookup(image)
        entrypoint = list(command) if command else [self._subst(a) for a in entry.entrypoint]
        if args is not None and (args or command):
            cmd = list(args)
        else:
            cmd = [] if command else [self._subst(a) for a in entry.cmd]
        argv = entrypoint + cmd
        if not argv:
            raise ContainerConfigError(f"image {image!r}: no command to run (no command, args or default cmd)")
        argv[0] = resolve_executable(argv[0])
        return argv

    @staticmethod
    def _subst(s: str) -> str:
        return s.replace("{venv}", str(_venv_bin())).replace("{python}", sys.executable)


def resolve_executable(name: str) -> str:
    """`python`/`python3` → the agent's interpreter; a bare name → the venv's script or the host's PATH."""
    if _PYTHON_NAMES.match(name):
        return sys.executable
    if "/" in name:
        return name
    venv = _venv_bin() / name
    if venv.exists():
        return str(venv)
    return shutil.which(name) or name


_VAR_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(s: str, env: dict[str, str]) -> str:
    """Kubernetes' `$(VAR)` expansion: defined names are replaced, undefined ones stay verbatim, and
    `$$` escapes (so `$$(VAR)` yields the literal `$(VAR)`)."""

    def sub(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1)
        return env.get(name, m.group(0))

    return _VAR_REF.sub(sub, s)


_FIELD_LABEL = re.compile(r"^metadata\.(labels|annotations)\['(.+)'\]$")


def field_ref(pod: dict, path: str) -> str:
    """The downward API's `fieldRef.fieldPath` values a kubelet supports."""
    meta, spec, status = pod.get("metadata", {}), pod.get("spec", {}), pod.get("status", {})
    simple = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName") or "default",
        "status.podIP": status.get("podIP"),
        "status.podIPs": ",".join(p["ip"] for p in status.get("podIPs") or []),
        "status.hostIP": status.get("hostIP"),
        "status.hostIPs": ",".join(p["ip"] for p in status.get("hostIPs") or []),
    }
    if path in simple:
        return simple[path] or ""
    m = _FIELD_LABEL.match(path)
    if m:
        return (meta.get(m.group(1)) or {}).get(m.group(2), "")
    if path in ("metadata.labels", "metadata.annotations"):
        d = meta.get(path.split(".")[1]) or {}
        return "\n".join(f'{k}="{v}"' for k, v in sorted(d.items()))
    raise ContainerConfigError(f"fieldRef {path!r} is not supported")


_SUFFIX = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
           "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18, "m": 1e-3, "": 1}


def parse_quantity(q: str | int | float) -> float:
    """A Kubernetes resource quantity ('500m', '2Gi', '1.5') as a number."""
    m = re.fullmatch(r"([+-]?[0-9.]+(?:[eE][+-]?\d+)?)([A-Za-z]*)", str(q).strip())
    if not m or m.group(2) not in _SUFFIX:
        raise ContainerConfigError(f"bad resource quantity {q!r}")
    return float(m.group(1)) * _SUFFIX[m.group(2)]


def resource_field_ref(container: dict, ref: dict, node_allocatable: dict[str, str]) -> str:
    """`resourceFieldRef` (limits.cpu, requests.memory, ...): the value divided by `divisor`, rounded
    up as the kubelet does; an unset limit reads the node's allocatable."""
    resource = ref.get("resource", "")
    kind, _, name = resource.partition(".")
    if kind not in ("limits", "requests") or name not in ("cpu", "memory", "ephemeral-storage"):
        raise ContainerConfigError(f"resourceFieldRef {resource!r} is not supported")
    res = (container.get("resources") or {}).get(kind) or {}
    value = res.get(name)
    if value is None:
        value = node_allocatable.get(name, "0") if kind == "limits" else "0"
    # The API server defaults an absent divisor to "0", which the kubelet reads as 1.
    divisor = parse_quantity(ref.get("divisor") or "1") or 1.0
    return str(max(math.ceil(parse_quantity(value) / divisor), 1 if kind == "limits" else 0))


def env_key(mount_path: str) -> str:
    """`/var/run/secrets/kubernetes.io/serviceaccount` → `PREHEAT_MOUNT_VAR_RUN_SECRETS_KUBERNETES_IO_SERVICEACCOUNT`."""
    return "PREHEAT_MOUNT_" + re.sub(r"[^A-Za-z0-9]+", "_", mount_path.strip("/")).upper()


def rewrite_paths(value: str, mounts: dict[str, str]) -> str:
    """Rewrite container paths under a mount point into the pod directory: an argument such as
    `--config=/etc/preheat/config.yaml` then names the file the agent materialised. Longest mount
    path wins; only whole path components match (`/etc/preheatx` is not under `/etc/preheat`)."""
    if not mounts:
        return value
    # One pass over all mount points (longest first in the alternation): a replacement is never matched
    # again, so a pod dir that itself lies under a mount point (/tmp) is left as it is.
    by_path = {mp.rstrip("/") or "/": local for mp, local in mounts.items()}
    alternation = "|".join(re.escape(mp) for mp in sorted(by_path, key=len, reverse=True))
    pat = re.compile(r"(?<![A-Za-z0-9_.-])(" + alternation + r")(?=/|$|[\s:=,;\"'])")
    return pat.sub(lambda m: by_path[m.group(1)], value)


SERVICEACCOUNT_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"


def host_env_passthrough() -> dict[str, str]:
    """Host variables a process needs that an image would have set (PATH to the venv first, caches)."""
    keep = ("HOME", "LANG", "LC_ALL", "TZ", "TMPDIR", "PREHEAT_CACHE", "HF_HOME", "HF_HUB_OFFLINE",
            "TRANSFORMERS_OFFLINE", "XDG_CACHE_HOME", "TORCH_HOME", "CUDA_VISIBLE_DEVICES",
            "PREHEAT_PROMETHEUS_URL")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    env["PATH"] = f"{_venv_bin()}:{os.environ.get('PATH', '/usr/local/bin:/usr/bin:/bin')}"
    # Images for Python services set this so logs appear at once; the local stand-in does the same.
    env["PYTHONUNBUFFERED"] = "1"
    return env
