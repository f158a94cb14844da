"""What this machine's CPU can do, read from the OS (no torch import): for kernel choice and benchmark records.

Every benchmark JSON carries `machine_record()` so a figure always names the CPU it was measured on;
the server's kernel choice (`models/kernels.py`) starts from `cpu_flags()`.
"""

from __future__ import annotations

import os
import platform
import sys
from functools import cache
from importlib import metadata
from pathlib import Path

# The flags that decide which CPU kernels run (bf16/int8 GEMM paths, vector width).
_FLAG_PREFIXES = ("avx2", "fma", "f16c", "avx512", "amx", "avx_ne_convert", "avx_vnni")


@cache
def _cpuinfo() -> dict[str, str]:
    """The first processor block of /proc/cpuinfo (empty where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields


def cpu_flags() -> frozenset[str]:
    """Every feature flag the kernel reports for this CPU.

    ``PREHEAT_CPU_FLAGS`` (separated by spaces or commas) narrows them to those listed, so the kernels of an older CPU
    can be chosen and checked on a newer one; it never adds a feature the CPU lacks.
    """
    flags = frozenset(_cpuinfo().get("flags", "").split())
    narrowed = os.environ.get("PREHEAT_CPU_FLAGS")
    return flags if narrowed is None else flags & frozenset(narrowed.replace(",", " ").split())


def cpu_model() -> str:
    """The CPU's model name (for example 'AMD EPYC'), or the platform's processor string."""
    return _cpuinfo().get("model name") or platform.processor() or platform.machine()


def relevant_flags(flags: frozenset[str] | None = None) -> list[str]:
    """The flags that matter for kernel choice, sorted."""
    flags = cpu_flags() if flags is None else flags
    return sorted(f for f in flags if f.startswith(_FLAG_PREFIXES))


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def usable_cores() -> int:
    """Cores this process may run on (the affinity mask, not the host's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def machine_record() -> dict:
    """The machine a benchmark ran on: CPU model and flags, cores, load, Python and torch versions."""
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    return {
        "cpu_model": cpu_model(),
        "cpu_flags": relevant_flags(),
        "cores": usable_cores(),
        "os_cpu_count": os.cpu_count(),
        "loadavg": load,
        "arch": platform.machine(),
        "python": sys.version.split()[0],
        "torch": _version("torch"),
    }
