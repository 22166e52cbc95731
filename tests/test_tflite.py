"""The incumbent's files in: a `.tflite` becomes one `.pte` that computes what TFLM computes.

MLPerf Tiny's trained keyword spotter (its own int8 file, real weights and scales) compiled for
the Ethos-U55-128 is held against TFLM's interpreter value for value; the file's quantization,
its rounding and its softmax are what make it equal, and upstream's forms are shown to differ.
Malformed files and operators that cannot be rebuilt are refused in one line (exit 2).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from tests.device_tools import compile_refused_in_one_line, mlperf_tiny

KWS = "kws_ref_model.tflite"
AD = "ad01_int8.tflite"


@pytest.fixture(scope="module")
def kws_u55(tmp_path_factory):
    import orchestrator

    out = tmp_path_factory.mktemp("tflite") / "kws.pte"
    result = orchestrator.compile(str(mlperf_tiny(KWS)), out, npu="ethos-u55-128")
    return out, result


def _plan(pte: Path) -> dict:
    return json.loads((pte.with_name(pte.stem + ".artifacts") / "plan.json").read_text())


def test_int8_file_on_the_npu_computes_what_tflm_computes(kws_u55):
    from orchestrator.device_runs.combined import load_program
    from orchestrator.verification import tflm

    pte, _ = kws_u55
    comparison = tflm.compare(load_program(pte), 16)
    assert comparison.values == 16 * 12
    assert comparison.differing == 0, comparison.detail()


def test_the_program_takes_the_files_int8_with_its_own_scales(kws_u55):
    pte, _ = kws_u55
    manifest = json.loads((pte.with_name(pte.stem + ".artifacts") / "manifest.json").read_text())
    io = manifest["io_quantization"]
    # the file's input tensor: scale 0.5847029 (float32), zero point 83; output 1/256, -128
    assert (np.float32(io["input0_scale"]), io["input0_zp"]) == (np.float32(0.5847029), 83)
    assert (io["output0_scale"], io["output0_zp"]) == (1 / 256, -128)
    assert manifest["model"]["file_sha256"]


def test_plan_rows_name_the_tflite_operator_and_tensor(kws_u55):
    pte, _ = kws_u55
    ops = _plan(pte)["ops"]
    convs = [op for op in ops if op["op"].startswith("aten.convolution")]
    assert len(convs) == 9
    first = convs[0]["tflite"]
    assert (first["opcode"], first["operator"], first["tensor"]) == ("CONV_2D", 0, 22)
    assert [c["tflite"]["opcode"] for c in convs[1:3]] == ["DEPTHWISE_CONV_2D", "CONV_2D"]


def test_the_files_softmax_runs_on_cmsis_nn_and_the_rest_on_the_npu(kws_u55):
    pte, _ = kws_u55
    ops = _plan(pte)["ops"]
    softmax = [op for op in ops if op.get("tflite", {}).get("opcode") == "SOFTMAX"
               and op["kind"] == "op"]
    assert [op["placement"] for op in softmax] == ["cmsis-nn"]
    assert "softmax" in softmax[0]["kernel"]
    convs = [op for op in ops if op.get("tflite", {}).get("opcode", "").endswith("CONV_2D")]
    assert {op["placement"] for op in convs} == {"npu"}
    # the 25x5 average pool over 25x5 at stride 25x5: one window, rebuilt at stride 1, which
    # the Arm backend's check takes (stride above 3 refused): one partition, as Vela's own
    pools = [op for op in ops if op.get("tflite", {}).get("opcode") == "AVERAGE_POOL_2D"
             and op["kind"] == "op"]
    assert [op["placement"] for op in pools] == ["npu"]
    assert _plan(pte)["summary"]["npu_partitions"] == 1


def test_upstream_rounding_differs_from_tflm_and_the_files_rounding_does_not(tmp_path,
                                                                              monkeypatch):
    """ExecuTorch writes every RESCALE with SINGLE_ROUND: the anomaly autoencoder (ten FULLY_
    CONNECTED layers, no softmax) then differs from TFLM on the U55; with DOUBLE_ROUND (our
    workaround, partitioners/upstream_ethos_u.tflite_rounding) every value equals TFLM's."""
    import contextlib

    import orchestrator
    from orchestrator.device_runs.combined import load_program
    from orchestrator.verification import tflm
    from partitioners import upstream_ethos_u

    path = str(mlperf_tiny(AD))
    ours = tmp_path / "ours.pte"
    orchestrator.compile(path, ours, npu="ethos-u55-128")
    assert tflm.compare(load_program(ours), 4).differing == 0

    monkeypatch.setattr(upstream_ethos_u, "tflite_rounding",
                        lambda active: contextlib.nullcontext())
    monkeypatch.setenv("ORCHESTRATE_CACHE", "off")
    upstream = tmp_path / "upstream.pte"
    orchestrator.compile(path, upstream, npu="ethos-u55-128")
    found = tflm.compare(load_program(upstream), 4)
    assert found.differing > 0 and found.max_steps >= 1


