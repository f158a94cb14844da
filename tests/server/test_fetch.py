"""`preheat-fetch` against a real HTTP server on 127.0.0.1 serving the real tiny model.

Each test runs the fetcher as its own process (as the init container does) and checks what it
leaves behind: the model's files byte for byte, the timing record, nothing half-written after a
failure, and the one-line error a user would see in the endpoint's status.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import subprocess
import sys
import tarfile
import threading
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import requests
from preheat_server.fetch import RECORD_NAME, cache_key, recorded_download_seconds


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:  # keep test output readable
        pass


class ModelStore:
    """A real http.server over a directory, in a thread; `url(name)` for a file or folder in it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), partial(_Quiet, directory=str(root)))
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/{name}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="session")
def tiny_folder() -> Path:
    from preheat_server.models.builtin import ensure_builtin

    return ensure_builtin("tiny")


@pytest.fixture
def store(tmp_path: Path, tiny_folder: Path) -> Any:
    """tiny.tar.gz (the model folder packed), tiny/ (the folder itself, with a sub-folder) and junk."""
    root = tmp_path / "store"
    root.mkdir()
    with tarfile.open(root / "tiny.tar.gz", "w:gz") as tar:
        for f in sorted(tiny_folder.iterdir()):
            tar.add(f, arcname=f.name)
    shutil.copytree(tiny_folder, root / "tiny")
    (root / "tiny" / "extra").mkdir()
    (root / "tiny" / "extra" / "notes.txt").write_text("nested files come too\n")
    (root / "junk.tar.gz").write_bytes(b"this is not an archive" * 100)
    evil = io.BytesIO()
    with tarfile.open(fileobj=evil, mode="w") as tar:
        data = b"owned"
        info = tarfile.TarInfo("../../escaped.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    (root / "evil.tar").write_bytes(evil.getvalue())
    s = ModelStore(root)
    yield s
    s.close()


def run_fetch(*args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "preheat_server.fetch", *map(str, args)],
                          capture_output=True, text=True, timeout=120)


def tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_archive_is_unpacked_checked_and_timed(store: ModelStore, tiny_folder: Path, tmp_path: Path) -> None:
    target = tmp_path / "vol" / "model"
    archive = store.root / "tiny.tar.gz"
    done = run_fetch(store.url("tiny.tar.gz"), target, "--sha256", sha256(archive))
    assert done.returncode == 0, done.stderr
    assert tree(target) == tree(tiny_folder)
    record = json.loads((target.parent / RECORD_NAME).read_text())
    assert record["uri"] == store.url("tiny.tar.gz") and record["path"] == str(target)
    assert record["bytes"] == archive.stat().st_size and record["cached"] is False
    assert record["seconds"] > 0
    assert recorded_download_seconds(target.parent / RECORD_NAME) == record["seconds"]
    # Only the model and its record are left in the volume: no temporary directory, no archive.
    assert sorted(p.name for p in target.parent.iterdir()) == sorted([RECORD_NAME, "model"])


def test_folder_listing_is_copied_with_sub_folders(store: ModelStore, tmp_path: Path) -> None:
    target = tmp_path / "vol" / "model"
    done = run_fetch(store.url("tiny/"), target)
    assert done.returncode == 0, done.stderr
    assert tree(target) == tree(store.root / "tiny")
    assert (target / "extra" / "notes.txt").read_text() == "nested files come too\n"


def test_an_unsafe_member_is_refused_also_where_tarfile_has_no_filters(store: ModelStore, tmp_path: Path,
                                                                       monkeypatch: Any) -> None:
    from preheat_server import fetch

    # Debian bookworm's Python 3.11.2 (the images' base) has no tarfile.data_filter: the member check is ours.
    monkeypatch.delattr(tarfile, "data_filter", raising=False)
    with pytest.raises(fetch.FetchError, match=r"unsafe archive member: '\.\./\.\./escaped\.txt' is outside"):
        fetch.fetch(store.url("evil.tar"), tmp_path / "vol" / "model")
    assert not (tmp_path / "escaped.txt").exists() and not (tmp_path.parent / "escaped.txt").exists()
    got = fetch.fetch(store.url("tiny.tar.gz"), tmp_path / "ok" / "model")
    assert got.bytes > 0 and (tmp_path / "ok" / "model" / "config.json").exists()


