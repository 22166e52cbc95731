"""A self-checking BundleIO `.bpte`: the `.pte` plus test inputs and the twin's outputs.

A firmware built with ExecuTorch's bundled-program support (the Arm executor runner's BundleIO
mode) loads the inputs, runs the method and compares its outputs with the expected ones, so the
device checks itself against the twin.

`BundledProgram` validates against an `ExecutorchProgramManager`, which a finished `.pte` no
longer has; it also accepts `pte_file_path`, taking the program bytes from the file unvalidated.
We use that, and do the validation ourselves: every bundled tensor carries the exact bytes and
dim_order of the program's input/output EValue as the twin laid them out. That matters because
`bundled_program.cpp::tensors_are_close` requires the expected output's strides (derived from
its dim_order) to equal the method output's, and a dim_order guessed from torch strides is
ambiguous for size-1 dims (DS-CNN's input is [1, 1, 49, 10] with dim_order (0, 2, 1, 3)).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from orchestrator.artifacts.files import atomic_write_bytes
from orchestrator.errors import UserError
from orchestrator.verification.twin import TwinRun, as_program, input_key
from orchestrator.verification.twin_verify import device_inputs, sample_inputs

METHOD_NAME = "forward"


def _patch(bundled_tensor, spec, data: bytes) -> None:
    bundled_tensor.dim_order = list(spec.dim_order)
    bundled_tensor.sizes = list(spec.sizes)
    bundled_tensor.data = data


def write_bundle(program, bpte_path, samples: int = 4, npu_model: str = "auto",
                 inputs=None, took: list | None = None) -> Path:
    """Write `bpte_path` with `samples` seeded inputs and the twin's outputs as expected values
    for the program (a loaded TwinProgram, or a `.pte` path);
    the twin computes the NPU partitions as `npu_model` chooses (orchestrator/verification/npu.py:
    "tosa" makes the partitions' TOSA graphs, what Vela was given, the expectation).

    Where a device's float values on a rounding boundary were found for a sample
    (`TwinProgram.device_floats`, verification/floats.py), that case's expectation takes them
    again; `took` (a list) receives (case, instructions taken, how the
    floats were found) for each."""
    from executorch.devtools.bundled_program.config import (  # lazy: heavy (executorch devtools)
        MethodTestCase, MethodTestSuite)
    from executorch.devtools.bundled_program.core import (  # lazy: heavy (executorch devtools)
        BundledProgram)
    from executorch.devtools.bundled_program.serialize import (  # lazy: heavy (executorch devtools)
        serialize_from_bundled_program_to_flatbuffer,
    )

    bpte_path = Path(bpte_path)
    if bpte_path.suffix != ".bpte":
        raise UserError(f"bundle '{bpte_path}' must end in .bpte")
    if not bpte_path.parent.is_dir():
        raise UserError(f"output folder '{bpte_path.parent}' does not exist")
    twin = as_program(program)
    twin.reset()  # a program with state: the cases are frames, from its initial state, as the
    # runner runs them in one loaded method
    if inputs is None:  # `samples` seeded inputs; else the samples given (model inputs)
        float_program, _ = twin.reference("float.pt2")
        inputs, _source = sample_inputs(float_program, samples, None)
    cases, runs = [], []
    for sample in inputs:
        program_inputs = device_inputs(twin, sample)
        stored = twin.device_floats.get(input_key(program_inputs))
        run: TwinRun = twin.run(program_inputs, npu=twin.npu_executor(npu_model),
                                device_floats=stored.values if stored else None)
        if run.took and took is not None:
            took.append((len(runs), len({t.instruction for t in run.took}), stored.origin))
        runs.append(run)
        cases.append(MethodTestCase(inputs=list(program_inputs), expected_outputs=list(run.outputs)))
    # Upstream reads the program from a file: hand it the bytes the twin ran and the manifest
    # checked, never the .pte again (it may have changed since).
    with tempfile.TemporaryDirectory(prefix="orchestrate-bundle-") as folder:
        pte_copy = Path(folder) / "program.pte"
        pte_copy.write_bytes(twin.pte_bytes)
        bundle = BundledProgram(None, [MethodTestSuite(METHOD_NAME, cases)],
                                pte_file_path=str(pte_copy))
        schema = bundle.serialize_to_schema()  # cached: the patches below are what gets serialized
    (suite,) = schema.method_test_suites
    for case, run in zip(suite.test_cases, runs):
        for value, spec, data in zip(case.inputs, twin.input_specs, run.input_bytes):
            _patch(value.val, spec, data)
        for value, spec, data in zip(case.expected_outputs, twin.output_specs, run.output_bytes):
            _patch(value.val, spec, data)
    flatbuffer = serialize_from_bundled_program_to_flatbuffer(bundle)
    atomic_write_bytes(bpte_path, flatbuffer)
    return bpte_path
