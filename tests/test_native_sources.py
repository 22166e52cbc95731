"""`orchestrate sources fetch` gives a pip-installed user (no ../shared/third_party) the pinned
source trees, and every native build finds them there. Offline: the "upstream" repositories are
local git repositories holding the files the builds look for, pinned at their commits."""

from __future__ import annotations

import subprocess
from dataclasses import replace

import pytest

from kernels.native import sources as native_sources
from orchestrator.cli import main

MARKERS = {"executorch": "runtime/executor/method.cpp", "cmsis-nn": "Include/arm_nnfunctions.h",
           "flatbuffers": "include/flatbuffers/flatbuffers.h",
           "ethos-u-core-driver": "src/ethosu55_interface.h"}


def _git(*args, cwd):
    return subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=cwd,
                          check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture()
def mirrors(tmp_path, monkeypatch):
    """Four local repositories, PINNED at their commits, and a cache and no default sources."""
    pinned, urls = [], {}
    for source in native_sources.PINNED:
        repo = tmp_path / "mirrors" / source.name
        (repo / MARKERS[source.name]).parent.mkdir(parents=True)
        (repo / MARKERS[source.name]).write_text(f"// {source.name}\n")
        _git("init", "-q", cwd=repo)
        _git("config", "uploadpack.allowAnySHA1InWant", "true", cwd=repo)
        _git("add", ".", cwd=repo)
        _git("commit", "-q", "-m", "pinned", cwd=repo)
        commit = _git("rev-parse", "HEAD", cwd=repo)
        (repo / "later.txt").write_text("after the pinned commit\n")
        _git("add", ".", cwd=repo)
        _git("commit", "-q", "-m", "later", cwd=repo)
        pinned.append(replace(source, url=str(repo), commit=commit))
        urls[source.name] = str(repo)
    monkeypatch.setattr(native_sources, "PINNED", tuple(pinned))
    monkeypatch.setattr(native_sources, "DEFAULT_THIRD_PARTY", tmp_path / "no-shared")
    monkeypatch.setenv("ORCHESTRATE_CACHE_DIR", str(tmp_path / "cache"))
    for name in ("ORCHESTRATE_THIRD_PARTY", "ORCHESTRATE_EXECUTORCH_SRC",
                 "ORCHESTRATE_CMSIS_NN_SRC"):
        monkeypatch.delenv(name, raising=False)
    return urls


def test_fetch_clones_each_pinned_commit_and_the_builds_find_the_trees(mirrors, tmp_path,
                                                                       capsys):
    from kernels.runtime import find_sources
    from kernels.native.sources import find_third_party

    assert main(["sources", "fetch"]) == 0
    root = tmp_path / "cache" / "sources"
    for source in native_sources.PINNED:
        tree = root / source.name
        assert (tree / MARKERS[source.name]).is_file()
        assert not (tree / "later.txt").exists()  # the pinned commit, not the branch head
        assert native_sources.fetched_commit(tree) == source.commit
    assert find_third_party().root == root.resolve()
    sources = find_sources()
    assert sources.executorch_src == (root / "executorch").resolve()
    assert sources.cmsis_nn_src == (root / "cmsis-nn").resolve()
    capsys.readouterr()
    assert main(["sources", "fetch"]) == 0  # already there: nothing fetched again
    assert capsys.readouterr().out.count(": already at ") == len(native_sources.PINNED)
    assert main(["sources"]) == 0
    assert "orchestrate sources fetch" in capsys.readouterr().out


def test_a_mirror_without_the_pinned_commit_is_one_line_and_leaves_nothing(mirrors, tmp_path,
                                                                           capsys):
    other = tmp_path / "other"
    other.mkdir()
    (other / "x.txt").write_text("x\n")
    _git("init", "-q", cwd=other)
    _git("add", ".", cwd=other)
    _git("commit", "-q", "-m", "unrelated", cwd=other)
    assert main(["sources", "fetch", "--only", "cmsis-nn", "--from", f"cmsis-nn={other}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("orchestrate: error: sources fetch: ") and len(err.splitlines()) == 1
    root = tmp_path / "cache" / "sources"
    assert not root.exists() or list(root.iterdir()) == []
    assert main(["sources", "fetch", "--from", "cmsis-nn"]) == 2
    assert "is not NAME=URL" in capsys.readouterr().err
