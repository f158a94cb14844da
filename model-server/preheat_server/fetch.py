"""`preheat-fetch`: put a model's weights from a URI into a directory before the server starts.

The pattern is KServe's storage initializer: an init container downloads the weights into a volume
that the server container mounts read-only, so a replica's cold start includes the download, as it
does in production. Only the standard library is used (this runs in an init container and must
start in well under a second; no torch, no event loop).

- ``http(s)://.../x.tar`` (or ``.tar.gz``/``.tgz``, or any name: tar's compression is detected from
  the bytes) is downloaded, checked against ``--sha256`` when given, and unpacked.
- ``http(s)://.../folder/`` (a trailing slash) is a directory listing as nginx's autoindex or
  ``python -m http.server`` serve it: every linked file is downloaded, sub-folders recursively.

Atomic: everything lands in a temporary directory beside the target and is renamed into place, so a
reader never sees half a model, and an interrupted fetch leaves nothing at the target. With
``--cache-dir`` (a per-node hostPath) the model is kept there under a key of the URI and checksum and
the target becomes a symlink to it; a second pod on the same node does not download again.

How long it took goes to a JSON record (``--record``, default ``<target's parent>/.preheat-fetch.json``)
that the server reads at start (``PREHEAT_FETCH_RECORD``) and exports as
``preheat:model_download_seconds``; the server's cold start then counts download + load.

Every failure (HTTP status, DNS, refused connection, bad archive, checksum) ends with one line on
stderr and exit status 1: the pod's ``FallbackToLogsOnError`` makes that line the init container's
termination message, which the operator puts in the endpoint's Ready condition.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import socket
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import asdict, dataclass
from html.parser import HTMLParser
from pathlib import Path

RECORD_NAME = ".preheat-fetch.json"
RECORD_ENV = "PREHEAT_FETCH_RECORD"
CHUNK = 1 << 20
SCHEMES = ("http", "https")


class FetchError(Exception):
    """A fetch that cannot succeed; the message is what the user sees in the endpoint's status."""


@dataclass(frozen=True)
class FetchResult:
    uri: str
    path: str
    seconds: float
    bytes: int
    cached: bool
    sha256: str | None


def cache_key(uri: str, sha256: str | None) -> str:
    """The cache entry's name: the same URI with another checksum is another model."""
    return hashlib.sha256(f"{uri}\n{sha256 or ''}".encode()).hexdigest()[:32]


def _check_uri(uri: str) -> urllib.parse.SplitResult:
    parts = urllib.parse.urlsplit(uri)
    if parts.scheme not in SCHEMES or not parts.netloc:
        raise FetchError(f"unsupported model URI {uri!r}: use http:// or https://")
    return parts


def _open(url: str, timeout_s: float):
    try:
        return urllib.request.urlopen(urllib.request.Request(url, headers={"User-Agent": "preheat-fetch"}),
                                      timeout=timeout_s)
    except urllib.error.HTTPError as exc:
        raise FetchError(f"GET {url}: HTTP {exc.code} {exc.reason}") from None
    except urllib.error.URLError as exc:
        reason = exc.reason
        if isinstance(reason, socket.gaierror):
            host = urllib.parse.urlsplit(url).hostname
            raise FetchError(f"GET {url}: cannot resolve host {host!r} ({reason.strerror})") from None
        raise FetchError(f"GET {url}: {getattr(reason, 'strerror', None) or reason}") from None
    except (TimeoutError, OSError) as exc:
        raise FetchError(f"GET {url}: {exc}") from None


def _download(url: str, dest: Path, timeout_s: float) -> tuple[int, str]:
    """Stream url to dest; returns (bytes, sha256 hex)."""
    digest = hashlib.sha256()
    size = 0
    with _open(url, timeout_s) as resp, open(dest, "wb") as out:
        expected = resp.headers.get("Content-Length")
        try:
            while chunk := resp.read(CHUNK):
                out.write(chunk)
                digest.update(chunk)
                size += len(chunk)
        except (TimeoutError, OSError) as exc:
            raise FetchError(f"GET {url}: download broke off after {size} bytes: {exc}") from None
    if expected is not None and expected.isdigit() and int(expected) != size:
        raise FetchError(f"GET {url}: got {size} bytes of {expected}")
    return size, digest.hexdigest()


