"""A16W8 per module (--precision): int16 activations where a user asks for them, on NPU targets
(CPU-only: tests/test_precision_cpu_only.py), through every method (tests/precision_models.py:
conv -> linear -> a Gram matrix -> linear, the Gram module raised to a16w8)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from orchestrator import api
from orchestrator.compilation import precision
from orchestrator.errors import UserError
from orchestrator.request import Request, resolve
from partitioners.policy import parse_policy
from tests.device_tools import passes_twin_host_runtime_and_qemu

MODEL = "tests/precision_models.py:conv_gram_linear"
RAISED = "gram=a16w8"


@pytest.fixture(scope="module")
def u55(tmp_path_factory):
    out = tmp_path_factory.mktemp("precision") / "gram_u55.pte"
    return api.compile(MODEL, out, npu="ethos-u55-128", precision=RAISED)


@pytest.fixture(scope="module")
def u85(tmp_path_factory):
    out = tmp_path_factory.mktemp("precision") / "gram_u85.pte"
    return api.compile(MODEL, out, platform="corstone320", npu="ethos-u85-256",
                       precision=RAISED)


@pytest.fixture(scope="module")
def digits_conv(tmp_path_factory):
    """The trained digits CNN on the U55-128 with its second convolution raised: an int16
    convolution inside the NPU partition (int16 IFM and OFM in Vela's command stream)."""
    from examples.digits import write_sets

    calibration, _ = write_sets(tmp_path_factory.mktemp("digits"))
    out = tmp_path_factory.mktemp("precision") / "digits_u55.pte"
    return api.compile("examples/digits.py:cnn", out, npu="ethos-u55-128",
                       calibration=str(calibration), precision="features.2=a16w8")


def _rows(result, module: str):
    return [r for r in result.plan.rows if r.module == module and r.kind == "op"]


def test_the_raised_modules_ops_compute_in_int16_and_the_others_in_int8(u55, u85):
    """On the U55 the Gram matrix's int16 product leaves the NPU (it multiplies int8
    activations only) and runs in float between int16 conversions; on the U85 it stays on the
    NPU in int16. Every other module's ops are int8 on both."""
    (bmm,) = [r for r in _rows(u55, "gram") if "bmm" in r.op]
    assert bmm.placement == "portable" and bmm.precision == "float"
    keys = [reason.key for reason in bmm.reasons]
    assert keys == ["npu-operator-support", "no-s16-operator"]
    assert "int16" in bmm.reasons[0].message
    wide = [r for r in u55.plan.rows if r.kind != "op" and "int16" in r.dtypes]
    assert {r.precision for r in wide} == {"a16w8"} and len(wide) >= 5
    (bmm85,) = [r for r in _rows(u85, "gram") if "bmm" in r.op]
    assert bmm85.placement == "npu" and bmm85.dtypes == "int16,int16 -> int16"
    assert bmm85.precision == "a16w8"
    for result in (u55, u85):
        others = [r for r in result.plan.rows if r.kind == "op" and r.module != "gram"]
        assert others and {r.precision for r in others} == {"a8w8"}


def test_int8_int16_boundaries_are_plan_rows_where_they_run(u55, u85):
    requantizes = [(r.placement, r.partition, r.dtypes) for r in u55.plan.rows
                   if r.kind == "requantize"]
    # the int8 tokens and their transpose become int16 at the end of partition 0; the int16
    # product meets the int8 head inside partition 1
    assert requantizes == [("npu", 0, "int8 -> int16"), ("npu", 0, "int8 -> int16"),
                           ("npu", 1, "int16 -> int8")]
    assert [r.dtypes for r in u85.plan.rows if r.kind == "requantize"] == \
        ["int8 -> int16", "int8 -> int16", "int16 -> int8"]
    text = u55.plan.to_text(width=100)
    ops = [r for r in u55.plan.rows if r.kind == "op"]
    int8_ops = sum(1 for r in ops if r.precision == "a8w8")
    assert f"precision (gram=a16w8): ops a8w8 {int8_ops}, float 1; int8<->int16 " \
           "requantizes: 2 on NPU p0, 1 on NPU p1" in text
    assert max(len(line) for line in text.splitlines()) <= 100


def test_plan_json_and_html_show_each_ops_precision(u55):
    import jsonschema

    from orchestrator.reports.coverage import SCHEMA_PATH

    document = json.loads((u55.artifacts / "plan.json").read_text())
    jsonschema.validate(document, json.loads(SCHEMA_PATH.read_text()))
    assert document["calibration"]["precision"] == {"gram": "a16w8"}
    assert {op["precision"] for op in document["ops"]} >= {"a8w8", "a16w8", "float"}
    assert all(op["precision"] for op in document["ops"] if op["kind"] != "npu-invocation")
    html = (u55.artifacts / "report.html").read_text()
    assert ">precision</th>" in html and ">a16w8</td>" in html
    manifest = json.loads((u55.artifacts / "manifest.json").read_text())
    assert manifest["calibration"]["precision"] == {"gram": "a16w8"}


def test_the_int16_values_are_int16_in_the_pte(u55):
    """The .pte's own tensors: partition 0 hands the CPU two int16 tensors, the CPU hands
    partition 1 one, and the quantizes and dequantizes on the CPU take dtype int16."""
    from kernels.program_view import ProgramView

    view = ProgramView.read(u55.pte.read_bytes())
    first, second = view.delegate_calls()
    outputs = [view.values[i] for i in first.args[1:]]
    assert [(v.dtype, v.sizes) for v in outputs] == [(torch.int16, (1, 4, 8)),
                                                     (torch.int16, (1, 8, 4))]
    assert view.values[second.args[0]].dtype == torch.int16
    wide_calls = [c for c in view.kernel_calls() if c.operator.name.startswith("cortex_m::")
                  and "quantize_per_tensor" in c.operator.name
                  and view.values[c.args[5]].scalar == 2]  # ExecuTorch's ScalarType Short
    assert len(wide_calls) == 3  # two dequantizes before the product, one quantize after


def test_the_mixed_program_passes_the_twin_the_host_runtime_and_qemu(u55):
    passes_twin_host_runtime_and_qemu(u55.pte)


def test_the_u85_program_passes_the_twin_the_host_runtime_and_qemu(u85):
    passes_twin_host_runtime_and_qemu(u85.pte)


def test_an_int16_convolution_runs_in_the_functional_model_as_the_tosa_graph_does(digits_conv):
    """The raised convolution reads and writes int16 on the NPU; the twin and the host runtime
    execute Vela's command stream in the functional model, each invocation checked byte for
    byte against the TOSA reference model (--npu-model both), and QEMU agrees with the twin."""
    (conv,) = _rows(digits_conv, "features.2")
    assert conv.placement == "npu" and conv.dtypes == "int16,int8,int32 -> int16"
    assert conv.precision == "a16w8"
    assert {r.precision for r in _rows(digits_conv, "features.0")} == {"a8w8"}
    import orchestrator

    report = orchestrator.verify(digits_conv.pte, samples=4, npu_model="both")
    assert report.passed, report.verdict
    assert "functional model" in report.method and "byte for byte" in report.method
    passes_twin_host_runtime_and_qemu(digits_conv.pte)


def test_a_requantize_on_the_cpu_is_a_dequantize_and_a_quantize_row(tmp_path):
    """With the int8 projection and the Gram module forced to the CPU, the int8 tokens become
    int16 on the CPU: both halves of each requantize are `requantize` rows on CMSIS-NN's
    quantize kernels, and the program passes every method."""
    from partitioners.policy import Policy, Selector

    policy = Policy(source="test", force_cpu=Selector(modules=("proj", "gram")))
    result = api.compile(MODEL, tmp_path / "cpu.pte", npu="ethos-u55-128", precision=RAISED,
                         policy=policy)
    cpu = [(r.op.split(".")[-2], r.dtypes) for r in result.plan.rows
           if r.kind == "requantize" and r.placement == "cmsis-nn"]
    assert cpu == [("dequantize_per_tensor", "int8 -> float32"),
                   ("quantize_per_tensor", "float32 -> int16")] * 2
    assert all(r.reasons[0].key == "requantize" for r in result.plan.rows
               if r.kind == "requantize" and r.placement == "cmsis-nn")
    passes_twin_host_runtime_and_qemu(result.pte)


def test_the_twin_checks_int16_values_in_int16_steps(u55):
    import orchestrator

    report = orchestrator.verify(u55.pte, samples=4, per_op=True)
    assert report.passed, report.verdict
    assert "int8/int16 (each value in steps of its own dtype)" in report.verdict


@pytest.mark.parametrize("given, says", [
    ("gram", "write MODULE=PRECISION"),
    ("gram=a32w8", "precision 'a32w8' for gram is not offered"),
    ("gram=a16w8,gram=a8w8", "is given two precisions"),
])
def test_bad_precision_syntax_is_one_line(given, says):
    with pytest.raises(UserError, match=says):
        precision.parse(given)


def test_an_unknown_module_names_the_closest(tmp_path):
    with pytest.raises(UserError, match="no module 'grm'.*did you mean gram"):
        api.plan(MODEL, npu="ethos-u55-128", precision="grm=a16w8")


def test_a_bad_precision_value_exits_2_with_one_line():
    done = subprocess.run([sys.executable, "-m", "orchestrator.cli", "plan", MODEL,
                           "--precision", "gram=int16"], capture_output=True, text=True)
    assert done.returncode == 2
    lines = [line for line in done.stderr.splitlines() if line.startswith("orchestrate")]
    assert lines == ["orchestrate: error: --precision: precision 'int16' for gram is not "
                     "offered; use one of a8w8, a16w8"]


def test_a_policys_precision_map_and_the_command_line_merge_per_module():
    policy = parse_policy({"precision": {"gram": "a16w8", "proj": "a16w8"}}, "p.yaml")
    resolved = resolve(Request(MODEL, npu="ethos-u55-128", policy=policy,
                               precision="proj=a8w8"))
    assert dict(resolved.precision) == {"gram": "a16w8", "proj": "a8w8"}
    with pytest.raises(UserError, match="policy p.yaml: precision: precision 'wide'"):
        resolve(Request(MODEL, npu="ethos-u55-128",
                        policy=parse_policy({"precision": {"gram": "wide"}}, "p.yaml")))


def test_the_precision_is_part_of_the_cache_key(u55):
    from dataclasses import replace

    from orchestrator.artifacts import cache

    compiled = u55.plan.compiled
    key = cache.quantized_key(compiled.model, compiled.calibration, compiled.target, True, True)
    plain = cache.quantized_key(compiled.model, replace(compiled.calibration, precision=()),
                                compiled.target, True, True)
    assert key != plain


def test_an_a16w8_lstm_on_the_u85_is_compiled_unchained_and_its_stream_equals_tosa(
        tmp_path, capsys):
    """lstm_classifier with its LSTM raised, on U85-256: 30 lookups on 16-bit activations, each
    a 2 KiB table filling the LUT memory. Chained, Vela 5.1 loads two of one group's tables
    into the one slot before the group runs (tests/test_u85_lut_reload.py shows it through
    upstream's flow), so the compile passes --disable-chaining, says so in the plan, and the
    Ethos-U85 model's bytes equal the TOSA graph's; verify --npu-model both passes it."""
    import numpy as np

    from npu_driver.ethos_u import run_partition
    from npu_driver.tosa_twin import run_tosa
    from orchestrator.cli import main
    from orchestrator.verification.twin import load_twin

    out = tmp_path / "lstm16.pte"
    result = api.compile("examples/user_models.py:lstm_classifier", out,
                         platform="corstone320", npu="ethos-u85-256", precision="lstm=a16w8")
    (fix,) = [w for w in result.compiled.workarounds if "--disable-chaining" in w.message]
    assert "30 lookups run on 16-bit activations" in fix.message
    # one partition per step of the recurrence (partitioners/repeated_steps.py), each with the
    # LSTM cell's sigmoid and tanh tables
    partitions = load_twin(out).partitions
    assert len(partitions) >= 6
    rng = np.random.default_rng(3)
    for partition in {p.payload: p for p in partitions}.values():
        arrays = [rng.integers(np.iinfo(s.numpy_type).min, np.iinfo(s.numpy_type).max,
                               size=s.shape, endpoint=True).astype(s.numpy_type)
                  for s in partition.io.inputs]
        got, _ = run_partition(partition.payload, arrays, "ethos-u85-256")
        assert got == [a.tobytes() for a in run_tosa(partition.tosa_bytes, partition.io, arrays)]
    assert main(["verify", str(out), "--runtime", "twin", "--npu-model", "both",
                 "--samples", "2"]) == 0
