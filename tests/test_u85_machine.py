"""The Ethos-U85 functional model (npu_driver/ethos_u/u85_machine.py) executes Vela's U85 command
streams byte for byte as the TOSA reference model executes the partitions' TOSA graphs, and
refuses what it does not execute by command name and word offset.

Programs (compiled once per module through the session fixture `compiles`): DS-CNN on U85-256
(part-kernel-first 2:4-sparse, SWD and FWD convolutions, depthwise, a 25x5 average pool as
pooling SUM), ResNet-8 on U85-2048 (four cores: interleaved FWD and per-core SWD streams,
convolutions chained into elementwise ADDs through the chaining buffer, AVERAGE pooling) and the
edge-case convolutions of tests/npu_edge_models.py on U85-256 (asymmetric zero padding, stride 2,
dilation 2, a strided depthwise, a 5x5 kernel with per-channel scales over four decades) and its
elementwise edge cases (int8 lookup tables loaded by DMA into the LUT memory, MIN/MAX/ADD/SUB
with operand scales, MUL, broadcasts, max/average/sum pooling) and matmul edge cases (weights
read from IFM2, REDUCE_SUM, ABS, 32-bit chained OFMs, HCW transposes), the user family
transposed_decoder on U85-256 (int32 accumulators loaded from IFM2 by pooling NONE and rescaled
per channel, lookup tables), tests/npu_edge_models.py's strided_edges on U85-256 (a stride-4
convolution as 16 1x1 convolutions summed in accumulators kept between them, padding in stepped
units) and bilinear_edges (the U85's resize: bilinear and nearest), the user families index_ops
(a gather DMA, a select) and gated_flip_two_outputs (a reversed OFM), the mixed model on U85-256 (an OFM written transposed, CHW; and a stride-4 convolution the
compile pads explicitly, since through upstream's flow alone Vela 5.1 decomposes it without its
top/left padding: the model executes what the registers say, which is not the TOSA graph).
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from npu_driver.ethos_u import UnmodelledCommand, run_partition
from npu_driver.ethos_u.u85_checker import parse_u85_payload
from npu_driver.tosa_twin import run_tosa
from orchestrator.cli import main
from orchestrator.verification.twin import load_twin
from examples.user_models import model_spec as user_model_spec
from tests.npu_edge_models import model_spec

SAMPLES = 2
PROGRAMS = {"ds-cnn@u85-256": ("ds-cnn", "ethos-u85-256"),
            "conv-edges@u85-256": (model_spec("conv_edges"), "ethos-u85-256"),
            "elementwise-edges@u85-256": (model_spec("elementwise_edges"), "ethos-u85-256"),
            "matmul-edges@u85-256": (model_spec("matmul_edges"), "ethos-u85-256"),
            "transposed-decoder@u85-256": (user_model_spec("transposed_decoder"),
                                           "ethos-u85-256"),
            "resnet8@u85-2048": ("resnet8", "ethos-u85-2048"),
            "strided-edges@u85-256": (model_spec("strided_edges"), "ethos-u85-256"),
            "bilinear-edges@u85-256": (model_spec("bilinear_edges"), "ethos-u85-256"),
            "index-ops@u85-256": (user_model_spec("index_ops"), "ethos-u85-256"),
            "gated-flip@u85-256": (user_model_spec("gated_flip_two_outputs"), "ethos-u85-256"),
            "mixed@u85-256": ("mixed", "ethos-u85-256")}


@pytest.fixture(scope="module")
def programs(compiles):
    return {key: compiles.get(model, platform="corstone320", npu=npu, write=True)[1]
            for key, (model, npu) in PROGRAMS.items()}


def _inputs(partition, rng):
    return [rng.integers(np.iinfo(spec.numpy_type).min, np.iinfo(spec.numpy_type).max,
                         size=spec.shape, endpoint=True).astype(spec.numpy_type)
            for spec in partition.io.inputs]


def _exact(partition, npu: str, seed: int = 2024):
    """The counters of the last of SAMPLES runs, every output byte equal to TOSA's."""
    rng = np.random.default_rng(seed)
    for _ in range(SAMPLES):
        arrays = _inputs(partition, rng)
        expected = [a.tobytes() for a in run_tosa(partition.tosa_bytes, partition.io, arrays)]
        got, counters = run_partition(partition.payload, arrays, npu)
        for index, (e, g) in enumerate(zip(expected, got)):
            differ = np.flatnonzero(np.frombuffer(e, np.uint8) != np.frombuffer(g, np.uint8))
            assert not differ.size, (f"{partition.delegate_name} output {index}: {differ.size} "
                                     f"of {len(e)} bytes differ from TOSA (first {differ[0]})")
    return counters