def _check_members(tar: tarfile.TarFile, into: Path) -> None:
    """Where tarfile has no extraction filters (Python before 3.11.4: Debian bookworm's 3.11.2, the
    images' base), refuse what the "data" filter would, and more: only plain files and folders, each
    inside `into` (no absolute path, no '..', no link, no device)."""
    root = into.resolve()
    for m in tar.getmembers():
        dest = (root / m.name).resolve()
        if not (m.isfile() or m.isdir()) or m.name.startswith("/") or not dest.is_relative_to(root):
            raise _UnsafeMember(f"{m.name!r} is {'outside the destination' if m.isfile() or m.isdir() else 'not a plain file or folder'}")


class _UnsafeMember(Exception):
    pass


def _unpack(archive: Path, into: Path, url: str) -> None:
    try:
        with tarfile.open(archive, "r:*") as tar:
            if hasattr(tarfile, "data_filter"):
                # The "data" filter refuses absolute paths, '..', links out of the tree and device files.
                tar.extractall(into, filter="data")
            else:
                _check_members(tar, into)
                tar.extractall(into)  # every member checked just above
    except (_UnsafeMember, getattr(tarfile, "FilterError", _UnsafeMember)) as exc:
        raise FetchError(f"{url}: unsafe archive member: {exc}") from None
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise FetchError(f"{url}: not a readable tar or tar.gz archive ({str(exc).splitlines()[0]})") from None


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self.hrefs += [v for k, v in attrs if k == "href" and v]


def _listing(url: str, timeout_s: float) -> list[str]:
    """The children of a folder URL: relative links below it (no parent, no query, no other host)."""
    with _open(url, timeout_s) as resp:
        body = resp.read().decode(resp.headers.get_content_charset() or "utf-8", "replace")
    parser = _Links()
    parser.feed(body)
    children = []
    for href in parser.hrefs:
        full = urllib.parse.urljoin(url, href)
        if urllib.parse.urlsplit(full).query or not full.startswith(url) or full == url:
            continue
        children.append(full)
    return sorted(set(children))


def _fetch_folder(url: str, into: Path, timeout_s: float, depth: int = 0) -> int:
    if depth > 8:
        raise FetchError(f"{url}: folder nested deeper than 8 levels")
    total = 0
    children = _listing(url, timeout_s)
    for child in children:
        name = urllib.parse.unquote(child[len(url):].rstrip("/"))
        if not name or "/" in name or name in (".", ".."):
            continue
        if child.endswith("/"):
            (into / name).mkdir()
            total += _fetch_folder(child, into / name, timeout_s, depth + 1)
        else:
            total += _download(child, into / name, timeout_s)[0]
    if depth == 0 and total == 0:
        raise FetchError(f"{url}: the folder listing links no files")
    return total


def _fill(uri: str, into: Path, sha256: str | None, timeout_s: float) -> int:
    """Download uri's model into the (empty) directory `into`; returns the bytes fetched."""
    if uri.endswith("/"):
        if sha256:
            raise FetchError("--sha256 checks an archive; a folder URI (ending in /) has none")
        return _fetch_folder(uri, into, timeout_s)
    archive = into.parent / f"{into.name}.archive"
    try:
        size, digest = _download(uri, archive, timeout_s)
        if sha256 and digest != sha256.lower():
            raise FetchError(f"{uri}: sha256 mismatch: expected {sha256.lower()}, got {digest}")
        _unpack(archive, into, uri)
    finally:
        archive.unlink(missing_ok=True)
    return size


