"""Where the bytes of a .pte go, and the dead constants upstream leaves in it."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module")
def ds_cnn_m55_both(compiles, tmp_path_factory):
    """DS-CNN for CPU-only Cortex-M55, as compiled (pruned) and as upstream serializes it."""
    from orchestrator.artifacts.outputs import write_outputs
    from orchestrator.compilation.pipeline import compile_model
    from orchestrator.sources.loader import load_calibration, load_model
    from orchestrator.target import resolve_target

    _, pruned = compiles.get("ds-cnn", "corstone300", "none", "cortex-m55", write=True)
    model = load_model("ds-cnn")
    upstream = compile_model(model, load_calibration(None, model.example_inputs),
                             resolve_target("corstone300", npu="none", cpu="cortex-m55"),
                             prune_constants=False)
    path = tmp_path_factory.mktemp("unpruned") / "ds_cnn_upstream.pte"
    write_outputs(upstream, path)
    return pruned, path


def test_upstream_serializes_constants_no_instruction_reads(ds_cnn_m55_both):
    from orchestrator.artifacts.size import analyze

    _, upstream = ds_cnn_m55_both
    report = analyze(upstream)
    # The float scales/zero points and original-layout weights that quantization folding and
    # the Cortex-M layout passes replaced: unused BUFFER placeholders, kept by ExecuTorch 1.5.1.
    assert report.dead_values > 0 and report.constant_bytes_dead > 7_000  # 7,728 B measured


def test_the_compile_ships_no_dead_constant_and_verifies_bit_exactly(ds_cnn_m55_both):
    from orchestrator.artifacts.size import analyze
    from orchestrator.verification.twin import load_twin

    pruned, upstream = ds_cnn_m55_both
    after, before = analyze(pruned), analyze(upstream)
    assert after.dead_values == 0 and after.constant_bytes_dead == 0
    assert after.constant_bytes_live == before.constant_bytes_live
    assert after.total_bytes < before.total_bytes - before.constant_bytes_dead
    # Same program: every output byte equal on the same inputs.
    sample = (torch.randn(1, 1, 49, 10, generator=torch.Generator().manual_seed(1)),)
    a, b = load_twin(pruned).run(sample), load_twin(upstream).run(sample)
    assert a.output_bytes == b.output_bytes


def test_size_categories_add_up_to_the_file(ds_cnn_m55_both, compiles):
    from orchestrator.artifacts.size import analyze

    _, u55 = compiles.get("ds-cnn", "corstone300", "ethos-u55-128", write=True)
    for pte in (*ds_cnn_m55_both, u55):
        report = analyze(pte)
        assert (report.constant_bytes_live + report.constant_bytes_dead + report.delegate_bytes
                + report.metadata_and_padding_bytes) == report.total_bytes == pte.stat().st_size
    report = analyze(u55)
    assert report.delegates and all(
        d.command_stream + d.weights + d.other == d.total and d.command_stream > 0
        for d in report.delegates)
