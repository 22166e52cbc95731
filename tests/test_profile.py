"""Per-op profiles from the runner (`verify --qemu --profile`, an ExecuTorch ETDump) and the plan
beside them (`plan --measured`): the file reads back with ExecuTorch's own reader, its figures
say what they count (instructions retired under QEMU, never cycles), every CPU row gets its
measured figure, and a profile of another program is refused in one line.

The QEMU tests skip with "not run: ..." without the toolchain, QEMU or the sources, and fail
under CI=true (tests/device_tools.py). The runner's trace build is cached like the plain one.
"""

from __future__ import annotations

import io
import json
import re
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest



def _cli(*argv: str) -> tuple[int, str, str]:
    from orchestrator.cli import main

    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def _etdump(path: Path):
    from executorch.devtools.etdump.serialize import deserialize_from_etdump_flatcc

    return deserialize_from_etdump_flatcc(path.read_bytes())  # size-prefixed, as ETDumpGen's


def _kernel_calls(pte: Path):
    from kernels.program_view import ProgramView

    return list(ProgramView.read(pte.read_bytes()).kernel_calls())


def test_a_qemu_profile_reads_back_with_executorchs_reader(ds_cnn_cpu, ds_cnn_profile):
    etdp, out = ds_cnn_profile
    calls = _kernel_calls(ds_cnn_cpu)
    untraced = [int(m[1].replace(",", "")) for m in
                re.finditer(r"case \d+: PASS, ([\d,]+) instructions", out)]
    etdump = _etdump(etdp)
    assert len(etdump.run_data) == len(untraced) == 4  # one run per inference
    for run, instructions in zip(etdump.run_data, untraced):
        events = [e.profile_event for e in run.events if e.profile_event is not None]
        kernels = [e for e in events if e.name.startswith("native_call_")]
        operator_calls = [e for e in events if e.name == "OPERATOR_CALL"]
        # One event per kernel call, at its instruction, named for the program's operator.
        assert [(e.chain_index, e.instruction_id) for e in operator_calls] == \
            [(0, call.index) for call in calls]
        assert [e.name.removeprefix("native_call_") for e in kernels] == \
            [f"{c.operator.name.split('::')[-1]}.{c.operator.overload}" for c in calls]
        measured = sum(e.end_time - e.start_time for e in operator_calls)
        assert measured == pytest.approx(instructions, rel=0.03)
        execute = next(e for e in events if e.name == "Method::execute")
        said = json.loads(bytes(execute.delegate_debug_metadata))
        assert said["clock"] == "instructions retired, QEMU -icount"
        assert said["unit"] == "instructions"


def test_verify_profile_names_instructions_retired_never_cycles(ds_cnn_cpu, ds_cnn_profile):
    etdp, out = ds_cnn_profile
    profile_lines = [line for line in out.splitlines() if line.startswith("profile:")]
    assert any(f"wrote {etdp}" in line for line in profile_lines), out
    figures = [line for line in profile_lines if "Method::execute" in line]
    assert figures and "instructions retired, QEMU -icount" in figures[0], out
    assert not any("cycles" in line for line in profile_lines), out
    table_header = next(line for line in out.splitlines() if line.strip().startswith("instr "))
    assert "instructions retired, QEMU -icount" in table_header


def test_plan_measured_shows_measured_beside_modelled_for_every_cpu_row(ds_cnn_cpu,
                                                                        ds_cnn_profile):
    etdp, _ = ds_cnn_profile
    code, out, err = _cli("plan", str(ds_cnn_cpu), "--measured", str(etdp))
    assert code == 0, err
    plan = json.loads(ds_cnn_cpu.with_suffix(".artifacts").joinpath("plan.json").read_text())
    cpu_rows = [i for i, op in enumerate(plan["ops"]) if op["placement"] != "npu"]
    assert len(cpu_rows) == len(_kernel_calls(ds_cnn_cpu))
    lines = out.splitlines()
    for row in cpu_rows:
        cells = next(line for line in lines if re.match(rf"\s*{row}\s+\d+\s", line)).split()
        modelled = f"{plan['ops'][row]['cost']['cycles']:,}"
        assert modelled in cells, (row, cells)
        assert re.fullmatch(r"[\d,]+", cells[-2]) and re.fullmatch(r"[\d.]+", cells[-1]), cells
    assert "measured: instructions retired, QEMU -icount; profile" in out
    assert re.search(r"total, \d+ CPU rows .*model [\d,]+ cycles", " ".join(out.split()))
    assert "model: the plan's cost models: CPU rows in CPU cycles at 32 MHz" in out