def test_ds_cnn_u85_256_stream_equals_tosa_byte_for_byte(programs):
    (partition,) = load_twin(programs["ds-cnn@u85-256"]).partitions
    counters = _exact(partition, "ethos-u85-256")
    assert dict(counters.operations) == {"conv": 6, "depthwise": 4, "pool.sum": 1}
    assert counters.commands == 259
    assert counters.macs == 2_656_768


def test_resnet8_u85_2048_chained_adds_and_four_cores_equal_tosa(programs):
    (partition,) = load_twin(programs["resnet8@u85-2048"]).partitions
    counters = _exact(partition, "ethos-u85-2048")
    assert counters.operations["chained"] == 3 and counters.operations["elementwise.add"] == 3
    assert counters.operations["pool.average"] == 1 and counters.operations["conv"] == 10
    # weight streams of several cores: WEIGHT1-3 are read
    assert "NPU_SET_WEIGHT3_BASE" in counters.by_opcode


def test_edge_case_convolutions_on_the_u85_equal_tosa(programs):
    (partition,) = load_twin(programs["conv-edges@u85-256"]).partitions
    counters = _exact(partition, "ethos-u85-256")
    assert counters.operations["conv"] == 4 and counters.operations["depthwise"] == 1


def test_u85_lookup_tables_and_elementwise_edges_equal_tosa(programs):
    (partition,) = load_twin(programs["elementwise-edges@u85-256"]).partitions
    counters = _exact(partition, "ethos-u85-256")
    assert counters.operations["lut"] == 3 and counters.operations["dma"] == 3
    assert {"elementwise.min", "elementwise.max", "elementwise.mul", "elementwise.sub",
            "pool.max", "pool.average"} <= set(counters.operations)


def test_a_u85_matmul_with_weights_from_ifm2_equals_tosa(programs):
    (partition,) = load_twin(programs["matmul-edges@u85-256"]).partitions
    counters = _exact(partition, "ethos-u85-256")
    assert counters.operations["pool.reduce_sum"] == 2 and counters.operations["transpose.HCW"]
    assert counters.operations["elementwise.abs"] == 1


def test_u85_accumulators_loaded_from_ifm2_equal_tosa(programs):
    (partition,) = load_twin(programs["transposed-decoder@u85-256"]).partitions
    counters = _exact(partition, "ethos-u85-256")
    assert counters.operations["pool.none"] == 2 and counters.operations["lut"] == 2


def test_a_transposed_u85_ofm_equals_tosa(programs):
    partition = load_twin(programs["mixed@u85-256"]).partitions[1]
    counters = _exact(partition, "ethos-u85-256")
    assert counters.operations["transpose.CHW"] == 1


def test_a_stride_4_convolution_summed_in_kept_accumulators_equals_tosa(programs):
    """Vela gives the U85 a stride-4 convolution as 16 1x1 convolutions (one per kernel
    position, each reading the IFM stepped by 4 through its stride registers), the first 15
    with ACC_FORMAT acc_output DISABLE (no OFM written), the rest with acc_input KEEP; the
    padding is in stepped units (PAD_TOP 1 with the IFM starting 3 rows in)."""
    (partition,) = load_twin(programs["strided-edges@u85-256"]).partitions
    counters = _exact(partition, "ethos-u85-256")
    assert counters.operations["conv"] == 16 and counters.operations["accumulators kept"] == 15
    assert counters.macs == 8 * 9 * 8 * 4 * 16


