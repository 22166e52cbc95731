"""Shared, session-scoped compiles: each (model, target) is compiled once for the whole run."""

from __future__ import annotations

import warnings

import pytest

import orchestrator  # noqa: F401 - pins host numerics before torch is imported

warnings.filterwarnings("ignore")


class CompileCache:
    def __init__(self, tmp_factory):
        self._cache = {}
        self._tmp = tmp_factory

    def get(self, model: str, platform: str = "corstone300", npu: str | None = None,
            cpu: str | None = None, io: str = "float", write: bool = False):
        """(Compiled, pte_path or None); `npu='none'` for CPU-only."""
        from orchestrator.artifacts import write_outputs
        from orchestrator.pipeline import compile_model
        from orchestrator.sources import load_calibration, load_model
        from orchestrator.target import resolve_target

        key = (model, platform, npu, cpu, io)
        if key not in self._cache:
            target = resolve_target(platform, npu=npu, cpu=cpu, io=io)
            loaded = load_model(model)
            compiled = compile_model(loaded, load_calibration(None, loaded.example_inputs), target)
            self._cache[key] = [compiled, None]
        entry = self._cache[key]
        if write and entry[1] is None:
            out = self._tmp.mktemp("pte") / f"{model}_{npu or 'default'}_{cpu or 'default'}_{io}.pte"
            write_outputs(entry[0], out)
            entry[1] = out
        return entry[0], entry[1]


@pytest.fixture(scope="session")
def compiles(tmp_path_factory) -> CompileCache:
    return CompileCache(tmp_path_factory)
