"""The ProgramView (kernels/program_view.py) says what a compiled program holds, the way the
model, the artifacts folder and `orchestrate size` say it."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module")
def ds_cnn_u55(compiles):
    """ds-cnn on Corstone-300 with the U55-128: (Compiled, .pte path), shared with test_size."""
    return compiles.get("ds-cnn", "corstone300", "ethos-u55-128", write=True)


@pytest.fixture(scope="module")
def view(ds_cnn_u55):
    from kernels.program_view import ProgramView

    return ProgramView.read(ds_cnn_u55[1].read_bytes())


@pytest.fixture(scope="module", params=["ethos-u55-128", "none"])
def compiled_and_view(request, compiles):
    """ds-cnn fully delegated to the U55-128, and CPU-only on the M55 (constants in the .pte);
    both shared with test_size and test_golden."""
    from kernels.program_view import ProgramView

    compiled, pte = compiles.get("ds-cnn", "corstone300", request.param, "cortex-m55",
                                 write=True)
    return compiled, ProgramView.read(pte.read_bytes())


def test_inputs_and_outputs_have_the_dtypes_and_shapes_of_the_model(ds_cnn_u55, view):
    compiled, _ = ds_cnn_u55
    model = compiled.model
    with torch.no_grad():
        expected_out = model.module(*model.example_inputs)
    expected_out = expected_out if isinstance(expected_out, tuple) else (expected_out,)
    assert [(v.dtype, v.sizes) for v in view.input_values] == [
        (x.dtype, tuple(x.shape)) for x in model.example_inputs]
    assert [(v.dtype, v.sizes) for v in view.output_values] == [
        (y.dtype, tuple(y.shape)) for y in expected_out]
    assert all(v.is_planned and sorted(v.dim_order) == list(range(len(v.sizes)))
               for v in (*view.input_values, *view.output_values))


def test_every_kernel_call_is_an_operator_the_artifacts_list(ds_cnn_u55, view):
    _, pte = ds_cnn_u55
    listed = set((pte.with_name(pte.stem + ".artifacts") / "operators.txt").read_text().split())
    calls = list(view.kernel_calls())
    assert calls and {call.operator.qualified_name for call in calls} <= listed
    assert set(view.operator_names) == listed


def test_delegate_payloads_are_the_bytes_orchestrate_size_reports(ds_cnn_u55, view):
    from npu_driver.payload import parse_payload
    from orchestrator.artifacts.size import analyze

    _, pte = ds_cnn_u55
    report = analyze(pte)
    assert view.delegates and [(d.index, d.backend, len(d.payload)) for d in view.delegates] == [
        (d.index, d.backend, d.total) for d in report.delegates]
    data = pte.read_bytes()
    for delegate in view.delegates:
        assert delegate.inline and data.count(delegate.payload) == 1
        payload = parse_payload(delegate.payload)
        (call,) = [c for c in view.delegate_calls() if c.delegate_index == delegate.index]
        assert len(call.args) == len(payload.inputs) + len(payload.outputs)


def test_the_view_of_the_written_file_is_the_view_the_compile_held(compiled_and_view):
    compiled, view = compiled_and_view
    assert view == compiled.program_view
    assert view.arena_bytes == compiled.arena_bytes > 0


def test_every_tensor_lies_inside_its_buffer(compiled_and_view):
    compiled, view = compiled_and_view
    tensors = [v for v in view.values if v.is_tensor]
    assert any(v.is_planned for v in tensors)
    assert any(v.is_constant for v in tensors) == (compiled.target.npu is None)
    for value in tensors:
        start = value.storage_offset * value.element_bytes
        if value.is_planned:
            assert 0 < value.mem_id < len(view.non_const_buffer_sizes)
            assert value.mem_offset + start + value.nbytes <= view.non_const_buffer_sizes[
                value.mem_id], value
        elif value.is_constant:
            assert start + value.nbytes <= len(view.constant_buffers[value.buffer]), value


def test_instruction_arguments_name_values_of_the_program(view):
    count = len(view.values)
    for call in view.instructions:
        assert all(0 <= a < count for a in getattr(call, "args", ()))
    assert [c.index for c in view.instructions] == list(range(len(view.instructions)))


def test_bytes_that_are_not_a_program_are_refused():
    from kernels.program_view import ProgramView

    with pytest.raises(Exception):
        ProgramView.read(b"not a program at all" * 8)
