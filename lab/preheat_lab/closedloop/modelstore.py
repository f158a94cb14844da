"""The closed loop's model store: the endpoint's weights served over HTTP through a shaped link.

In production most of a replica's cold start is fetching weights (an 8B-parameter model in bf16 is
16 GB; from object storage at a few Gbit/s that is tens of seconds), and a new replica is only useful
once they are in. The tiny model loads in seconds, so on its own it hides the problem an autoscaler
has to solve. The store gives every replica of the closed loop that download for the real reason:

* an uncompressed tar of the built-in model (what `preheat-fetch` unpacks, checked against its
  sha256), served by `python -m http.server` on the test host's address that pods reach (the local
  cluster's real nodes put each pod in its own network namespace behind its node's bridge);
* the store's traffic shaped with `tc` to a stated rate, chosen from the archive's size so that one
  replica alone downloads it in `download_s`: on each device its replies leave by (each node's bridge;
  `lo` for a client on the host), an HTB root whose unclassified traffic goes unshaped (its direct
  queue), and one class at the rate that a u32 filter on the store's source port feeds. Everything else
  (API server, Prometheus, requests) is untouched.

A class is a node's link to the store: replicas on one node that download at once share it, as they
share a node's network bandwidth to an object store in production. The shaping is allowed only inside
Preheat's own network namespace (scripts/netns.sh), never on the machine's own devices.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import re
import socket
import subprocess
import sys
import tarfile
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

DEFAULT_DOWNLOAD_S = 22.0  # one replica alone; with the tiny model's 4-13 s load: cold starts of ~26-35 s
# The HTB class and filter handles; the root's default 0 sends unclassified packets to its direct queue.
ROOT_HANDLE, STORE_CLASS = "1:", "1:10"
# The production case the same download time stands for (for the docs and the JSON).
EXAMPLE_MODEL_BYTES = 16e9  # an 8B-parameter model in bf16


class ModelStoreError(Exception):
    """The store cannot run as asked; the message says why and what to do."""


@dataclass(frozen=True)
class Archive:
    path: Path
    bytes: int
    sha256: str


def build_archive(model_dir: Path, dest: Path) -> Archive:
    """An uncompressed tar of `model_dir`'s files, byte-for-byte the same on every run (sorted names,
    no times or owners), so its sha256 is the model's identity. Uncompressed: weights barely compress
    and a replica should spend its cold start on the link, not on gunzip."""
    files = sorted(p for p in Path(model_dir).iterdir() if p.is_file())
    if not files:
        raise ModelStoreError(f"{model_dir}: no model files to archive")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for f in files:
            info = tarfile.TarInfo(f.name)
            info.size, info.mode, info.mtime = f.stat().st_size, 0o644, 0
            with open(f, "rb") as fh:
                tar.addfile(info, fh)
    data = buf.getvalue()
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, dest)
    return Archive(dest, len(data), hashlib.sha256(data).hexdigest())


def rate_for(size_bytes: int, download_s: float) -> int:
    """The link rate (bit/s) at which one replica alone downloads `size_bytes` in `download_s`."""
    if size_bytes <= 0:
        raise ModelStoreError(f"archive size must be > 0 bytes, got {size_bytes}")
    if not download_s > 0:
        raise ModelStoreError(f"download time must be > 0 s, got {download_s}")
    return max(8_000, round(size_bytes * 8 / download_s))  # tc's smallest sensible rate: 1 kB/s


def shaping_commands(port: int, rate_bit_s: int, dev: str = "lo") -> list[list[str]]:
    """The tc commands that put the store's outgoing traffic (source port `port`) through one class
    of `rate_bit_s` and leave every other packet on `dev` unshaped. `replace` on the root makes a
    second run (or a leftover from a killed one) start clean."""
    if not 0 < port < 65536:
        raise ModelStoreError(f"port must be 1-65535, got {port}")
    if rate_bit_s <= 0:
        raise ModelStoreError(f"rate must be > 0 bit/s, got {rate_bit_s}")
    rate = f"{int(rate_bit_s)}bit"
    return [
        ["tc", "qdisc", "replace", "dev", dev, "root", "handle", ROOT_HANDLE, "htb", "default", "0"],
        ["tc", "class", "add", "dev", dev, "parent", ROOT_HANDLE, "classid", STORE_CLASS,
         "htb", "rate", rate, "ceil", rate],
        ["tc", "filter", "add", "dev", dev, "parent", ROOT_HANDLE, "protocol", "ip", "prio", "1",
         "u32", "match", "ip", "sport", str(port), "0xffff", "flowid", STORE_CLASS],
    ]


def unshaping_commands(dev: str = "lo") -> list[list[str]]:
    return [["tc", "qdisc", "del", "dev", dev, "root"]]


def parse_sent_bytes(tc_class_stats: str) -> int | None:
    """Bytes a class has sent, from `tc -s class show` (this iproute2 prints classes as text even with -j)."""
    m = re.search(r"Sent (\d+) bytes", tc_class_stats)
    return int(m.group(1)) if m else None


def check_netns(env: dict[str, str] | None = None) -> str:
    """The Preheat network namespace we run in; refuses to shape the machine's own loopback."""
    name = (env if env is not None else os.environ).get("PREHEAT_NETNS")
    if not name:
        raise ModelStoreError(
            "the model store shapes traffic on `lo` with tc, which is allowed only inside Preheat's own "
            "network namespace: run through `bash scripts/netns.sh --rm NAME ...` (make demo does), or pass "
            "--no-model-store for the built-in model without a download")
    return name