def _file(name: str) -> bytearray:
    return bytearray(mlperf_tiny(name).read_bytes())


def _tensor_table(data: bytes, index: int):
    from ethosu.vela.tflite.Model import Model

    return Model.GetRootAsModel(bytes(data), 0).Subgraphs(0).Tensors(index)


def _with_wrong_magic():
    data = _file(KWS)
    data[4:8] = b"XXXX"
    return data, "no 'TFL3' identifier"


def _truncated():
    data = _file(KWS)
    return data[:len(data) // 3], "corrupt"


def _buffer_out_of_range():
    data = _file(KWS)
    tensor = _tensor_table(data, 17)
    at = tensor._tab.Pos + tensor._tab.Offset(8)  # Tensor.buffer (field 2)
    struct.pack_into("<I", data, at, 10_000)
    return data, "names buffer 10000"


def _huge_shape():
    data = _file(KWS)
    tensor = _tensor_table(data, 22)
    at = tensor._tab.Vector(tensor._tab.Offset(4))  # Tensor.shape's first element
    struct.pack_into("<i", data, at + 4, 1 << 24)
    return data, "a dimension outside"


@pytest.mark.parametrize("make", [_with_wrong_magic, _truncated, _buffer_out_of_range,
                                  _huge_shape], ids=lambda f: f.__name__.strip("_"))
def test_malformed_tflite_is_refused_in_one_line_and_writes_nothing(tmp_path, capsys, make):
    data, expected = make()
    model = tmp_path / "model.tflite"
    model.write_bytes(bytes(data))
    compile_refused_in_one_line(model, capsys, expected)


def test_an_operator_that_cannot_be_rebuilt_is_named_with_its_index(tmp_path):
    from ethosu.vela.tflite.BuiltinOperator import BuiltinOperator
    from ethosu.vela.tflite.Model import Model

    from orchestrator.errors import UserError
    from orchestrator.sources.loader import load_model

    data = _file(KWS)
    model = Model.GetRootAsModel(bytes(data), 0)
    softmax = next(i for i in range(model.OperatorCodesLength())
                   if model.OperatorCodes(i).DeprecatedBuiltinCode() == BuiltinOperator.SOFTMAX)
    code = model.OperatorCodes(softmax)
    struct.pack_into("<b", data, code._tab.Pos + code._tab.Offset(4), BuiltinOperator.ARG_MAX)
    path = tmp_path / "argmax.tflite"
    path.write_bytes(bytes(data))
    with pytest.raises(UserError) as raised:
        load_model(str(path))
    assert "TFLite operator ARG_MAX (operator 12 of the graph)" in str(raised.value)
    assert raised.value.exit_code == 2


def test_float_file_is_rebuilt_with_the_values_the_interpreter_computes():
    """A float file (no quantization of its own) is rebuilt as the same float network: TFLM's
    float reference kernels and the module agree to float rounding on ResNet-8."""
    import torch

    from orchestrator.sources.tflite_file import read_tflite
    from orchestrator.sources.tflite_module import build
    from orchestrator.verification.tflm import run_tflm

    path = mlperf_tiny("pretrainedResnet.tflite")
    graph = read_tflite(path)
    module, _, quantization = build(graph)
    assert quantization is None
    x = np.random.default_rng(0).standard_normal((1, 32, 32, 3)).astype(np.float32)
    (theirs,), _ = run_tflm(path, [[x]])
    with torch.no_grad():
        ours = module(torch.from_numpy(x).permute(0, 3, 1, 2)).numpy()
    assert np.abs(ours - theirs[0]).max() < 1e-5


def test_an_even_average_pool_sums_raw_codes_on_the_npu_where_tosas_pool_rounds_a_tie_otherwise(
        tmp_path, monkeypatch):
    """ResNet-8's 8x8 average pool divides by 64, so a sum can fall halfway between two steps:
    TFLM sums the raw codes and rounds the tie away from zero, a TOSA AVG_POOL2D subtracts the
    zero point and rounds it up. Rebuilt as a depthwise convolution on the raw sum
    (tflite_pools.RawSumPool) the pool runs on the NPU, in the one partition, and the program
    equals TFLM; as upstream's AVG_POOL2D on the NPU it differs."""
    import orchestrator
    from orchestrator.device_runs.combined import load_program
    from orchestrator.sources import tflite_module
    from orchestrator.verification import tflm

    path = str(mlperf_tiny("pretrainedResnet_quant.tflite"))
    ours = tmp_path / "ours.pte"
    orchestrator.compile(path, ours, npu="ethos-u85-256", platform="corstone320")
    plan = _plan(ours)
    pools = [op for op in plan["ops"]
             if op.get("tflite", {}).get("opcode") == "AVERAGE_POOL_2D" and op["kind"] == "op"]
    assert [(op["op"].split(".")[1], op["placement"]) for op in pools] == [
        ("convolution", "npu")]
    assert plan["summary"]["npu_partitions"] == 1
    assert tflm.compare(load_program(ours), 8).differing == 0

    monkeypatch.setattr(tflite_module, "raw_sum_pools", lambda graph: {})
    monkeypatch.setattr(tflite_module.FileQuantization, "kept_on_cpu", property(
        lambda self: tuple((m, "softmax") for m in self.cmsis_nn_modules)))
    monkeypatch.setenv("ORCHESTRATE_CACHE", "off")
    on_npu = tmp_path / "on_npu.pte"
    orchestrator.compile(path, on_npu, npu="ethos-u85-256", platform="corstone320")
    assert [op["placement"] for op in _plan(on_npu)["ops"]
            if op.get("tflite", {}).get("opcode") == "AVERAGE_POOL_2D"
            and op["kind"] == "op"] == ["npu"]
    found = tflm.compare(load_program(on_npu), 8)
    assert found.differing > 0 and found.max_steps >= 1


def test_shape_arithmetic_is_computed_once_and_a_flatten_rebuilt(tmp_path):
    """The converter writes a Keras flatten of a dynamic batch as SHAPE -> STRIDED_SLICE ->
    PACK -> RESHAPE (MobileNetV3-Small's squeeze-excite and head): the shape operators become
    constants and only the RESHAPE computes; a TILE (Keras' nearest upsampling) repeats NHWC
    axes in the module's NCHW order."""
    import torch

    from orchestrator.sources.tflite_file import TfliteGraph, TfliteOperator, TfliteTensor
    from orchestrator.sources.tflite_module import build

    def t(index, shape, dtype, data=None):
        if data is not None:
            data = np.asarray(data, dtype=dtype)
            data.setflags(write=False)
        return TfliteTensor(index, f"t{index}", tuple(shape), np.dtype(dtype), data)

    tensors = (t(0, (1, 2, 2, 3), np.float32), t(1, (4,), np.int32),
               t(2, (1,), np.int32, [0]), t(3, (1,), np.int32, [1]), t(4, (1,), np.int32, [1]),
               t(5, (), np.int32), t(6, (), np.int32, -1), t(7, (2,), np.int32),
               t(8, (1, 12), np.float32), t(9, (4,), np.int32, [1, 2, 1, 2]),
               t(10, (1, 4, 2, 6), np.float32))
    ops = (TfliteOperator(0, "SHAPE", (0,), (1,)),
           TfliteOperator(1, "STRIDED_SLICE", (1, 2, 3, 4), (5,), {"shrink_axis_mask": 1}),
           TfliteOperator(2, "PACK", (5, 6), (7,), {"axis": 0}),
           TfliteOperator(3, "RESHAPE", (0, 7), (8,)),
           TfliteOperator(4, "TILE", (0, 9), (10,)))
    graph = TfliteGraph(tmp_path / "g.tflite", tensors, ops, (0,), (8, 10), 3, "")
    module, (example,), _ = build(graph)
    assert [name for name, _, _ in module.steps] == ["op3", "op4"]
    nhwc = torch.arange(12, dtype=torch.float32).reshape(1, 2, 2, 3)
    flat, tiled = module(nhwc.permute(0, 3, 1, 2))
    assert torch.equal(flat, nhwc.reshape(1, 12))
    assert torch.equal(tiled.permute(0, 2, 3, 1), nhwc.repeat(1, 2, 1, 2))


def test_tflm_gets_an_arena_for_a_small_file_with_a_large_feature_map():
    """A 2.4 KB file averaging a 272x272x8 map: the tflite-micro package's default arena (ten
    times the file) cannot hold it and TFLM refused to allocate; the arena is sized from the
    file's tensors."""
    from orchestrator.verification.tflm import run_tflm

    path = Path(__file__).parent / "data" / "tflite" / "large_mean_int8.tflite"
    x = np.random.default_rng(0).integers(-128, 128, (1, 272, 272, 3), dtype=np.int8)
    (outputs,), _ = run_tflm(path, [[x]])
    assert outputs[0].shape == (1, 4) and outputs[0].dtype == np.int8


def test_only_a_power_of_two_pool_read_by_classifiers_is_summed_raw():
    """ResNet-8's 8x8 pool (64, read through a RESHAPE by its FULLY_CONNECTED) is summed raw;
    the keyword spotter's 25x5 pool (125, odd: no tie to round) keeps the TOSA pool."""
    from orchestrator.sources.tflite_file import read_tflite
    from orchestrator.sources.tflite_pools import raw_sum_pools

    graph = read_tflite(mlperf_tiny("pretrainedResnet_quant.tflite"))
    (pool,) = raw_sum_pools(graph).values()
    assert (pool.count, pool.channels, len(pool.codes)) == (64, 64, 2)
    assert [graph.operators[i].opcode for i in pool.consumers] == ["FULLY_CONNECTED"]
    assert pool.weight < 0 and pool.bias < 0  # no file tensor has these indices
    assert raw_sum_pools(read_tflite(mlperf_tiny(KWS))) == {}