def test_plan_measured_json_has_a_measured_block_per_op_and_follows_the_schema(
        ds_cnn_cpu, ds_cnn_profile):
    import jsonschema

    from orchestrator.reports.coverage import SCHEMA_PATH

    etdp, _ = ds_cnn_profile
    code, out, err = _cli("plan", str(ds_cnn_cpu), "--measured", str(etdp), "--format", "json")
    assert code == 0, err
    document = json.loads(out)
    jsonschema.validate(document, json.loads(SCHEMA_PATH.read_text()))
    measured = [op["measured"] for op in document["ops"]]
    assert all(m["unit"] == "instructions" and m["value"] > 0 for m in measured)
    summary = document["summary"]["measured"]
    assert summary["kernel_calls"]["measured"] == sum(m["value"] for m in measured)
    assert summary["clock"] == "instructions retired, QEMU -icount"
    assert summary["runs"] == 4 and summary["method_execute"] >= summary["kernel_calls"]["measured"]


def test_a_profile_of_another_program_is_refused(compiles, ds_cnn_profile):
    etdp, _ = ds_cnn_profile
    # The same model with int8 I/O: no boundary quantize/dequantize, another program.
    _, other = compiles.get("ds-cnn", "corstone300", "none", "cortex-m55", io="int8", write=True)
    code, out, err = _cli("plan", str(other), "--measured", str(etdp))
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1, err
    assert "is of another program" in err


def test_a_device_profile_of_other_operators_is_refused(ds_cnn_cpu, ds_cnn_profile, tmp_path):
    """An ETDumpGen profile names no program: its instructions and kernels decide."""
    from executorch.devtools.etdump.serialize import serialize_to_etdump_flatcc

    etdp, _ = ds_cnn_profile
    etdump = _etdump(etdp)
    for run in etdump.run_data:
        for event in run.events:
            profile = event.profile_event
            profile.delegate_debug_metadata = b""
            if profile.name.startswith("native_call_") and profile.instruction_id == 4:
                profile.name = "native_call_quantized_add.out"
    device = tmp_path / "device.etdp"
    device.write_bytes(serialize_to_etdump_flatcc(etdump))  # unprefixed: read too
    code, out, err = _cli("plan", str(ds_cnn_cpu), "--measured", str(device))
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1, err
    assert "is not of this program: instruction 4 ran quantized_add.out" in err


def test_a_device_profile_of_this_program_names_no_clock_it_does_not_know(ds_cnn_cpu,
                                                                           ds_cnn_profile,
                                                                           tmp_path):
    from executorch.devtools.etdump.serialize import serialize_to_etdump_flatcc

    etdp, _ = ds_cnn_profile
    etdump = _etdump(etdp)
    for run in etdump.run_data:
        for event in run.events:
            event.profile_event.delegate_debug_metadata = b""
    device = tmp_path / "device.etdp"
    device.write_bytes(serialize_to_etdump_flatcc(etdump))
    code, out, err = _cli("plan", str(ds_cnn_cpu), "--measured", str(device))
    assert code == 0, err
    assert "device ticks: the profile does not name its clock" in " ".join(out.split())
    assert "matched to this program by its instructions" in " ".join(out.split())


def _no_operator_events(path: Path) -> Path:
    from executorch.devtools.etdump import schema_flatcc as schema
    from executorch.devtools.etdump.serialize import serialize_to_etdump_flatcc

    event = schema.Event(profile_event=schema.ProfileEvent(
        name="Method::execute", chain_index=-1, instruction_id=0, delegate_debug_id_int=-1,
        delegate_debug_id_str="", delegate_debug_metadata=b"", start_time=0, end_time=10),
        allocation_event=None, debug_event=None)
    etdump = schema.ETDumpFlatCC(version=0, run_data=[schema.RunData(
        name="Execute", bundled_input_index=-1, allocators=[], events=[event])])
    path.write_bytes(serialize_to_etdump_flatcc(etdump))
    return path


def _text(path: Path) -> Path:
    path.write_text("not a profile")
    return path


@pytest.mark.parametrize("make, says", [
    (lambda folder: folder / "missing.etdp", "not found"),
    (lambda folder: _text(folder / "text.etdp"), "is not an ETDump"),
    (lambda folder: _no_operator_events(folder / "empty.etdp"), "has no operator events"),
])
def test_an_unreadable_or_empty_profile_is_one_line(ds_cnn_cpu, tmp_path, make, says):
    code, out, err = _cli("plan", str(ds_cnn_cpu), "--measured", str(make(tmp_path)))
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and says in err, err


def test_profile_is_a_qemu_option(ds_cnn_cpu):
    code, out, err = _cli("verify", str(ds_cnn_cpu), "--profile")
    assert code == 2 and "add --qemu" in err
