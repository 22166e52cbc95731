"""Bad and hostile inputs: each is refused with exit 2 and one line, and nothing is written.

Every case runs the CLI in-process from inside its own temporary folder and compares that folder
before and after, byte for byte and modification time: a refused command leaves nothing behind
and overwrites nothing. Hostile files try to run `touch MARKER`; the marker must never appear.
A model `.py` is code and runs; everything else a command reads is data.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import shutil
import zipfile
from pathlib import Path

import pytest
import torch
from torch import nn

from orchestrator.cli import main

MARKER = "MARKER"


class _Hostile:
    """Unpickling this runs a shell command, as a booby-trapped file would."""

    def __init__(self, command: str):
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


def _torch_pickle(command: str) -> bytes:
    buffer = io.BytesIO()
    torch.save(_Hostile(command), buffer)
    return buffer.getvalue()


def _snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): (p.is_dir(), p.stat().st_mtime_ns,
                                         None if p.is_dir() else p.read_bytes())
            for p in sorted(folder.rglob("*"))}


def _run(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exit_request:  # argparse refuses bad option values by exiting
        return exit_request.code


def _refused(argv, folder: Path, capsys, *says: str, code: int = 2) -> str:
    """Run `argv` in `folder`; require `code`, one stderr line containing `says`, no change."""
    before = _snapshot(folder)
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        assert _run([str(a) for a in argv]) == code
    finally:
        os.chdir(cwd)
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("orchestrate: error: "), err
    for text in says:
        assert text in lines[0], lines[0]
    assert _snapshot(folder) == before
    assert not (folder / MARKER).exists()
    return lines[0]


# --- fixtures -------------------------------------------------------------------------------

class _Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x):
        return torch.relu(self.conv(x)).mean((2, 3))


@pytest.fixture(scope="module")
def saved_program(tmp_path_factory) -> Path:
    """A valid .pt2 of a tiny conv model, which hostile variants are made from."""
    path = tmp_path_factory.mktemp("pt2") / "tiny.pt2"
    torch.export.save(torch.export.export(_Tiny().eval(), (torch.randn(1, 3, 8, 8),)), path)
    return path


@pytest.fixture(scope="module")
def cpu_pte(compiles) -> Path:
    """The shared CPU-only ds-cnn program, compiled once per test session."""
    return compiles.get("ds-cnn", npu="none", write=True)[1]


def _copy_pte(pte: Path, folder: Path) -> Path:
    copy = folder / pte.name
    shutil.copy2(pte, copy)
    shutil.copytree(pte.with_name(pte.stem + ".artifacts"), folder / (pte.stem + ".artifacts"))
    return copy


def _rehash(pte: Path) -> None:
    """Record the artifacts' current SHA-256s in the manifest, as a hostile editor would, so the
    loaders behind the hash check are what a test exercises."""
    import hashlib

    folder = pte.with_name(pte.stem + ".artifacts")
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["files"] = {name: hashlib.sha256((folder / name).read_bytes()).hexdigest()
                         for name in manifest.get("files", {})}
    (folder / "manifest.json").write_text(json.dumps(manifest))


def _rewrite(src: Path, dst: Path, edit) -> Path:
    """Copy a .pt2, passing each member's (name, bytes) through `edit` (None drops it); an
    `edit.extra` dict adds members."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        root = zin.namelist()[0].split("/", 1)[0]
        for info in zin.infolist():
            data = edit(info.filename.split("/", 1)[1], zin.read(info.filename))
            if data is not None:
                zout.writestr(info, data)
        for name, data in getattr(edit, "extra", {}).items():
            zout.writestr(f"{root}/{name}", data)
    return dst


def _replace_member(member: str, data: bytes):
    return lambda name, old: data if name == member else old


def _edit_json(member: str, change):
    def edit(name, old):
        if name != member:
            return old
        document = json.loads(old)
        change(document)
        return json.dumps(document).encode()
    return edit


def _touch(folder: Path) -> str:
    return f"touch {folder / MARKER}"


# --- model sources --------------------------------------------------------------------------

def _model_file(folder: Path, body: str) -> Path:
    path = folder / "model.py"
    path.write_text("import sys\nimport torch\nfrom torch import nn\n" + body)
    return path


