"""Modules ExecuTorch tests its own backends with, which ended in an internal error or a
verify that could not run: each now compiles and passes every method, or is refused in one
line naming the op (tests/peer_symptom_models.py; the whole peer suite: benchmarks/peer_suite.py)."""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.cli import main
from tests.device_tools import host_runtime_or_missing, qemu_or_missing

MODELS = Path(__file__).resolve().parent / "peer_symptom_models.py"


def _verified(factory: str, tmp_path, capsys, *target: str) -> str:
    pte = tmp_path / f"{factory}.pte"
    assert main(["compile", f"{MODELS}:{factory}", *target, "-o", str(pte), "--quiet"]) == 0, \
        capsys.readouterr().err
    capsys.readouterr()
    code = main(["verify", str(pte), "--samples", "2"])
    out = capsys.readouterr().out
    assert code == 0, out
    return out


def _methods(out: str) -> dict[str, str]:
    found = {}
    for line in out.splitlines():
        for method in ("twin", "host runtime", "QEMU Cortex-M55"):
            if line.startswith(f"  {method}: "):
                found[method] = line.split(": ")[1]
    return found


def test_an_lstm_returning_its_tuple_verifies_on_every_method(tmp_path, capsys):
    """Its outputs are `output, (h, c)`: verify compares the program's three flat outputs with
    the model's nested ones (it raised AttributeError: 'tuple' object has no attribute 'float')."""
    host_runtime_or_missing().close()
    qemu_or_missing()
    out = _verified("lstm_tuple", tmp_path, capsys, "--npu", "none")
    assert _methods(out) == {"twin": "passed", "host runtime": "passed",
                             "QEMU Cortex-M55": "passed"}, out
    assert "output 2 " in out, out  # output, h and c: three program outputs compared


def test_an_index_with_whole_dimensions_runs_in_the_twin(tmp_path, capsys):
    """aten::index.Tensor_out with `Tensor?[]` indices holding None: the twin computed nothing
    (torch refused the list) and so no method ran; now all three pass."""
    host_runtime_or_missing().close()
    qemu_or_missing()
    out = _verified("index_none", tmp_path, capsys, "--npu", "none")
    assert _methods(out) == {"twin": "passed", "host runtime": "passed",
                             "QEMU Cortex-M55": "passed"}, out


def test_a_partition_the_arm_backend_cannot_lower_leaves_the_npu_with_its_words(tmp_path,
                                                                                 capsys):
    """The U55's TOSA lowering refuses the float constant a Linear + BatchNorm1d fold leaves
    (an internal error before): the partition's ops move to the CPU and the plan quotes the
    backend. What remains is refused by the device check in one line naming the op."""
    assert main(["plan", f"{MODELS}:linear_bn", "--npu", "ethos-u55-128", "--format",
                 "json", "-o", str(tmp_path / "plan.json"), "--quiet"]) == 0, \
        capsys.readouterr().err
    capsys.readouterr()
    rows = json.loads((tmp_path / "plan.json").read_text())["ops"]
    moved = [r for r in rows if any(reason.get("key") == "backend-refused-npu"
                                    for reason in r.get("reasons", []))]
    assert moved, rows
    assert all("the Arm backend could not lower" in reason["message"]
               for r in moved for reason in r["reasons"] if reason["key"] == "backend-refused-npu")
    code = main(["compile", f"{MODELS}:linear_bn", "--npu", "ethos-u55-128", "-o",
                 str(tmp_path / "lbn.pte"), "--quiet"])
    err = [line for line in capsys.readouterr().err.splitlines()
           if line.startswith("orchestrate: ")]
    assert code in (0, 2), err
    if code == 2:
        assert len(err) == 1 and "aten::addmm" in err[0], err
