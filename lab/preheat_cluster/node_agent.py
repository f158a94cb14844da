"""The node agent: a small kubelet stand-in that runs each pod bound to its node(s) as local processes.

It registers Nodes and keeps their Leases fresh, watches the pods bound to them, and for each pod
gives it a loopback IP, materialises its volumes and in-cluster credentials in a per-pod directory,
runs its containers (image → local command through the image map), probes them as the kubelet does,
restarts them per restartPolicy with back-off, and terminates them gracefully on deletion. What it
does not do is listed in docs/cluster.md."""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime as dt
import http.client
import ipaddress
import itertools
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

from . import procs
from .podspec import (
    SERVICEACCOUNT_MOUNT,
    ContainerConfigError,
    ImageMap,
    ImageNotMapped,
    env_key,
    expand,
    field_ref,
    host_env_passthrough,
    normalise_image,
    resolve_executable,
    resource_field_ref,
    rewrite_paths,
)

log = logging.getLogger("preheat.node_agent")
SMP = "application/strategic-merge-patch+json"
AGENT = "preheat-node-agent"
LEASE_DURATION_S = 40
LEASE_RENEW_S = 10
NODE_STATUS_EVERY_S = 60
MAX_BACKOFF_S = 300
# A container that ran this long without crashing has its back-off reset (the kubelet's rule).
BACKOFF_RESET_S = 600


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_micro() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# ---------------------------------------------------------------------------------------------------
# Pod IPs
# ---------------------------------------------------------------------------------------------------
class IpAllocator:
    """Hands out addresses of the cluster's pod CIDR; a released address is not reused until the range
    wraps, and a live one never is. The CIDR is local to this host (see `podnet`), so binding needs
    no setup."""

    def __init__(self, cidr: str):
        self.network = ipaddress.ip_network(cidr)
        self._hosts = [h for h in self.network.hosts() if int(h) & 0xFF not in (0, 255)]
        self._live: set[str] = set()
        self._counter = itertools.count(0)
        self._lock = threading.Lock()

    def allocate(self) -> str:
        with self._lock:
            for _ in range(len(self._hosts)):
                ip = str(self._hosts[next(self._counter) % len(self._hosts)])
                if ip not in self._live:
                    self._live.add(ip)
                    return ip
        raise RuntimeError(f"pod CIDR {self.network} exhausted")

    def reserve(self, ip: str) -> None:
        with self._lock:
            self._live.add(ip)

    def release(self, ip: str | None) -> None:
        with self._lock:
            self._live.discard(ip)


# ---------------------------------------------------------------------------------------------------
# Probes
# ---------------------------------------------------------------------------------------------------
@dataclass
class ProbeState:
    """One probe of one container, with the kubelet's counters."""

    kind: str  # startup | liveness | readiness
    spec: dict
    started_at: float
    result: bool  # the probe's current verdict
    successes: int = 0
    failures: int = 0
    next_at: float = 0.0
    last_message: str = ""

    def __post_init__(self) -> None:
        self.next_at = self.started_at + float(self.spec.get("initialDelaySeconds") or 0)

    @property
    def period(self) -> float:
        return float(self.spec.get("periodSeconds") or 10)

    def record(self, ok: bool, message: str) -> bool:
        """Feed one probe outcome; returns True when the verdict changed."""
        self.last_message = message
        if ok:
            self.successes += 1
            self.failures = 0
            flip = not self.result and self.successes >= int(self.spec.get("successThreshold") or 1)
        else:
            self.failures += 1
            self.successes = 0
            flip = self.result and self.failures >= int(self.spec.get("failureThreshold") or 3)
        if flip:
            self.result = not self.result
        return flip


def run_probe(spec: dict, *, pod_ip: str, ports: dict[str, int], env: dict[str, str], cwd: str) -> tuple[bool, str]:
    """Run one probe action as the kubelet does; returns (success, message)."""
    timeout = float(spec.get("timeoutSeconds") or 1)
    try:
        if "httpGet" in spec:
            return _probe_http(spec["httpGet"], pod_ip, ports, timeout)
        if "tcpSocket" in spec:
            port = _port(spec["tcpSocket"].get("port"), ports)
            host = spec["tcpSocket"].get("host") or pod_ip
            with socket.create_connection((host, port), timeout=timeout):
                return True, ""
        if "exec" in spec:
            argv = [expand(a, env) for a in spec["exec"].get("command") or []]
            if not argv:
                return False, "exec probe without a command"
            argv[0] = resolve_executable(argv[0])
            r = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, timeout=timeout,
                               stdin=subprocess.DEVNULL)
            out = (r.stdout + r.stderr).decode(errors="replace")[-500:]
            return r.returncode == 0, f"exit code {r.returncode}: {out}"
        if "grpc" in spec:
            return False, "grpc probes are not supported by the local node agent"
        return False, "probe has no handler"
    except subprocess.TimeoutExpired:
        return False, f"probe timed out after {timeout}s"
    except (OSError, ValueError, http.client.HTTPException) as e:
        return False, str(e)


def _port(port: Any, ports: dict[str, int]) -> int:
    if isinstance(port, int) or (isinstance(port, str) and port.isdigit()):
        return int(port)
    if port in ports:
        return ports[port]
    raise ValueError(f"named port {port!r} not found in the container's ports")


def _probe_http(h: dict, pod_ip: str, ports: dict[str, int], timeout: float) -> tuple[bool, str]:
    host = h.get("host") or pod_ip
    port = _port(h.get("port"), ports)
    if (h.get("scheme") or "HTTP").upper() == "HTTPS":
        conn = http.client.HTTPSConnection(host, port, timeout=timeout, context=ssl._create_unverified_context())
    else:
        conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        headers = {x["name"]: x["value"] for x in h.get("httpHeaders") or []}
        headers.setdefault("User-Agent", "kube-probe/preheat")
        conn.request("GET", h.get("path") or "/", headers=headers)
        r = conn.getresponse()
        r.read(1024)
        return 200 <= r.status < 400, f"HTTP probe failed with statuscode: {r.status}"
    finally:
        conn.close()


