"""Each step of a compile runs once: what `benchmarks/compile_speed.py` measures against the
plain upstream flow depends on it (the speed itself is the benchmark's, never a test's)."""

from __future__ import annotations

import collections

import pytest
import torch


@pytest.fixture(scope="module")
def counted_compile():
    from executorch.exir import EdgeProgramManager

    from kernels.runtime import HostRuntime
    from orchestrator.compilation.pipeline import compile_model
    from orchestrator.sources.loader import load_calibration, load_model
    from orchestrator.target import resolve_target

    counts: collections.Counter = collections.Counter()

    def counting(owner, name):
        upstream = getattr(owner, name)

        def wrapper(*args, **kwargs):
            counts[name] += 1
            return upstream(*args, **kwargs)

        return upstream, wrapper

    patches = [(torch.export, "export"), (EdgeProgramManager, "to_executorch"),
               (HostRuntime, "run"), (torch.export.ExportedProgram, "run_decompositions")]
    saved = []
    for owner, name in patches:
        upstream, wrapper = counting(owner, name)
        saved.append((owner, name, upstream))
        setattr(owner, name, wrapper)
    try:
        model = load_model("ds-cnn")
        compiled = compile_model(model, load_calibration(None, model.example_inputs),
                                 resolve_target("corstone300", npu="ethos-u55-128"))
    finally:
        for owner, name, upstream in saved:
            setattr(owner, name, upstream)
    return compiled, counts


def test_a_compile_exports_twice_serializes_once_and_runs_on_the_device_once(
        counted_compile):
    compiled, counts = counted_compile
    if compiled.cache_hit:  # capture and quantization came from the on-disk cache
        assert counts["export"] == 0
    else:  # the float model, and the quantized one
        assert counts["export"] == 2
    assert counts["to_executorch"] == 1
    assert counts["run"] == (1 if compiled.device_run and compiled.device_run.ran else 0)
    # to_edge's own decompositions, as in upstream's flow (3 for ds-cnn on the U55)
    assert counts["run_decompositions"] <= 3


def test_vela_runs_once_per_npu_partition(counted_compile):
    from partitioners.npu import npu_delegates

    compiled, _ = counted_compile
    delegates = npu_delegates(compiled.final_program, compiled.lowered.vela_runs)
    assert len(compiled.lowered.vela_runs) == len(delegates) == 2