def test_u85_resizes_nearest_and_bilinear_equal_tosa(programs):
    """NPU_OP_RESIZE as regor lowers TOSA RESIZE: bilinear 2x with half-pixel centres (scale
    4/2, offset -1), bilinear to 9x11 with aligned corners, a nearest downsampling (scales
    2/6 and 6/20, offset -3); TOSA's integer algorithm on the registers' scale, step and
    offset, the result with 16 fraction bits through OFM_SCALE (shift 16, + 4 for the
    bilinear 1/16)."""
    (partition,) = load_twin(programs["bilinear-edges@u85-256"]).partitions
    counters = _exact(partition, "ethos-u85-256")
    assert counters.operations["resize.bilinear"] == 2
    assert counters.operations["resize.nearest"] == 1


def test_a_u85_gather_dma_and_select_equal_tosa(programs):
    """index_ops' second partition on U85-256: a GATHER as a 2-D DMA with indexed source rows
    (int32 indices in the weight data, IDX_MAX the last row), and a SELECT as regor lowers it
    (CMP_GT, then OR(AND(a, mask), AND_NOT(b, mask)))."""
    partition = load_twin(programs["index-ops@u85-256"]).partitions[1]
    counters = _exact(partition, "ethos-u85-256")
    assert counters.operations["dma.gather"] == 1 and counters.operations["elementwise.cmp_gt"]
    assert {"elementwise.and", "elementwise.and_not", "elementwise.or"} <= set(
        counters.operations)


def test_a_reversed_u85_ofm_equals_tosa(programs):
    """gated_flip_two_outputs on U85-256: a flip along the channels written as an OFM with
    activation_reverse C, its registers those of the unreversed map."""
    (partition,) = load_twin(programs["gated-flip@u85-256"]).partitions
    counters = _exact(partition, "ethos-u85-256")
    assert counters.operations["reverse.C"] == 1


def test_u85_int16_activations_and_interpolating_tables_equal_tosa():
    """tests/npu_edge_models.py's int16_edges quantized a16w8 (ExecuTorch's Arm backend, as
    `--precision MODULE=a16w8` does) for U85-256: int16 convolutions, depthwise, max pooling,
    add and multiply, and sigmoid and tanh as LUT_S16_S16 (512 int16 base/slope pairs filling
    the 2048-byte LUT memory, interpolated in 128 steps)."""
    from npu_driver.payload import parse_payload
    from npu_driver.tosa_twin import graph_io
    from tests.npu_edge_models import int16_edges, lower_a16w8

    rng = np.random.default_rng(16)
    (tosa, payload), = lower_a16w8(int16_edges, "ethos-u85-256")
    payload, io = parse_payload(payload), graph_io(tosa)
    assert {spec.numpy_type for spec in io.inputs} == {"int16"}
    for _ in range(SAMPLES):
        arrays = [rng.integers(-32768, 32768, size=spec.shape).astype(spec.numpy_type)
                  for spec in io.inputs]
        expected = [a.tobytes() for a in run_tosa(tosa, io, arrays)]
        got, counters = run_partition(payload, arrays, "ethos-u85-256")
        assert got == expected
    assert counters.operations["lut"] == 3 and counters.operations["dma"] == 2
    assert {"conv", "depthwise", "pool.max", "elementwise.add",
            "elementwise.mul"} <= set(counters.operations)


