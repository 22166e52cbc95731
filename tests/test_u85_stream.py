"""The Ethos-U85 command stream, on DS-CNN's U85-256 program: decoded with the U85 table (from
Arm's ethosu85_interface.h) into named commands with word offsets, bounded by the U85 stream
checker against the regions the payload declares, and a stream whose OFM write runs past its
region (a tampered OFM base or row stride, manifest hashes rewritten as tests/tampering.py does)
refused by verify on every method, naming the command and its word offset, before the TOSA
reference model computes the partition."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from npu_driver.ethos_u import FAST_SCRATCH_REGION, SCRATCH_REGION, StreamRefused
from npu_driver.ethos_u.errors import CommandStreamError
from npu_driver.ethos_u.u85_checker import (U85_ACCELERATORS, U85Checker, check_u85_stream,
                                            disassemble_u85, parse_u85_payload)
from npu_driver.ethos_u.u85_commands import U85_OPCODES, fields, table, table_from_header
from orchestrator.verification.npu import NpuExecutor
from orchestrator.verification.twin import load_twin
from tests.device_tools import missing
from tests.npu_edge_models import model_spec
from tests.tampering import (check_firmware_refuses_on_the_device, copy_program, payload_bytes,
                             replace_payload, verify_fails_on_every_method)

PARTITION = "lowered_module_0"
NPU = "ethos-u85-256"


@pytest.fixture(scope="module")
def ds_cnn(compiles):
    return compiles.get("ds-cnn", platform="corstone320", npu=NPU, write=True)[1]


def _regions(payload):
    return [len(payload.weight_bytes), payload.scratch_bytes, None]


def test_the_u85_command_table_is_arms_interface_definition():
    from kernels.native.sources import third_party_root

    header = Path(third_party_root(None)[0]) / "ethos-u-core-driver" / "src" / \
        "ethosu85_interface.h"
    if not header.is_file():
        missing(f"no {header}")
    assert table() == table_from_header(header.read_text())
    assert len(table()["cmd0"]) + len(table()["cmd1"]) == len(table()["fields"]) == 111


def test_every_word_of_ds_cnn_u85_stream_decodes_into_a_named_command(ds_cnn):
    payload = load_twin(ds_cnn).partitions[0].payload
    cop = parse_u85_payload(payload.cmd_bytes)
    (commands,) = cop.command_streams
    assert cop.optimizer_configs[0].product == 2  # config_r.product: Ethos-U85
    # every word is covered, one command after the other, and the stream ends with a STOP
    words = len(payload.cmd_bytes) // 4
    ends = [c.offset + (1 if c.payload is None else 2) for c in commands]
    assert [c.offset for c in commands[1:]] == ends[:-1] and ends[-1] == words
    assert commands[-1].name == "NPU_OP_STOP"
    names = set(table()["cmd0"]) | set(table()["cmd1"])
    assert all(c.name in names for c in commands)
    operations = [c.name for c in commands if c.name.startswith("NPU_OP_")]
    assert operations.count("NPU_OP_CONV") == 6 and operations.count("NPU_OP_DEPTHWISE") == 4
    assert operations.count("NPU_OP_POOL") == 1
    # the fields are the header's: the first convolution's kernel is DS-CNN's 10x4, stride 2
    conv = next(c for c in commands if c.name == "NPU_OP_CONV")
    before = {c.name: c for c in commands if c.offset < conv.offset}
    assert fields(before["NPU_SET_KERNEL_HEIGHT_M1"]) == {"height_m1": 9}
    assert fields(before["NPU_SET_KERNEL_WIDTH_M1"]) == {"width_m1": 3}
    stride = fields(before["NPU_SET_KERNEL_STRIDE"])
    assert stride["stride_x_lsb"] == stride["stride_y_lsb"] == 1
    listing = disassemble_u85(payload.cmd_bytes)
    assert f"{conv.offset:6}  NPU_OP_CONV" in listing
    assert "activation_format=NHCWB16" in listing


def test_ds_cnn_u85_stream_stays_inside_its_regions(ds_cnn):
    payload = load_twin(ds_cnn).partitions[0].payload
    check = check_u85_stream(payload.cmd_bytes, _regions(payload), NPU, (FAST_SCRATCH_REGION,))
    extent = check.extent()
    assert 0 < extent[0] <= len(payload.weight_bytes)
    assert 0 < extent[SCRATCH_REGION] <= payload.scratch_bytes
    # every operation's OFM is bounded, and each weight stream and scale table
    assert sum(a.what == "OFM" for a in check.accesses) == 11
    assert len(check.weights) == 10 and len(check.scales) == 10


def test_an_unknown_u85_opcode_is_refused_naming_its_word(ds_cnn):
    payload = load_twin(ds_cnn).partitions[0].payload
    commands = parse_u85_payload(payload.cmd_bytes).command_streams[0]
    target = next(c for c in commands if c.name == "NPU_OP_DEPTHWISE")
    blob = bytearray(payload.cmd_bytes)
    blob[4 * target.offset:4 * target.offset + 2] = (0x04).to_bytes(2, "little")  # no cmd0 4
    assert 0x04 not in U85_OPCODES[0]
    with pytest.raises(CommandStreamError,
                       match=f"unknown cmd0 opcode 0x004 at word {target.offset}"):
        check_u85_stream(bytes(blob), _regions(payload), NPU)


def _set_register(pte: Path, name: str, value: int) -> int:
    """Set the payload word of the last `name` command before the first NPU_OP_CONV of the
    U85 partition to `value` (hashes rewritten); returns that convolution's word offset."""
    twin = load_twin(pte)
    payload = payload_bytes(twin)
    cmd = twin.partitions[0].payload.cmd_bytes
    commands = parse_u85_payload(cmd).command_streams[0]
    conv = next(c for c in commands if c.name == "NPU_OP_CONV")
    register = [c for c in commands if c.name == name and c.offset < conv.offset][-1]
    blob = bytearray(payload)
    at = payload.index(cmd) + 4 * (register.offset + 1)
    blob[at:at + 4] = value.to_bytes(4, "little")
    replace_payload(pte, payload, bytes(blob))
    return conv.offset


