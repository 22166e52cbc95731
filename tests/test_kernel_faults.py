"""Device faults the twin's kernels and the plan's static checks report, read from the catalogue.

cortex_m::transpose (backends/cortex_m/ops/op_transpose.cpp, `kMaxSupportedDims = 4`) fails with
"transpose_out: expected tensor rank in [1, 4], got N" for an input of rank 0 or above 4.
"""

from __future__ import annotations

import math

import pytest
import torch


def _raw(sizes, dtype=torch.int8):
    from kernels.reference import RawTensor

    nbytes = math.prod(sizes) * torch.tensor([], dtype=dtype).element_size()
    return RawTensor(dtype, tuple(sizes), tuple(range(len(sizes))), memoryview(bytearray(nbytes)))


def _transpose(sizes, perm):
    from kernels.reference import execute

    source = _raw(sizes)
    values = torch.arange(math.prod(sizes), dtype=torch.int64).remainder(251).sub(125)
    source.data[:] = values.to(torch.int8).numpy().tobytes()
    out = _raw([sizes[p] for p in perm])
    result = execute("cortex_m::transpose", "out", [source, list(perm), out])
    expected = values.to(torch.int8).reshape(sizes).permute(perm).contiguous()
    written = torch.frombuffer(bytearray(out.data), dtype=torch.int8).reshape(out.sizes)
    return result, expected, written


def test_twin_transpose_of_rank_5_is_a_device_fault():
    from partitioners.reasons import CATALOGUE

    result, expected, written = _transpose((1, 2, 3, 2, 2), (0, 2, 1, 3, 4))
    (fault,) = result.faults
    entry = CATALOGUE[fault.key]
    assert (fault.key, entry.kind, fault.check, fault.op) == (
        "transpose-rank", "device-fault", "kMaxSupportedDims", "cortex_m::transpose.out")
    assert fault.message == entry.template.format(op="cortex_m::transpose.out", rank=5,
                                                  max_rank=4)
    assert "rank 5" in fault.message and "[1, 4]" in fault.message
    # The value is still computed as if the check passed, so the rest stays comparable.
    assert torch.equal(written, expected)


@pytest.mark.parametrize("sizes, perm", [((2, 3), (1, 0)), ((1, 2, 3, 4), (0, 2, 3, 1))])
def test_twin_transpose_within_the_kernel_limit_has_no_fault(sizes, perm):
    result, expected, written = _transpose(sizes, perm)
    assert result.faults == ()
    assert torch.equal(written, expected)


def test_plan_and_twin_flag_the_unlegalized_rank_5_transpose(tmp_path):
    """shufflenet_small's channel shuffle is a 5-D int8 permute: without legalization it becomes
    cortex_m::transpose, which the plan marks on its row and the twin faults on when it runs."""
    from examples.user_models import model_spec
    from orchestrator.compilation.pipeline import compile_model
    from orchestrator.planning.planner import make_plan
    from orchestrator.sources.loader import load_calibration, load_model
    from orchestrator.target import resolve_target
    from orchestrator.verification.twin import load_twin
    from orchestrator.verification.twin_verify import device_inputs

    model = load_model(model_spec("shufflenet_small"))
    samples = load_calibration(None, model.example_inputs)
    compiled = compile_model(model, samples, resolve_target("corstone300", npu="none"),
                             legalize=False)
    plan = make_plan(compiled)
    rank_faults = [(row.kernel, fault) for row in plan.rows for fault in row.device_faults
                   if fault.key == "transpose-rank"]
    assert rank_faults
    for kernel, fault in rank_faults:
        assert kernel == "arm_transpose_s8"
        assert fault.message.startswith("cortex_m::transpose supports tensor rank 1 to 4, "
                                        "got rank 5")

    pte = tmp_path / "shufflenet_small.pte"
    pte.write_bytes(compiled.pte_bytes)
    twin = load_twin(pte)
    run = twin.run(device_inputs(twin, tuple(model.example_inputs)))
    twin_faults = [f for f in run.faults if f.key == "transpose-rank"]
    assert len(twin_faults) == len(rank_faults)
    assert {f.op for f in twin_faults} == {"cortex_m::transpose.out"}
    assert all("got rank 5" in f.message for f in twin_faults)


@pytest.mark.parametrize("shape6d, elem_size, sizes, key, fields", [
    # 2*3*5 = 30 bytes over 4 chunks of 8 bytes: not divisible
    ((1, 1, 1, 1, 4, 8), 1, (2, 3, 5), "npu-output-chunks", dict(tensor_bytes=30, chunk_count=4)),
    # 3 chunks of 10 bytes against Vela's 4-byte chunks
    ((1, 1, 1, 1, 3, 4), 1, (3, 10), "npu-output-chunk-bytes", dict(chunk=10, vela_chunk=4)),
    # 3 chunks of 12 bytes against Vela's 4-byte chunks: factor 3
    ((1, 1, 1, 1, 3, 4), 1, (3, 12), "npu-output-expansion", dict(factor=3, elem_size=1)),
])
def test_twin_npu_output_copy_faults_read_their_catalogue_entry(shape6d, elem_size, sizes, key,
                                                                fields):
    from types import SimpleNamespace

    from orchestrator.verification.twin import _copy_output
    from partitioners.reasons import CATALOGUE

    vela = SimpleNamespace(shape6d=shape6d, elem_size=elem_size,
                           nbytes=math.prod(d or 1 for d in shape6d) * elem_size)
    tensor = _raw(sizes)
    fault = _copy_output(bytes(vela.nbytes), vela, tensor, "EthosUBackend lowered_module_0", 1)
    assert (fault.key, fault.check) == (key, "output copy")
    assert fault.message == CATALOGUE[key].template.format(slot=1, **fields)