def test_missing_model_file(tmp_path, capsys):
    _refused(["compile", "missing.py:factory", "--npu", "none", "-o", "out.pte"], tmp_path, capsys,
             "model file not found", "missing.py")


def test_unknown_zoo_name(tmp_path, capsys):
    _refused(["compile", "no-such-net", "--npu", "none", "-o", "out.pte"], tmp_path, capsys,
             "unknown model 'no-such-net'", "ds-cnn")


def test_model_file_of_unsupported_type(tmp_path, capsys):
    (tmp_path / "model.h5").write_bytes(b"\x89HDF")
    _refused(["compile", "model.h5", "--npu", "none", "-o", "out.pte"], tmp_path, capsys,
             "unsupported file type")


def test_factory_raising_system_exit_0_is_an_error_not_a_success(tmp_path, capsys):
    _model_file(tmp_path, "def factory():\n    sys.exit(0)\n")
    _refused(["compile", "model.py:factory", "--npu", "none", "-o", "out.pte"], tmp_path, capsys,
             "model.py:factory() raised SystemExit")


def test_model_file_exiting_at_import(tmp_path, capsys):
    _model_file(tmp_path, "sys.exit(0)\n")
    _refused(["plan", "model.py:factory", "--npu", "none"], tmp_path, capsys,
             "importing", "raised SystemExit")


def test_forward_exiting_the_process(tmp_path, capsys):
    _model_file(tmp_path, "class M(nn.Module):\n    def forward(self, x):\n        sys.exit(0)\n"
                "def factory():\n    return M(), (torch.zeros(1, 4),)\n")
    _refused(["compile", "model.py:factory", "--npu", "none", "-o", "out.pte"], tmp_path, capsys,
             "forward on the example inputs raised SystemExit")


def test_forward_returning_none(tmp_path, capsys):
    _model_file(tmp_path, "class M(nn.Module):\n    def forward(self, x):\n        return None\n"
                "def factory():\n    return M(), (torch.zeros(1, 4),)\n")
    _refused(["compile", "model.py:factory", "--npu", "none", "-o", "out.pte"], tmp_path, capsys,
             "forward returned None", "return a tensor or a tuple of tensors")


def test_forward_raising(tmp_path, capsys):
    _model_file(tmp_path, "class M(nn.Module):\n    def forward(self, x):\n"
                "        return x @ torch.zeros(3, 3)\n"
                "def factory():\n    return M(), (torch.zeros(1, 4),)\n")
    _refused(["plan", "model.py:factory", "--npu", "none"], tmp_path, capsys,
             "forward on the example inputs raised RuntimeError")


def test_factory_returning_the_wrong_type(tmp_path, capsys):
    _model_file(tmp_path, "def factory():\n    return 42\n")
    _refused(["compile", "model.py:factory", "--npu", "none", "-o", "out.pte"], tmp_path, capsys,
             "returned int", "(nn.Module, example_inputs_tuple)")


# --- hostile .pt2 models: nothing in them may run --------------------------------------------

def test_pt2_whose_sample_inputs_pickle_runs_a_command(tmp_path, capsys, saved_program):
    hostile = _rewrite(saved_program, tmp_path / "hostile.pt2", _replace_member(
        "data/sample_inputs/model.pt", _torch_pickle(_touch(tmp_path))))
    _refused(["compile", hostile, "--npu", "none", "-o", "out.pte"], tmp_path, capsys,
             "member 'data/sample_inputs/model.pt'", "torch.load(weights_only=True) refuses",
             "posix.system")


def test_pt2_whose_pickled_weight_runs_a_command(tmp_path, capsys, saved_program):
    def pickled_weight(config):
        config["config"]["conv.weight"]["use_pickle"] = True

    def edit(name, old):
        if name == "data/weights/model_weights_config.json":
            return _edit_json(name, pickled_weight)(name, old)
        return _torch_pickle(_touch(tmp_path)) if name == "data/weights/weight_0" else old

    hostile = _rewrite(saved_program, tmp_path / "hostile.pt2", edit)
    _refused(["compile", hostile, "--npu", "none", "-o", "out.pte"], tmp_path, capsys,
             "member 'data/weights/weight_0'", "could run code")