# ---------------------------------------------------------------------------------------------------
# Containers
# ---------------------------------------------------------------------------------------------------
@dataclass
class Container:
    """Runtime state of one container of a pod."""

    spec: dict
    init: bool = False
    proc: subprocess.Popen | None = None
    restart_count: int = 0
    state: dict = field(default_factory=lambda: {"waiting": {"reason": "ContainerCreating"}})
    last_state: dict = field(default_factory=dict)
    started_at: float = 0.0
    backoff_s: float = 0.0
    restart_at: float = 0.0
    done: bool = False  # terminated and will not be restarted
    probes: dict[str, ProbeState] = field(default_factory=dict)
    kill_reason: str | None = None  # why the agent is stopping it (liveness, startup probe)
    reaped: bool = False  # this process's exit has been accounted for
    env: dict[str, str] = field(default_factory=dict)  # the environment it was started with (for probes)

    @property
    def name(self) -> str:
        return self.spec["name"]

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def started(self) -> bool:
        if not self.running:
            return False
        p = self.probes.get("startup")
        return p is None or p.result

    @property
    def ready(self) -> bool:
        if not self.started:
            return False
        p = self.probes.get("readiness")
        return p is None or p.result

    def status(self, image: str) -> dict:
        st = {
            "name": self.name, "image": image, "imageID": f"preheat-local://{normalise_image(image)[0]}",
            "ready": self.ready, "started": self.started, "restartCount": self.restart_count,
            "state": self.state,
        }
        if self.proc is not None:
            st["containerID"] = f"preheat://{self.proc.pid}"
        if self.last_state:
            st["lastState"] = self.last_state
        return st