def _without_strided_padding(tosa_bytes: bytes) -> bytes:
    """The mixed partition's TOSA graph with its stride-4 convolution's padding removed and
    the SLICE before it (ExecuTorch trims the 32x32 map to 31x31 so that the padded size is a
    whole number of strides) widened back to 32x32: the convolution the Vela 5.1 stream
    computes."""
    import struct

    from tosa.Conv2dAttribute import Conv2dAttribute
    from tosa.Op import Op
    from npu_driver.tosa_twin import main_block

    data = bytearray(tosa_bytes)
    block = main_block(tosa_bytes)
    ops = [block.Operators(i) for i in range(block.OperatorsLength())]
    tensors = {block.Tensors(i).Name(): block.Tensors(i) for i in range(block.TensorsLength())}
    shapes = {block.Shapes(i).Name(): block.Shapes(i) for i in range(block.ShapesLength())}
    conv, attribute = next((o, a) for o in ops if o.Op() == Op.CONV2D for a in [
        Conv2dAttribute()] if not a.Init(o.Attribute().Bytes, o.Attribute().Pos) and list(
            a.StrideAsNumpy()) == [4, 4])
    sliced = conv.Inputs(0)
    trim = next(o for o in ops if o.Op() == Op.SLICE and o.Outputs(0) == sliced)
    full = list(tensors[trim.Inputs(0)].ShapeAsNumpy())
    pad = attribute._tab.Vector(attribute._tab.Offset(4))
    assert struct.unpack_from("<4i", data, pad) == (1, 0, 1, 0)  # top, bottom, left, right
    struct.pack_into("<4i", data, pad, 0, 0, 0, 0)
    size = shapes[trim.Inputs(2)]
    struct.pack_into("<4q", data, size._tab.Vector(size._tab.Offset(8)), *full)
    shape = tensors[sliced]
    struct.pack_into("<4i", data, shape._tab.Vector(shape._tab.Offset(6)), *full)
    return bytes(data)


def _mixed_downsample():
    """The mixed model's downsampling convolution alone (upstream's quantizer cannot take the
    whole mixed model: its sort and scalar multiply fail in its annotation passes)."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        module = torch.nn.Sequential(torch.nn.Conv2d(8, 16, 4, stride=4, padding=1),
                                     torch.nn.ReLU()).eval()
        return module, (torch.rand(1, 8, 32, 32) * 2 - 1,)


@pytest.fixture(scope="module")
def upstream_downsample():
    """The mixed model's stride-4 convolution through upstream's own int8 flow (EthosUQuantizer,
    EthosUPartitioner, Vela 5.1) for U85-256, none of the orchestrator's rewrites: (TOSA,
    payload, io) of its partition."""
    from npu_driver.payload import parse_payload
    from npu_driver.tosa_twin import graph_io
    from tests.npu_edge_models import lower_int8

    (tosa, payload), = lower_int8(_mixed_downsample, "ethos-u85-256")
    return tosa, parse_payload(payload), graph_io(tosa)


def test_vela_computes_the_mixed_models_strided_convolution_without_its_padding(
        upstream_downsample):
    """Upstream's behaviour: the mixed model's 4x4 stride-4 pad-1 convolution on U85-256.
    ExecuTorch trims its 32x32 IFM to 31x31 by a SLICE, which regor moves into the
    convolution's IFM slice; its stride decomposition (scheduler_decompose.cpp DecomposeConv2D)
    then finds the slice offset set and never makes it -padding, so the 16 accumulating 1x1
    convolutions read rows and columns 4i + k with PAD_* 0 where the graph reads 4i + k - 1.
    The model executes what the registers say (the NPU has no other padding): its bytes are the
    TOSA graph's with that convolution unpadded over the untrimmed map, and differ from the
    graph Vela was given. (The orchestrator's compile rewrites such a convolution first:
    partitioners/quantizable.py strided_conv_padding_explicit, tested below.)"""
    tosa, payload, io = upstream_downsample
    unpadded = _without_strided_padding(tosa)
    rng = np.random.default_rng(5)
    for _ in range(SAMPLES):
        arrays = [rng.integers(-128, 128, size=spec.shape).astype(spec.numpy_type)
                  for spec in io.inputs]
        got, counters = run_partition(payload, arrays, "ethos-u85-256")
        assert got[0] == run_tosa(unpadded, io, arrays)[0].tobytes()
        differ = np.frombuffer(got[0], np.int8) != run_tosa(tosa, io, arrays)[0].reshape(-1)
        assert differ.sum() > 500
    assert counters.operations["accumulators kept"] == 15


def test_the_compiled_mixed_model_pads_explicitly_and_equals_tosa(programs, capsys):
    """The same model through `compile` for U85-256: the convolution is computed unpadded on
    the input cropped to 31x31 and padded explicitly to 32x32 (the plan names the workaround),
    which Vela lowers as a pad and 64 1x1 convolutions, and now every partition's bytes equal
    the TOSA graph's, so verify --npu-model both passes it."""
    partition = load_twin(programs["mixed@u85-256"]).partitions[0]
    counters = _exact(partition, "ethos-u85-256")
    assert counters.operations["conv"] == 65  # the first convolution and the 64
    assert {"elementwise.cmp_gt", "elementwise.and", "elementwise.and_not",
            "elementwise.or"} <= set(counters.operations)
    assert main(["verify", str(programs["mixed@u85-256"]), "--runtime", "twin",
                 "--npu-model", "both", "--samples", "1"]) == 0
    assert main(["plan", "mixed", "--platform", "corstone320", "--npu", "ethos-u85-256"]) == 0
    plan = " ".join(capsys.readouterr().out.split())
    assert ("workaround applied to downsample: Vela 5.1 for the Ethos-U85 (regor's "
            "DecomposeConv2D of a stride above 3 drops the padding with the input slice it "
            "folds): a 4x4 convolution of stride 4x4 and padding 1x1 on a 32x32 input computed "
            "unpadded on the input cropped to 31x31 and padded explicitly to 32x32") in plan


