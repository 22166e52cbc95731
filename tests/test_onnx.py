"""An `.onnx` from another framework's exporter (TensorFlow/Keras through tf2onnx, quantized by
ONNX Runtime into QDQ form: tests/data/onnx/make.py) becomes one `.pte`: a float file is
calibrated like any model, a QDQ file keeps its scales, and the program is held against ONNX
Runtime running the same file. Malformed files are refused in one line (exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.device_tools import compile_refused_in_one_line

DATA = Path(__file__).resolve().parent / "data" / "onnx"


def _ort(path: Path, x: np.ndarray) -> np.ndarray:
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x})[0]


def _program_outputs(pte: Path, xs) -> list[np.ndarray]:
    import torch

    from orchestrator.device_runs.accuracy import _as_float
    from orchestrator.device_runs.combined import load_program
    from orchestrator.verification.twin_verify import device_inputs

    program = load_program(pte)
    npu = program.npu_executor("auto")
    return [_as_float(program, 0, program.run(device_inputs(program, (torch.from_numpy(x),)),
                                             npu=npu).outputs[0]).numpy() for x in xs]


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    import orchestrator

    folder = tmp_path_factory.mktemp("onnx")
    made = {}
    for name, target in (("digits_mlp_qdq", "ethos-u55-128"), ("digits_cnn_qdq", "ethos-u55-128"),
                         ("digits_cnn_qdq", "none")):
        out = folder / f"{name}_{target}.pte"
        orchestrator.compile(str(DATA / f"{name}.onnx"), out, npu=target)
        made[name, target] = out
    return made


def test_qdq_file_on_the_npu_computes_what_onnx_runtime_computes(compiled):
    """The QDQ MLP's scales and per-channel weights kept: on the U55 every output value equals
    ONNX Runtime's on the file (64 digits)."""
    features = np.load(DATA / "digits_test_features.npz")["input0"][:64].astype(np.float32)
    ours = _program_outputs(compiled["digits_mlp_qdq", "ethos-u55-128"], features)
    theirs = [_ort(DATA / "digits_mlp_qdq.onnx", x) for x in features]
    assert max(float(np.abs(a - b).max()) for a, b in zip(ours, theirs)) == 0.0


@pytest.mark.parametrize("target", ["ethos-u55-128", "none"])
def test_qdq_cnn_keeps_its_accuracy_and_its_reference(compiled, target):
    """The QDQ CNN (convolutions, depthwise, max and global average pools, Gemm, softmax): the
    program agrees with its quantized reference (default verify by the twin) and classifies the
    held-out digits as well as ONNX Runtime does on the file, within 3 points."""
    from orchestrator.device_runs.combined import verify_all

    pte = compiled["digits_cnn_qdq", target]
    verdict = verify_all(pte, samples=4, methods=("twin",))
    assert verdict.exit_code == 0, verdict.render_text()
    data = np.load(DATA / "digits_test_images.npz")
    images, labels = data["input0"][:150].astype(np.float32), data["labels"][:150]
    ours = np.array([o.argmax() for o in _program_outputs(pte, images)])
    theirs = np.array([_ort(DATA / "digits_cnn_qdq.onnx", x).argmax() for x in images])
    assert abs(float((ours == labels).mean()) - float((theirs == labels).mean())) <= 0.03
    assert (ours == theirs).mean() >= 0.95


def test_a_bias_follows_the_programs_input_scale(compiled):
    """ONNX Runtime quantizes the CNN's input after its Reshape (1/255) and its Gemm's input
    after the global average pool, ranges upstream's quantizer shares with their producers: each
    bias is pinned to the scales its layer is given (input x weight), not to the file's, or the
    NPU adds it at the wrong scale (top-1 10% on the U55 when the file's bias scales were
    kept)."""
    import torch

    from orchestrator.device_runs.combined import load_program

    _, reference = load_program(compiled["digits_cnn_qdq", "ethos-u55-128"]).reference(
        "quantized.pt2")
    checked = 0
    for node in reference.graph.nodes:
        if node.target in (torch.ops.aten.conv2d.default, torch.ops.aten.linear.default):
            x, w, b = node.args[:3]
            ratio = getattr(reference, b.args[1].target) / (
                x.args[1] * getattr(reference, w.args[1].target))
            assert torch.allclose(ratio, torch.ones_like(ratio), rtol=1e-6), node.name
            checked += 1
    assert checked == 4


def test_float_file_is_rebuilt_with_the_values_onnx_runtime_computes():
    import torch

    from orchestrator.sources.onnx_module import build_onnx

    module, _, quantization = build_onnx(DATA / "digits_cnn.onnx")
    assert quantization is None
    images = np.load(DATA / "digits_test_images.npz")["input0"][:16].astype(np.float32)
    with torch.no_grad():
        worst = max(float(np.abs(module(torch.from_numpy(x)).numpy()
                                 - _ort(DATA / "digits_cnn.onnx", x)).max()) for x in images)
    assert worst < 1e-5


def test_plan_rows_name_the_onnx_node(compiled):
    plan = json.loads((compiled["digits_cnn_qdq", "none"].with_name(
        "digits_cnn_qdq_none.artifacts") / "plan.json").read_text())
    convs = [op for op in plan["ops"] if op["op"].startswith("aten.convolution")]
    assert [c["onnx"]["opcode"] for c in convs] == ["Conv", "Conv", "Conv"]
    assert convs[0]["onnx"]["operator"] == 11 and convs[0]["onnx"]["tensor_name"]
    # CPU-only: int8 on CMSIS-NN, the first one too, whose input comes from a Reshape (which
    # ExecuTorch's Cortex-M quantizer leaves in float unless the input is made channels-last)
    assert {c["placement"] for c in convs} == {"cmsis-nn"}


def _truncated(tmp_path):
    data = (DATA / "digits_cnn.onnx").read_bytes()
    return data[:len(data) // 3], "does not parse"


def _custom_domain(tmp_path):
    import onnx

    model = onnx.load(DATA / "digits_cnn.onnx")
    model.graph.node[3].domain = "com.example"
    return model.SerializeToString(), "node 3, domain 'com.example'"


def _external_data(tmp_path):
    import onnx

    model = onnx.load(DATA / "digits_cnn.onnx")
    tensor = model.graph.initializer[0]
    tensor.data_location = onnx.TensorProto.EXTERNAL
    entry = tensor.external_data.add()
    entry.key, entry.value = "location", "/etc/passwd"
    return model.SerializeToString(), "external file"


def _unsupported_op(tmp_path):
    import onnx

    model = onnx.load(DATA / "digits_cnn.onnx")
    model.graph.node[11].op_type = "LpNormalization"
    return model.SerializeToString(), "ONNX operator LpNormalization (node 11 of the graph"


@pytest.mark.parametrize("make", [_truncated, _custom_domain, _external_data, _unsupported_op],
                         ids=lambda f: f.__name__.strip("_"))
def test_malformed_onnx_is_refused_in_one_line_and_writes_nothing(tmp_path, capsys, make):
    data, expected = make(tmp_path)
    model = tmp_path / "model.onnx"
    model.write_bytes(bytes(data))
    compile_refused_in_one_line(model, capsys, expected)
