"""Shared values (orchestrator/compilation/share_values.py): equal read-only arguments name one
value, written values keep their own, and the program computes the same bytes."""

from __future__ import annotations

from executorch.exir import schema

from orchestrator.compilation.share_values import share_plan_values
from orchestrator.verification.twin import run_twin


def _plan(values, instructions, inputs=(), outputs=()):
    return schema.ExecutionPlan(
        name="forward", container_meta_type=schema.ContainerMetadata("", ""),
        values=[schema.EValue(v) for v in values], inputs=list(inputs), outputs=list(outputs),
        chains=[schema.Chain(list(inputs), list(outputs),
                             [schema.Instruction(schema.KernelCall(0, list(args)))
                              for args in instructions], [])],
        operators=[schema.Operator("executorch_prim::add", "Scalar")], delegates=[],
        non_const_buffer_sizes=[0])


def _vals(plan, call):
    return [plan.values[i].val for i in plan.chains[0].instructions[call].instr_args.args]


def test_equal_read_only_scalars_share_one_value_and_a_written_one_keeps_its_own():
    plan = _plan([schema.Int(1), schema.Int(1), schema.Int(1), schema.Int(1), schema.Int(1)],
                 [(0, 1, 2), (3, 4, 2)])
    before = [_vals(plan, i) for i in range(2)]
    record = share_plan_values(plan)
    assert (record.values_before, record.values_after) == (5, 2)
    args = [plan.chains[0].instructions[i].instr_args.args for i in range(2)]
    # both read-only pairs name the shared value; the written output (2) is still distinct
    assert args[0][0] == args[0][1] == args[1][0] == args[1][1] != args[0][2] == args[1][2]
    assert [_vals(plan, i) for i in range(2)] == before


def test_values_equal_to_python_but_not_to_the_runtime_stay_apart():
    plan = _plan([schema.Bool(True), schema.Int(1), schema.Double(0.0), schema.Double(-0.0),
                  schema.Null(), schema.Null(), schema.Int(7)],
                 [(0, 1, 2, 3, 4, 5, 6)])
    record = share_plan_values(plan)
    assert record.values_after == 6  # only the two Nulls became one
    vals = _vals(plan, 0)
    assert isinstance(vals[0], schema.Bool) and isinstance(vals[1], schema.Int)
    assert repr(vals[2].double_val) == "0.0" and repr(vals[3].double_val) == "-0.0"


def test_int_lists_share_after_their_items_and_unreferenced_values_go():
    plan = _plan([schema.Int(3), schema.Int(3), schema.IntList([0]), schema.IntList([1]),
                  schema.Int(99), schema.Int(0)],
                 [(2, 3, 5)])
    share_plan_values(plan)
    vals = _vals(plan, 0)
    args = plan.chains[0].instructions[0].instr_args.args
    assert args[0] == args[1]  # [Int 3] and [Int 3 (copy)] are one list now
    assert [plan.values[i].val.int_val for i in vals[0].items] == [3]
    assert all(getattr(v.val, "int_val", None) != 99 for v in plan.values)  # nothing used it


def test_the_pytree_specs_the_runtime_never_reads_are_emptied():
    plan = _plan([schema.Int(1), schema.Int(2)], [(0, 1)])
    plan.container_meta_type = schema.ContainerMetadata('[1, {"type": "builtins.tuple"}]',
                                                        '[1, {"type": null}]')
    record = share_plan_values(plan)
    assert record.container_metadata_bytes == 31 + 19
    # the table stays, so the deprecated Program::get_output_flattening_encoding finds a string
    assert plan.container_meta_type == schema.ContainerMetadata("", "")