# ---------------------------------------------------------------------------------------------------
# One pod
# ---------------------------------------------------------------------------------------------------
class PodWorker:
    """Owns one pod (by UID) from binding to finalisation; all its work runs on its own thread."""

    def __init__(self, agent: NodeAgent, pod: dict):
        self.agent = agent
        self.pod = pod
        self.uid = pod["metadata"]["uid"]
        self.ns = pod["metadata"]["namespace"]
        self.name = pod["metadata"]["name"]
        self.wake = threading.Event()
        self.removed = False  # the API object is gone (force deletion)
        self.failed = False  # the worker hit an agent bug; the agent only finalises the pod's deletion
        self.ip: str | None = (pod.get("status") or {}).get("podIP")
        self.dir = agent.state_dir / "pods" / self.ns / self.name
        self.containers: dict[str, Container] = {}
        self.init_containers: list[Container] = []
        self.mounts: dict[str, dict[str, str]] = {}  # container → {mountPath: local path}
        self.volume_error: str | None = None
        self.volumes_ready = False
        self.token_refresh_at = float("inf")
        self.last_status: dict | None = None
        self.cond_times: dict[str, tuple[str, str]] = {}  # condition type → (status, lastTransitionTime)
        self.start_time = now_iso()
        self.thread = threading.Thread(target=self._run, name=f"pod-{self.ns}/{self.name}", daemon=True)

    # ----- inputs from the watch -----
    def update(self, pod: dict) -> None:
        self.pod = pod
        self.wake.set()

    def gone(self) -> None:
        self.removed = True
        self.wake.set()

    @property
    def spec(self) -> dict:
        return self.pod["spec"]

    @property
    def deleting(self) -> bool:
        return bool(self.pod["metadata"].get("deletionTimestamp")) or self.removed

    # ----- the loop -----
    def _run(self) -> None:
        try:
            self._prepare()
            while not self.deleting:
                self._step()
                self._publish()
                self.wake.wait(timeout=self._next_wakeup())
                self.wake.clear()
            self._terminate()
        except Exception as e:  # a bad pod must never take the agent down
            log.exception("pod %s/%s: worker failed", self.ns, self.name)
            self.failed = True
            self.agent.event(self.pod, "Warning", "AgentError", f"node agent error: {e}")
            self._kill_all(0)
            # Say so in the pod's status too, rather than leaving it Pending without a reason.
            for c in self._all():
                c.state = {"waiting": {"reason": "AgentError", "message": f"node agent error: {e}"}}
            self.last_status = None
            with contextlib.suppress(Exception):
                self._publish()
        finally:
            self.agent.ips.release(self.ip)
            self.agent.forget(self)

    def _prepare(self) -> None:
        if self.dir.exists() and (self.dir / "uid").exists() and (self.dir / "uid").read_text() != self.uid:
            shutil.rmtree(self.dir, ignore_errors=True)  # an older pod of the same name
        self._kill_stale()
        for sub in ("logs", "volumes", "pids"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        (self.dir / "uid").write_text(self.uid)
        if self.ip:
            self.agent.ips.reserve(self.ip)
        else:
            self.ip = self.agent.ips.allocate()
        self.init_containers = [Container(c, init=True) for c in self.spec.get("initContainers") or []]
        self.containers = {c["name"]: Container(c) for c in self.spec.get("containers") or []}
        for c in list(self.containers.values()):
            c.state = {"waiting": {"reason": "PodInitializing" if self.init_containers else "ContainerCreating"}}

    def _kill_stale(self) -> None:
        # A previous agent (crashed or restarted) may have left this pod's processes running.
        for pidfile in (self.dir / "pids").glob("*.pid") if (self.dir / "pids").exists() else []:
            try:
                pid = int(pidfile.read_text())
            except ValueError:
                continue
            if procs.alive(pid):
                procs.terminate([pid], grace_s=2)

    def _next_wakeup(self) -> float:
        t = time.monotonic()
        due = [self.token_refresh_at]
        for c in self._all():
            if c.restart_at and not c.running and not c.done:
                due.append(c.restart_at)
            if c.running:
                due.extend(p.next_at for p in c.probes.values())
        if not self.volumes_ready:
            due.append(t + 1.0)
        return max(0.05, min(min(due) - t, 30.0))

    def _all(self) -> list[Container]:
        return [*self.init_containers, *self.containers.values()]

    def _step(self) -> None:
        if not self.volumes_ready:
            try:
                self._materialise_volumes()
                self.volumes_ready = True
                self.volume_error = None
            except ContainerConfigError as e:
                if self.volume_error != str(e):
                    self.agent.event(self.pod, "Warning", "FailedMount", str(e))
                self.volume_error = str(e)
                for c in self._all():
                    c.state = {"waiting": {"reason": "CreateContainerConfigError", "message": str(e)}}
                return
        if time.monotonic() >= self.token_refresh_at:
            self._materialise_volumes(tokens_only=True)
        for c in self._all():
            self._reap(c)
        # Init containers one after another, each to completion; then every app container.
        for c in self.init_containers:
            if c.done and c.state.get("terminated", {}).get("exitCode") == 0:
                continue
            if not c.running:
                self._maybe_start(c)
            return
        for c in self.containers.values():
            if c.running:
                self._probe(c)
            elif not c.done:
                self._maybe_start(c)

    # ----- containers -----
    def _log_tail(self, c: Container, lines: int = 80, max_bytes: int = 4096) -> str:
        try:
            data = (self.dir / "logs" / f"{c.name}.log").read_bytes()[-64 * 1024:]
        except OSError:
            return ""
        text = "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:])
        return text.encode()[-max_bytes:].decode("utf-8", "ignore").strip()

    def _reap(self, c: Container) -> None:
        """Notice a container that exited and decide whether and when it restarts."""
        if c.proc is None or c.reaped or c.proc.poll() is None:
            return
        c.reaped = True
        code = c.proc.returncode
        exit_code = 128 - code if code < 0 else code  # killed by signal N → 128 + N, as a runtime reports
        reason = c.kill_reason or ("Completed" if exit_code == 0 else "Error")
        c.kill_reason = None
        ran = time.monotonic() - c.started_at
        term = {"exitCode": exit_code, "reason": reason, "startedAt": c.state.get("running", {}).get("startedAt"),
                "finishedAt": now_iso(), "containerID": f"preheat://{c.proc.pid}"}
        # As the kubelet does: a failed container with FallbackToLogsOnError reports its log's tail
        # (the last 80 lines, at most 4 KiB), so controllers can say why it failed.
        if exit_code != 0 and c.spec.get("terminationMessagePolicy") == "FallbackToLogsOnError":
            message = self._log_tail(c)
            if message:
                term["message"] = message
        c.state = {"terminated": term}
        c.probes = {}
        (self.dir / "pids" / f"{c.name}.pid").unlink(missing_ok=True)
        policy = self.spec.get("restartPolicy", "Always")
        restart = policy == "Always" or (policy == "OnFailure" and exit_code != 0)
        if c.init:
            restart = exit_code != 0 and policy != "Never"
        if not restart or self.deleting:
            c.done = True
            return
        if ran >= BACKOFF_RESET_S:
            c.backoff_s = 0
        c.restart_at = time.monotonic() + c.backoff_s
        if c.backoff_s > 0:
            c.last_state = {"terminated": term}
            c.state = {"waiting": {"reason": "CrashLoopBackOff", "message":
                                   f"back-off {c.backoff_s:.0f}s restarting failed container={c.name} pod={self.name}"}}
            self.agent.event(self.pod, "Warning", "BackOff", f"Back-off restarting failed container {c.name}")
        c.backoff_s = min(max(c.backoff_s * 2, self.agent.backoff_base_s), MAX_BACKOFF_S)

    def _maybe_start(self, c: Container) -> None:
        if c.done or c.running or time.monotonic() < c.restart_at:
            return
        image = c.spec.get("image", "")
        try:
            env = self._env(c)
            mounts = self.mounts.get(c.name, {})
            argv = self.agent.image_map.argv(image, c.spec.get("command"), c.spec.get("args"))
            argv = [argv[0], *(rewrite_paths(expand(a, env), mounts) for a in argv[1:])]
            cwd = self._workdir(c, mounts)
        except ImageNotMapped as e:
            if c.state.get("waiting", {}).get("reason") != "ImageNotMapped":
                self.agent.event(self.pod, "Warning", "ImageNotMapped", str(e))
            c.state = {"waiting": {"reason": "ImageNotMapped", "message": str(e)}}
            c.restart_at = time.monotonic() + 30  # the map file may be edited; look again later
            return
        except ContainerConfigError as e:
            if c.state.get("waiting", {}).get("message") != str(e):
                self.agent.event(self.pod, "Warning", "Failed", f"Error: {e}")
            c.state = {"waiting": {"reason": "CreateContainerConfigError", "message": str(e)}}
            c.restart_at = time.monotonic() + 2
            return
        logf = self.dir / "logs" / f"{c.name}.log"
        if c.proc is not None:
            c.restart_count += 1
            if "terminated" in c.state:
                c.last_state = {"terminated": c.state["terminated"]}
            with open(logf, "a") as f:
                f.write(f"\n----- preheat-node-agent: restart {c.restart_count} at {now_iso()} -----\n")
        try:
            c.proc = procs.start(argv, log=logf, env=env, cwd=cwd)
            c.reaped = False
        except OSError as e:
            msg = f"failed to start {argv[0]}: {e}"
            self.agent.event(self.pod, "Warning", "Failed", msg)
            c.state = {"waiting": {"reason": "RunContainerError", "message": msg}}
            c.proc = None
            c.restart_at = time.monotonic() + max(c.backoff_s, self.agent.backoff_base_s)
            return
        (self.dir / "pids" / f"{c.name}.pid").write_text(str(c.proc.pid))
        c.started_at = time.monotonic()
        c.env = env
        c.state = {"running": {"startedAt": now_iso()}}
        threading.Thread(target=self._await_exit, args=(c.proc,), daemon=True, name=f"wait-{c.proc.pid}").start()
        self.agent.event(self.pod, "Normal", "Started", f"Started container {c.name} (pid {c.proc.pid})")
        self._post_start(c, env, cwd)
        if not c.init:
            for kind, key, initial in (("startup", "startupProbe", False), ("liveness", "livenessProbe", True),
                                       ("readiness", "readinessProbe", False)):
                if c.spec.get(key):
                    c.probes[kind] = ProbeState(kind, c.spec[key], c.started_at, initial)

    def _post_start(self, c: Container, env: dict, cwd: str) -> None:
        hook = (c.spec.get("lifecycle") or {}).get("postStart")
        if hook:
            ok, msg = run_probe({**hook, "timeoutSeconds": 30}, pod_ip=self.ip, ports=self._ports(c), env=env, cwd=cwd)
            if not ok:
                self.agent.event(self.pod, "Warning", "FailedPostStartHook", msg)
                self._stop(c, "FailedPostStartHook")

    def _await_exit(self, proc: subprocess.Popen) -> None:
        proc.wait()
        self.wake.set()

    def _ports(self, c: Container) -> dict[str, int]:
        return {p["name"]: p["containerPort"] for p in c.spec.get("ports") or [] if p.get("name")}

    def _probe(self, c: Container) -> None:
        t = time.monotonic()
        env = c.env
        startup = c.probes.get("startup")
        for kind in ("startup", "liveness", "readiness"):
            p = c.probes.get(kind)
            if p is None or t < p.next_at:
                continue
            # Liveness and readiness wait until the startup probe has succeeded, as in the kubelet.
            if kind != "startup" and startup is not None and not startup.result:
                p.next_at = t + p.period
                continue
            if kind == "startup" and p.result:
                continue
            ok, msg = run_probe(p.spec, pod_ip=self.ip, ports=self._ports(c), env=env,
                                cwd=self._workdir(c, self.mounts.get(c.name, {})))
            p.next_at = time.monotonic() + p.period
            changed = p.record(ok, msg)
            if not ok:
                self.agent.event(self.pod, "Warning", "Unhealthy", f"{kind.capitalize()} probe failed: {msg}",
                                 dedupe=f"{c.name}/{kind}")
            if changed and not p.result and kind in ("liveness", "startup"):
                self.agent.event(self.pod, "Normal", "Killing",
                                 f"Container {c.name} failed {kind} probe, will be restarted")
                self._stop(c, "Error")
                return

    def _stop(self, c: Container, reason: str) -> None:
        """Stop a container so that it restarts per policy (liveness or startup failure)."""
        if not c.running:
            return
        c.kill_reason = reason
        grace = float(self.spec.get("terminationGracePeriodSeconds", 30))
        procs.terminate([c.proc.pid], grace_s=grace)
        c.proc.wait()
        self._reap(c)

    # ----- environment, mounts, working dir -----
    def _env(self, c: Container) -> dict[str, str]:
        a = self.agent
        env = host_env_passthrough()
        env.update({
            "HOSTNAME": self.name,
            "POD_IP": self.ip or "",
            "KUBERNETES_SERVICE_HOST": "127.0.0.1",
            "KUBERNETES_SERVICE_PORT": str(a.api_port),
            "KUBERNETES_SERVICE_PORT_HTTPS": str(a.api_port),
            "KUBERNETES_PORT": f"tcp://127.0.0.1:{a.api_port}",
            "PREHEAT_POD_DIR": str(self.dir),
            "PREHEAT_MOUNT_ROOT": str(self.dir / "volumes"),
        })
        mounts = self.mounts.get(c.name, {})
        for mp, local in mounts.items():
            env[env_key(mp)] = local
        if SERVICEACCOUNT_MOUNT in mounts:
            env["PREHEAT_SERVICEACCOUNT_DIR"] = mounts[SERVICEACCOUNT_MOUNT]
        # envFrom first, then env: later definitions win, as in the kubelet. Only these, the
        # container's own values, name container paths; the agent's values above are host paths
        # already (and may lie under a mount point such as /tmp), so they are not rewritten.
        own: dict[str, str] = {}
        for src in c.spec.get("envFrom") or []:
            prefix = src.get("prefix", "")
            if "configMapRef" in src:
                data = self._config_map(src["configMapRef"]["name"], src["configMapRef"].get("optional"))
            elif "secretRef" in src:
                data = self._secret(src["secretRef"]["name"], src["secretRef"].get("optional"))
            else:
                continue
            own.update({prefix + k: v for k, v in (data or {}).items()})
        for e in c.spec.get("env") or []:
            own[e["name"]] = self._env_value(c, e, {**env, **own})
        env.update({k: rewrite_paths(v, mounts) for k, v in own.items()})
        env[procs.MARKER] = a.cluster_id
        return env

    def _env_value(self, c: Container, e: dict, env: dict[str, str]) -> str:
        if "value" in e:
            return expand(e.get("value") or "", env)
        vf = e.get("valueFrom") or {}
        if "fieldRef" in vf:
            pod = {**self.pod, "status": {**(self.pod.get("status") or {}), "podIP": self.ip,
                                          "podIPs": [{"ip": self.ip}], "hostIP": "127.0.0.1",
                                          "hostIPs": [{"ip": "127.0.0.1"}]}}
            return field_ref(pod, vf["fieldRef"]["fieldPath"])
        if "resourceFieldRef" in vf:
            target = self.containers.get(vf["resourceFieldRef"].get("containerName") or c.name, c)
            return resource_field_ref(target.spec, vf["resourceFieldRef"], self.agent.allocatable)
        for kind, getter in (("configMapKeyRef", self._config_map), ("secretKeyRef", self._secret)):
            if kind in vf:
                ref = vf[kind]
                data = getter(ref["name"], ref.get("optional"))
                if data is None or ref["key"] not in data:
                    if ref.get("optional"):
                        return ""
                    raise ContainerConfigError(f"couldn't find key {ref['key']} in {kind[:-6]} {self.ns}/{ref['name']}")
                return data[ref["key"]]
        raise ContainerConfigError(f"env {e['name']}: unsupported valueFrom {sorted(vf)}")

    def _config_map(self, name: str, optional: bool | None) -> dict[str, str] | None:
        try:
            cm = self.agent.core.read_namespaced_config_map(name, self.ns)
        except ApiException as e:
            if e.status == 404 and optional:
                return None
            raise ContainerConfigError(f"configmap {self.ns}/{name}: {e.reason}") from e
        data = dict(cm.data or {})
        data.update({k: base64.b64decode(v).decode(errors="replace") for k, v in (cm.binary_data or {}).items()})
        return data

    def _secret(self, name: str, optional: bool | None) -> dict[str, str] | None:
        try:
            s = self.agent.core.read_namespaced_secret(name, self.ns)
        except ApiException as e:
            if e.status == 404 and optional:
                return None
            raise ContainerConfigError(f"secret {self.ns}/{name}: {e.reason}") from e
        return {k: base64.b64decode(v).decode(errors="replace") for k, v in (s.data or {}).items()}

    def _workdir(self, c: Container, mounts: dict[str, str]) -> str:
        wd = c.spec.get("workingDir")
        if not wd:
            d = self.dir / "work" / c.name
            d.mkdir(parents=True, exist_ok=True)
            return str(d)
        wd = rewrite_paths(wd, mounts)
        if Path(wd).is_dir():
            return wd
        # An image directory that does not exist on the host lives under the pod's rootfs stand-in.
        d = self.dir / "rootfs" / wd.lstrip("/")
        d.mkdir(parents=True, exist_ok=True)
        return str(d)

    # ----- volumes -----
    def _materialise_volumes(self, tokens_only: bool = False) -> None:
        vols = {v["name"]: v for v in self.spec.get("volumes") or []}
        refresh = float("inf")
        for name, v in vols.items():
            d = self.dir / "volumes" / name
            if "projected" in v:
                refresh = min(refresh, self._projected(d, v["projected"], tokens_only))
            elif tokens_only:
                continue
            elif "emptyDir" in v:
                d.mkdir(parents=True, exist_ok=True)
            elif "configMap" in v:
                self._write_items(d, self._config_map(v["configMap"]["name"], v["configMap"].get("optional")),
                                  v["configMap"].get("items"), v["configMap"].get("defaultMode"))
            elif "secret" in v:
                self._write_items(d, self._secret(v["secret"]["secretName"], v["secret"].get("optional")),
                                  v["secret"].get("items"), v["secret"].get("defaultMode"))
            elif "downwardAPI" in v:
                self._write_items(d, self._downward(v["downwardAPI"].get("items") or []), None, None)
            elif "hostPath" in v:
                continue  # the node is this host: the path is used as it is
            else:
                kind = next((k for k in v if k != "name"), "?")
                raise ContainerConfigError(f"volume {name!r}: type {kind} is not supported by the local node agent")
        self.token_refresh_at = time.monotonic() + refresh if refresh != float("inf") else float("inf")
        if tokens_only:
            return
        for c in self._all():
            m = {}
            for vm in c.spec.get("volumeMounts") or []:
                v = vols.get(vm["name"])
                if v is None:
                    raise ContainerConfigError(f"container {c.name}: volumeMount {vm['name']!r} has no volume")
                local = Path(v["hostPath"]["path"]) if "hostPath" in v else self.dir / "volumes" / vm["name"]
                if vm.get("subPath"):
                    local = local / vm["subPath"]
                m[vm["mountPath"]] = str(local)
            self.mounts[c.name] = m

    def _projected(self, d: Path, proj: dict, tokens_only: bool) -> float:
        """Write a projected volume; returns seconds until its token needs refreshing."""
        d.mkdir(parents=True, exist_ok=True)
        refresh = float("inf")
        for src in proj.get("sources") or []:
            if "serviceAccountToken" in src:
                t = src["serviceAccountToken"]
                exp = int(t.get("expirationSeconds") or 3600)
                token = self._token(t.get("audience"), exp)
                _atomic_write(d / t.get("path", "token"), token, 0o600)
                # The kubelet refreshes at 80 % of the token's lifetime.
                refresh = min(refresh, exp * 0.8)
            elif tokens_only:
                continue
            elif "configMap" in src:
                cm = src["configMap"]
                self._write_items(d, self._config_map(cm["name"], cm.get("optional")), cm.get("items"),
                                  proj.get("defaultMode"), clear=False)
            elif "secret" in src:
                s = src["secret"]
                self._write_items(d, self._secret(s["name"], s.get("optional")), s.get("items"),
                                  proj.get("defaultMode"), clear=False)
            elif "downwardAPI" in src:
                self._write_items(d, self._downward(src["downwardAPI"].get("items") or []), None, None, clear=False)
            else:
                raise ContainerConfigError(f"projected source {sorted(src)} is not supported")
        return refresh

    def _token(self, audience: str | None, expiration: int) -> str:
        spec = client.V1TokenRequestSpec(
            audiences=[audience] if audience else [],
            expiration_seconds=expiration,
            bound_object_ref=client.V1BoundObjectReference(api_version="v1", kind="Pod", name=self.name, uid=self.uid),
        )
        sa = self.spec.get("serviceAccountName") or "default"
        try:
            tr = self.agent.core.create_namespaced_service_account_token(
                sa, self.ns, client.AuthenticationV1TokenRequest(spec=spec))
        except ApiException as e:
            raise ContainerConfigError(f"token for serviceaccount {self.ns}/{sa}: {e.reason} {e.body}") from e
        return tr.status.token

    def _downward(self, items: list[dict]) -> dict[str, str]:
        out = {}
        for it in items:
            if "fieldRef" in it:
                out[it["path"]] = field_ref(self.pod, it["fieldRef"]["fieldPath"])
            elif "resourceFieldRef" in it:
                c = self.containers.get(it["resourceFieldRef"].get("containerName", ""))
                out[it["path"]] = resource_field_ref(c.spec if c else {}, it["resourceFieldRef"], self.agent.allocatable)
        return out

    @staticmethod
    def _write_items(d: Path, data: dict[str, str] | None, items: list[dict] | None, mode: int | None,
                     clear: bool = True) -> None:
        if clear and d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True, exist_ok=True)
        if data is None:
            return  # optional and absent: an empty directory, as the kubelet makes
        pairs = [(i["key"], i["path"], i.get("mode")) for i in items] if items else [(k, k, None) for k in data]
        for key, path, m in pairs:
            if key not in data:
                raise ContainerConfigError(f"key {key!r} not found")
            target = d / path
            target.parent.mkdir(parents=True, exist_ok=True)
            _atomic_write(target, data[key], m or mode or 0o644)

    # ----- status -----
    def _status(self) -> dict:
        inits = [c.status(c.spec.get("image", "")) for c in self.init_containers]
        cs = [c.status(c.spec.get("image", "")) for c in self.containers.values()]
        initialized = all(c.done and c.state.get("terminated", {}).get("exitCode") == 0 for c in self.init_containers)
        apps = list(self.containers.values())
        all_ready = initialized and all(c.ready for c in apps)
        init_failed = any(c.done and c.state.get("terminated", {}).get("exitCode") != 0 for c in self.init_containers)
        if init_failed:
            phase = "Failed"
        elif apps and all(c.done for c in apps):
            phase = "Succeeded" if all(c.state["terminated"]["exitCode"] == 0 for c in apps) else "Failed"
        elif initialized and any(c.proc is not None for c in apps):
            phase = "Running"
        else:
            phase = "Pending"
        old = {c["type"]: c for c in (self.pod.get("status") or {}).get("conditions") or []}

        def cond(t: str, ok: bool, reason: str | None = None) -> dict:
            s = "True" if ok else "False"
            prev = self.cond_times.get(t)
            if prev is None or prev[0] != s:
                self.cond_times[t] = prev = (s, now_iso())
            c = {"type": t, "status": s, "lastTransitionTime": prev[1]}
            if reason and not ok:
                c["reason"] = reason
            return c

        conds = [cond("PodReadyToStartContainers", True), cond("Initialized", initialized, "ContainersNotInitialized"),
                 cond("ContainersReady", all_ready, "ContainersNotReady"), cond("Ready", all_ready, "ContainersNotReady")]
        if "PodScheduled" in old:
            conds.append(old["PodScheduled"])
        st = {"phase": phase, "conditions": conds, "hostIP": "127.0.0.1", "hostIPs": [{"ip": "127.0.0.1"}],
              "podIP": self.ip, "podIPs": [{"ip": self.ip}], "startTime": self.start_time,
              "containerStatuses": cs}
        if inits:
            st["initContainerStatuses"] = inits
        return st

    def _publish(self) -> None:
        st = self._status()
        # Compare without timestamps that only change on transitions: publish only real changes.
        if st == self.last_status:
            return
        try:
            self.agent.core.patch_namespaced_pod_status(self.name, self.ns, {"status": st}, _content_type=SMP)
            self.last_status = st
        except ApiException as e:
            if e.status == 404:
                self.removed = True
            else:
                log.warning("pod %s/%s: status update failed: %s", self.ns, self.name, e.reason)

    # ----- termination -----
    def _terminate(self) -> None:
        meta = self.pod["metadata"]
        grace = meta.get("deletionGracePeriodSeconds")
        if grace is None:
            grace = self.spec.get("terminationGracePeriodSeconds", 30)
        if self.removed:
            grace = min(grace, 2)  # force-deleted: the kubelet too stops it quickly
        deadline = time.monotonic() + max(float(grace), 0)
        running = [c for c in self._all() if c.running]
        if running:
            self.agent.event(self.pod, "Normal", "Killing", f"Stopping containers {[c.name for c in running]} "
                             f"(grace {grace}s)")
        # preStop hooks run first and eat into the grace period, as in the kubelet.
        hooks = []
        for c in running:
            hook = (c.spec.get("lifecycle") or {}).get("preStop")
            if hook:
                th = threading.Thread(target=self._pre_stop, args=(c, hook, deadline), daemon=True)
                th.start()
                hooks.append(th)
        for th in hooks:
            th.join(timeout=max(0.0, deadline - time.monotonic()))
        for c in running:
            procs.signal_group(c.proc.pid, signal.SIGTERM)
        while time.monotonic() < deadline and any(c.running for c in running):
            self.wake.wait(timeout=min(0.2, max(0.0, deadline - time.monotonic())))
            self.wake.clear()
        self._kill_all(0)
        for c in running:
            self._reap(c)
            c.done = True
        if not self.removed:
            try:
                if self.last_status is not None:
                    self._publish()
                self.agent.core.delete_namespaced_pod(
                    self.name, self.ns, grace_period_seconds=0,
                    body=client.V1DeleteOptions(grace_period_seconds=0, preconditions=client.V1Preconditions(uid=self.uid)))
            except ApiException as e:
                if e.status not in (404, 409):
                    log.warning("pod %s/%s: final delete failed: %s", self.ns, self.name, e.reason)
        shutil.rmtree(self.dir / "volumes", ignore_errors=True)

    def _pre_stop(self, c: Container, hook: dict, deadline: float) -> None:
        ok, msg = run_probe({**hook, "timeoutSeconds": max(1, int(deadline - time.monotonic()))},
                            pod_ip=self.ip, ports=self._ports(c), env=c.env,
                            cwd=self._workdir(c, self.mounts.get(c.name, {})))
        if not ok:
            self.agent.event(self.pod, "Warning", "FailedPreStopHook", f"PreStop hook failed: {msg}")

    def _kill_all(self, grace: float) -> None:
        pids = [c.proc.pid for c in self._all() if c.running]
        if pids:
            procs.terminate(pids, grace_s=grace)
        for c in self._all():
            if c.proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    c.proc.wait(timeout=5)


