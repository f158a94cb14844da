"""Real nodes: each node is a containerd (CRI, runc, bridge CNI) and a kubelet with its own state, pod
CIDR, cgroup root and serving certificate; the cluster adds one kube-proxy (iptables) and CoreDNS.

All of it runs inside the cluster's own network namespace (scripts/netns.sh), which stands for one
host: the nodes share its network stack, so there is one kube-proxy for it, each node's pods sit on
their own bridge, and the kernel routes between the bridges. Node addresses live on that namespace's
loopback device (never the machine's).

The renderers (`containerd_config`, `cni_conflist`, `kubelet_config`, ...) are pure; `RealNodes` starts
and stops the processes and undoes every change it made to the host (mounts, cgroups, links,
sysctls)."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from . import procs

SERVICE_CIDR = "10.96.0.0/16"
CLUSTER_DNS_IP = "10.96.0.10"
CLUSTER_DOMAIN = "cluster.local"
POD_CIDR = "10.244.0.0/16"
# Node, CoreDNS and API server addresses on the namespace's loopback device.
NODE_NET = ipaddress.ip_network("10.250.0.0/24")
API_SERVER_IP = str(NODE_NET.network_address + 254)
DNS_IP = str(NODE_NET.network_address + 253)
DNS_PORT = 53
CNI_BIN_DIRS = ("/usr/lib/cni", "/opt/cni/bin")
CGROUP_V1_CONTROLLERS = ("cpu", "cpuacct", "cpuset", "memory", "devices", "freezer", "blkio", "pids", "systemd")
# The kernel settings the kubelet rewrites unless protectKernelDefaults is on (which would instead
# refuse to start on this host's values): recorded before and restored by `down`.
KUBELET_SYSCTLS = ("vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
                   "kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes")


# Imported into every node at start (the model server's takes ~100 s a node: ~6 GB with PyPI's torch);
# others on demand through `LocalCluster.load_image`, or at start when named in $PREHEAT_NODE_IMAGES.
PRELOADED_IMAGES = ("pause", "operator", "lightweight-server", "model-server")


def preloaded_images(env: str | None) -> tuple[str, ...]:
    """The archives every node imports at start: PRELOADED_IMAGES plus a comma-separated list."""
    extra = [i.strip() for i in (env or "").split(",") if i.strip()]
    return tuple(dict.fromkeys([*PRELOADED_IMAGES, *extra]))


def pod_log_files(state_dir: Path, namespace: str, pod: str, container: str | None) -> list[Path]:
    """A pod's container logs on any real node (the kubelet's podLogsDir: <ns>_<pod>_<uid>/<container>/<n>.log),
    oldest first."""
    pattern = f"nodes/*/pod-logs/{namespace}_{pod}_*/{container or '*'}/*.log"
    return sorted(Path(state_dir).glob(pattern), key=lambda p: p.stat().st_mtime)


class NodeError(RuntimeError):
    """A real node could not be set up; the message says which part and why."""


@dataclass(frozen=True)
class NodePlan:
    """Where one node's state lives and which addresses it has."""

    name: str
    index: int
    ip: str
    pod_cidr: str
    dir: Path
    cgroup_root: str

    @property
    def socket(self) -> Path:
        return self.dir / "containerd.sock"

    @property
    def bridge(self) -> str:
        return f"phbr{self.index}"

    @property
    def pod_gateway(self) -> str:
        return str(next(ipaddress.ip_network(self.pod_cidr).hosts()))


def plan_nodes(state_dir: Path, count: int, cluster_tag: str) -> list[NodePlan]:
    """`count` nodes under `state_dir/nodes`; `cluster_tag` keeps cgroup roots of two clusters apart."""
    if not 1 <= count <= 200:
        raise NodeError(f"nodes must be 1..200, got {count}")
    pods = ipaddress.ip_network(POD_CIDR)
    return [NodePlan(name=f"preheat-node-{i}", index=i, ip=str(NODE_NET.network_address + i),
                     pod_cidr=str(list(pods.subnets(new_prefix=24))[i]),
                     dir=Path(state_dir) / "nodes" / f"preheat-node-{i}",
                     cgroup_root=f"/preheat-{cluster_tag}/node-{i}")
            for i in range(1, count + 1)]