def test_shared_program_is_smaller_and_computes_the_same_bytes(compiles, tmp_path):
    from orchestrator.artifacts.outputs import write_outputs
    from orchestrator.compilation.pipeline import compile_model
    from orchestrator.sources.loader import load_calibration, load_model
    from orchestrator.target import resolve_target

    shared, pte = compiles.get("ds-cnn", npu="none", cpu="cortex-m55", write=True)
    loaded = load_model("ds-cnn")
    calibration = load_calibration(None, loaded.example_inputs)
    unshared = compile_model(loaded, calibration,
                             resolve_target("corstone300", npu="none", cpu="cortex-m55"),
                             share_values=False, share_tables=False)  # as the emitter writes it
    before = tmp_path / "before.pte"
    write_outputs(unshared, before)
    assert len(shared.pte_bytes) < len(unshared.pte_bytes) - 6000  # 41,264 -> 34,448 B
    assert len(shared.program_view.values) < len(unshared.program_view.values) // 2
    for sample in calibration.samples[:2]:
        assert run_twin(pte, tuple(sample)).output_bytes == \
            run_twin(before, tuple(sample)).output_bytes


# Shared tables (orchestrator/compilation/share_tables.py): equal flatbuffer objects written
# once, a `.pte` ExecuTorch's own reader and runtime read as the same program.

def _tensor(sizes, dim_order, buffer=0, offset=None, scalar_type=None):
    from executorch.exir.scalar_type import ScalarType

    allocation = None if offset is None else schema.AllocationDetails(1, offset, 0)
    return schema.Tensor(scalar_type or ScalarType.CHAR, 0, list(sizes), list(dim_order), False,
                         0, buffer, allocation, schema.TensorShapeDynamism.STATIC)


def _pte(values, instructions, constants=(), **plan_fields):
    from executorch.exir._serialize._program import PTEFile

    plan = _plan(values, instructions)
    for name, value in plan_fields.items():
        setattr(plan, name, value)
    program = schema.Program(0, [plan], [schema.Buffer(b"")] +
                             [schema.Buffer(bytes(c)) for c in constants], [], [],
                             schema.SubsegmentOffsets(0, []), None, [])
    return PTEFile(program)


def _both_writers(pte):
    """(shared-tables bytes, ExecuTorch serializer bytes) of one PTEFile."""
    from orchestrator.compilation import share_tables, upstream_exir

    return share_tables.write_pte(pte), upstream_exir.write_pte(pte)


def test_equal_tensor_metadata_is_written_once_and_reads_back_to_the_same_program():
    from orchestrator.compilation import upstream_exir

    sizes = (1, 7, 11, 13)
    pattern = b"".join(n.to_bytes(4, "little") for n in sizes)  # the int32 `sizes` vector
    # four activations of one shape at two offsets: one `sizes` vector, two tensor tables
    pte = _pte([_tensor(sizes, (0, 2, 3, 1), offset=o) for o in (0, 4096, 0, 4096)],
               [(0, 1), (1, 2), (2, 3)])
    shared, upstream = _both_writers(pte)
    assert upstream.count(pattern) == 4 and shared.count(pattern) == 1
    assert len(shared) < len(upstream)
    assert upstream_exir.read_pte(shared).program == upstream_exir.read_pte(upstream).program