def equivalent_rate_gbit_s(download_s: float, model_bytes: float = EXAMPLE_MODEL_BYTES) -> float:
    """The link that downloads a production-sized model (default 16 GB) in the same time."""
    return model_bytes * 8 / download_s / 1e9


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _run(cmd: list[str]) -> None:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ModelStoreError(f"cannot run `{' '.join(cmd)}`: {e}") from None
    if r.returncode != 0:
        raise ModelStoreError(f"`{' '.join(cmd)}` failed: {(r.stderr or r.stdout).strip() or r.returncode} "
                              "(needs CAP_NET_ADMIN and the kernel's htb qdisc and u32 classifier)")


class ModelStore:
    """The built-in `model` as an archive on an HTTP server whose uplink is `rate_bit_s` (default: the
    rate that downloads it in `download_s`). `start()` builds, serves and shapes; `stop()` undoes both."""

    def __init__(self, root: Path, model: str = "tiny", download_s: float = DEFAULT_DOWNLOAD_S,
                 rate_bit_s: int | None = None, host: str = "127.0.0.1", devs: tuple[str, ...] = ("lo",)):
        if not download_s > 0:
            raise ModelStoreError(f"download time must be > 0 s, got {download_s}")
        self.root, self.model, self.download_s = Path(root), model, download_s
        if not devs:
            raise ModelStoreError("the store needs at least one device to shape")
        self.rate_bit_s, self.host, self.devs = rate_bit_s, host, tuple(devs)
        self.archive: Archive | None = None
        self.port: int | None = None
        self.proc: subprocess.Popen | None = None
        self.shaped = False

    @property
    def uri(self) -> str:
        if self.archive is None or self.port is None:
            raise ModelStoreError("the model store is not started")
        return f"http://{self.host}:{self.port}/{urllib.parse.quote(self.archive.path.name)}"

    def start(self, model_dir: Path | None = None) -> ModelStore:
        check_netns()
        if model_dir is None:
            from preheat_server.models.builtin import ensure_builtin

            model_dir = ensure_builtin(self.model)
        self.archive = build_archive(model_dir, self.root / f"{self.model}.tar")
        if self.rate_bit_s is None:
            self.rate_bit_s = rate_for(self.archive.bytes, self.download_s)
        self.port = _free_port(self.host)
        # Shape before serving: no byte leaves the store unshaped.
        try:
            for dev in self.devs:
                self.shaped = True  # from the first command on, stop() undoes what is there
                for cmd in shaping_commands(self.port, self.rate_bit_s, dev):
                    _run(cmd)
            logf = open(self.root / "store.log", "ab")  # noqa: SIM115 - the child keeps it
            with logf:
                # Same process group as the closed loop: a Ctrl-C reaches the store too.
                self.proc = subprocess.Popen(
                    [sys.executable, "-m", "http.server", str(self.port), "--bind", self.host,
                     "--directory", str(self.root)], stdout=logf, stderr=subprocess.STDOUT)
            self._wait_serving()
        except BaseException:
            self.stop()
            raise
        return self

    def sent_bytes(self) -> int | None:
        """What has gone through the store's links so far, summed (None when not shaped or unreadable)."""
        if not self.shaped:
            return None
        total = 0
        for dev in self.devs:
            try:
                r = subprocess.run(["tc", "-s", "class", "show", "dev", dev, "classid", STORE_CLASS],
                                   capture_output=True, text=True, timeout=15)
            except (OSError, subprocess.TimeoutExpired):
                return None
            sent = parse_sent_bytes(r.stdout)
            if sent is None:
                return None
            total += sent
        return total

    def _wait_serving(self, timeout_s: float = 15.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise ModelStoreError(f"the store's http.server exited ({self.proc.returncode}); "
                                      f"see {self.root / 'store.log'}")
            with contextlib.suppress(OSError), socket.create_connection((self.host, self.port), 0.5):
                return
            time.sleep(0.1)
        raise ModelStoreError(f"the store did not listen on {self.host}:{self.port} within {timeout_s:g} s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None
        if self.shaped:
            for cmd in (c for dev in self.devs for c in unshaping_commands(dev)):
                try:
                    _run(cmd)
                except ModelStoreError as e:
                    log.warning("%s", e)
            self.shaped = False

    def describe(self) -> dict:
        """What was emulated, for the JSON and the docs."""
        assert self.archive is not None and self.rate_bit_s is not None
        alone_s = self.archive.bytes * 8 / self.rate_bit_s
        return {
            "uri": self.uri, "sha256": self.archive.sha256, "archive_bytes": self.archive.bytes,
            "rate_bit_s": self.rate_bit_s, "download_alone_s": round(alone_s, 2),
            "shaping": f"tc htb on {', '.join(self.devs)}: the store's source port {self.port} into one class "
                       f"per device at {self.rate_bit_s} bit/s, every other packet unshaped",
            "shared_link": "one class per node (its link to the store): n downloads at once on one node take "
                           "about n times as long each",
            "equivalent": f"a {EXAMPLE_MODEL_BYTES / 1e9:.0f} GB model (8B parameters in bf16) at "
                          f"{equivalent_rate_gbit_s(alone_s):.1f} Gbit/s",
            "node_cache": False,
        }


def _prom_by_pod(prometheus_url: str, query: str) -> dict[str, float]:
    params = urllib.parse.urlencode({"query": query})
    with urllib.request.urlopen(f"{prometheus_url.rstrip('/')}/api/v1/query?{params}", timeout=10) as r:
        data = json.loads(r.read())
    out = {}
    for row in (data.get("data") or {}).get("result") or []:
        pod = row.get("metric", {}).get("pod")
        if pod:
            out[pod] = float(row["value"][1])
    return out


def pod_cold_starts(prometheus_url: str, namespace: str, endpoint: str, since_wall: float,
                    measured: dict[str, float] | None = None) -> list[dict]:
    """Per pod of the endpoint that Prometheus scraped since `since_wall`: the download its fetch
    record holds and the cold start its server reports (download + load), both as exported by the
    model server (`preheat:model_download_seconds`, `preheat:model_load_seconds`), beside the closed
    loop's own creation -> Ready (`measured`, by pod name). Empty when Prometheus cannot answer."""
    window = max(30, int(time.time() - since_wall) + 30)
    sel = f'{{namespace="{namespace}",endpoint="{endpoint}"}}'
    try:
        download = _prom_by_pod(prometheus_url, f"max by (pod) (max_over_time(preheat:model_download_seconds{sel}[{window}s]))")
        server = _prom_by_pod(prometheus_url, f"max by (pod) (max_over_time(preheat:model_load_seconds{sel}[{window}s]))")
    except (OSError, ValueError) as e:
        log.warning("per-pod cold starts from Prometheus: %s", e)
        return []
    measured = measured or {}
    pods = sorted(set(download) | set(server) | set(measured))
    return [{"pod": p, "download_s": download.get(p), "server_cold_start_s": server.get(p),
             "cold_start_s": measured.get(p)} for p in pods]