# sun_path is 108 bytes with its NUL: a longer socket path fails to bind, and the process that wanted it
# exits or never serves (containerd; kubelet's pod-resources socket).
MAX_SOCKET_PATH = 107


def check_socket_paths(nodes: list[NodePlan]) -> None:
    """Refuse, before anything starts, a state dir too deep for the unix sockets the nodes listen on."""
    paths = [f"{n.socket}.ttrpc" for n in nodes]
    paths += [str(n.dir / "kubelet" / "pod-resources" / "kubelet.sock") for n in nodes]
    longest = max(paths, key=len)
    if len(longest) > MAX_SOCKET_PATH:
        raise NodeError(f"{longest} is {len(longest)} bytes; a unix socket's path holds at most "
                        f"{MAX_SOCKET_PATH}: give the cluster a shorter state dir")


# The kubelet's device-plugin registration socket: a constant in the kubelet, not under --root-dir.
DEVICE_PLUGIN_SOCKET = Path("/var/lib/kubelet/device-plugins/kubelet.sock")


UNUSED_CONTAINERD_PLUGINS = [
    "io.containerd.nri.v1.nri", "io.containerd.snapshotter.v1.erofs", "io.containerd.differ.v1.erofs",
    "io.containerd.mount-handler.v1.erofs", "io.containerd.snapshotter.v1.blockfile",
    "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing",
]


def _toml_str(s: str | Path) -> str:
    return json.dumps(str(s))


def containerd_config(node: NodePlan, *, sandbox_image: str, runc: str, cni_bin_dirs: list[str]) -> str:
    """containerd 2.x config (version 3) for one node: its own root, state, socket and CNI dir."""
    d = node.dir / "containerd"
    runtime = 'plugins."io.containerd.cri.v1.runtime"'
    return "\n".join([
        "version = 3",
        f"root = {_toml_str(d / 'root')}",
        f"state = {_toml_str(d / 'state')}",
        # Plugins nothing here uses that reach outside the node's own dirs at start: NRI listens on one
        # host-wide socket (/var/run/nri/nri.sock) two nodes would fight over; erofs and blockfile probe
        # the kernel and host tools. Fewer host dependencies, fewer ways for a node not to come up.
        f"disabled_plugins = {json.dumps(UNUSED_CONTAINERD_PLUGINS)}",
        "[grpc]",
        f"  address = {_toml_str(node.socket)}",
        "[ttrpc]",
        f"  address = {_toml_str(str(node.socket) + '.ttrpc')}",
        "[debug]",
        # info names each plugin as it loads: when a node's socket never appears, its log says where it stopped.
        '  level = "info"',
        '[plugins."io.containerd.cri.v1.images"]',
        '  snapshotter = "overlayfs"',
        # Images are imported, never pulled: nothing may garbage-collect them away.
        '[plugins."io.containerd.cri.v1.images".pinned_images]',
        f"  sandbox = {_toml_str(sandbox_image)}",
        f"[{runtime}]",
        # A negative oom_score_adj is refused on this host (no CAP_SYS_RESOURCE): clamp, don't fail.
        "  restrict_oom_score_adj = true",
        # Pod network namespaces under our state dir, not the machine's /var/run/netns.
        "  netns_mounts_under_state_dir = true",
        f"[{runtime}.cni]",
        f"  bin_dirs = {json.dumps(cni_bin_dirs)}",
        f"  conf_dir = {_toml_str(node.dir / 'cni' / 'net.d')}",
        "  max_conf_num = 1",
        f"[{runtime}.containerd]",
        '  default_runtime_name = "runc"',
        f"[{runtime}.containerd.runtimes.runc]",
        '  runtime_type = "io.containerd.runc.v2"',
        f"[{runtime}.containerd.runtimes.runc.options]",
        f"  BinaryName = {_toml_str(runc)}",
        "  SystemdCgroup = false",
        '[plugins."io.containerd.grpc.v1.cri"]',
        f'  stream_server_address = "{node.ip}"',
        '  stream_server_port = "0"',
        "",
    ])