def _past_the_scratch(ds_cnn, folder, how: str):
    pte = copy_program(ds_cnn, folder)
    scratch = load_twin(pte).partitions[0].payload.scratch_bytes
    name, value = {"base": ("NPU_SET_OFM_BASE0", scratch - 64),
                   "stride": ("NPU_SET_OFM_STRIDE_Y", 4096)}[how]
    return pte, _set_register(pte, name, value)


@pytest.mark.parametrize("how", ["base", "stride"])
def test_a_u85_ofm_write_past_its_region_is_refused_naming_command_and_offset(
        ds_cnn, tmp_path, how):
    pte, conv = _past_the_scratch(ds_cnn, tmp_path, how)
    partition = load_twin(pte).partitions[0]
    payload = partition.payload
    with pytest.raises(StreamRefused) as refused:
        check_u85_stream(payload.cmd_bytes, _regions(payload), NPU, (FAST_SCRATCH_REGION,))
    assert str(refused.value).startswith(f"NPU_OP_CONV at word {conv}: OFM reaches bytes ")
    assert f"of region {SCRATCH_REGION}, which has {payload.scratch_bytes} bytes" in str(
        refused.value)


def test_the_executor_checks_the_stream_before_the_tosa_graph_runs(ds_cnn, tmp_path):
    """The refusal comes from the check, not from the TOSA reference model: the executor
    raises before it computes anything, and an intact stream's check is reported."""
    from orchestrator.verification.npu import NpuModelFault

    pte, conv = _past_the_scratch(ds_cnn, tmp_path, "base")
    executor = NpuExecutor("auto", NPU)
    assert "bounds-checked" in executor.method
    with pytest.raises(NpuModelFault, match=f"NPU_OP_CONV at word {conv}: OFM reaches"):
        executor.check_u85(load_twin(pte).partitions[0], f"EthosUBackend {PARTITION}")
    intact = NpuExecutor("auto", NPU)
    intact.check_u85(load_twin(ds_cnn).partitions[0], f"EthosUBackend {PARTITION}")
    assert intact.tally.stream_checks[PARTITION].startswith("259 commands decoded")


@pytest.mark.parametrize("how", ["base", "stride"])
def test_verify_refuses_a_u85_stream_writing_past_its_region_on_every_method(
        ds_cnn, tmp_path, capsys, how):
    pte, conv = _past_the_scratch(ds_cnn, tmp_path, how)
    verify_fails_on_every_method(pte, capsys, PARTITION,
                                 f"NPU_OP_CONV at word {conv}: OFM reaches bytes")


@pytest.mark.parametrize("model,features", [("mixed", {"transposed"}),
                                            (model_spec("strided_edges"), {"kept"})],
                         ids=["mixed", "strided-edges"])
