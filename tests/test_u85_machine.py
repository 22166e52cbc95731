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
per channel, lookup tables), the
mixed model on U85-256 (an OFM written transposed, CHW; and a partition whose convolutions keep
their accumulators between operations, which the model refuses: that partition runs as its TOSA
graph, and verify says so by name).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from npu_driver.ethos_u import UnmodelledCommand, run_partition
from npu_driver.ethos_u.u85_checker import parse_u85_payload
from npu_driver.ethos_u.u85_commands import fields
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


def test_kept_accumulators_are_refused_naming_command_and_word(programs):
    partition = load_twin(programs["mixed@u85-256"]).partitions[0]
    commands = parse_u85_payload(partition.payload.cmd_bytes).command_streams[0]
    kept = next(c for c in commands if c.name == "NPU_OP_CONV" and fields(
        [s for s in commands if s.name == "NPU_SET_ACC_FORMAT" and s.offset < c.offset][-1])[
            "acc_output"])
    with pytest.raises(UnmodelledCommand,
                       match=f"^NPU_OP_CONV at word {kept.offset}: ACC_FORMAT acc_input RESET "
                             "/ acc_output DISABLE"):
        run_partition(partition.payload, _inputs(partition, np.random.default_rng(0)),
                      "ethos-u85-256")


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


def test_verify_names_the_u85_partition_left_to_the_tosa_graph(programs, capsys):
    assert main(["verify", str(programs["mixed@u85-256"]), "--runtime", "twin",
                 "--npu-model", "stream", "--samples", "2"]) == 0
    out = capsys.readouterr().out
    assert ("lowered_module_0: command stream not executed (NPU_OP_CONV at word "
            in out and "computed from its TOSA graph by the TOSA reference model" in out)
    assert "lowered_module_1: 84 commands" in out


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
