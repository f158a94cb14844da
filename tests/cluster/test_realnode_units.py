"""The real node's pure parts: two nodes (and two clusters) never share a socket, state dir, bridge,
pod CIDR, cgroup root or log dir, and the configs parse as the components read them."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import signal
import sys
import tomllib
from pathlib import Path

import pytest
from preheat_cluster.realnode import (
    API_SERVER_IP,
    CLUSTER_DNS_IP,
    SERVICE_CIDR,
    NodeError,
    NodeFleet,
    _cgroup_mounts,
    check_socket_paths,
    cni_conflist,
    containerd_config,
    dns_service_manifests,
    image_archives,
    kubelet_config,
    plan_nodes,
    pod_log_files,
    preloaded_images,
)


def test_nodes_get_disjoint_state_addresses_and_cgroups(tmp_path: Path) -> None:
    a = plan_nodes(tmp_path / "a", 2, "aaaa")
    b = plan_nodes(tmp_path / "b", 2, "bbbb")
    for field in ("name", "ip", "pod_cidr", "dir", "cgroup_root", "socket", "bridge"):
        assert len({getattr(n, field) for n in a}) == 2, field
    assert {n.cgroup_root for n in a}.isdisjoint(n.cgroup_root for n in b)
    nets = [ipaddress.ip_network(n.pod_cidr) for n in a]
    assert not nets[0].overlaps(nets[1])
    assert not any(net.overlaps(ipaddress.ip_network(SERVICE_CIDR)) for net in nets)
    assert all(n.ip != API_SERVER_IP for n in a)
    with pytest.raises(NodeError, match=r"1\.\.200"):
        plan_nodes(tmp_path, 0, "x")


def test_containerd_config_is_toml_with_the_nodes_own_paths(tmp_path: Path) -> None:
    n1, n2 = plan_nodes(tmp_path, 2, "t")
    docs = [tomllib.loads(containerd_config(n, sandbox_image="localhost/preheat/pause:v1", runc="/usr/sbin/runc",
                                            cni_bin_dirs=["/usr/lib/cni"])) for n in (n1, n2)]
    for n, d in zip((n1, n2), docs, strict=True):
        assert d["grpc"]["address"] == str(n.socket)
        assert d["root"].startswith(str(n.dir)) and d["state"].startswith(str(n.dir))
        rt = d["plugins"]["io.containerd.cri.v1.runtime"]
        assert rt["restrict_oom_score_adj"] is True
        assert rt["cni"]["conf_dir"].startswith(str(n.dir))
        assert rt["containerd"]["runtimes"]["runc"]["options"]["SystemdCgroup"] is False
        assert d["plugins"]["io.containerd.cri.v1.images"]["pinned_images"]["sandbox"] == "localhost/preheat/pause:v1"
    assert docs[0]["grpc"]["address"] != docs[1]["grpc"]["address"]
    # NRI's socket is one per host: two nodes would fight over it.
    assert all("io.containerd.nri.v1.nri" in d["disabled_plugins"] for d in docs)


def test_a_state_dir_too_deep_for_unix_sockets_is_refused_before_anything_starts(tmp_path: Path) -> None:
    check_socket_paths(plan_nodes(Path("/tmp/pytest-of-root/pytest-9/real-nodes0"), 2, "t"))
    deep = Path("/tmp") / ("d" * 60)
    with pytest.raises(NodeError, match=r"unix socket's path holds at most 107"):
        check_socket_paths(plan_nodes(deep, 2, "t"))


def test_a_checkout_too_deep_for_the_sockets_gets_its_cluster_state_under_tmp(monkeypatch) -> None:
    from preheat_cluster import launcher

    monkeypatch.setattr(launcher, "DEFAULT_STATE_DIR", Path("/tmp") / ("d" * 60) / ".cluster")
    short = launcher.default_state_dir()
    assert short.parent == Path("/tmp") and short.name.startswith("preheat-cluster-")
    check_socket_paths(plan_nodes(short, 2, "t"))
    # The same checkout gets the same dir every time, so `down` finds what `up` started.
    assert launcher.default_state_dir() == short
    monkeypatch.setattr(launcher, "DEFAULT_STATE_DIR", Path("/tmp/repo/.cluster"))
    assert launcher.default_state_dir() == Path("/tmp/repo/.cluster")


def test_a_node_process_that_exits_fails_the_wait_at_once_with_its_log(tmp_path: Path) -> None:
    from preheat_cluster import procs

    def start(name: str, argv: list[str]) -> int:
        return procs.start(argv, log=tmp_path / "logs" / f"{name}.log", env=os.environ).pid

    fleet = NodeFleet(state_dir=tmp_path, bin_dir=tmp_path, cache=tmp_path, nodes=plan_nodes(tmp_path, 1, "t"),
                      sandbox_image="pause", start=start, kubectl=lambda *a, **k: "",
                      write_kubeconfig=lambda *a: None, issue_cert=lambda *a, **k: (tmp_path, tmp_path))
    fleet._started["containerd-1"] = start("containerd-1", ["sh", "-c", "echo 'bind: invalid argument' >&2; exit 1"])
    with pytest.raises(NodeError, match=r"(?s)exited waiting for the socket.*bind: invalid argument"):
        fleet._wait_started("containerd-1", "the socket", lambda: False, timeout=60)


# What a kubelet does with the host-wide device-plugin socket at start: empty its directory, then bind.
KUBELET_STAND_IN = """
import glob, os, socket, sys, time
path = sys.argv[1]
for f in glob.glob(os.path.join(os.path.dirname(path), "*")):
    os.unlink(f)
