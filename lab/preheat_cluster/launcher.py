"""`LocalCluster`: brings up etcd, kube-apiserver, controller-manager, scheduler, Prometheus and real
nodes (kubelet + containerd each, kube-proxy, CoreDNS: realnode.py) as local processes inside Preheat's
network namespace, and takes them down again.

All state (PKI, etcd data, kubeconfigs, logs, the nodes' containerd and kubelet dirs) lives in one state
dir, `.cluster/` at the repository root by default (`default_state_dir`). Ports are chosen at random and recorded in `state.json`, so a second
cluster with another state dir never collides with the first."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import random
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from . import procs
from .pki import Pki, ensure_front_proxy, ensure_pki, issue_cert
from .prometheus import remove_file_sd_target, render_config, write_config, write_file_sd_target
from .realnode import (
    API_SERVER_IP,
    POD_CIDR,
    SERVICE_CIDR,
    NodeError,
    NodeFleet,
    add_loopback_address,
    check_socket_paths,
    del_loopback_address,
    node_binaries_missing,
    plan_nodes,
    pod_log_files,
    preloaded_images,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_STATE_DIR = REPO_ROOT / ".cluster"
CONTROL_PLANE = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
# The autoscalers Preheat is compared with, when `preheat_cluster.peers` started them (host processes
# like the control plane, so `down` stops them first).
PEERS = ("prometheus-adapter", "aibrix-controllers", "keda-operator", "keda-adapter")
VERSIONS_FILE = REPO_ROOT / "cluster" / "versions.env"


def default_state_dir() -> Path:
    """`.cluster/` in the checkout, unless the checkout is too deep for the nodes' unix sockets (108 bytes):
    then a short dir of its own under /tmp, the same for every command run from this checkout."""
    try:
        check_socket_paths(plan_nodes(DEFAULT_STATE_DIR, 2, "check"))
        return DEFAULT_STATE_DIR
    except NodeError:
        return Path("/tmp") / f"preheat-cluster-{hashlib.sha1(str(DEFAULT_STATE_DIR).encode()).hexdigest()[:10]}"


def pinned_versions(path: Path = VERSIONS_FILE) -> dict[str, str]:
    """cluster/versions.env as a dict (KEY=VALUE lines; comments and blanks skipped)."""
    out = {}
    for line in path.read_text().splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and not key.startswith("#"):
            out[key] = value
    return out


class ClusterError(RuntimeError):
    """The cluster could not be brought up or inspected; the message says which component and why."""


def default_bin_dir() -> Path:
    cache = Path(os.environ.get("PREHEAT_CACHE", Path.home() / ".cache" / "preheat"))
    return cache / "bin"


def prometheus_binary(bin_dir: Path | None = None) -> str | None:
    """Our Prometheus build (with Kubernetes SD) in the bin dir, or `$PREHEAT_PROMETHEUS`. Debian's
    package is not used: it is built without Kubernetes service discovery."""
    env = os.environ.get("PREHEAT_PROMETHEUS")
    if env:
        return env
    p = (bin_dir or default_bin_dir()) / "prometheus"
    return str(p) if os.access(p, os.X_OK) else None


def missing_binaries(bin_dir: Path) -> list[str]:
    """Names of the binaries `up` needs that are not there (empty when all are)."""
    missing = [b for b in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")
               if not os.access(bin_dir / b, os.X_OK)]
    if not prometheus_binary(bin_dir):
        missing.append("prometheus")
    return missing


def _free_port(taken: set[int]) -> int:
    # Below the kernel's ephemeral range (32768+) so an outgoing connection cannot grab it meanwhile.
    for _ in range(1000):
        port = random.randint(20000, 32000)
        if port in taken:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        taken.add(port)
        return port
    raise ClusterError("no free loopback port found")


@dataclass
class LocalCluster:
    """A local Kubernetes made of the real components. `up()` is idempotent for a live cluster."""

    state_dir: Path = field(default_factory=default_state_dir)
    bin_dir: Path = field(default_factory=default_bin_dir)
    nodes: int = 2
    scrape_interval: str | None = None
    ready_timeout_s: float = 180.0
    # Real nodes: the image archives every node imports at start (realnode.preloaded_images).
    node_images: tuple[str, ...] = field(default_factory=lambda: preloaded_images(os.environ.get("PREHEAT_NODE_IMAGES")))

    def __post_init__(self) -> None:
        self.state_dir = Path(self.state_dir).resolve()
        self.bin_dir = Path(self.bin_dir)

    # ----- paths and recorded state -----------------------------------------------------------------
    @property
    def kubeconfig(self) -> Path:
        return self.state_dir / "kubeconfig"

    @property
    def pki(self) -> Pki:
        return Pki(self.state_dir / "pki")

    @property
    def logs_dir(self) -> Path:
        return self.state_dir / "logs"

    @property
    def file_sd_dir(self) -> Path:
        return self.state_dir / "prometheus" / "file_sd"

    @property
    def _state_file(self) -> Path:
        return self.state_dir / "state.json"

    @property
    def cluster_id(self) -> str:
        return str(self.state_dir)

    def _state(self) -> dict:
        try:
            return json.loads(self._state_file.read_text())
        except FileNotFoundError:
            return {}

    def _save_state(self, st: dict) -> None:
        tmp = self._state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(st, indent=2))
        tmp.replace(self._state_file)

    @property
    def ports(self) -> dict[str, int]:
        return self._state().get("ports", {})

    @property
    def pod_cidr(self) -> str:
        """The block pods' addresses come from (each node has a /24 of it)."""
        return POD_CIDR

    @property
    def api_server_url(self) -> str:
        return f"https://127.0.0.1:{self.ports['apiserver']}"

    @property
    def prometheus_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['prometheus']}"

    @property
    def prometheus_url_for_pods(self) -> str:
        """Prometheus as pods reach it: a pod has its own loopback, so through the namespace's address
        the API server advertises."""
        return f"http://{self.host_address_for_pods}:{self.ports['prometheus']}"

    @property
    def host_address_for_pods(self) -> str:
        """The address of this (test) host that pods reach: the namespace's address the API server
        advertises, bound on its loopback."""
        return API_SERVER_IP

    @property
    def pod_bridges(self) -> tuple[str, ...]:
        """The devices traffic from this host to pods leaves by: each node's bridge (made at `up`)."""
        return tuple(n.bridge for n in self._fleet().nodes)

    def pod_log_path(self, namespace: str, pod: str, container: str | None = None) -> Path:
        """The kubelet's newest log file of a pod's container (the first container's when `container` is None)."""
        files = pod_log_files(self.state_dir, namespace, pod, container)
        return files[-1] if files else self.state_dir / "nodes" / "no-log-yet" / f"{namespace}_{pod}.log"

    # ----- health -------------------------------------------------------------------------------------
    def _ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.pki.ca_crt))
        ctx.load_cert_chain(str(self.pki.crt("admin")), str(self.pki.key("admin")))
        return ctx

    def _get(self, url: str, *, tls: bool = True, timeout: float = 2.0) -> tuple[int, str]:
        try:
            ctx = self._ssl_context() if tls else None
            with urllib.request.urlopen(url, timeout=timeout, context=ctx) as r:
                return r.status, r.read().decode(errors="replace")
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(errors="replace")
        except (OSError, ssl.SSLError) as e:
            return 0, str(e)

    def components(self) -> tuple[str, ...]:
        """The processes this cluster runs, in start order."""
        return (*CONTROL_PLANE, *self._fleet().names(), "prometheus")

    def _fleet(self) -> NodeFleet:
        cache = self.bin_dir.parent
        return NodeFleet(
            state_dir=self.state_dir, bin_dir=self.bin_dir, cache=cache,
            nodes=plan_nodes(self.state_dir, int(self._state().get("nodes", self.nodes)),
                             hashlib.sha1(self.cluster_id.encode()).hexdigest()[:10]),
            sandbox_image=f"localhost/preheat/pause:{pinned_versions()['KUBERNETES_VERSION']}",
            start=self._start, kubectl=lambda *a, input=None: kubectl(self, *a, input=input),
            write_kubeconfig=self._write_kubeconfig,
            issue_cert=lambda name, **kw: issue_cert(self.pki, name, **kw), images=self.node_images)

    def load_image(self, name: str) -> float:
        """Import cluster/images.sh's archive `name` (e.g. "model-server-cuda") into every node;
        returns seconds taken."""
        archive = self.bin_dir.parent / "images" / f"{name}.tar"
        if not archive.exists():
            raise ClusterError(f"no image archive {archive}: run `make images` (cluster/images.sh {name})")
        t0 = time.monotonic()
        try:
            self._fleet().load_image(archive)
        except NodeError as e:
            raise ClusterError(str(e)) from e
        return time.monotonic() - t0

    def restart_node(self, index: int) -> None:
        """Bring a node whose kubelet and containerd were stopped back (its state is kept)."""
        try:
            self._fleet().restart_node(index)
        except NodeError as e:
            raise ClusterError(str(e)) from e

    def component_pids(self) -> dict[str, int]:
        return {k: int(v) for k, v in self._state().get("pids", {}).items()}

    def status(self) -> dict[str, str]:
        """Each component → 'running' / 'ready' / 'stopped' / 'not ready: ...'."""
        st = self._state()
        if not st:
            return dict.fromkeys(self.components(), "stopped")
        out = {}
        pids = st.get("pids", {})
        for c in self.components():
            pid = pids.get(c)
            out[c] = "running" if pid and procs.alive(int(pid)) else "stopped"
        if out["kube-apiserver"] == "running":
            code, body = self._get(f"{self.api_server_url}/readyz")
            out["kube-apiserver"] = "ready" if code == 200 else f"not ready: {code} {body[:200]}"
        if out["prometheus"] == "running":
            code, _ = self._get(f"{self.prometheus_url}/-/ready", tls=False)
            out["prometheus"] = "ready" if code == 200 else f"not ready: {code}"
        return out

    def is_up(self) -> bool:
        s = self.status()
        return s["kube-apiserver"] == "ready" and all(v != "stopped" for v in s.values())

    # ----- up -----------------------------------------------------------------------------------------
    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
        env[procs.MARKER] = self.cluster_id
        env.pop("KUBECONFIG", None)
        return env

    def _start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> int:
        """Start a process of this cluster (recorded, marked, logged); `env` adds to its environment."""
        p = procs.start(argv, log=self.logs_dir / f"{name}.log", env={**self._env(), **(env or {})}, cwd=self.state_dir)
        st = self._state()
        st.setdefault("pids", {})[name] = p.pid
        self._save_state(st)
        return p.pid

    def _write_kubeconfig(self, path: Path, user: str) -> None:
        def b64(p: Path) -> str:
            return base64.b64encode(p.read_bytes()).decode()

        cfg = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "preheat-local", "cluster": {
                "server": self.api_server_url, "certificate-authority-data": b64(self.pki.ca_crt)}}],
            "users": [{"name": user, "user": {
                "client-certificate-data": b64(self.pki.crt(user)),
                "client-key-data": b64(self.pki.key(user))}}],
            "contexts": [{"name": "preheat-local", "context": {"cluster": "preheat-local", "user": user}}],
            "current-context": "preheat-local",
        }
        path.write_text(yaml.safe_dump(cfg))
        path.chmod(0o600)

    def _wait(self, what: str, check, timeout: float, pid_names: tuple[str, ...] = ()) -> None:
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            ok, last = check()
            if ok:
                return
            for n in pid_names:
                pid = self.component_pids().get(n)
                if pid and not procs.alive(pid):
                    raise ClusterError(f"{n} exited while waiting for {what}; see {self.logs_dir / (n + '.log')}:\n"
                                       + procs.log_tail(self.logs_dir / f"{n}.log"))
            time.sleep(0.25)
        raise ClusterError(f"timed out after {timeout:.0f}s waiting for {what}: {last}")

    def up(self, *, quiet: bool = False) -> float:
        """Start every component and wait until the cluster is ready; returns seconds taken."""
        t0 = time.monotonic()
        if self._state_file.exists() and self.is_up():
            if not quiet:
                print(f"cluster already up ({self.state_dir})", file=sys.stderr)
            return 0.0
        if self._state_file.exists():
            # A half-dead cluster from an earlier run: clear it before starting afresh.
            self.down(quiet=True)
        missing = missing_binaries(self.bin_dir)
        if missing:
            raise ClusterError(
                f"missing binaries {missing} in {self.bin_dir}: run `make binaries` (or "
                "`bash cluster/build-binaries.sh all`) first")
        if node_binaries_missing(self.bin_dir):
            raise ClusterError(f"real nodes need {node_binaries_missing(self.bin_dir)}: run "
                               "`bash cluster/build-node.sh all` and `make images` first")
        self.state_dir.mkdir(parents=True, exist_ok=True)
        taken: set[int] = set()
        ports = {n: _free_port(taken) for n in
                 ("etcd", "etcd-peer", "apiserver", "controller-manager", "scheduler", "prometheus")}
        self._save_state({"ports": ports, "pids": {}, "started_at": time.time(), "nodes": self.nodes})
        try:
            self._up_components(ports)
        except BaseException:
            self.down(quiet=True, keep_logs=True)
            raise
        took = time.monotonic() - t0
        (self.state_dir / "prometheus-url").write_text(self.prometheus_url + "\n")
        st = self._state()
        st["ready_after_s"] = round(took, 1)
        self._save_state(st)
        if not quiet:
            print(f"cluster ready in {took:.1f}s: KUBECONFIG={self.kubeconfig} "
                  f"prometheus={self.prometheus_url}", file=sys.stderr)
        return took

    def _up_components(self, ports: dict[str, int]) -> None:
        pki = ensure_pki(self.state_dir / "pki")
        front_ca, proxy_crt, proxy_key = ensure_front_proxy(pki)
        b = self.bin_dir
        etcd_url = f"https://127.0.0.1:{ports['etcd']}"
        peer_url = f"http://127.0.0.1:{ports['etcd-peer']}"
        self._start("etcd", [
            str(b / "etcd"), "--name=local", f"--data-dir={self.state_dir / 'etcd'}",
            f"--listen-client-urls={etcd_url}", f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls={peer_url}", f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=local={peer_url}",
            f"--cert-file={pki.crt('etcd')}", f"--key-file={pki.key('etcd')}",
            "--client-cert-auth", f"--trusted-ca-file={pki.ca_crt}",
            # Test state is thrown away anyway; fsync on a shared disk costs seconds per write burst.
            "--unsafe-no-fsync", "--log-level=warn", "--quota-backend-bytes=2147483648",
        ])
        # The API server retries etcd, so it starts at once; Prometheus' discovery retries too.
        self._write_prometheus_config()
        self.start_prometheus()
        # Pods reach the API server through the `kubernetes` Service, so it listens on an address of the
        # namespace's loopback device too (never outside the namespace).
        add_loopback_address(API_SERVER_IP)
        where = ["--bind-address=0.0.0.0", f"--advertise-address={API_SERVER_IP}",
                 "--endpoint-reconciler-type=lease", "--kubelet-preferred-address-types=InternalIP",
                 # A lost node's pods are evicted after 10 s, not 5 min (the node-loss test).
                 "--default-not-ready-toleration-seconds=10", "--default-unreachable-toleration-seconds=10"]
        self._start("kube-apiserver", [
            str(b / "kube-apiserver"), *where,
            f"--etcd-servers={etcd_url}", f"--etcd-cafile={pki.ca_crt}",
            f"--etcd-certfile={pki.crt('apiserver-etcd-client')}", f"--etcd-keyfile={pki.key('apiserver-etcd-client')}",
            f"--secure-port={ports['apiserver']}",
            f"--cert-dir={self.state_dir / 'apiserver-certs'}",
            f"--tls-cert-file={pki.crt('apiserver')}", f"--tls-private-key-file={pki.key('apiserver')}",
            f"--client-ca-file={pki.ca_crt}",
            f"--kubelet-client-certificate={pki.crt('apiserver-kubelet-client')}",
            f"--kubelet-client-key={pki.key('apiserver-kubelet-client')}",
            "--authorization-mode=Node,RBAC",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki.sa_pub}", f"--service-account-signing-key-file={pki.sa_key}",
            f"--service-cluster-ip-range={SERVICE_CIDR}", "--allow-privileged=true",
            # The aggregation layer (kubernetes.io/docs/tasks/extend-kubernetes/configure-aggregation-layer),
            # with the flags and header names kubeadm sets: extension API servers such as
            # prometheus-adapter (custom.metrics.k8s.io, read by the HPA) sit behind it. Routing to the
            # Service's endpoints, not its ClusterIP: the peers run on this host, not in pods.
            f"--requestheader-client-ca-file={front_ca}", "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User", "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={proxy_crt}", f"--proxy-client-key-file={proxy_key}",
            "--enable-aggregator-routing=true",
            "--profiling=false", "--v=1",
        ])
        self._write_kubeconfig(self.kubeconfig, "admin")
        for ident in ("controller-manager", "scheduler"):
            self._write_kubeconfig(self.state_dir / f"{ident}.kubeconfig", ident)
        self._wait("kube-apiserver /readyz",
                   lambda: (lambda r: (r[0] == 200, f"{r[0]} {r[1][-300:]}"))(self._get(f"{self.api_server_url}/readyz")),
                   self.ready_timeout_s, ("etcd", "kube-apiserver"))
        cm_kc = self.state_dir / "controller-manager.kubeconfig"
        self._start("kube-controller-manager", [
            str(b / "kube-controller-manager"), f"--kubeconfig={cm_kc}",
            f"--authentication-kubeconfig={cm_kc}", f"--authorization-kubeconfig={cm_kc}",
            "--bind-address=127.0.0.1", f"--secure-port={ports['controller-manager']}",
            f"--tls-cert-file={pki.crt('components-serving')}", f"--tls-private-key-file={pki.key('components-serving')}",
            "--leader-elect=false", f"--root-ca-file={pki.ca_crt}",
            f"--service-account-private-key-file={pki.sa_key}", "--use-service-account-credentials=true",
            f"--cluster-signing-cert-file={pki.ca_crt}", f"--cluster-signing-key-file={pki.ca_key}",
            # The operator's scale tests create hundreds of pods: don't let client-side throttling
            # become the bottleneck being measured.
            "--kube-api-qps=200", "--kube-api-burst=400", "--concurrent-replicaset-syncs=10",
            # A real node that stops reporting is NotReady after 20 s (kubelets report every 5 s).
            "--node-monitor-grace-period=20s", "--node-monitor-period=2s",
            "--profiling=false", "--v=1",
        ])
        sch_kc = self.state_dir / "scheduler.kubeconfig"
        self._start("kube-scheduler", [
            str(b / "kube-scheduler"), f"--kubeconfig={sch_kc}",
            f"--authentication-kubeconfig={sch_kc}", f"--authorization-kubeconfig={sch_kc}",
            "--bind-address=127.0.0.1", f"--secure-port={ports['scheduler']}", "--leader-elect=false",
            f"--tls-cert-file={pki.crt('components-serving')}", f"--tls-private-key-file={pki.key('components-serving')}",
            "--profiling=false", "--v=1",
        ])
        try:
            timings = self._fleet().up(pki.ca_crt)
        except NodeError as e:
            raise ClusterError(str(e)) from e
        st = self._state()
        st["node_timings_s"] = {k: round(v, 1) for k, v in timings.items()}
        self._save_state(st)
        node_procs = tuple(self._fleet().names())
        self._wait("controller-manager and scheduler /healthz", self._check_cm_scheduler, 60,
                   ("kube-controller-manager", "kube-scheduler"))
        self._wait(f"{self.nodes} Ready node(s) and the default ServiceAccount", self._check_nodes,
                   120, node_procs)
        self._wait("prometheus /-/ready",
                   lambda: (lambda r: (r[0] == 200, str(r)))(self._get(f"{self.prometheus_url}/-/ready", tls=False)),
                   60, ("prometheus",))

    def _check_cm_scheduler(self) -> tuple[bool, str]:
        p = self.ports
        a = self._get(f"https://127.0.0.1:{p['controller-manager']}/healthz")
        s = self._get(f"https://127.0.0.1:{p['scheduler']}/healthz")
        return a[0] == 200 and s[0] == 200, f"controller-manager {a}, scheduler {s}"

    def _check_nodes(self) -> tuple[bool, str]:
        code, body = self._get(f"{self.api_server_url}/api/v1/nodes")
        if code != 200:
            return False, f"{code} {body[:200]}"
        items = json.loads(body).get("items", [])
        ready = [n for n in items if any(c["type"] == "Ready" and c["status"] == "True"
                                         for c in n.get("status", {}).get("conditions", []))]
        sa, _ = self._get(f"{self.api_server_url}/api/v1/namespaces/default/serviceaccounts/default")
        return len(ready) >= self.nodes and sa == 200, f"{len(ready)}/{self.nodes} nodes Ready, default SA {sa}"

    # ----- Prometheus -----------------------------------------------------------------------------------
    def _write_prometheus_config(self) -> None:
        self.file_sd_dir.mkdir(parents=True, exist_ok=True)
        cfg = render_config(api_server=self.api_server_url, ca_file=self.pki.ca_crt,
                            cert_file=self.pki.crt("admin"), key_file=self.pki.key("admin"),
                            file_sd_dir=self.file_sd_dir, interval=self.scrape_interval)
        write_config(self.state_dir / "prometheus" / "prometheus.yml", cfg)

    def start_prometheus(self, *, wait: bool = False) -> None:
        """(Re)start Prometheus on the recorded port with the same data dir, so history survives."""
        prom = prometheus_binary(self.bin_dir)
        if not prom:
            raise ClusterError(f"prometheus not found in {self.bin_dir}: run `bash cluster/build-binaries.sh prometheus`")
        pid = self.component_pids().get("prometheus")
        if pid and procs.alive(pid):
            return
        d = self.state_dir / "prometheus"
        self._start("prometheus", [
            prom, f"--config.file={d / 'prometheus.yml'}", f"--storage.tsdb.path={d / 'data'}",
            # Pods (an operator pod) reach it from their own network namespaces; every address here is
            # inside the cluster's namespace (scripts/netns.sh), never the machine's.
            f"--web.listen-address=0.0.0.0:{self.ports['prometheus']}", "--web.enable-lifecycle",
            "--storage.tsdb.retention.time=2d", "--log.level=warn",
        ])
        if wait:
            self._wait("prometheus /-/ready",
                       lambda: (lambda r: (r[0] == 200, str(r)))(self._get(f"{self.prometheus_url}/-/ready", tls=False)),
                       60, ("prometheus",))

    def stop_prometheus(self) -> None:
        """Stop Prometheus (a test of a failing metrics source); `start_prometheus()` brings it back."""
        pid = self.component_pids().get("prometheus")
        if pid:
            left = procs.terminate([pid], grace_s=15)
            if left:
                raise ClusterError(f"prometheus (pid {pid}) did not stop")

    def register_scrape_target(self, name: str, address: str, labels: dict[str, str] | None = None) -> Path:
        """Have Prometheus scrape a host process at `address` (HOST:PORT) with extra target `labels`."""
        return write_file_sd_target(self.file_sd_dir, name, address, labels or {})

    def unregister_scrape_target(self, name: str) -> None:
        remove_file_sd_target(self.file_sd_dir, name)

    # ----- down ---------------------------------------------------------------------------------------
    def down(self, *, quiet: bool = False, keep_logs: bool = True) -> list[int]:
        """Stop every process this cluster started and remove its state; returns PIDs left (empty)."""
        pids = self.component_pids()
        st = self._state()
        not_undone: list[str] = []
        if st.get("nodes"):
            # The nodes first, while the API server still answers: pods go through CRI, then every
            # host change (mounts, cgroups, bridges, iptables, sysctls) is undone.
            fleet = self._fleet()
            t_nodes = time.monotonic()
            not_undone = fleet.down(pids, procs.terminate)
            if not quiet:
                print(f"real nodes down in {time.monotonic() - t_nodes:.1f}s {fleet.down_timings_s}", file=sys.stderr)
            del_loopback_address(API_SERVER_IP)
        # Peers (prometheus-adapter, ...) started by `preheat_cluster.peers` are recorded like components.
        peers = [n for n in PEERS if n in pids]
        order = [*peers, "prometheus", "kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"]
        for name in order:
            if name in pids:
                procs.terminate([pids[name]], grace_s=10)
        # Anything else carrying our marker: a peer's children, strays.
        left = procs.marked_pids(self.cluster_id)
        if left:
            procs.terminate(left, grace_s=3)
            for p in procs.marked_pids(self.cluster_id):
                procs.signal_group(p, signal.SIGKILL)
            time.sleep(0.2)
        left = procs.marked_pids(self.cluster_id)
        if left:
            raise ClusterError(f"processes still running after down: {left}")
        if not_undone:
            raise ClusterError(f"real nodes left behind (mounts or cgroups): {not_undone}")
        if self.state_dir.exists():
            logs = self.logs_dir
            keep = self.state_dir.parent / f"{self.state_dir.name}-last-logs" if keep_logs and logs.exists() else None
            if keep:
                shutil.rmtree(keep, ignore_errors=True)
                shutil.move(str(logs), keep)
            shutil.rmtree(self.state_dir, ignore_errors=True)
            if keep:
                self.state_dir.mkdir(parents=True, exist_ok=True)
                shutil.move(str(keep), self.state_dir / "last-logs")
        if not quiet:
            print(f"cluster down: no processes left ({self.state_dir})", file=sys.stderr)
        return left


def kubectl(cluster: LocalCluster, *args: str, check: bool = True, input: str | None = None) -> str:
    """Run the cluster's kubectl against its admin kubeconfig; returns stdout."""
    r = subprocess.run([str(cluster.bin_dir / "kubectl"), f"--kubeconfig={cluster.kubeconfig}", *args],
                       capture_output=True, text=True, input=input, timeout=120)
    if check and r.returncode != 0:
        raise ClusterError(f"kubectl {' '.join(args)} failed: {r.stderr.strip()}")
    return r.stdout
