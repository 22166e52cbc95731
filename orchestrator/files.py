"""Writing outputs so that a failed run leaves nothing half-written, with the user's usual modes."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def publish_mode(path: Path) -> None:
    """`mkstemp`/`mkdtemp` create 0600/0700 entries; give them the modes a plain write would."""
    base = 0o777 if Path(path).is_dir() else 0o666
    os.chmod(path, base & ~_umask())


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write to a temporary sibling, then rename over `path`."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=".orchestrate-", suffix=path.suffix, dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        publish_mode(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