def test_every_schema_table_reads_back_as_the_executorch_serializer_writes_it():
    """Fields the zoo never sets (delegates, lists, moves, frames, devices) keep their slots."""
    from executorch.exir.backend.compile_spec_schema import CompileSpec
    from executorch.exir.scalar_type import ScalarType

    from orchestrator.compilation import upstream_exir

    # distinct non-default values in every field, so that two swapped slots read back wrong
    extra = schema.ExtraTensorInfo(3, "layer.weight", schema.TensorDataLocation.EXTERNAL,
                                   schema.DeviceType.CPU, 2)
    values = [_tensor((4, 3), (1, 0), buffer=1, scalar_type=ScalarType.FLOAT),
              _tensor((4, 3), (0, 1), offset=64), schema.Int(-(2 ** 40)), schema.Bool(True),
              schema.Double(float("inf")), schema.Double(0.125), schema.String("a string"),
              schema.IntList([2, 2]), schema.DoubleList([-0.0, 1.5]),
              schema.BoolList([True, False, True]), schema.TensorList([0, 1]),
              schema.OptionalTensorList([0, -1]), schema.Null()]
    values[0].extra_tensor_info = schema.ExtraTensorInfo(device_type=schema.DeviceType.CUDA)
    values[1].extra_tensor_info = extra
    values[1].storage_offset, values[1].layout = 5, 1
    values[1].shape_dynamism = schema.TensorShapeDynamism.DYNAMIC_UNBOUND
    delegates = [schema.BackendDelegate(
        name, schema.BackendDelegateDataReference(schema.DataLocation.INLINE, index),
        [CompileSpec("output_format", b"vela_bin_stream")])
        for index, name in enumerate(("EthosUBackend", "Other"))]
    pte = _pte(values, [(0, 1)], constants=[bytes(range(48))], delegates=delegates,
               non_const_buffer_device=[schema.NonConstBufferDevice(1, schema.DeviceType.CUDA,
                                                                    2)],
               non_const_buffer_sizes=[0, 128], inputs=[0], outputs=[1],
               container_meta_type=schema.ContainerMetadata("in", "out"))
    pte.program.version = 7
    pte.program.backend_delegate_data = [schema.BackendDelegateInlineData(bytes(range(37))),
                                         schema.BackendDelegateInlineData(b"other")]
    chain = pte.program.execution_plan[0].chains[0]
    chain.inputs, chain.outputs = [0], [1]
    chain.instructions += [schema.Instruction(schema.DelegateCall(0, [0, 1])),
                           schema.Instruction(schema.MoveCall(0, 1)),
                           schema.Instruction(schema.JumpFalseCall(3, 0)),
                           schema.Instruction(schema.FreeCall(1))]
    chain.stacktrace = [schema.FrameList([schema.Frame("model.py", 12, "forward", "x + 1")])]
    shared, upstream = _both_writers(pte)
    assert upstream_exir.read_pte(shared).program == upstream_exir.read_pte(upstream).program


def test_the_writers_schema_is_the_installed_program_fbs():
    import dataclasses
    import re
    from importlib import resources

    from orchestrator.compilation.share_tables import _TABLES, _UNIONS

    folder = resources.files("executorch.exir._serialize")
    text = "\n".join(re.sub(r"//.*", "", (folder / name).read_text())
                     for name in ("scalar_type.fbs", "program.fbs"))
    enums = dict(re.findall(r"enum\s+(\w+)\s*:\s*(\w+)", text))
    unions = {name: tuple(re.findall(r"\w+", body))
              for name, body in re.findall(r"union\s+(\w+)\s*{([^}]*)}", text)}
    tables = {}
    for name, body in re.findall(r"table\s+(\w+)\s*{([^}]*)}", text):
        fields = []
        for field, kind, attributes in re.findall(r"(\w+)\s*:\s*([\w\[\]]+)[^;(]*(\([^)]*\))?",
                                                  body):
            kind = enums.get(kind, kind)
            kind = "[" + enums.get(kind[1:-1], kind[1:-1]) + "]" if kind.startswith("[") else kind
            fields.append((field, kind, "force_align" in attributes))
        tables[name] = tuple(fields)
    ours = {name: tuple((field, kind.split(" ")[0] + ("]" if " " in kind else ""), " " in kind)
                        for field, kind in fields) for name, fields in _TABLES.items()}
    assert ours == tables
    assert _UNIONS == unions
    for name, fields in _TABLES.items():  # the writer reads each field by its schema name
        assert {f.name for f in dataclasses.fields(getattr(schema, name))} == \
            {field for field, _ in fields}


def test_constants_stay_16_byte_aligned_in_a_segment_that_starts_at_16_bytes():
    import struct

    from orchestrator.compilation import upstream_exir

    pte = _pte([_tensor((5,), (0,), buffer=1), _tensor((3,), (0,), buffer=2)], [(0, 1)],
               constants=[b"\x01" * 5, b"\x02" * 3])
    shared, upstream = _both_writers(pte)
    program_size, segment_base, segment_bytes = struct.unpack_from("<QQQ", shared, 16)
    assert segment_base % 16 == 0 and segment_base - program_size < 16
    assert struct.unpack_from("<QQ", upstream, 16)[1] % 128 == 0  # upstream's base
    assert shared[segment_base:segment_base + segment_bytes] == \
        b"\x01" * 5 + bytes(11) + b"\x02" * 3
    assert upstream_exir.read_pte(shared).program == upstream_exir.read_pte(upstream).program