def test_u85_partitions_are_bounded_with_transposed_and_kept_ofms(compiles, model, features):
    """What the U55 never emits, on U85-256: an OFM written transposed (CHW: its tile registers
    describe the permuted map; the mixed model) and OFMs of storage NONE (accumulators kept for
    the next operation, nothing written; a stride-4 convolution decomposed per tap,
    strided_edges); all are bounded inside the payload's regions, the transposed write ending
    exactly at the input it precedes."""
    pte = compiles.get(model, platform="corstone320", npu=NPU, write=True)[1]
    seen = set()
    for partition in load_twin(pte).partitions:
        payload = partition.payload
        commands = parse_u85_payload(payload.cmd_bytes).command_streams[0]
        precisions = [fields(c) for c in commands if c.name == "NPU_SET_OFM_PRECISION"]
        check = check_u85_stream(payload.cmd_bytes, _regions(payload), NPU,
                                 (FAST_SCRATCH_REGION,))
        assert check.extent()[SCRATCH_REGION] <= payload.scratch_bytes
        assert check.extent()[0] <= len(payload.weight_bytes)
        operations = sum(c.name.startswith("NPU_OP_") and c.name != "NPU_OP_STOP"
                         for c in commands)
        written = sum(a.what == "OFM" for a in check.accesses)
        if any(p["activation_storage"] == 3 for p in precisions):  # NONE
            assert written < operations
            seen.add("kept")
        if any(p["activation_transpose"] for p in precisions):
            transposed = next(a for a in check.accesses if a.what == "OFM")
            assert transposed.highest + 1 == payload.inputs[0].offset
            seen.add("transposed")
    assert seen == features


def test_a_check_firmware_runs_the_u85_stream_check_on_the_device(ds_cnn, tmp_path):
    """`orchestrate firmware --profile check` for the Corstone-320: the firmware checks each
    Ethos-U85 invocation with the U85's command table before the driver submits it
    (templates/npu_stream_check.c). DS-CNN as compiled runs to the twin's bytes; with its first
    convolution's OFM base moved past the scratch (the ELF's embedded program patched: one
    word), the core on QEMU refuses it in the host checker's words, and the host is never
    asked to compute the invocation."""
    pte, conv = _past_the_scratch(ds_cnn, tmp_path / "tampered", "base")
    check_firmware_refuses_on_the_device(ds_cnn, pte, conv, tmp_path / "fw")


def test_weights_from_ifm2_are_bounded_as_ofm_depth_by_ifm_depth(compiles):
    """A matmul's weights read from IFM2 (matmul_edges on U85-256: [8, 16] x [16, 12]) are a
    1 x OFM depth x IFM depth map, 12 x 16 here (regor's RewriteMatmul transposes the operand
    so; the model reads it so, bit-exact): with IFM2_BASE0 moved so that the map's last byte
    is the scratch's last, the stream is accepted, and one byte further it is refused naming
    the convolution. The transposed 16 x 12 bound lets that one through: its 12 channels end
    4 bytes short in each brick, and its columns 12-15 lie past WIDTH0, in tile 1."""
    from tests.npu_edge_models import model_spec

    pte = compiles.get(model_spec("matmul_edges"), platform="corstone320", npu=NPU,
                       write=True)[1]
    payload = load_twin(pte).partitions[0].payload
    commands = parse_u85_payload(payload.cmd_bytes).command_streams[0]
    conv = next(c for c in commands if c.name == "NPU_OP_CONV" and fields(c)["weights_ifm2"])
    base = [c for c in commands if c.name == "NPU_SET_IFM2_BASE0" and c.offset < conv.offset][-1]
    registers = {c.name: fields(c) for c in commands if c.offset < conv.offset}
    assert registers["NPU_SET_IFM2_WIDTH0_M1"]["width_m1"] + 1 == 12  # the OFM depth
    assert registers["NPU_SET_IFM_DEPTH_M1"]["depth_m1"] + 1 == 16
    extent = 11 * 16 + 16  # NHCWB16, STRIDE_X 16: x 0..11, channels 0..15 in one brick

    def with_base(address: int) -> bytes:
        blob = bytearray(payload.cmd_bytes)
        blob[4 * (base.offset + 1):4 * (base.offset + 2)] = address.to_bytes(4, "little")
        return bytes(blob)

    def check(cmd: bytes):
        # as the U85 model checks before it runs (its LUT loads bounded in the LUT memory)
        checker = U85Checker(U85_ACCELERATORS[NPU], _regions(payload), {FAST_SCRATCH_REGION})
        checker.lut_loads = True
        return checker.run(cmd)

    assert registers["NPU_SET_IFM2_STRIDE_X"]["addr_lo"] == 16
    check(with_base(payload.scratch_bytes - extent))
    with pytest.raises(StreamRefused, match=f"^NPU_OP_CONV at word {conv.offset}: IFM2 reaches "
                                            f"bytes {payload.scratch_bytes - extent + 1}\\.\\."
                                            f"{payload.scratch_bytes} of region 1"):
        check(with_base(payload.scratch_bytes - extent + 1))