def test_pt2_with_a_pickled_object_constant(tmp_path, capsys, saved_program):
    def add_object(config):
        config["config"]["thing"] = {"path_name": "opaque_obj_0", "is_param": False,
                                     "use_pickle": True, "tensor_meta": None}

    edit = _edit_json("data/constants/model_constants_config.json", add_object)
    edit.extra = {"data/constants/opaque_obj_0": pickle.dumps(_Hostile(_touch(tmp_path)))}
    hostile = _rewrite(saved_program, tmp_path / "hostile.pt2", edit)
    _refused(["compile", hostile, "--npu", "none", "-o", "out.pte"], tmp_path, capsys,
             "member 'data/constants/opaque_obj_0'", "pickled Python object")


def test_pt2_whose_symbolic_shape_string_is_code(tmp_path, capsys, saved_program):
    """torch parses symbolic sizes with sympy.sympify, which evaluates the string."""
    def symbolic(program):
        sizes = program["graph_module"]["graph"]["tensor_values"]["conv2d"]["sizes"]
        sizes[0] = {"as_expr": {"expr_str": f"__import__('os').system('{_touch(tmp_path)}')",
                                "hint": {"as_int": 1}}}

    hostile = _rewrite(saved_program, tmp_path / "hostile.pt2",
                       _edit_json("models/model.json", symbolic))
    _refused(["compile", hostile, "--npu", "none", "-o", "out.pte"], tmp_path, capsys,
             "member 'models/model.json'", "symbolic", "export with static shapes")


def test_pt2_whose_names_are_code(tmp_path, capsys, saved_program):
    """Names end up in the Python source torch.fx generates for the module."""
    evil = f'x=__import__("os").system("{_touch(tmp_path)}")'
    hostile = _rewrite(saved_program, tmp_path / "hostile.pt2", lambda name, old: (
        old.replace(b'{"name": "x"}', json.dumps({"name": evil}).encode())
        if name == "models/model.json" else old))
    _refused(["compile", hostile, "--npu", "none", "-o", "out.pte"], tmp_path, capsys,
             "member 'models/model.json'", "not a plain identifier")


def test_pt2_calling_a_python_function(tmp_path, capsys, saved_program):
    def call_system(program):
        node = program["graph_module"]["graph"]["nodes"][1]
        node["target"] = "torch.os.system"
        node["inputs"] = [{"name": "command", "arg": {"as_string": _touch(tmp_path)}, "kind": 1}]

    hostile = _rewrite(saved_program, tmp_path / "hostile.pt2",
                       _edit_json("models/model.json", call_system))
    _refused(["compile", hostile, "--npu", "none", "-o", "out.pte"], tmp_path, capsys,
             "calls 'torch.os.system', which is not a torch operator")


def test_pt2_carrying_aotinductor_native_code(tmp_path, capsys, saved_program):
    edit = _replace_member("", b"")
    edit.extra = {"data/aotinductor/model/model.so": b"\x7fELF"}
    hostile = _rewrite(saved_program, tmp_path / "hostile.pt2", edit)
    _refused(["compile", hostile, "--npu", "none", "-o", "out.pte"], tmp_path, capsys,
             "member 'data/aotinductor/model/model.so'", "AOTInductor")


def test_pt2_of_random_bytes(tmp_path, capsys):
    (tmp_path / "noise.pt2").write_bytes(bytes(range(256)) * 8)
    _refused(["compile", "noise.pt2", "--npu", "none", "-o", "out.pte"], tmp_path, capsys,
             "noise.pt2 is not a .pt2 archive written by torch.export.save")


# --- platform, target and calibration -------------------------------------------------------

def test_platform_yaml_that_does_not_parse(tmp_path, capsys):
    (tmp_path / "soc.yaml").write_text("name: [unclosed\n")
    _refused(["plan", "ds-cnn", "--platform", "soc.yaml"], tmp_path, capsys, "soc.yaml")


def test_platform_yaml_with_a_python_tag(tmp_path, capsys):
    (tmp_path / "soc.yaml").write_text(
        f"name: !!python/object/apply:os.system ['{_touch(tmp_path)}']\n")
    _refused(["plan", "ds-cnn", "--platform", "soc.yaml"], tmp_path, capsys, "soc.yaml")


def test_unknown_platform_name(tmp_path, capsys):
    _refused(["plan", "ds-cnn", "--platform", "corstone999"], tmp_path, capsys,
             "unknown platform 'corstone999'")


