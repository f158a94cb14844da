"""Quantized weights on disk: computed once per (checkpoint content, precision, group size), then read.

Quantizing at every start meant reading the fp32 checkpoint and rounding every matrix (the issue saw
91 s for int8, 164 s for int4 on a loaded machine); a cached start reads a file a quarter to a half the
size of the fp32 one. The key is the SHA-256 of the checkpoint's weight files (memoised by path, size
and mtime, so an unchanged file is hashed once) with everything that changes the result, so a changed
checkpoint or recipe never reuses stale weights. The cache holds the layout-independent tensors
(int8 rows and scales, nibble-packed int4 and its scales/zeros, norms, biases); the device's kernel
layout is rebuilt from them at load (cheap) because it depends on the torch build.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from ..models.builtin import cache_root

# Bump when the quantized format or recipe changes.
QUANT_CACHE_VERSION = 1


def _digest_file(path: Path, memo: dict[str, str]) -> str:
    st = path.stat()
    key = f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}"
    if key not in memo:
        with open(path, "rb") as f:
            memo[key] = hashlib.file_digest(f, "sha256").hexdigest()
    return memo[key]


def content_digest(files: list[Path]) -> str:
    """SHA-256 over the files' own SHA-256s (memoised in the cache folder by path, size and mtime)."""
    memo_path = cache_root() / "quantized" / "digests.json"
    try:
        memo = json.loads(memo_path.read_text())
    except (OSError, ValueError):
        memo = {}
    before = len(memo)
    digests = [_digest_file(f, memo) for f in sorted(files)]
    if len(memo) != before:
        _atomic_write(memo_path, json.dumps(memo).encode())
    return hashlib.sha256("".join(digests).encode()).hexdigest()


def cache_file(files: list[Path], precision: str, group_size: int, fused: bool) -> Path:
    recipe = json.dumps([QUANT_CACHE_VERSION, content_digest(files), precision, group_size, fused])
    key = hashlib.sha256(recipe.encode()).hexdigest()[:24]
    return cache_root() / "quantized" / f"{precision}-g{group_size}-{key}.safetensors"


def load(path: Path) -> dict[str, torch.Tensor] | None:
    if not path.is_file():
        return None
    try:
        return load_file(str(path))
    except Exception:  # a truncated or foreign file: recompute (and overwrite) rather than fail the start
        return None


def save(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    """Atomically (readers see a whole file or none); tied tensors are stored once each name."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".q-", suffix=".safetensors", dir=path.parent)
    os.close(fd)
    try:
        save_file({k: v.detach().cpu().contiguous().clone() for k, v in tensors.items()}, tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".d-", dir=path.parent)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(tmp, 0o644)  # mkstemp makes it private; the cache is shared like pip's
    os.replace(tmp, path)
