"""What every native build of orchestrate shares: where the third-party sources are, how many
jobs to run, how inputs are hashed into a cache key and how a result is written.

Used by the host runtime (kernels/host_runtime/build.py, kernels/runtime.py) and the Corstone
runner firmware (platforms/qemu.py); a new native part (a release firmware, a native helper)
uses it too, so one environment variable means one thing everywhere:

    ORCHESTRATE_THIRD_PARTY     a folder holding executorch/, cmsis-nn/, flatbuffers/,
                                ethos-u-core-driver/ (default: ../shared/third_party beside
                                this repository)
    ORCHESTRATE_EXECUTORCH_SRC  one tree, overriding the folder above (likewise
    ORCHESTRATE_CMSIS_NN_SRC    ..._CMSIS_NN_SRC)
    ORCHESTRATE_BUILD_JOBS      parallel compile jobs (default: min(2, cores))
    ORCHESTRATE_CACHE_DIR       the cache root every build keeps a subfolder of
                                (kernels/cache_root.py)

Source trees are read where they lie and never copied into the project.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

from kernels.cache_root import cache_root

THIRD_PARTY_ENV = "ORCHESTRATE_THIRD_PARTY"
JOBS_ENV = "ORCHESTRATE_BUILD_JOBS"
TREE_ENVS = {"executorch": "ORCHESTRATE_EXECUTORCH_SRC", "cmsis-nn": "ORCHESTRATE_CMSIS_NN_SRC"}
REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_THIRD_PARTY = REPO_ROOT.parent / "shared" / "third_party"
MAX_DEFAULT_JOBS = 2


def third_party_root(root: str | Path | None = None) -> tuple[Path, str]:
    """The folder of source trees and where that choice came from: `root`, else
    $ORCHESTRATE_THIRD_PARTY, else ../shared/third_party."""
    if root:
        return Path(root).expanduser().resolve(), "argument"
    if os.environ.get(THIRD_PARTY_ENV):
        return Path(os.environ[THIRD_PARTY_ENV]).expanduser().resolve(), \
            f"${THIRD_PARTY_ENV}"
    return DEFAULT_THIRD_PARTY.resolve(), "repository default"


def source_tree(name: str, given: str | Path | None = None,
                root: str | Path | None = None) -> tuple[Path, str]:
    """One tree (`executorch`, `cmsis-nn`, ...): `given`, else its own variable
    ($ORCHESTRATE_EXECUTORCH_SRC, ...), else `<third-party root>/<name>`; with the origin."""
    if given:
        return Path(given).expanduser().resolve(), "argument"
    env = TREE_ENVS.get(name)
    if env and os.environ.get(env):
        return Path(os.environ[env]).expanduser().resolve(), f"${env}"
    base, origin = third_party_root(root)
    return base / name, origin


def build_jobs() -> int:
    """Parallel compile jobs: $ORCHESTRATE_BUILD_JOBS, else min(2, cores)."""
    named = os.environ.get(JOBS_ENV)
    if named and named.isdigit() and int(named) > 0:
        return int(named)
    return max(1, min(MAX_DEFAULT_JOBS, os.cpu_count() or 1))


def build_cache(kind: str) -> Path:
    """The cache folder of one kind of build (`host_runtime`, `firmware`, ...)."""
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