@pytest.mark.parametrize(
    ("name", "extra", "message"),
    [
        ("missing.tar.gz", [], "HTTP 404"),
        ("junk.tar.gz", [], "not a readable tar or tar.gz archive"),
        ("evil.tar", [], "unsafe archive member"),
        ("tiny.tar.gz", ["--sha256", "0" * 64], "sha256 mismatch: expected " + "0" * 64),
        ("tiny.tar.gz", ["--sha256", "abc"], "--sha256 must be 64 hex digits"),
        ("tiny/", ["--sha256", "0" * 64], "a folder URI (ending in /) has none"),
    ],
)
def test_failures_exit_1_with_one_clear_line_and_leave_nothing(
    store: ModelStore, tmp_path: Path, name: str, extra: list[str], message: str
) -> None:
    target = tmp_path / "vol" / "model"
    done = run_fetch(store.url(name), target, *extra)
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("preheat-fetch: ") and message in last, done.stderr
    assert "Traceback" not in done.stderr
    assert not target.exists()
    assert not (tmp_path / "escaped.txt").exists() and not (tmp_path.parent / "escaped.txt").exists()
    leftovers = list(target.parent.iterdir()) if target.parent.exists() else []
    assert leftovers == []


def test_unknown_host_and_refused_port_and_scheme(tmp_path: Path) -> None:
    dns = run_fetch("http://no-such-model-store.invalid/m.tar.gz", tmp_path / "a" / "model", "--timeout-s", "10")
    assert dns.returncode == 1 and "cannot resolve host 'no-such-model-store.invalid'" in dns.stderr
    with ThreadingHTTPServer(("127.0.0.1", 0), _Quiet) as closed:
        port = closed.server_address[1]
    refused = run_fetch(f"http://127.0.0.1:{port}/m.tar.gz", tmp_path / "b" / "model")
    assert refused.returncode == 1 and "Connection refused" in refused.stderr
    s3 = run_fetch("s3://bucket/m.tar.gz", tmp_path / "c" / "model")
    assert s3.returncode == 1 and "use http:// or https://" in s3.stderr


def test_node_cache_downloads_once_per_node(store: ModelStore, tiny_folder: Path, tmp_path: Path) -> None:
    cache = tmp_path / "node-cache"
    url = store.url("tiny.tar.gz")
    first = run_fetch(url, tmp_path / "pod1" / "model", "--cache-dir", cache)
    assert first.returncode == 0, first.stderr
    store.close()  # the second pod on this node must not need the store at all
    second = run_fetch(url, tmp_path / "pod2" / "model", "--cache-dir", cache)
    assert second.returncode == 0, second.stderr
    entry = cache / cache_key(url, None)
    for pod in ("pod1", "pod2"):
        target = tmp_path / pod / "model"
        assert target.is_symlink() and target.resolve() == entry.resolve()
        assert tree(target) == tree(tiny_folder)
    one = json.loads((tmp_path / "pod1" / RECORD_NAME).read_text())
    two = json.loads((tmp_path / "pod2" / RECORD_NAME).read_text())
    assert one["cached"] is False and one["bytes"] > 0
    assert two["cached"] is True and two["bytes"] == 0
    assert [p.name for p in cache.iterdir()] == [entry.name]


def test_a_restarted_fetch_replaces_what_an_earlier_try_left(store: ModelStore, tiny_folder: Path,
                                                             tmp_path: Path) -> None:
    target = tmp_path / "vol" / "model"
    target.mkdir(parents=True)
    (target / "stale.bin").write_bytes(b"old")
    done = run_fetch(store.url("tiny.tar.gz"), target)
    assert done.returncode == 0, done.stderr
    assert tree(target) == tree(tiny_folder)


def test_server_counts_the_download_in_its_cold_start(store: ModelStore, tmp_path: Path, monkeypatch: Any,
                                                      spawn_server_process: Any, server_tools: Any) -> None:
    """The server's exported cold start is download + load; the download is its own series too."""
    target = tmp_path / "vol" / "model"
    assert run_fetch(store.url("tiny.tar.gz"), target).returncode == 0
    record = target.parent / RECORD_NAME
    data = json.loads(record.read_text())
    # A slow store, as the closed loop's shaped link makes it: the record says 42 s.
    data["seconds"] = 42.0
    record.write_text(json.dumps(data))
    monkeypatch.setenv("PREHEAT_FETCH_RECORD", str(record))
    server = spawn_server_process(["--model", str(target)])
    server_tools.wait_ready(server.url)
    metrics = server_tools.parse_metrics(requests.get(server.url + "/metrics", timeout=60).text)
    assert metrics[("preheat:model_download_seconds", ())] == 42.0
    assert metrics[("preheat:model_load_seconds", ())] > 42.0