def cni_conflist(node: NodePlan) -> dict:
    """Bridge CNI on the node's own bridge and pod CIDR; kube-proxy does Service NAT, so no ipMasq."""
    return {
        "cniVersion": "1.0.0",
        "name": f"preheat-{node.name}",
        "plugins": [
            {"type": "bridge", "bridge": node.bridge, "isGateway": True, "ipMasq": False, "hairpinMode": True,
             "ipam": {"type": "host-local", "ranges": [[{"subnet": node.pod_cidr, "gateway": node.pod_gateway}]],
                      "routes": [{"dst": "0.0.0.0/0"}], "dataDir": str(node.dir / "cni" / "ipam")}},
            {"type": "portmap", "capabilities": {"portMappings": True}},
            {"type": "loopback"},
        ],
    }


def kubelet_config(node: NodePlan, *, ca: Path, cert: Path, key: Path) -> dict:
    """KubeletConfiguration for one node on this host (cgroups v1 hybrid, no systemd, shared disk)."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": node.ip, "port": 10250, "readOnlyPort": 0,
        "healthzBindAddress": node.ip, "healthzPort": 10248,
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                           "x509": {"clientCAFile": str(ca)}},
        "authorization": {"mode": "Webhook"},
        "tlsCertFile": str(cert), "tlsPrivateKeyFile": str(key),
        "containerRuntimeEndpoint": f"unix://{node.socket}",
        # This host has cgroups v1 (hybrid) and no systemd.
        "failCgroupV1": False, "cgroupDriver": "cgroupfs", "cgroupRoot": node.cgroup_root,
        "cgroupsPerQOS": True, "enforceNodeAllocatable": ["pods"],
        "clusterDNS": [CLUSTER_DNS_IP], "clusterDomain": CLUSTER_DOMAIN,
        "resolvConf": str(node.dir / "resolv.conf"),
        "podLogsDir": str(node.dir / "pod-logs"),
        "podCIDR": node.pod_cidr,
        "protectKernelDefaults": False,
        # Both nodes see the machine's disk, and images cannot be pulled again: no image GC and no disk
        # eviction, as kind configures its nodes ("disable disk resource management by default",
        # sigs.k8s.io/kind pkg/cluster/internal/kubeadm/config.go). With a 2 % threshold, importing the
        # 6 GB model-server image on a nearly full disk set DiskPressure, and its 5-minute transition
        # period kept a test pod unschedulable past its deadline.
        "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
        "evictionHard": {"memory.available": "200Mi", "nodefs.available": "0%", "imagefs.available": "0%",
                         "nodefs.inodesFree": "0%"},
        "evictionPressureTransitionPeriod": "10s",
        "serializeImagePulls": False,
        "shutdownGracePeriod": "0s",
        "nodeStatusUpdateFrequency": "5s",
        "syncFrequency": "10s",
        "fileCheckFrequency": "10s",
        "rotateCertificates": False, "serverTLSBootstrap": False,
    }


def kube_proxy_config(*, kubeconfig: Path, node: NodePlan, metrics_port: int, healthz_port: int) -> dict:
    """One kube-proxy for the namespace's network stack, iptables mode (IPVS is not in this kernel)."""
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": "iptables",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": node.name,
        "bindAddress": node.ip,
        "clusterCIDR": POD_CIDR,
        "healthzBindAddress": f"{node.ip}:{healthz_port}",
        "metricsBindAddress": f"{node.ip}:{metrics_port}",
        # Source NAT every Service hop: the nodes' bridges are not bridged to each other, and the
        # reply of a pod reached through a ClusterIP must come back through the same conntrack entry.
        "iptables": {"masqueradeAll": True, "syncPeriod": "5s", "minSyncPeriod": "0s"},
        # The conntrack table size and timeouts are the machine's; leave them as they are.
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
    }