@pytest.mark.parametrize("kernel,stride,padding,size,rewritten", [
    (4, 4, 1, (32, 32), ((31, 31), [1, 0, 1, 0])),   # the mixed model's
    (5, 4, 2, (34, 34), ((34, 34), [2, 1, 2, 1])),  # reads one row of bottom padding
    (4, (4, 1), 1, (33, 16), ((31, 16), [1, 1, 1, 0])),
    (4, 4, 1, (30, 30), None),                       # divides: no slice, Vela is right
    (3, 3, 1, (32, 32), None),                       # stride 3: no decomposition
    (4, 4, 0, (33, 33), None),                       # no padding to lose
])
def test_only_a_padded_stride_above_3_on_an_input_that_does_not_divide_is_rewritten(
        kernel, stride, padding, size, rewritten):
    import torch

    from partitioners.quantizable import strided_conv_padding_explicit

    conv = torch.nn.Conv2d(8, 16, kernel, stride=stride, padding=padding).eval()
    x = torch.rand(1, 8, *size)
    module = torch.export.export(conv, (x,)).module(check_guards=False)
    fixes = strided_conv_padding_explicit(module)
    ops = [n for n in module.graph.nodes if n.op == "call_function"]
    if rewritten is None:
        assert fixes == [] and [str(n.target) for n in ops] == ["aten.conv2d.default"]
        return
    (used, pads), (fix,) = rewritten, fixes
    pad = next(n for n in ops if n.target == torch.ops.aten.constant_pad_nd.default)
    conv_node = next(n for n in ops if n.target == torch.ops.aten.conv2d.default)
    assert pad.args[1] == pads and conv_node.args[0] is pad and conv_node.args[4] == [0, 0]
    assert tuple(pad.args[0].meta["val"].shape[2:]) == used
    assert f"cropped to {used[0]}x{used[1]}" in fix.message
    with torch.no_grad():
        assert torch.allclose(module(x), conv(x), atol=1e-6)