def _atomic_write(path: Path, data: str, mode: int) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(data)
    tmp.chmod(mode)
    tmp.replace(path)


# ---------------------------------------------------------------------------------------------------
# The agent
# ---------------------------------------------------------------------------------------------------
class NodeAgent:
    """Registers the nodes, keeps their Leases, and runs a PodWorker for each pod bound to them."""

    def __init__(self, args: argparse.Namespace):
        self.state_dir = Path(args.state_dir).resolve()
        self.cluster_id = os.environ.get(procs.MARKER, str(self.state_dir))
        self.image_map = ImageMap.load(args.image_map)
        self.node_names = [f"{args.node_prefix}-{i}" for i in range(args.nodes)]
        self.gpus = args.gpus_per_node
        self.allocatable = {"cpu": args.cpu, "memory": args.memory, "pods": str(args.max_pods),
                            "ephemeral-storage": "100Gi"}
        if self.gpus:
            self.allocatable["nvidia.com/gpu"] = str(self.gpus)
        self.backoff_base_s = args.crashloop_backoff_s
        self.ips = IpAllocator(args.pod_cidr)
        config.load_kube_config(config_file=args.kubeconfig)
        cfg = client.Configuration.get_default_copy()
        cfg.connection_pool_maxsize = 64
        self.api = client.ApiClient(cfg)
        self.core = client.CoreV1Api(self.api)
        self.coord = client.CoordinationV1Api(self.api)
        self.api_port = int(cfg.host.rsplit(":", 1)[1])
        self.workers: dict[str, PodWorker] = {}
        self.finalised: set[str] = set()
        self.failed: set[str] = set()
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self._event_seen: dict[str, float] = {}

    # ----- nodes and leases -----
    def _node_body(self, name: str) -> dict:
        labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                  "node.kubernetes.io/instance-type": "preheat-local", "preheat.dev/local-node": "true"}
        if self.gpus:
            labels["nvidia.com/gpu.present"] = "true"
        return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
                "status": self._node_status()}

    def _node_status(self) -> dict:
        t = now_iso()

        def c(tp: str, st: str, reason: str, msg: str) -> dict:
            return {"type": tp, "status": st, "reason": reason, "message": msg,
                    "lastHeartbeatTime": t, "lastTransitionTime": t}

        return {
            "capacity": self.allocatable, "allocatable": self.allocatable,
            "conditions": [c("Ready", "True", "KubeletReady", "preheat node agent is posting ready status"),
                           c("MemoryPressure", "False", "KubeletHasSufficientMemory", "ok"),
                           c("DiskPressure", "False", "KubeletHasNoDiskPressure", "ok"),
                           c("PIDPressure", "False", "KubeletHasSufficientPID", "ok")],
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": "localhost"}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
            "nodeInfo": {"machineID": "", "systemUUID": "", "bootID": "", "kernelVersion": os.uname().release,
                         "osImage": "preheat local node agent", "containerRuntimeVersion": "preheat://processes",
                         "kubeletVersion": "v0.0.0-preheat", "kubeProxyVersion": "", "operatingSystem": "linux",
                         "architecture": "amd64"},
        }

    def register_nodes(self) -> None:
        for name in self.node_names:
            try:
                self.core.create_node(self._node_body(name))
            except ApiException as e:
                if e.status != 409:
                    raise
            self.core.patch_node_status(name, {"status": self._node_status()}, _content_type=SMP)
            log.info("node %s registered (allocatable %s)", name, self.allocatable)

    def heartbeat_loop(self) -> None:
        last_status = time.monotonic()
        while not self.stopping.wait(LEASE_RENEW_S):
            try:
                for name in self.node_names:
                    self._renew_lease(name)
                if time.monotonic() - last_status >= NODE_STATUS_EVERY_S:
                    for name in self.node_names:
                        self.core.patch_node_status(name, {"status": self._node_status()}, _content_type=SMP)
                    last_status = time.monotonic()
            except Exception as e:
                log.warning("heartbeat failed: %s", e)

    def _renew_lease(self, name: str) -> None:
        body = {"metadata": {"name": name, "namespace": "kube-node-lease"},
                "spec": {"holderIdentity": name, "leaseDurationSeconds": LEASE_DURATION_S, "renewTime": now_micro()}}
        try:
            self.coord.patch_namespaced_lease(name, "kube-node-lease", body, _content_type=SMP)
        except ApiException as e:
            if e.status != 404:
                raise
            node = self.core.read_node(name)
            body["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": name,
                                                    "uid": node.metadata.uid}]
            self.coord.create_namespaced_lease("kube-node-lease", body)

    # ----- pods -----
    def watch_pods(self, node: str) -> None:
        """List then watch the pods bound to `node`; relist on 410 Gone or a dropped connection."""
        sel = f"spec.nodeName={node}"
        while not self.stopping.is_set():
            try:
                resp = self.core.list_pod_for_all_namespaces(field_selector=sel, _preload_content=False)
                data = json.loads(resp.data)
                rv = data["metadata"]["resourceVersion"]
                seen = set()
                for p in data.get("items", []):
                    seen.add(p["metadata"]["uid"])
                    self.on_pod("MODIFIED", p)
                with self.lock:
                    stale = [w for w in self.workers.values() if w.spec.get("nodeName") == node and w.uid not in seen]
                for w in stale:
                    w.gone()
                w = watch.Watch()
                for ev in w.stream(self.core.list_pod_for_all_namespaces, field_selector=sel, resource_version=rv,
                                   timeout_seconds=300, allow_watch_bookmarks=True, deserialize=False):
                    if self.stopping.is_set():
                        return
                    # Plain dicts: deserialising every event into models costs CPU for nothing.
                    obj = ev["object"]
                    if ev["type"] == "ERROR":
                        break
                    if ev["type"] == "BOOKMARK":
                        continue
                    self.on_pod(ev["type"], obj)
            except ApiException as e:
                if e.status != 410:
                    log.warning("pod watch on %s: %s", node, e.reason)
                    self.stopping.wait(1)
            except Exception as e:
                log.warning("pod watch on %s: %s", node, e)
                self.stopping.wait(1)

    def on_pod(self, kind: str, pod: dict) -> None:
        uid = pod["metadata"]["uid"]
        with self.lock:
            if uid in self.finalised:
                return
            if uid in self.failed:
                if pod["metadata"].get("deletionTimestamp") or kind == "DELETED":
                    self.failed.discard(uid)
                    threading.Thread(target=self._finalise, args=(pod,), daemon=True).start()
                return
            w = self.workers.get(uid)
            if kind == "DELETED":
                if w:
                    w.gone()
                return
            if w is None:
                finished = (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")
                if finished and not pod["metadata"].get("deletionTimestamp"):
                    return  # finished before this agent started: nothing to run
                w = PodWorker(self, pod)
                self.workers[uid] = w
                w.thread.start()
                return
        w.update(pod)

    def forget(self, w: PodWorker) -> None:
        with self.lock:
            self.workers.pop(w.uid, None)
            # Late watch events for a finalised pod must not start it again; a pod whose worker failed
            # is only finalised when it is deleted (its processes are already stopped).
            (self.failed if w.failed else self.finalised).add(w.uid)

    def _finalise(self, pod: dict) -> None:
        meta = pod["metadata"]
        with contextlib.suppress(ApiException):
            self.core.delete_namespaced_pod(
                meta["name"], meta["namespace"], grace_period_seconds=0,
                body=client.V1DeleteOptions(grace_period_seconds=0, preconditions=client.V1Preconditions(uid=meta["uid"])))

    def event(self, pod: dict, type_: str, reason: str, message: str, dedupe: str | None = None) -> None:
        """Record a core/v1 Event on `pod` (never raises: Events are best effort, as in the kubelet)."""
        meta = pod["metadata"]
        if dedupe:
            key = f"{meta['uid']}/{dedupe}"
            if time.monotonic() - self._event_seen.get(key, 0) < 30:
                return  # one Unhealthy event per container and probe every 30 s is plenty
            self._event_seen[key] = time.monotonic()
        t = now_iso()
        body = {
            "metadata": {"name": f"{meta['name']}.{secrets.token_hex(8)}", "namespace": meta["namespace"]},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "namespace": meta["namespace"],
                               "uid": meta["uid"], "resourceVersion": meta.get("resourceVersion")},
            "reason": reason, "message": message[:1024], "type": type_, "count": 1,
            "firstTimestamp": t, "lastTimestamp": t,
            "source": {"component": AGENT, "host": pod.get("spec", {}).get("nodeName", "")},
            "reportingComponent": AGENT, "reportingInstance": pod.get("spec", {}).get("nodeName", ""),
        }
        try:
            self.core.create_namespaced_event(meta["namespace"], body)
        except Exception as e:
            log.debug("event %s on %s/%s not recorded: %s", reason, meta["namespace"], meta["name"], e)

    # ----- lifecycle -----
    def run(self) -> None:
        self.register_nodes()
        threading.Thread(target=self.heartbeat_loop, daemon=True, name="heartbeat").start()
        for n in self.node_names:
            self._renew_lease(n)
            threading.Thread(target=self.watch_pods, args=(n,), daemon=True, name=f"watch-{n}").start()
        self.stopping.wait()

    def shutdown(self) -> None:
        """Stop every pod's processes at once (the cluster is going down: no graceful period)."""
        self.stopping.set()
        with self.lock:
            workers = list(self.workers.values())
        pids = [c.proc.pid for w in workers for c in w._all() if c.running]
        procs.terminate(pids, grace_s=3)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="preheat-node-agent", description=__doc__.splitlines()[0])
    ap.add_argument("--kubeconfig", required=True)
    ap.add_argument("--state-dir", required=True, help="cluster state dir; pods live under <state-dir>/pods")
    ap.add_argument("--image-map", required=True)
    ap.add_argument("--nodes", type=int, default=1, help="how many Nodes to register")
    ap.add_argument("--node-prefix", default="local-node")
    ap.add_argument("--gpus-per-node", type=int, default=0, help="fake nvidia.com/gpu count per node")
    ap.add_argument("--cpu", default="64")
    ap.add_argument("--memory", default="256Gi")
    ap.add_argument("--max-pods", type=int, default=1000)
    ap.add_argument("--pod-cidr", default="127.10.0.0/16", help="pods' addresses (local to this host)")
    ap.add_argument("--crashloop-backoff-s", type=float, default=10.0, help="first restart back-off (kubelet: 10 s)")
    ap.add_argument("--log-level", default="INFO")
    args = ap.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(threadName)s %(message)s")
    # Hundreds of pods mean hundreds of mostly idle threads: keep their stacks small.
    threading.stack_size(512 * 1024)
    agent = NodeAgent(args)

    def stop(signum, _frame):
        log.info("signal %s: stopping all pods", signum)
        agent.shutdown()
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    agent.run()


if __name__ == "__main__":
    main()