def test_unknown_npu(tmp_path, capsys):
    _refused(["compile", "ds-cnn", "--npu", "ethos-u99-7", "-o", "out.pte"], tmp_path, capsys,
             "ethos-u99-7")


def test_an_npu_of_another_shipped_platform_names_that_platform(tmp_path, capsys):
    _refused(["plan", "ds-cnn", "--npu", "ethos-u85-256"], tmp_path, capsys,
             "'ethos-u85-256' is not available on corstone300; allowed: ethos-u55-32")
    _refused(["plan", "ds-cnn", "--npu", "ethos-u85-256"], tmp_path, capsys,
             "--platform corstone320")


def test_unknown_cpu(tmp_path, capsys):
    _refused(["plan", "ds-cnn", "--cpu", "cortex-a53"], tmp_path, capsys, "cortex-a53")


def test_calibration_file_that_cannot_be_read(tmp_path, capsys):
    (tmp_path / "calib.pt").write_bytes(b"not a tensor file")
    _refused(["compile", "ds-cnn", "--npu", "none", "--calibration", "calib.pt", "-o", "out.pte"],
             tmp_path, capsys, "calib.pt cannot be read by torch.load(weights_only=True)")


def test_calibration_pickle_that_runs_a_command(tmp_path, capsys):
    (tmp_path / "calib.pt").write_bytes(_torch_pickle(_touch(tmp_path)))
    _refused(["compile", "ds-cnn", "--npu", "none", "--calibration", "calib.pt", "-o", "out.pte"],
             tmp_path, capsys, "weights_only=True")


def test_calibration_path_missing(tmp_path, capsys):
    _refused(["plan", "ds-cnn", "--calibration", "nowhere.npz"], tmp_path, capsys,
             "calibration path not found")


@pytest.mark.parametrize("value", ["0", "nan", "inf", "-5", "0.5", "fast"])
def test_cpu_clock_that_is_not_a_frequency(tmp_path, capsys, value):
    _refused(["compile", "ds-cnn", "--npu", "none", f"--cpu-hz={value}", "-o", "out.pte"],
             tmp_path, capsys, "argument --cpu-hz", repr(value))


def test_npu_clock_of_zero(tmp_path, capsys):
    _refused(["plan", "ds-cnn", "--npu-hz", "0"], tmp_path, capsys, "argument --npu-hz",
             "at least 1")


@pytest.mark.parametrize("value", ["150", "-1", "nan"])
def test_npu_coverage_gate_outside_0_to_100(tmp_path, capsys, value):
    _refused(["plan", "ds-cnn", f"--fail-under-npu-coverage={value}"], tmp_path, capsys,
             "argument --fail-under-npu-coverage", "give 0 to 100")


def test_negative_partition_gate(tmp_path, capsys):
    _refused(["plan", "ds-cnn", "--max-partitions=-1"], tmp_path, capsys,
             "argument --max-partitions", "give 0 or more")


def test_missing_runner_ops_file(tmp_path, capsys):
    _refused(["plan", "ds-cnn", "--runner-ops", "ops.txt"], tmp_path, capsys,
             "--runner-ops file 'ops.txt' not found")


def test_sweep_with_an_empty_npu_name(tmp_path, capsys):
    _refused(["sweep", "ds-cnn", "--npus", "ethos-u55-128,,none"], tmp_path, capsys,
             "has an empty name")


# --- outputs: checked before compiling, never replacing what is not ours -------------------

def test_plan_report_over_the_model_source_is_refused(tmp_path, capsys):
    shutil.copy2(Path(__file__).parents[1] / "examples" / "my_model.py", tmp_path / "m.py")
    _refused(["plan", "m.py:factory", "--npu", "none", "-o", "m.py"], tmp_path, capsys,
             "-o 'm.py' is the model file")


def test_plan_report_over_the_calibration_file_is_refused(tmp_path, capsys):
    torch.save(torch.zeros(1, 1, 49, 10), tmp_path / "calib.pt")
    _refused(["plan", "ds-cnn", "--calibration", "calib.pt", "-o", "calib.pt"], tmp_path, capsys,
             "is the calibration data")


