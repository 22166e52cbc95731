"""Where the third-party sources of every native build are: the folder, each tree, the pinned
commits `orchestrate sources fetch` clones, and the content digest of what a firmware reads.

One environment variable means one thing to the host runtime (kernels/native/host.py), the
runner firmware (kernels/native/runner.py) and `orchestrate firmware`'s projects:

    ORCHESTRATE_THIRD_PARTY     a folder holding executorch/, cmsis-nn/, flatbuffers/,
                                ethos-u-core-driver/ (default: ../shared/third_party beside
                                a checkout of this repository, else what `orchestrate sources
                                fetch` cloned into <cache>/sources)
    ORCHESTRATE_EXECUTORCH_SRC  one tree, overriding the folder above (likewise
    ORCHESTRATE_CMSIS_NN_SRC    ..._CMSIS_NN_SRC)

Source trees are read where they lie and never copied into the project.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from kernels.native.cache import build_cache, tree_digest
from kernels.native.errors import ThirdPartySourcesNotFound

THIRD_PARTY_ENV = "ORCHESTRATE_THIRD_PARTY"
TREE_ENVS = {"executorch": "ORCHESTRATE_EXECUTORCH_SRC", "cmsis-nn": "ORCHESTRATE_CMSIS_NN_SRC"}
REPO_ROOT = Path(__file__).resolve().parent.parent.parent
# A checkout has its pyproject.toml beside the packages; an installed wheel (site-packages) has
# no "beside this repository", so there the default is only the fetched trees.
IN_CHECKOUT = (REPO_ROOT / "pyproject.toml").is_file()
DEFAULT_THIRD_PARTY = REPO_ROOT.parent / "shared" / "third_party"


@dataclass(frozen=True)
class PinnedSource:
    """One upstream tree at the commit the native builds are made and tested with."""

    name: str  # the folder name under a third-party root
    url: str
    commit: str


# The commits of ../shared/third_party (its README), which `sources fetch` clones for a
# pip-installed user who has no such folder.
PINNED = (
    PinnedSource("executorch", "https://github.com/pytorch/executorch.git",
                 "cff6f4dd32e630945b7188512c1f2b4f102b05ad"),
    PinnedSource("cmsis-nn", "https://github.com/ARM-software/CMSIS-NN.git",
                 "dbf45dbfcc515421dd6099037d3e2637b90748c8"),
    PinnedSource("flatbuffers", "https://github.com/google/flatbuffers.git",
                 "595bf0007ab1929570c7671f091313c8fc20644e"),
    PinnedSource("ethos-u-core-driver",
                 "https://github.com/pytorch-labs/ethos-u-core-driver-mirror.git",
                 "e79714ad3ee3862adbd49cdc1715ca55de19ec7e"),
)
SOURCE_RECORD = "ORCHESTRATE_SOURCE.txt"  # url and commit of a fetched tree


class SourceFetchError(RuntimeError):
    """A pinned tree could not be fetched (no git, unreachable, the commit is not there)."""


def fetched_root() -> Path:
    """Where `orchestrate sources fetch` puts the pinned trees."""
    return build_cache("sources")


def third_party_root(root: str | Path | None = None) -> tuple[Path, str]:
    """The folder of source trees and where that choice came from: `root`, else
    $ORCHESTRATE_THIRD_PARTY, else ../shared/third_party beside a checkout, else the fetched
    trees (also when nothing was fetched: that is where `orchestrate sources fetch` puts them)."""
    if root:
        return Path(root).expanduser().resolve(), "argument"
    if os.environ.get(THIRD_PARTY_ENV):
        return Path(os.environ[THIRD_PARTY_ENV]).expanduser().resolve(), \
            f"${THIRD_PARTY_ENV}"
    if IN_CHECKOUT and DEFAULT_THIRD_PARTY.is_dir():
        return DEFAULT_THIRD_PARTY.resolve(), "beside the checkout"
    if fetched_root().is_dir() and any(fetched_root().iterdir()):
        return fetched_root().resolve(), "orchestrate sources fetch"
    return fetched_root().resolve(), "nothing fetched yet"


def sources_hint() -> str:
    """What to do when a source tree is missing: the one sentence every such message ends with."""
    return (f"set ${THIRD_PARTY_ENV} to a folder holding executorch/, cmsis-nn/, flatbuffers/ and "
            "ethos-u-core-driver/, or run `orchestrate sources fetch`; `orchestrate doctor` "
            "shows what this machine can run")


def fetched_commit(folder: Path) -> str | None:
    """The commit a fetched tree records, or None (not fetched by us)."""
    record = folder / SOURCE_RECORD
    if not record.is_file():
        return None
    fields = dict(line.split("=", 1) for line in record.read_text().splitlines() if "=" in line)
    return fields.get("commit")


def _git(args: list[str], cwd: Path) -> str:
    try:
        done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True,
                              timeout=3600, env={**os.environ, "GIT_TERMINAL_PROMPT": "0"})
    except FileNotFoundError:
        raise SourceFetchError("git is not installed (apt-get install git)") from None
    except subprocess.TimeoutExpired:
        raise SourceFetchError(f"git {args[0]} took more than an hour") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        raise SourceFetchError(last)
    return done.stdout.strip()


def fetch_source(source: PinnedSource, url: str | None = None,
                 into: Path | None = None) -> tuple[Path, bool]:
    """Clone `source` at its pinned commit into `into` (default: fetched_root()) from `url`
    (default: the upstream URL; a local mirror works). Returns (folder, fetched now); a tree
    already there at the commit is kept. Written to a temporary sibling and renamed."""
    root = Path(into) if into else fetched_root()
    final = root / source.name
    if fetched_commit(final) == source.commit:
        return final, False
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{source.name}-", dir=root))
    origin = url or source.url
    try:
        _git(["init", "-q"], staging)
        try:  # one commit's worth: servers (and local mirrors) allow fetching a commit by id
            _git(["fetch", "-q", "--depth", "1", origin, source.commit], staging)
        except SourceFetchError:
            _git(["fetch", "-q", origin], staging)  # a server that refuses: everything
        try:
            _git(["checkout", "-q", "--detach", source.commit], staging)
        except SourceFetchError:
            raise SourceFetchError(f"{origin} does not have commit {source.commit}") from None
        head = _git(["rev-parse", "HEAD"], staging)
        if head != source.commit:
            raise SourceFetchError(f"{origin} gave {head}, not {source.commit}")
        shutil.rmtree(staging / ".git")
        (staging / SOURCE_RECORD).write_text(f"url={origin}\ncommit={source.commit}\n")
        if final.exists():
            shutil.rmtree(final)
        staging.rename(final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return final, True


def fetch_sources(urls: dict[str, str] | None = None, into: Path | None = None,
                  names: Iterable[str] | None = None,
                  log: Callable[[str], None] | None = None) -> Path:
    """Every pinned tree (or `names`), each from `urls[name]` when given; the root they are in."""
    wanted = set(names) if names else {s.name for s in PINNED}
    unknown = wanted - {s.name for s in PINNED}
    if unknown:
        raise SourceFetchError(f"unknown source tree(s) {', '.join(sorted(unknown))}; the "
                               f"pinned ones are {', '.join(s.name for s in PINNED)}")
    root = Path(into) if into else fetched_root()
    made = [folder for folder in (root.parent, root) if not folder.exists()]
    try:
        for source in PINNED:
            if source.name in wanted:
                folder, fetched = fetch_source(source, (urls or {}).get(source.name), root)
                if log:
                    log(f"{source.name}: {'fetched' if fetched else 'already'} at "
                        f"{source.commit[:12]} in {folder}")
    except BaseException:
        # A fetch that got nothing (offline, a bad mirror) leaves no empty folder behind: an
        # empty sources folder would read as "fetched" to the next lookup.
        for folder in reversed(made):
            try:
                folder.rmdir()  # only when empty
            except OSError:
                break
        raise
    return root


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


@dataclass(frozen=True)
class ThirdParty:
    """The source trees a firmware is compiled from."""

    root: Path
    executorch: Path
    cmsis_nn: Path
    flatbuffers: Path
    ethos_u_driver: Path  # the Ethos-U core driver (only an NPU build needs it)


def find_third_party(root: str | Path | None = None) -> ThirdParty:
    """The source snapshot: `root`, else $ORCHESTRATE_THIRD_PARTY, else ../shared/third_party."""
    base, origin = third_party_root(root)
    needed = {
        "executorch": base / "executorch" / "runtime" / "executor" / "method.cpp",
        "cmsis-nn": base / "cmsis-nn" / "Include" / "arm_nnfunctions.h",
        "flatbuffers": base / "flatbuffers" / "include" / "flatbuffers" / "flatbuffers.h",
    }
    missing = [name for name, marker in needed.items() if not marker.is_file()]
    if missing:
        raise ThirdPartySourcesNotFound(
            f"no {', '.join(missing)} sources in {base} ({origin}); {sources_hint()}"
        )
    return ThirdParty(base, base / "executorch", base / "cmsis-nn", base / "flatbuffers",
                      base / "ethos-u-core-driver")


def source_tree_digest(third_party: ThirdParty) -> str:
    """The content digest of every source tree a firmware build reads."""
    et = third_party.executorch
    return tree_digest(
        [et / "runtime", et / "kernels", et / "backends/cortex_m", et / "devtools/bundled_program",
         et / "extension", et / "schema", et / "codegen", third_party.cmsis_nn / "Include",
         third_party.cmsis_nn / "Source", third_party.flatbuffers / "include"],
        third_party.root,
    )