time.sleep(0.3)  # the kubelet's own start between the two: long enough for another to empty the dir too
s = socket.socket(socket.AF_UNIX)
s.bind(path)  # 'address already in use' if another bound it after this one emptied the dir
s.listen()
time.sleep(120)
"""


def test_kubelets_start_one_at_a_time_so_the_shared_device_plugin_socket_binds(tmp_path, monkeypatch) -> None:
    from preheat_cluster import procs, realnode

    sock = tmp_path / "device-plugins" / "kubelet.sock"
    sock.parent.mkdir()
    monkeypatch.setattr(realnode, "DEVICE_PLUGIN_SOCKET", sock)
    started: list[tuple[str, bool]] = []

    def start(name: str, argv: list[str]) -> int:
        started.append((name, sock.exists()))
        return procs.start(argv, log=tmp_path / "logs" / f"{name}.log", env=os.environ).pid

    fleet = NodeFleet(state_dir=tmp_path, bin_dir=tmp_path, cache=tmp_path, nodes=plan_nodes(tmp_path, 2, "t"),
                      sandbox_image="pause", start=start, kubectl=lambda *a, **k: "",
                      write_kubeconfig=lambda *a: None, issue_cert=lambda *a, **k: (tmp_path, tmp_path))
    monkeypatch.setattr(fleet, "_kubelet_argv", lambda n: [sys.executable, "-c", KUBELET_STAND_IN, str(sock)])
    try:
        for n in fleet.nodes:
            fleet._start_kubelet(n)
        # Each started once the last had bound (and with the socket file of the last removed first).
        assert started == [("kubelet-1", False), ("kubelet-2", False)]
        assert sock.exists()
        assert all(procs.alive(pid) for pid in fleet._started.values())
    finally:
        for pid in fleet._started.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_cni_and_kubelet_configs_follow_the_plan(tmp_path: Path) -> None:
    n1, n2 = plan_nodes(tmp_path, 2, "t")
    for n in (n1, n2):
        bridge = cni_conflist(n)["plugins"][0]
        assert bridge["bridge"] == n.bridge
        assert bridge["ipam"]["ranges"][0][0]["subnet"] == n.pod_cidr
        assert ipaddress.ip_address(bridge["ipam"]["ranges"][0][0]["gateway"]) in ipaddress.ip_network(n.pod_cidr)
        k = kubelet_config(n, ca=tmp_path / "ca", cert=tmp_path / "c", key=tmp_path / "k")
        assert k["address"] == k["healthzBindAddress"] == n.ip
        assert k["cgroupRoot"] == n.cgroup_root and k["cgroupDriver"] == "cgroupfs"
        assert k["failCgroupV1"] is False
        assert k["podLogsDir"].startswith(str(n.dir))
        assert k["clusterDNS"] == [CLUSTER_DNS_IP]
        assert k["containerRuntimeEndpoint"] == f"unix://{n.socket}"
    json.dumps(cni_conflist(n1))  # what containerd reads is JSON


def test_dns_service_points_at_coredns() -> None:
    svc, eps = dns_service_manifests()
    assert svc["spec"]["clusterIP"] == CLUSTER_DNS_IP
    assert eps["metadata"]["labels"]["kubernetes.io/service-name"] == svc["metadata"]["name"]
    assert {p["protocol"] for p in eps["ports"]} == {"UDP", "TCP"}


def test_cgroup_mounts_are_read_from_mountinfo() -> None:
    info = (
        "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
        "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
        "40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd\n"
        "50 23 0:40 / /sys/kernel/debug rw - debugfs debugfs rw\n"
        "60 23 0:41 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n"
    )
    assert _cgroup_mounts(info) == [
        ("/sys/fs/cgroup", "tmpfs", "rw,mode=755"), ("/sys/fs/cgroup/cpu", "cgroup", "rw,cpu"),
        ("/sys/fs/cgroup/systemd", "cgroup", "rw,name=systemd"), ("/sys/fs/cgroup/unified", "cgroup2", "rw")]


def test_image_archives_put_pause_first_and_skip_the_base(tmp_path: Path) -> None:
    d = tmp_path / "images"
    d.mkdir()
    for name in ("base-bookworm-x.tar", "operator.tar", "pause.tar", "model-server.tar"):
        (d / name).write_bytes(b"")
    assert [t.name for t in image_archives(tmp_path)] == ["pause.tar", "model-server.tar", "operator.tar"]


def test_nodes_preload_pause_and_the_operator_plus_what_the_environment_names() -> None:
    assert preloaded_images(None) == ("pause", "operator", "lightweight-server", "model-server")
    assert preloaded_images(" model-server-cuda,,model-server, operator ") == (
        "pause", "operator", "lightweight-server", "model-server", "model-server-cuda")


def test_pod_logs_are_found_under_any_nodes_kubelet_log_dir(tmp_path: Path) -> None:
    logs = plan_nodes(tmp_path, 2, "cccc")[1].dir / "pod-logs"
    first = logs / "ns_web-0_uid1" / "main" / "0.log"
    restarted = logs / "ns_web-0_uid1" / "main" / "1.log"
    other = logs / "ns_web-1_uid2" / "main" / "0.log"
    for i, f in enumerate((first, restarted, other)):
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text("x")
        os.utime(f, (1000 + i, 1000 + i))
    assert pod_log_files(tmp_path, "ns", "web-0", "main") == [first, restarted]
    assert pod_log_files(tmp_path, "ns", "web-0", None) == [first, restarted]
    assert pod_log_files(tmp_path, "ns", "web-0", "sidecar") == []