def _materialize(uri: str, final: Path, sha256: str | None, timeout_s: float) -> int:
    """Fill a temporary sibling of `final` and rename it into place; 0 bytes when another writer won."""
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".fetch-", dir=final.parent))
    except PermissionError as exc:
        raise FetchError(f"cannot write under {final.parent}: {exc.strerror}") from None
    try:
        size = _fill(uri, tmp, sha256, timeout_s)
        os.chmod(tmp, 0o755)  # mkdtemp makes it 0700; the server may run as another user
        try:
            os.rename(tmp, final)
        except OSError:
            if not final.is_dir():
                raise
            return 0  # a concurrent fetch on this node finished first: its copy is the same model
        return size
    except PermissionError as exc:
        raise FetchError(f"cannot write under {final.parent}: {exc.strerror}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _replace_with_symlink(target: Path, link_to: Path) -> None:
    tmp = target.with_name(f".{target.name}.link")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(link_to)
    if target.is_dir() and not target.is_symlink():
        shutil.rmtree(target)
    os.replace(tmp, target)


def fetch(uri: str, target: Path, *, sha256: str | None = None, cache_dir: Path | None = None,
          timeout_s: float = 60.0) -> FetchResult:
    """Make `target` hold uri's model; see the module docstring for the rules."""
    _check_uri(uri)
    if sha256 is not None and (len(sha256) != 64 or any(c not in "0123456789abcdefABCDEF" for c in sha256)):
        raise FetchError(f"--sha256 must be 64 hex digits, got {sha256!r}")
    sha256 = sha256.lower() if sha256 else None  # one cache entry whatever the case it was given in
    start = time.monotonic()
    if cache_dir is not None:
        entry = cache_dir / cache_key(uri, sha256)
        cached = entry.is_dir()
        size = 0 if cached else _materialize(uri, entry, sha256, timeout_s)
        target.parent.mkdir(parents=True, exist_ok=True)
        _replace_with_symlink(target, entry)
    else:
        if target.is_symlink() or target.exists():
            # A restarted init container: the pod's volume may hold an earlier try's model.
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            else:
                target.unlink()
        cached = False
        size = _materialize(uri, target, sha256, timeout_s)
    return FetchResult(uri=uri, path=str(target), seconds=time.monotonic() - start, bytes=size,
                       cached=cached, sha256=sha256)


def write_record(result: FetchResult, record: Path) -> None:
    tmp = record.with_name(f".{record.name}.tmp")
    tmp.write_text(json.dumps({**asdict(result), "finished_at": time.time()}) + "\n")
    os.replace(tmp, record)


def recorded_download_seconds(record: str | os.PathLike | None = None) -> float | None:
    """The download time a fetch record holds (the server's half of the contract), None without one.

    `record` defaults to $PREHEAT_FETCH_RECORD, which the operator sets where an init container fetched.
    """
    path = record if record is not None else os.environ.get(RECORD_ENV)
    if not path:
        return None
    try:
        seconds = float(json.loads(Path(path).read_text())["seconds"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return seconds if seconds >= 0 else None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="preheat-fetch",
        description="Download a model (a tar/tar.gz archive, or a folder listing when the URI ends in /) "
                    "into TARGET atomically, before the model server starts.")
    p.add_argument("uri", help="http:// or https:// URI of the archive or folder")
    p.add_argument("target", type=Path, help="directory to create (the server's --model)")
    p.add_argument("--sha256", help="expected sha256 of the archive (hex)")
    p.add_argument("--cache-dir", type=Path,
                   help="per-node cache: keep the model here and make TARGET a symlink to it")
    p.add_argument("--record", type=Path, help=f"where to write the timing record "
                                               f"(default: TARGET's parent/{RECORD_NAME})")
    p.add_argument("--timeout-s", type=float, default=60.0, help="socket timeout (default: %(default)s)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    target = args.target.absolute()
    try:
        result = fetch(args.uri, target, sha256=args.sha256, cache_dir=args.cache_dir,
                       timeout_s=args.timeout_s)
        write_record(result, args.record or target.parent / RECORD_NAME)
    except (FetchError, OSError) as exc:
        # OSError: a full or read-only volume, a cache dir the init container's user cannot write.
        # One line: with FallbackToLogsOnError the log's tail is the termination message.
        print("preheat-fetch: " + " ".join(str(exc).split()), file=sys.stderr)
        return 1
    how = "from the node cache" if result.cached else f"{result.bytes} bytes"
    print(f"preheat-fetch: {result.uri} -> {result.path} ({how}) in {result.seconds:.2f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
