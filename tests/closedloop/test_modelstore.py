"""The closed loop's model store: the archive preheat-fetch unpacks, the link's rate, the tc commands
that shape only the store's traffic, the endpoint spec's model.uri, and the per-pod cold-start record.
One `cluster` test shapes a real loopback inside Preheat's network namespace and downloads through it."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import urllib.parse
from functools import partial
from http.server import BaseHTTPRequestHandler, SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from preheat_lab.closedloop import LoopConfig, endpoint_manifest
from preheat_lab.closedloop import modelstore as MS
from preheat_lab.closedloop.__main__ import build_parser, main, summary_line
from preheat_lab.closedloop.experiment import MODES, cold_start_headline, hpa_per_replica
from preheat_server import fetch as F


def _model(tmp_path: Path) -> Path:
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text('{"kind": "tiny"}')
    (d / "model.safetensors").write_bytes(bytes(range(256)) * 40)
    (d / "tokenizer.json").write_text("{}")
    return d


def _serve(root: Path):
    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), partial(Quiet, directory=str(root)))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


def test_the_archive_is_reproducible_and_is_what_preheat_fetch_unpacks(tmp_path):
    model = _model(tmp_path)
    a = MS.build_archive(model, tmp_path / "store" / "tiny.tar")
    b = MS.build_archive(model, tmp_path / "again" / "tiny.tar")
    assert a.sha256 == b.sha256 and a.bytes == b.bytes == a.path.stat().st_size
    httpd = _serve(a.path.parent)
    try:
        got = F.fetch(f"http://127.0.0.1:{httpd.server_address[1]}/tiny.tar", tmp_path / "pod" / "model",
                      sha256=a.sha256)
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert got.bytes == a.bytes
    for f in model.iterdir():
        assert (tmp_path / "pod" / "model" / f.name).read_bytes() == f.read_bytes()


def test_an_empty_model_folder_is_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(MS.ModelStoreError, match="no model files"):
        MS.build_archive(tmp_path / "empty", tmp_path / "x.tar")


def test_the_link_rate_downloads_the_archive_alone_in_the_stated_time():
    assert MS.rate_for(2_750_000, 22.0) == 1_000_000
    assert MS.rate_for(2_750_000, 11.0) == 2 * MS.rate_for(2_750_000, 22.0)
    # the production case the same time stands for: 16 GB in 22 s
    assert MS.equivalent_rate_gbit_s(22.0) == pytest.approx(16e9 * 8 / 22 / 1e9)
    for size, secs in ((0, 22.0), (1000, 0.0), (1000, -1.0)):
        with pytest.raises(MS.ModelStoreError):
            MS.rate_for(size, secs)


def test_only_the_stores_source_port_is_shaped_everything_else_on_lo_is_not():
    cmds = MS.shaping_commands(8765, 1_000_000)
    root, cls, flt = cmds
    # HTB root whose default 0 sends unclassified packets to its direct queue: not shaped at all
    assert root == ["tc", "qdisc", "replace", "dev", "lo", "root", "handle", "1:", "htb", "default", "0"]
    assert cls[cls.index("classid") + 1] == MS.STORE_CLASS
    assert cls[cls.index("rate") + 1] == cls[cls.index("ceil") + 1] == "1000000bit"  # no borrowing above it
    # the store's replies (source port) into that class: what flows from the store to the replicas
    assert flt[flt.index("u32"):] == ["u32", "match", "ip", "sport", "8765", "0xffff", "flowid", MS.STORE_CLASS]
    assert MS.unshaping_commands() == [["tc", "qdisc", "del", "dev", "lo", "root"]]
    for port, rate in ((0, 1000), (70000, 1000), (80, 0)):
        with pytest.raises(MS.ModelStoreError):
            MS.shaping_commands(port, rate)


def test_the_bytes_through_the_link_are_read_from_tcs_class_stats():
    text = ("class htb 1:10 root prio 0 rate 1Mbit ceil 1Mbit burst 1600b cburst 1600b \n"
            " Sent 2712345 bytes 190 pkt (dropped 0, overlimits 120 requeues 0) \n backlog 0b 0p requeues 0\n")
    assert MS.parse_sent_bytes(text) == 2712345
    assert MS.parse_sent_bytes("") is None


def test_shaping_is_refused_outside_preheats_network_namespace(tmp_path, monkeypatch):
    with pytest.raises(MS.ModelStoreError, match=r"scripts/netns\.sh") as err:
        MS.check_netns({})
    assert "--no-model-store" in str(err.value)
    assert MS.check_netns({"PREHEAT_NETNS": "preheat-demo"}) == "preheat-demo"
    monkeypatch.delenv("PREHEAT_NETNS", raising=False)
    with pytest.raises(MS.ModelStoreError, match="network namespace"):
        MS.ModelStore(tmp_path).start(_model(tmp_path))
    assert not (tmp_path / "tiny.tar").exists()  # nothing built, nothing shaped


def test_the_cli_says_why_it_cannot_shape_outside_the_namespace(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("PREHEAT_NETNS", raising=False)
    (tmp_path / "kubeconfig").write_text("")
    args = ["--cluster-state", str(tmp_path), "--modes", "preheat"]
    assert build_parser().parse_args(args).model_store is True  # on by default
    assert build_parser().parse_args([*args, "--no-model-store"]).model_store is False

    class Up:
        def __init__(self, state_dir):
            self.kubeconfig, self.prometheus_url = tmp_path / "kubeconfig", "http://127.0.0.1:1"
            self.register_scrape_target = self.unregister_scrape_target = None
            self.bin_dir = self.state_dir = tmp_path

    monkeypatch.setattr("preheat_cluster.LocalCluster", Up)
    assert main(args) == 2
    assert "Preheat's own network namespace" in capsys.readouterr().err


def test_every_mode_downloads_the_same_weights_and_the_hpa_target_is_unchanged(tmp_path):
    from preheat.controller.builders import FETCH_CONTAINER, deployment
    from preheat.controller.spec import parse_spec

    base = LoopConfig(kubeconfig=tmp_path / "k", prometheus_url="http://p", out_dir=tmp_path)
    uri = LoopConfig(kubeconfig=tmp_path / "k", prometheus_url="http://p", out_dir=tmp_path,
                     model_uri="http://127.0.0.1:8765/tiny.tar", model_sha256="ab" * 32)
    assert endpoint_manifest(base, "preheat")["spec"]["model"] == {"builtin": "tiny"}
    for mode in MODES:
        spec = endpoint_manifest(uri, mode)["spec"]
        assert spec["model"] == {"uri": "http://127.0.0.1:8765/tiny.tar", "sha256": "ab" * 32}
        parsed = parse_spec(spec)  # the operator's model (and the CRD) accepts it
        pod = deployment("tiny", "ns", parsed, {"apiVersion": "v1", "kind": "X", "metadata": {"name": "t", "uid": "u"}})
        [init] = pod["spec"]["template"]["spec"]["initContainers"]
        assert init["name"] == FETCH_CONTAINER and init["args"][0] == uri.model_uri
        assert "--sha256" in init["args"] and "--cache-dir" not in init["args"]  # every replica downloads
        # only the model differs from the built-in endpoint's spec
        assert {k: v for k, v in spec.items() if k != "model"} == \
            {k: v for k, v in endpoint_manifest(base, mode)["spec"].items() if k != "model"}
    assert hpa_per_replica(uri) == hpa_per_replica(base)


class _FakeProm(BaseHTTPRequestHandler):
    answers: dict[str, dict[str, float]] = {}

    def do_GET(self):
        q = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)["query"][0]
        series = next(v for k, v in self.answers.items() if k in q)
        body = {"status": "success", "data": {"resultType": "vector", "result": [
            {"metric": {"pod": p}, "value": [0, str(v)]} for p, v in series.items()]}}
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def test_each_pods_download_and_cold_start_sit_beside_the_loops_measurement(tmp_path):
    _FakeProm.answers = {"model_download_seconds": {"a": 21.5, "b": 40.2},
                         "model_load_seconds": {"a": 27.0, "b": 47.9}}
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _FakeProm)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        rows = MS.pod_cold_starts(f"http://127.0.0.1:{httpd.server_address[1]}", "ns", "tiny", 0.0,
                                  {"a": 28.0, "b": 49.0, "c": 30.0})
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert rows == [
        {"pod": "a", "download_s": 21.5, "server_cold_start_s": 27.0, "cold_start_s": 28.0},
        {"pod": "b", "download_s": 40.2, "server_cold_start_s": 47.9, "cold_start_s": 49.0},
        {"pod": "c", "download_s": None, "server_cold_start_s": None, "cold_start_s": 30.0},
    ]
    h = cold_start_headline({"pod_cold_starts": rows, "cold_start_s": [28.0, 49.0, 30.0],
                             "operator_cold_start_s": 47.0})
    assert h == {"cold_start_p50_s": 30.0, "cold_start_max_s": 49.0, "download_p50_s": pytest.approx(30.85),
                 "download_max_s": 40.2, "operator_cold_start_s": 47.0}
    line = summary_line({"hpa": {**h, "slo_attainment": 0.9, "replica_seconds": 300.0}})
    assert "cold start p50 30 s (max 49 s, download p50 31 s)" in line
    # unreachable Prometheus: no rows, not an exception at the end of a run
    assert MS.pod_cold_starts("http://127.0.0.1:9", "ns", "tiny", 0.0, {"a": 28.0}) == []


@pytest.mark.cluster
def test_the_store_shapes_only_its_own_traffic_on_a_real_loopback(tmp_path):
    if not os.environ.get("PREHEAT_NETNS"):
        pytest.fail("needs Preheat's network namespace (run through scripts/netns.sh, as make test does)",
                    pytrace=False)
    model = _model(tmp_path)
    store = MS.ModelStore(tmp_path / "store", download_s=1.0)
    store.start(model)
    try:
        assert store.proc is not None and store.proc.poll() is None
        got = F.fetch(store.uri, tmp_path / "pod" / "model", sha256=store.archive.sha256)
        assert got.bytes == store.archive.bytes
        other = _serve(tmp_path)  # another server on the same loopback: not the store's port
        try:
            F.fetch(f"http://127.0.0.1:{other.server_address[1]}/store/{store.archive.path.name}",
                    tmp_path / "other" / "model")
        finally:
            other.shutdown()
            other.server_close()
        # the store's download went through its class; the other server's did not
        assert store.archive.bytes <= store.sent_bytes() < 2 * store.archive.bytes
    finally:
        store.stop()
    shown = subprocess.run(["tc", "qdisc", "show", "dev", "lo"], capture_output=True, text=True, check=True)
    assert "htb" not in shown.stdout and store.proc is None