def test_plan_report_and_pte_on_the_same_path_are_refused(tmp_path, capsys):
    _refused(["plan", "ds-cnn", "-o", "x.pte", "--pte", "x.pte"], tmp_path, capsys,
             "would overwrite each other")


def test_compile_output_that_is_a_folder(tmp_path, capsys):
    (tmp_path / "d.pte").mkdir()
    _refused(["compile", "ds-cnn", "--npu", "none", "-o", "d.pte"], tmp_path, capsys,
             "-o 'd.pte' is a folder")


def test_compile_output_not_ending_in_pte(tmp_path, capsys):
    _refused(["compile", "ds-cnn", "--npu", "none", "-o", "out.bin"], tmp_path, capsys,
             "must end in .pte")


def test_compile_into_a_missing_folder(tmp_path, capsys):
    _refused(["compile", "ds-cnn", "--npu", "none", "-o", "nowhere/out.pte"], tmp_path, capsys,
             "output folder 'nowhere' does not exist")


def test_compile_into_a_folder_that_cannot_be_written(tmp_path, capsys):
    # /proc refuses new files even to root, for whom permission bits would not.
    _refused(["compile", "ds-cnn", "--npu", "none", "-o", "/proc/out.pte"], tmp_path, capsys,
             "cannot write in output folder '/proc'")


def test_compile_output_name_too_long(tmp_path, capsys):
    _refused(["compile", "ds-cnn", "--npu", "none", "-o", "n" * 300 + ".pte"], tmp_path, capsys,
             "bytes the file system allows")


def test_compile_output_whose_artifacts_name_is_too_long(tmp_path, capsys):
    # The .pte name fits in 255 bytes; "<stem>.artifacts" beside it does not.
    _refused(["compile", "ds-cnn", "--npu", "none", "-o", "n" * 248 + ".pte"], tmp_path, capsys,
             ".artifacts", "bytes the file system allows")


def test_existing_user_folder_in_the_artifacts_place_is_not_replaced(tmp_path, capsys):
    (tmp_path / "out.artifacts").mkdir()
    (tmp_path / "out.artifacts" / "notes.txt").write_text("mine")
    _refused(["compile", "ds-cnn", "--npu", "none", "-o", "out.pte"], tmp_path, capsys,
             "'out.artifacts' exists and is a folder orchestrate did not write")


def test_existing_user_file_in_the_artifacts_place_is_not_renamed(tmp_path, capsys):
    (tmp_path / "out.artifacts").write_text("mine")
    _refused(["compile", "ds-cnn", "--npu", "none", "-o", "out.pte"], tmp_path, capsys,
             "'out.artifacts' exists and is a file orchestrate did not write")


def test_bundle_over_a_folder_is_refused(tmp_path, capsys):
    (tmp_path / "out.bpte").mkdir()
    _refused(["compile", "ds-cnn", "--npu", "none", "-o", "out.pte", "--bundle"], tmp_path,
             capsys, "--bundle 'out.bpte' is a folder")


def test_recompiling_replaces_our_artifacts_and_keeps_a_users_old_folder(tmp_path, compiles):
    from orchestrator.artifacts.outputs import write_outputs

    compiled, _ = compiles.get("ds-cnn", npu="none", write=True)
    pte = tmp_path / "out.pte"
    write_outputs(compiled, pte)
    (tmp_path / "out.artifacts" / "stale.txt").write_text("from an earlier compile")
    users = tmp_path / "out.artifacts.old"
    users.mkdir()
    (users / "keep.txt").write_text("mine")

    write_outputs(compiled, pte)

    assert (users / "keep.txt").read_text() == "mine"
    assert not (tmp_path / "out.artifacts" / "stale.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.artifacts", "out.artifacts.old",
                                                          "out.pte"]


# --- verify: the .pte and its artifacts are data ---------------------------------------------

def test_verify_a_missing_pte(tmp_path, capsys):
    _refused(["verify", "gone.pte"], tmp_path, capsys, "'gone.pte' not found")