def test_a_padded_stride_4_conv1d_is_rewritten_too():
    """A Conv1d 4/4 pad 1 on 64 samples through upstream's flow alone differs from its TOSA
    graph on U85-256 in 188 of 256 bytes, as its 2-D form does."""
    import torch

    from partitioners.quantizable import strided_conv_padding_explicit

    conv = torch.nn.Conv1d(8, 16, 4, stride=4, padding=1).eval()
    x = torch.rand(1, 8, 64)
    module = torch.export.export(conv, (x,)).module(check_guards=False)
    (fix,) = strided_conv_padding_explicit(module)
    pad = next(n for n in module.graph.nodes if n.target == torch.ops.aten.constant_pad_nd.default)
    assert pad.args[1] == [1, 0] and tuple(pad.args[0].meta["val"].shape) == (1, 8, 63)
    assert "a 4 convolution of stride 4 and padding 1 on a 64 input" in fix.message
    with torch.no_grad():
        assert torch.allclose(module(x), conv(x), atol=1e-6)


def test_an_unmodelled_pooling_mode_is_refused_naming_command_and_word(programs):
    (partition,) = load_twin(programs["ds-cnn@u85-256"]).partitions
    payload = partition.payload
    commands = parse_u85_payload(payload.cmd_bytes).command_streams[0]
    pool = next(c for c in commands if c.name == "NPU_OP_POOL")
    blob = bytearray(payload.cmd_bytes)
    blob[4 * pool.offset + 2:4 * pool.offset + 4] = (5).to_bytes(2, "little")  # MIN
    tampered = replace(payload, cmd_bytes=bytes(blob))
    with pytest.raises(UnmodelledCommand,
                       match=f"^NPU_OP_POOL at word {pool.offset}: pooling mode MIN is not "
                             "modelled by the Ethos-U85 model"):
        run_partition(tampered, _inputs(partition, np.random.default_rng(0)), "ethos-u85-256")


def test_verify_runs_u85_partitions_from_their_command_streams(programs, capsys):
    assert main(["verify", str(programs["ds-cnn@u85-256"]), "--runtime", "twin",
                 "--npu-model", "both", "--samples", "2"]) == 0
    out = capsys.readouterr().out
    assert "Vela command stream executed by the Ethos-U85 functional model (ethos-u85-256), " \
           "compared byte for byte with the TOSA reference model" in out
    assert "lowered_module_0: 259 commands, 2,656,768 MACs; = the plan's MACs" in out
    assert "not executed" not in out


def test_verify_names_the_u85_partition_left_to_the_tosa_graph(programs, tmp_path, capsys):
    """DS-CNN's pooling turned into MIN (hashes rewritten), which the model does not execute:
    verify --npu-model stream computes that partition from its TOSA graph and says why."""
    from tests.tampering import copy_program, payload_bytes, replace_payload

    pte = copy_program(programs["ds-cnn@u85-256"], tmp_path)
    twin = load_twin(pte)
    payload = payload_bytes(twin)
    cmd = twin.partitions[0].payload.cmd_bytes
    pool = next(c for c in parse_u85_payload(cmd).command_streams[0] if c.name == "NPU_OP_POOL")
    blob = bytearray(payload)
    at = payload.index(cmd) + 4 * pool.offset + 2
    blob[at:at + 2] = (5).to_bytes(2, "little")  # pooling_mode MIN
    replace_payload(pte, payload, bytes(blob))
    assert main(["verify", str(pte), "--runtime", "twin", "--npu-model", "stream",
                 "--samples", "1"]) == 0
    out = capsys.readouterr().out
    assert (f"lowered_module_0: command stream not executed (NPU_OP_POOL at word {pool.offset}"
            f": pooling mode MIN is not modelled" in out)
    assert "computed from its TOSA graph by the TOSA reference model" in out