def test_zoo_programs_are_the_serializers_programs_in_fewer_bytes(compiles):
    from orchestrator.artifacts.size import analyze
    from orchestrator.compilation import upstream_exir

    for npu in ("none", "ethos-u55-128"):
        compiled, pte = compiles.get("ds-cnn", npu=npu, cpu="cortex-m55", write=True)
        upstream = upstream_exir.write_pte(upstream_exir.read_pte(compiled.pte_bytes))
        assert upstream_exir.read_pte(compiled.pte_bytes).program == \
            upstream_exir.read_pte(upstream).program
        assert len(compiled.pte_bytes) < len(upstream)
    # CPU-only: 36,784 B -> 34,448 B; tables and padding 7,808 B -> 5,472 B
    report = analyze(compiles.get("ds-cnn", npu="none", cpu="cortex-m55", write=True)[1])
    assert report.metadata_and_padding_bytes < 5500 < 7808


def test_the_layout_names_every_byte_of_the_file(compiles):
    from orchestrator.compilation import share_tables, upstream_exir

    pte = _pte([_tensor((5,), (0,), buffer=1), _tensor((3,), (0,), buffer=2)], [(0, 1)],
               constants=[b"\x01" * 5, b"\x02" * 3])
    layout = share_tables.pte_layout(pte)
    assert sum(layout.values()) == len(share_tables.write_pte(pte))
    assert (layout["constants"], layout["padding between constants"]) == (8, 11)
    assert layout["extended header"] == 32 and layout["Tensor"] > 0
    # a zoo program: read back and laid out again, its bytes are accounted for to the byte
    compiled, _ = compiles.get("ds-cnn", npu="none", cpu="cortex-m55")
    again = upstream_exir.read_pte(compiled.pte_bytes)
    assert share_tables.write_pte(again) == compiled.pte_bytes
    assert sum(share_tables.pte_layout(again).values()) == len(compiled.pte_bytes)


def test_the_real_runtime_runs_both_writers_programs_to_the_same_bytes(compiles):
    from tests.device_tools import host_runtime_or_missing

    from orchestrator.compilation import upstream_exir
    from orchestrator.sources.loader import load_calibration, load_model

    compiled, _ = compiles.get("ds-cnn", npu="none", cpu="cortex-m55")
    upstream = upstream_exir.write_pte(upstream_exir.read_pte(compiled.pte_bytes))
    samples = load_calibration(None, load_model("ds-cnn").example_inputs).samples[:2]
    # the pybindings load with Verification::InternalConsistency: the flatbuffer verifier
    with host_runtime_or_missing() as runtime:
        for sample in samples:
            ours = runtime.run(compiled.pte_bytes, tuple(sample)).outputs
            theirs = runtime.run(upstream, tuple(sample)).outputs
            assert [o.numpy().tobytes() for o in ours] == [o.numpy().tobytes() for o in theirs]


def _values_length_at(pte: bytes) -> int:
    """Where the first plan's value-table length is: Program field 1 (execution_plan), its
    first table, ExecutionPlan field 2 (values)."""
    def child(table: int, slot: int) -> int:
        vtable = table - int.from_bytes(pte[table:table + 4], "little", signed=True)
        field = table + int.from_bytes(pte[vtable + 4 + 2 * slot:vtable + 6 + 2 * slot], "little")
        return field + int.from_bytes(pte[field:field + 4], "little")

    plans = child(int.from_bytes(pte[:4], "little"), 1)
    plan = plans + 4 + int.from_bytes(pte[plans + 4:plans + 8], "little")
    return child(plan, 2)


def test_the_runtime_verifier_accepts_shared_tables_and_refuses_a_broken_table(compiles):
    from kernels.upstream_runtime import verification_refusal

    for npu in ("none", "ethos-u55-128"):
        compiled, _ = compiles.get("ds-cnn", npu=npu, cpu="cortex-m55")
        assert verification_refusal(compiled.pte_bytes) is None
    # the verifier is really on: a value table that runs past the end of the file is refused
    broken = bytearray(compiled.pte_bytes)
    at = _values_length_at(broken)
    assert int.from_bytes(broken[at:at + 4], "little") == len(compiled.program_view.values)
    broken[at:at + 4] = (100_000).to_bytes(4, "little")
    assert verification_refusal(bytes(broken)) is not None