def test_verify_a_pte_that_does_not_match_its_manifest(tmp_path, capsys, cpu_pte):
    pte = _copy_pte(cpu_pte, tmp_path)
    data = bytearray(pte.read_bytes())
    data[len(data) // 2] ^= 0x01
    pte.write_bytes(bytes(data))
    _refused(["verify", pte.name, "--samples", "1"], tmp_path, capsys,
             "does not match its artifacts", "re-run `orchestrate compile`")


def test_verify_without_a_manifest(tmp_path, capsys, cpu_pte):
    pte = _copy_pte(cpu_pte, tmp_path)
    (tmp_path / (pte.stem + ".artifacts") / "manifest.json").unlink()
    _refused(["verify", pte.name, "--samples", "1"], tmp_path, capsys, "manifest.json is missing")


def test_verify_with_float_reference_of_random_bytes(tmp_path, capsys, cpu_pte):
    pte = _copy_pte(cpu_pte, tmp_path)
    (tmp_path / (pte.stem + ".artifacts") / "float.pt2").write_bytes(os.urandom(4096))
    _refused(["verify", pte.name, "--samples", "1"], tmp_path, capsys,
             "float.pt2 was changed after compiling", "re-run `orchestrate compile`")
    _rehash(pte)
    _refused(["verify", pte.name, "--samples", "1"], tmp_path, capsys,
             "float.pt2 is not a .pt2 archive", "re-run `orchestrate compile`")


def test_verify_with_a_hostile_quantized_reference(tmp_path, capsys, cpu_pte):
    pte = _copy_pte(cpu_pte, tmp_path)
    reference = tmp_path / (pte.stem + ".artifacts") / "quantized.pt2"
    original = tmp_path / "original.pt2"
    reference.rename(original)
    _rewrite(original, reference, _replace_member("data/sample_inputs/model.pt",
                                                  _torch_pickle(_touch(tmp_path))))
    original.unlink()
    _rehash(pte)
    _refused(["verify", pte.name, "--samples", "1"], tmp_path, capsys,
             "quantized.pt2: refusing to load member 'data/sample_inputs/model.pt'")


def test_verify_with_a_hostile_float_reference_shape_string(tmp_path, capsys, cpu_pte):
    pte = _copy_pte(cpu_pte, tmp_path)
    reference = tmp_path / (pte.stem + ".artifacts") / "float.pt2"
    original = tmp_path / "original.pt2"
    reference.rename(original)

    def symbolic(program):
        values = program["graph_module"]["graph"]["tensor_values"]
        name = next(iter(values))
        values[name]["sizes"][0] = {"as_expr": {
            "expr_str": f"__import__('os').system('{_touch(tmp_path)}')", "hint": {"as_int": 1}}}

    _rewrite(original, reference, _edit_json("models/model.json", symbolic))
    original.unlink()
    _rehash(pte)
    _refused(["verify", pte.name, "--samples", "1"], tmp_path, capsys, "float.pt2")


def test_verify_with_a_zero_timeout(tmp_path, capsys, cpu_pte):
    pte = _copy_pte(cpu_pte, tmp_path)
    _refused(["verify", pte.name, "--fvp", "--timeout", "0"], tmp_path, capsys,
             "argument --timeout")


def test_shared_pte_fixture_still_matches_its_manifest(cpu_pte):
    manifest = json.loads((cpu_pte.with_name(cpu_pte.stem + ".artifacts") / "manifest.json")
                          .read_text())
    assert manifest["pte"]["sha256"] == hashlib.sha256(cpu_pte.read_bytes()).hexdigest()


_UNEXPORTABLE = '''
import torch
from torch import nn


class Branchy(nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            return x * 2
        return x - 1


class NonZero(nn.Module):
    def forward(self, x):
        return torch.nonzero(x > 0).float().sum(0)


def branchy():
    return Branchy(), (torch.randn(1, 4),)


def nonzero():
    return NonZero(), (torch.randn(1, 4),)
'''


def test_a_failed_export_is_one_line_without_the_graph_dump(tmp_path, capsys):
    (tmp_path / "m.py").write_text(_UNEXPORTABLE)
    _refused(["plan", "m.py:branchy", "--npu", "none"], tmp_path, capsys,
             "torch.export could not capture model", "Data-dependent branching")


def test_a_data_dependent_output_shape_is_an_unsupported_model_error(tmp_path, capsys):
    (tmp_path / "m.py").write_text(_UNEXPORTABLE)
    _refused(["plan", "m.py:nonzero", "--npu", "none"], tmp_path, capsys,
             "node nonzero", "data-dependent output shape", "fixed-size form")