def corefile(*, kubeconfig: Path, listen_ip: str) -> str:
    """CoreDNS answers cluster names from the API server and refuses everything else (no way out)."""
    return (
        f".:{DNS_PORT} {{\n"
        f"    bind {listen_ip}\n"
        "    errors\n"
        "    health 127.0.0.1:0\n"
        f"    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{\n"
        f"        kubeconfig {kubeconfig} preheat-local\n"
        "        pods insecure\n"
        "        fallthrough in-addr.arpa ip6.arpa\n"
        "        ttl 5\n"
        "    }\n"
        "    cache 5\n"
        "    loop\n"
        "    reload\n"
        "}\n"
    )


def dns_service_manifests() -> list[dict]:
    """kube-dns: a ClusterIP Service whose one endpoint is CoreDNS, a process on `DNS_IP`."""
    ports = [{"name": "dns", "port": 53, "protocol": "UDP", "targetPort": DNS_PORT},
             {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": DNS_PORT}]
    svc = {"apiVersion": "v1", "kind": "Service",
           "metadata": {"name": "kube-dns", "namespace": "kube-system", "labels": {"k8s-app": "kube-dns"}},
           "spec": {"clusterIP": CLUSTER_DNS_IP, "ports": ports}}
    eps = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
           "metadata": {"name": "kube-dns-coredns", "namespace": "kube-system",
                        "labels": {"kubernetes.io/service-name": "kube-dns",
                                   "endpointslice.kubernetes.io/managed-by": "preheat-cluster"}},
           "addressType": "IPv4",
           "endpoints": [{"addresses": [DNS_IP], "conditions": {"ready": True}}],
           "ports": [{"name": p["name"], "port": DNS_PORT, "protocol": p["protocol"]} for p in ports]}
    return [svc, eps]


def node_binaries_missing(bin_dir: Path) -> list[str]:
    """What a real node needs that is not installed (empty when all are)."""
    missing = [b for b in ("kubelet", "kube-proxy", "containerd", "containerd-shim-runc-v2", "ctr", "coredns")
               if not os.access(bin_dir / b, os.X_OK)]
    missing += [t for t in ("runc", "iptables", "conntrack") if not shutil.which(t)]
    if not any(Path(d, "bridge").exists() for d in CNI_BIN_DIRS):
        missing.append("CNI plugins (containernetworking-plugins)")
    return missing


def image_archives(cache: Path) -> list[Path]:
    """The image archives cluster/images.sh saved (pause first: every pod needs it)."""
    d = cache / "images"
    tars = sorted(d.glob("*.tar")) if d.exists() else []
    return sorted((t for t in tars if not t.name.startswith("base-")), key=lambda t: t.name != "pause.tar")


def run(argv: list[str], *, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise NodeError(f"`{' '.join(argv)}` failed ({r.returncode}): {(r.stderr or r.stdout).strip()[-800:]}")
    return r


# ----- host changes, each with its undo -------------------------------------------------------------
def add_loopback_address(ip: str) -> None:
    """Only inside Preheat's own network namespace: never on the machine's loopback device."""
    if not os.environ.get("PREHEAT_NETNS"):
        raise NodeError("real nodes run only inside Preheat's network namespace: run through "
                        "`scripts/netns.sh NAME ...` (make cluster-up/test/demo do)")
    run(["ip", "addr", "replace", f"{ip}/32", "dev", "lo"])


def add_bridge(name: str) -> None:
    """A node's bridge before its first pod (CNI's bridge plugin adopts it), so the host can shape traffic
    to the node's pods from the start (the closed loop's model store); `down` deletes it."""
    if not os.environ.get("PREHEAT_NETNS"):
        raise NodeError("real nodes run only inside Preheat's network namespace")
    if run(["ip", "link", "show", name], check=False).returncode != 0:
        run(["ip", "link", "add", "name", name, "type", "bridge"])
    run(["ip", "link", "set", name, "up"])


def del_loopback_address(ip: str) -> None:
    if os.environ.get("PREHEAT_NETNS"):
        run(["ip", "addr", "del", f"{ip}/32", "dev", "lo"], check=False)


def _bindable(ip: str) -> bool:
    import socket

    with socket.socket() as s:
        try:
            s.bind((ip, 0))
        except OSError:
            return False
    return True


def namespace_sysctls() -> None:
    """Forwarding between the nodes' bridges, and bridged pod-to-pod traffic through iptables so
    kube-proxy's NAT sees it (both per network namespace)."""
    for key, value in (("net/ipv4/ip_forward", "1"), ("net/bridge/bridge-nf-call-iptables", "1")):
        path = Path("/proc/sys") / key
        if path.exists():
            path.write_text(value)


def read_sysctls() -> dict[str, str]:
    out = {}
    for key in KUBELET_SYSCTLS:
        with contextlib.suppress(OSError):
            out[key] = (Path("/proc/sys") / key).read_text().strip()
    return out


def restore_sysctls(saved: dict[str, str]) -> None:
    for key, value in saved.items():
        with contextlib.suppress(OSError):
            (Path("/proc/sys") / key).write_text(value)


def _cgroup_mounts(mountinfo: str) -> list[tuple[str, str, str]]:
    """(mount point, fstype, super options) of the cgroup mounts (and their tmpfs) in a mountinfo."""
    out = []
    for line in mountinfo.splitlines():
        pre, _, post = line.partition(" - ")
        fields, tail = pre.split(), post.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        mp, (fstype, _src, opts) = fields[4], tail[:3]
        if mp == "/sys/fs/cgroup" or (mp.startswith("/sys/fs/cgroup/") and fstype in ("cgroup", "cgroup2")):
            out.append((mp, fstype, opts))
    return out


def ensure_cgroup_mounts() -> None:
    """`ip netns exec` gives its command a fresh /sys without the cgroup mounts; runc and the kubelet
    need them, so the machine's (as its init sees them) are mounted again in this mount namespace.
    A v1 hierarchy mounted twice is the same hierarchy: nothing about the machine changes."""
    mine = Path("/proc/self/mountinfo").read_text()
    if any(fs in ("cgroup", "cgroup2") for _, fs, _ in _cgroup_mounts(mine)):
        return
    for mp, fstype, opts in _cgroup_mounts(Path("/proc/1/mountinfo").read_text()):
        Path(mp).mkdir(parents=True, exist_ok=True)
        src = "tmpfs" if fstype == "tmpfs" else "cgroup"
        mount_opts = "mode=755" if fstype == "tmpfs" else opts
        run(["mount", "-t", fstype, "-o", mount_opts, src, mp])


def make_cgroup_root(root: str) -> None:
    """The kubelet requires its cgroup root to exist in every v1 hierarchy."""
    for ctrl in CGROUP_V1_CONTROLLERS:
        base = Path("/sys/fs/cgroup") / ctrl
        if base.is_dir():
            (base / root.lstrip("/")).mkdir(parents=True, exist_ok=True)


def cgroup_pids(root: str) -> list[int]:
    """Every process left in a node's cgroups (container processes do not carry our env marker)."""
    pids: set[int] = set()
    for ctrl in ("pids", "memory", "cpu"):
        base = Path("/sys/fs/cgroup") / ctrl / root.lstrip("/")
        if not base.is_dir():
            continue
        for procs_file in base.rglob("cgroup.procs"):
            with contextlib.suppress(OSError):
                pids.update(int(p) for p in procs_file.read_text().split())
    return sorted(pids)


def remove_cgroup_tree(root: str) -> list[str]:
    """rmdir a cgroup subtree, deepest first, in every hierarchy; returns what could not go."""
    left = []
    top = root.lstrip("/").split("/")[0]
    # runc also makes the container's cgroup in the hybrid layout's cgroup2 tree ("unified").
    for ctrl in (*CGROUP_V1_CONTROLLERS, "unified"):
        base = Path("/sys/fs/cgroup") / ctrl / top
        if not base.is_dir():
            continue
        for d in [*sorted((p for p in base.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)), base]:
            try:
                d.rmdir()
            except OSError:
                left.append(str(d))
    return left


def unmount_under(path: Path) -> list[str]:
    """Unmount everything mounted below `path` (deepest first); returns mount points that stayed."""
    prefix = str(path.resolve()).rstrip("/") + "/"
    points = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mp = line.split()[4].replace("\\040", " ")
            if mp.startswith(prefix):
                points.append(mp)
    for mp in sorted(set(points), key=lambda p: -p.count("/")):
        run(["umount", "-l", mp], check=False)
    with open("/proc/self/mountinfo") as f:
        return [ln.split()[4] for ln in f if ln.split()[4].startswith(prefix)]


def write_yaml(path: Path, doc: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


# ----- the fleet: bring-up and tear-down --------------------------------------------------------------
@dataclass
class NodeFleet:
    """Starts a cluster's real nodes through `start(name, argv)` (the launcher's process starter, which
    records PIDs and logs) and undoes it all in `down`. `kubectl(*args, input=...)` runs as admin."""

    state_dir: Path
    bin_dir: Path
    cache: Path
    nodes: list[NodePlan]
    sandbox_image: str
    start: Callable[[str, list[str]], int]
    kubectl: Callable[..., str]
    write_kubeconfig: Callable[[Path, str], None]
    issue_cert: Callable[..., tuple[Path, Path]]
    images: tuple[str, ...] = PRELOADED_IMAGES
    down_timings_s: dict[str, float] = field(default_factory=dict)
    _started: dict[str, int] = field(default_factory=dict)

    @property
    def logs_dir(self) -> Path:
        """Where the launcher's process starter writes each process's log (`<name>.log`)."""
        return self.state_dir / "logs"

    @property
    def saved_sysctls(self) -> Path:
        return self.state_dir / "nodes" / "sysctls.json"

    def names(self) -> list[str]:
        """Process names, in start order."""
        return ([f"containerd-{n.index}" for n in self.nodes] + [f"kubelet-{n.index}" for n in self.nodes]
                + ["kube-proxy", "coredns"])

    def up(self, ca: Path) -> dict[str, float]:
        """Every node Ready-able (the launcher waits for Ready); returns seconds per phase."""
        t: dict[str, float] = {}
        t0 = time.monotonic()
        check_socket_paths(self.nodes)
        missing = node_binaries_missing(self.bin_dir)
        if missing:
            raise NodeError(f"real nodes need {missing}: run `bash cluster/build-node.sh all`")
        archives = image_archives(self.cache)
        if not archives or archives[0].name != "pause.tar":
            raise NodeError(f"no pause image in {self.cache / 'images'}: run `make images`")
        self.saved_sysctls.parent.mkdir(parents=True, exist_ok=True)
        if not self.saved_sysctls.exists():
            self.saved_sysctls.write_text(json.dumps(read_sysctls()))
        if _bindable(self.nodes[0].ip):
            raise NodeError(f"{self.nodes[0].ip} is already on this namespace's loopback device: another "
                            "real-node cluster runs here (one per network namespace: they share its stack)")
        namespace_sysctls()
        ensure_cgroup_mounts()
        add_loopback_address(DNS_IP)
        runc = shutil.which("runc") or "runc"
        cni_bins = [d for d in CNI_BIN_DIRS if Path(d, "bridge").exists()]
        for n in self.nodes:
            add_loopback_address(n.ip)
            add_bridge(n.bridge)
            make_cgroup_root(n.cgroup_root)
            (n.dir / "cni" / "net.d").mkdir(parents=True, exist_ok=True)
            (n.dir / "cni" / "net.d" / "10-bridge.conflist").write_text(json.dumps(cni_conflist(n), indent=2))
            (n.dir / "resolv.conf").write_text("")  # pods' upstream: none (no way out)
            cfg = n.dir / "containerd.toml"
            cfg.write_text(containerd_config(n, sandbox_image=self.sandbox_image, runc=runc, cni_bin_dirs=cni_bins))
            self._start_containerd(n)
        for n in self.nodes:
            self._wait_started(f"containerd-{n.index}", f"{n.name}'s containerd socket", n.socket.exists, 120)
        t["containerd_s"] = time.monotonic() - t0
        t1 = time.monotonic()
        missing = set(self.images) - {t.stem for t in archives}
        if missing:
            raise NodeError(f"no image archive for {sorted(missing)} in {self.cache / 'images'}: run `make images`")
        for tar in archives:
            if tar.stem in self.images:
                self.load_image(tar)
        t["image_import_s"] = time.monotonic() - t1
        for n in self.nodes:
            cert, key = self.issue_cert(f"kubelet-{n.index}", cn=f"system:node:{n.name}", org="system:nodes",
                                        server=True, client=True, dns=[n.name], ips=[n.ip])
            self.write_kubeconfig(n.dir / "kubelet.kubeconfig", f"kubelet-{n.index}")
            write_yaml(n.dir / "kubelet.yaml", kubelet_config(n, ca=ca, cert=cert, key=key))
            self._start_kubelet(n)
        self.issue_cert("kube-proxy", cn="system:kube-proxy", org=None, server=False, client=True)
        kp_kc = self.state_dir / "kube-proxy.kubeconfig"
        self.write_kubeconfig(kp_kc, "kube-proxy")
        kp = write_yaml(self.state_dir / "kube-proxy.yaml",
                        kube_proxy_config(kubeconfig=kp_kc, node=self.nodes[0], metrics_port=10249, healthz_port=10256))
        self.start("kube-proxy", [str(self.bin_dir / "kube-proxy"), f"--config={kp}", "--v=1"])
        cf = self.state_dir / "Corefile"
        cf.write_text(corefile(kubeconfig=self.state_dir / "kubeconfig", listen_ip=DNS_IP))
        self.start("coredns", [str(self.bin_dir / "coredns"), "-conf", str(cf)])
        self.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(dns_service_manifests()))
        t["node_processes_s"] = time.monotonic() - t0
        return t

    def _start_containerd(self, n: NodePlan) -> None:
        self._started[f"containerd-{n.index}"] = self.start(
            f"containerd-{n.index}", [str(self.bin_dir / "containerd"), f"--config={n.dir / 'containerd.toml'}"])

    def _start_kubelet(self, n: NodePlan) -> None:
        """Start a node's kubelet and wait until it has bound the device-plugin registration socket.

        That socket (DEVICE_PLUGIN_SOCKET) is host-wide whatever --root-dir says, and each kubelet
        empties its directory before it binds: two starting together can both empty it and then both
        bind, and the second exits on `address already in use` (seen in CI). So one at a time: the last
        kubelet's socket file is removed here (the next kubelet would remove it anyway) and its
        reappearance means this one bound it. No device plugin registers on these nodes, so nothing dials the older sockets."""
        DEVICE_PLUGIN_SOCKET.unlink(missing_ok=True)
        self._started[f"kubelet-{n.index}"] = self.start(f"kubelet-{n.index}", self._kubelet_argv(n))
        self._wait_started(f"kubelet-{n.index}", f"{n.name}'s kubelet to bind {DEVICE_PLUGIN_SOCKET}",
                           DEVICE_PLUGIN_SOCKET.exists, 120)

    def _kubelet_argv(self, n: NodePlan) -> list[str]:
        return [str(self.bin_dir / "kubelet"), f"--config={n.dir / 'kubelet.yaml'}",
                f"--kubeconfig={n.dir / 'kubelet.kubeconfig'}", f"--hostname-override={n.name}", f"--node-ip={n.ip}",
                f"--root-dir={n.dir / 'kubelet'}", f"--cert-dir={n.dir / 'kubelet-pki'}", "--v=1"]

    def restart_node(self, index: int) -> None:
        """Start a stopped node's containerd and kubelet again on its kept state (a node coming back)."""
        n = next((n for n in self.nodes if n.index == index), None)
        if n is None or not (n.dir / "kubelet.yaml").exists():
            raise NodeError(f"no node {index} in this cluster to restart")
        self._start_containerd(n)
        self._wait_started(f"containerd-{n.index}", f"{n.name}'s containerd socket", n.socket.exists, 120)
        self._start_kubelet(n)

    def _wait_started(self, name: str, what: str, check: Callable[[], bool], timeout: float) -> None:
        """Wait for `check`; fail at once if process `name` exits, and either way with the tail of its log
        (in CI the log is all there is to go on)."""
        pid = self._started.get(name)
        deadline = time.monotonic() + timeout
        while not check():
            exited = pid is not None and not procs.alive(pid)
            if exited or time.monotonic() > deadline:
                why = "exited" if exited else f"timed out after {timeout:.0f}s"
                raise NodeError(f"{why} waiting for {what}; the end of {name}'s log:\n{procs.log_tail(self.logs_dir / f'{name}.log')}")
            time.sleep(0.2)

    def load_image(self, archive: Path) -> None:
        """Import an image archive into every node's containerd (what `kind load` does)."""
        # --discard-unpacked-layers: once unpacked into the snapshotter the compressed layers can go, so a
        # node holds one copy of an image, not two (the model server's is 6 GB per copy); ctr allows it only
        # for a --local import (not through the transfer service).
        for n in self.nodes:
            run([str(self.bin_dir / "ctr"), f"--address={n.socket}", "-n", "k8s.io", "images", "import",
                 "--all-platforms", "--local", "--discard-unpacked-layers", str(archive)], timeout=900)

    def down(self, pids: dict[str, int], terminate: Callable[..., list[int]]) -> list[str]:
        """Stop kubelets, then every pod through CRI, then containerd; undo every host change.
        Returns what could not be undone (empty when all was)."""
        left: list[str] = []
        t0 = time.monotonic()
        first = ("coredns", "kube-proxy", *(f"kubelet-{n.index}" for n in self.nodes))
        terminate([pids[name] for name in first if name in pids], grace_s=10)
        crictl = self.bin_dir / "crictl"
        removals = [subprocess.Popen([str(crictl), f"--runtime-endpoint=unix://{n.socket}", "--timeout=30s",
                                      "rmp", "-fa"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    for n in self.nodes
                    if f"containerd-{n.index}" in pids and n.socket.exists() and os.access(crictl, os.X_OK)]
        for r in removals:
            with contextlib.suppress(subprocess.TimeoutExpired):
                r.wait(timeout=120)
        t1 = time.monotonic()
        terminate([pids[f"containerd-{n.index}"] for n in self.nodes if f"containerd-{n.index}" in pids], grace_s=10)
        self.down_timings_s = {"node_processes_s": round(t1 - t0, 1), "containerd_s": round(time.monotonic() - t1, 1)}
        # Whatever is still in a node's cgroups (shims, containers) goes too.
        ensure_cgroup_mounts()
        for n in self.nodes:
            for pid in cgroup_pids(n.cgroup_root):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, 9)
        time.sleep(0.3)
        # The last kubelet's device-plugin socket file (host-wide, _start_kubelet says why).
        DEVICE_PLUGIN_SOCKET.unlink(missing_ok=True)
        left += unmount_under(self.state_dir / "nodes")
        for n in self.nodes:
            run(["ip", "link", "del", n.bridge], check=False)
            del_loopback_address(n.ip)
        del_loopback_address(DNS_IP)
        kube_proxy = self.bin_dir / "kube-proxy"
        if os.environ.get("PREHEAT_NETNS") and os.access(kube_proxy, os.X_OK):
            run([str(kube_proxy), "--cleanup"], check=False, timeout=60)
        _remove_container_log_links(self.state_dir)
        if self.nodes:
            left += remove_cgroup_tree(self.nodes[0].cgroup_root)
        with contextlib.suppress(OSError, ValueError):
            restore_sysctls(json.loads(self.saved_sysctls.read_text()))
        return left


def _remove_container_log_links(state_dir: Path) -> None:
    """The kubelet links every container's log into /var/log/containers (a fixed path)."""
    d = Path("/var/log/containers")
    if not d.is_dir():
        return
    prefix = str(Path(state_dir).resolve())
    for link in d.iterdir():
        with contextlib.suppress(OSError):
            if link.is_symlink() and os.readlink(link).startswith(prefix):
                link.unlink()
