"""Where native builds keep their results and how a result gets there: one cache folder per kind
of build under the cache root (kernels/cache_root.py, $ORCHESTRATE_CACHE_DIR), keys that are
digests of every input, and writes that a reader never sees half done.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

from kernels.cache_root import cache_root


def build_cache(kind: str) -> Path:
    """The cache folder of one kind of build (`host_runtime`, `sources`, ...)."""
    return cache_root() / kind


def digest(*parts: str | bytes) -> str:
    """SHA-256 of `parts`, each terminated so ("ab", "c") and ("a", "bc") differ."""
    hashed = hashlib.sha256()
    for part in parts:
        hashed.update(part.encode() if isinstance(part, str) else part)
        hashed.update(b"\0")
    return hashed.hexdigest()


def tree_digest(paths: Iterable[Path], relative_to: Path) -> str:
    """Content digest of every file under `paths`, named relative to `relative_to`."""
    hashed = hashlib.sha256()
    for top in paths:
        files = [top] if top.is_file() else sorted(p for p in top.rglob("*") if p.is_file())
        for path in files:
            hashed.update(str(path.relative_to(relative_to)).encode() + b"\0")
            hashed.update(hashlib.sha256(path.read_bytes()).digest())
    return hashed.hexdigest()


def atomic_write(path: Path, data: bytes | str) -> None:
    """Write `path` through a temporary sibling, so a reader never sees half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data.encode() if isinstance(data, str) else data)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def publish_folder(staging: Path, out: Path) -> None:
    """Move a finished folder (one that holds a `done` file) into place; another process may
    have won the race."""
    try:
        os.replace(staging, out)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        if not (out / "done").is_file():
            raise