def test_a_tampered_u85_command_fails_verify_once_the_stream_runs(programs, tmp_path, capsys):
    """The last convolution's OFM zero point changed in DS-CNN's U85 stream (manifest hashes
    rewritten): no bound, weight or scale moves, so the stream checker and the weight check
    pass it and the TOSA graph alone computes the old result; executing the bytes shows it."""
    from tests.tampering import copy_program, payload_bytes, replace_payload

    pte = copy_program(programs["ds-cnn@u85-256"], tmp_path)
    twin = load_twin(pte)
    payload = payload_bytes(twin)
    cmd = twin.partitions[0].payload.cmd_bytes
    commands = parse_u85_payload(cmd).command_streams[0]
    zero_point = [c for c in commands if c.name == "NPU_SET_OFM_ZERO_POINT"][-1]
    blob = bytearray(payload)
    at = payload.index(cmd) + 4 * zero_point.offset + 2
    blob[at:at + 2] = ((zero_point.param + 9) & 0xFFFF).to_bytes(2, "little")
    replace_payload(pte, payload, bytes(blob))
    assert main(["verify", str(pte), "--runtime", "twin", "--npu-model", "tosa",
                 "--samples", "2"]) == 0
    capsys.readouterr()
    assert main(["verify", str(pte), "--runtime", "twin", "--npu-model", "both",
                 "--samples", "2"]) == 4
    out = capsys.readouterr()
    assert ("EthosUBackend lowered_module_0): output 0 of the command stream differs from the "
            "TOSA graph's") in out.out + out.err