def test_a_gather_dma_is_bounded_by_its_largest_index(compiles):
    """index_ops' GATHER on U85-256, a 2-D DMA with indexed source rows: the source is bounded
    up to row IDX_MAX (the hardware's limit on an index), so an IDX_MAX whose row runs past
    the scratch is refused naming the DMA, and the largest that fits is accepted."""
    from examples.user_models import model_spec as user_model_spec

    pte = compiles.get(user_model_spec("index_ops"), platform="corstone320", npu=NPU,
                       write=True)[1]
    payload = load_twin(pte).partitions[1].payload
    commands = parse_u85_payload(payload.cmd_bytes).command_streams[0]
    dma = next(c for c in commands if c.name == "NPU_OP_DMA_START")
    registers = {c.name: c for c in commands if c.offset < dma.offset}
    assert fields(registers["NPU_SET_DMA0_SRC_REGION"])["idx_mode"]
    source = registers["NPU_SET_DMA0_SRC"].address
    stride = registers["NPU_SET_DMA0_SRC_STRIDE0"].address
    length = registers["NPU_SET_DMA0_LEN"].address
    fits = (payload.scratch_bytes - source - length) // stride

    def with_idx_max(value: int) -> bytes:
        blob = bytearray(payload.cmd_bytes)
        at = 4 * (registers["NPU_SET_DMA0_IDX_MAX"].offset + 1)
        blob[at:at + 4] = value.to_bytes(4, "little")
        return bytes(blob)

    def check(cmd: bytes):
        checker = U85Checker(U85_ACCELERATORS[NPU], _regions(payload), {FAST_SCRATCH_REGION})
        checker.lut_loads = True
        return checker.run(cmd)

    assert any(a.what == "DMA index" for a in check(with_idx_max(fits)).accesses)
    with pytest.raises(StreamRefused, match=f"^NPU_OP_DMA_START at word {dma.offset}: DMA "
                                            "source reaches bytes "):
        check(with_idx_max(fits + 1))


def test_a_u85_stream_loading_lookup_tables_is_bounded_and_its_weights_checked(compiles):
    """matmul_edges on U85-256 loads its lookup table by DMA into the LUT memory and takes
    three operands from OP_SCALAR, whose values Vela also stores in the weight data as int32s
    nothing reads. The stream checker bounds the LUT load in the 2048-byte LUT memory (verify's
    check before the first run, as the model's), and the weight check accounts for every byte:
    each stored value must equal an OP_SCALAR of the stream, so one flipped byte in one fails."""
    from npu_driver.ethos_u import WeightMismatch, check_partition_weights
    from tests.npu_edge_models import model_spec

    pte = compiles.get(model_spec("matmul_edges"), platform="corstone320", npu=NPU,
                       write=True)[1]
    partition = load_twin(pte).partitions[0]
    payload = partition.payload
    check = check_u85_stream(payload.cmd_bytes, _regions(payload), NPU, (FAST_SCRATCH_REGION,),
                             lut_loads=True)
    assert any(a.region == -1 and a.what == "DMA destination" for a in check.accesses)
    report = check_partition_weights(payload, partition.tosa_bytes, NPU)
    assert report.checked and not report.unchecked
    data = payload.weight_bytes
    stored = [at for at in range(0, len(data), 16)
              if data[at:at + 4] in {v.to_bytes(4, "little") for v in check.scalars}
              and any(data[at:at + 4]) and not any(data[at + 4:at + 16])]
    assert stored
    flipped = bytearray(data)
    flipped[stored[0]] ^= 0x01
    with pytest.raises(WeightMismatch, match="non-zero byte"):
        check_partition_weights(replace(payload, weight_bytes=bytes(flipped)),
                                partition.tosa_bytes, NPU)
