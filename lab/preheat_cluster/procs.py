"""Starting, finding and stopping the cluster's processes.

Every process the cluster starts on this host (components, the nodes' kubelets and containerd, peers)
carries the env var `PREHEAT_CLUSTER_ID=<state dir>`, so `down` can find them all in /proc and verify
that none is left; the pods' containers are found through the nodes' cgroups (realnode.py)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

MARKER = "PREHEAT_CLUSTER_ID"


def start(
    argv: list[str], *, log: Path, env: Mapping[str, str], cwd: Path | None = None
) -> subprocess.Popen:
    """Start `argv` in its own process group (so a signal reaches its children too), output to `log`."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        return subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=dict(env),
            cwd=cwd, start_new_session=True, close_fds=True,
        )


def alive(pid: int) -> bool:
    """True if `pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
        return state not in (b"Z", b"X")
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def marked_pids(cluster_id: str) -> list[int]:
    """PIDs of live processes whose environment carries this cluster's marker."""
    needle = f"{MARKER}={cluster_id}".encode()
    found = []
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        if needle + b"\0" in env or env.endswith(needle):
            pid = int(entry)
            if alive(pid):
                found.append(pid)
    return found


def signal_group(pid: int, sig: int) -> None:
    """Signal the process group led by `pid` (falls back to the single process)."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def terminate(pids: Iterable[int], *, grace_s: float = 10.0) -> list[int]:
    """SIGTERM each process group, wait up to `grace_s`, then SIGKILL; returns PIDs still alive."""
    pids = [p for p in pids if alive(p)]
    for p in pids:
        signal_group(p, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        _reap(pids)
        time.sleep(0.1)
    for p in pids:
        if alive(p):
            signal_group(p, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        _reap(pids)
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


def _reap(pids: Iterable[int]) -> None:
    # Our own children stay zombies until waited for; only these PIDs, never other children of a
    # test process.
    for p in pids:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(p, os.WNOHANG)


def log_tail(path: Path, n: int = 30) -> str:
    """The last `n` lines of a process's log, for an error message ("(no log)" when there is none)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except FileNotFoundError:
        return "(no log)"