def test_verify_qemu_on_the_corstone_320_executes_the_u85_bytes(programs, tmp_path, capsys):
    """`verify --qemu --npu-model stream` on a Corstone-320 program: each invocation the
    firmware's EthosUBackend hands over the bridge runs from its command stream in the U85
    model (4 cases x 259 commands), and a flipped weight byte (hashes rewritten) fails it,
    naming the partition, whatever the samples exercise."""
    from tests.device_tools import qemu_or_missing
    from npu_driver.ethos_u.u85_checker import check_u85_stream
    from tests.tampering import copy_program, flip_weight_byte

    qemu_or_missing()
    ds_cnn = programs["ds-cnn@u85-256"]
    assert main(["verify", str(ds_cnn), "--qemu", "--npu-model", "stream"]) == 0
    out = capsys.readouterr().out
    assert "Ethos-U85 command streams in the Ethos-U85 model over semihosting" in out
    assert "npu: 4 invocation(s), 1,036 NPU commands executed by the Ethos-U85 model" in out

    pte = copy_program(ds_cnn, tmp_path)
    twin = load_twin(pte)
    partition = twin.partitions[0].payload
    check = check_u85_stream(partition.cmd_bytes, [len(partition.weight_bytes),
                                                   partition.scratch_bytes, None],
                             "ethos-u85-256", (2,))
    first = check.weights[0]  # the first convolution's weight stream, in region 0
    flip_weight_byte(pte, first.base + first.length // 2, 0x40)
    assert main(["verify", str(pte), "--qemu", "--npu-model", "stream"]) == 4
    captured = capsys.readouterr()
    text = captured.out + captured.err
    assert "lowered_module_0" in text and "weight" in text, text[-2000:]


HEAD_SLICE = """
import torch
from torch import nn


class QScaled(nn.Module):
    \"\"\"q of an attention's qkv split, scaled: unbind(0) of a permuted 5-D tensor.\"\"\"

    def __init__(self):
        super().__init__()
        self.register_buffer("c", torch.tensor([0.35]))

    def forward(self, x):
        q, k, v = x.reshape(4, 16, 3, 4, 16).permute(2, 0, 3, 1, 4).unbind(0)
        return (q * self.c).reshape(1, 16, 16, 16)


def model():
    g = torch.Generator().manual_seed(1)
    return QScaled().eval(), (torch.rand(1, 64, 192, generator=g) * 2 - 1,)
"""


def test_vela_steps_no_head_of_a_sliced_attention_tensor_so_q_is_selected_before_the_permute(
        tmp_path, monkeypatch):
    """Upstream's behaviour: the q of every timm/torchvision attention (`qkv.reshape(B, N, 3,
    H, D).permute(2, 0, 3, 1, 4).unbind(0)`) scaled on U85-256. Vela 5.1 folds the SLICE (extent
    1 on its leading axis) into the MUL's IFM and splits the MUL per batch without stepping the
    IFM (regor's DecomposeLeadingDimensions takes the extent-1 axis for a broadcast): 4 MULs
    with one IFM_BASE0, so heads 1-3 get head 0's q. The model executes those registers (the
    U85 has no batch register) and differs from the TOSA graph; MobileViT-XXS was written with
    exit 0 this way and failed every verify method. Without our rewrite, the compile's device
    check moves the partition to the CPU, naming the difference. With it, q is selected before
    the permute (`heads_selected_before_permute`), Vela steps every batch, the partition stays
    on the NPU and the program verifies."""
    from orchestrator import api
    from partitioners import quantizable

    (tmp_path / "head.py").write_text(HEAD_SLICE)
    with monkeypatch.context() as patched:  # upstream's form: the rewrite not made (and not
        # cached: the cache's key holds the rewrites' source, which the patch leaves alone)
        patched.setattr(quantizable, "heads_selected_before_permute", lambda *args: [])
        patched.setenv("ORCHESTRATE_CACHE", "off")
        api.compile(f"{tmp_path / 'head.py'}:model", tmp_path / "upstream.pte",
                    platform="corstone320", npu="ethos-u85-256")
    plan = json.loads((tmp_path / "upstream.artifacts" / "plan.json").read_text())
    reasons = [r["message"] for op in plan["ops"] for r in op["reasons"]]
    assert any("its command stream fails on the ethos-u85-256 (functional model): output 0 of "
               "the command stream differs from the TOSA graph's" in r for r in reasons), reasons
    assert plan["summary"]["npu_partitions"] == 0

    pte = tmp_path / "head.pte"
    api.compile(f"{tmp_path / 'head.py'}:model", pte, platform="corstone320",
                npu="ethos-u85-256")
    plan = json.loads((tmp_path / "head.artifacts" / "plan.json").read_text())
    assert plan["summary"]["npu_partitions"] == 1 and len(load_twin(pte).partitions) == 1
    workarounds = json.dumps(plan)
    assert "DecomposeLeadingDimensions" in workarounds
    assert main(["verify", str(pte), "--samples", "2"]) == 0


FIVE_AXIS_SELECT = """
import torch
from torch import nn


class Attention(nn.Module):
    \"\"\"q, k and v selected on the middle of five axes, then permuted, into SDPA.\"\"\"

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.qkv = nn.Linear(64, 192)

    def forward(self, x):
        t = self.qkv(x).reshape(4, 16, 3, 4, 16)
        q, k, v = (t.select(2, i).permute(0, 2, 1, 3) for i in range(3))
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)


def model():
    g = torch.Generator().manual_seed(0)
    return Attention().eval(), (torch.randn(4, 16, 64, generator=g),)
"""


def test_upstream_lowers_a_select_on_a_middle_axis_into_attention_as_the_wrong_rows(tmp_path):
    """Upstream's behaviour, which the rewrite above steps around: ExecuTorch 1.5.1's Arm
    backend lowers v = `select(t, 2, 2).permute(0, 2, 1, 3)` of a 5-D t, feeding SDPA's second
    matmul, as a TRANSPOSE to (B, 3, H, N, D), a RESHAPE to (B x 3 x H, N, D) and one contiguous
    SLICE of B x H rows: rows of the wrong batches and of q and k. The TOSA graph, which the
    command stream computes byte for byte, is then far from the quantized reference (so the
    rewrite selects on the axes after it merged into one, which lowers right)."""
    from orchestrator import api

    (tmp_path / "five.py").write_text(FIVE_AXIS_SELECT)
    pte = tmp_path / "five.pte"
    api.compile(f"{tmp_path / 'five.py'}:model", pte, platform="corstone320",
                npu="ethos-u85-256")
    assert len(load_twin(pte).partitions) == 1  # its stream equals its graph
    assert main(["verify", str(pte), "--runtime", "twin", "--npu-model", "tosa",
                 "--samples", "2"]) == 4
