"""The command-stream checker and the weight check, on DS-CNN's U55-128 program: a stream whose
OFM write runs past its region is refused before anything runs, naming the command and its word
offset, on the twin, the host runtime and the QEMU bridge's handler; and every weight byte of
the program is checked against the TOSA graph whatever the inputs, so one flipped byte at every
97th position of the weight data fails verify, all of them (manifest hashes rewritten as
tests/tampering.py does)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from ethosu.vela.ethos_u55_regs.ethos_u55_regs import cmd0, cmd1

from npu_driver.ethos_u import (FAST_SCRATCH_REGION, SCRATCH_REGION,
                                StreamRefused, check_partition_weights, check_stream,
                                parse_custom_operator_payload, resolve_accelerator)
from npu_driver.ethos_u.reserved_bits import HEADERS, masks_from_header, reserved_masks
from orchestrator.cli import main
from orchestrator.verification.npu import NpuExecutor, NpuModelFault
from orchestrator.verification.twin import load_twin
from tests.device_tools import missing
from tests.tampering import (check_firmware_refuses_on_the_device, copy_program,
                             flip_weight_byte, payload_bytes, replace_payload,
                             verify_fails_on_every_method)

PARTITION = "lowered_module_0"


@pytest.fixture(scope="module")
def ds_cnn(compiles):
    return compiles.get("ds-cnn", npu="ethos-u55-128", write=True)[1]


def _first_conv(commands):
    return next(c for c in commands if c.opcode == cmd0.NPU_OP_CONV)


def _set_register(pte: Path, opcode, value: int) -> int:
    """Set the payload word of the last `opcode` command before the first NPU_OP_CONV of
    partition 0 to `value` (hashes rewritten); returns that convolution's word offset."""
    twin = load_twin(pte)
    payload = payload_bytes(twin)
    cmd = twin.partitions[0].payload.cmd_bytes
    commands = parse_custom_operator_payload(cmd).command_streams[0]
    conv = _first_conv(commands)
    register = [c for c in commands if c.opcode == opcode and c.offset < conv.offset][-1]
    blob = bytearray(payload)
    at = payload.index(cmd) + 4 * (register.offset + 1)
    blob[at:at + 4] = value.to_bytes(4, "little")
    replace_payload(pte, payload, bytes(blob))
    return conv.offset


def _past_the_scratch(ds_cnn, folder, how: str):
    """DS-CNN with its first convolution's OFM moved past the end of the scratch: its base
    (OFM_BASE0) or its row stride (OFM_STRIDE_Y)."""
    pte = copy_program(ds_cnn, folder)
    scratch = load_twin(pte).partitions[0].payload.scratch_bytes
    opcode, value = {"base": (cmd1.NPU_SET_OFM_BASE0, scratch - 64),
                     "stride": (cmd1.NPU_SET_OFM_STRIDE_Y, 4096)}[how]
    return pte, _set_register(pte, opcode, value)


@pytest.mark.parametrize("how", ["base", "stride"])
def test_an_ofm_write_past_its_region_is_refused_before_it_runs_naming_command_and_offset(
        ds_cnn, tmp_path, how):
    pte, conv = _past_the_scratch(ds_cnn, tmp_path, how)
    payload = load_twin(pte).partitions[0].payload
    accel = resolve_accelerator(parse_custom_operator_payload(payload.cmd_bytes), None)
    with pytest.raises(StreamRefused) as refused:
        check_stream(payload.cmd_bytes, [len(payload.weight_bytes), payload.scratch_bytes, None],
                     accel, (FAST_SCRATCH_REGION,))
    assert str(refused.value).startswith(f"NPU_OP_CONV at word {conv}: OFM reaches bytes ")
    assert f"of region {SCRATCH_REGION}, which has {payload.scratch_bytes} bytes" in str(
        refused.value)


@pytest.mark.parametrize("how", ["base", "stride"])
def test_the_refusal_is_the_verdict_on_every_method(ds_cnn, tmp_path, capsys,
                                                                     how):
    pte, conv = _past_the_scratch(ds_cnn, tmp_path, how)
    verify_fails_on_every_method(pte, capsys, PARTITION,
                                 f"NPU_OP_CONV at word {conv}: OFM reaches bytes")


def test_the_qemu_bridge_handler_refuses_it_with_the_same_words(ds_cnn, tmp_path):
    """What the QEMU bridge calls for each invocation the firmware hands over
    (orchestrator/device_runs/qemu_npu.py), on the regions as the firmware sends them."""
    from orchestrator.device_runs.qemu_npu import QemuNpuHandler

    pte, conv = _past_the_scratch(ds_cnn, tmp_path, "base")
    twin = load_twin(pte)
    partition = twin.partitions[0]
    handler = QemuNpuHandler(twin, "ethos-u55-128", npu_model="stream")
    regions = [bytearray(partition.payload.weight_bytes),
               bytearray(partition.payload.scratch_bytes), bytearray(0)]
    with pytest.raises(NpuModelFault, match=f"NPU_OP_CONV at word {conv}: OFM reaches bytes"):
        handler(partition.payload.cmd_bytes, regions)
    assert not any(regions[SCRATCH_REGION])  # refused before the NPU wrote a byte


def test_the_reserved_bit_table_is_arms_interface_definitions():
    from kernels.native.sources import third_party_root

    root = Path(third_party_root(None)[0]) / "ethos-u-core-driver" / "src"
    for product, header in HEADERS.items():
        if not (root / header).is_file():
            missing(f"no {root / header}")
        assert reserved_masks(product) == masks_from_header((root / header).read_text())


def test_every_weight_byte_of_ds_cnn_is_checked_against_the_tosa_graph(ds_cnn):
    for partition in load_twin(ds_cnn).partitions:
        report = check_partition_weights(partition.payload, partition.tosa_bytes)
        assert report.checked_bytes == report.weight_bytes and not report.unchecked, \
            report.summary()
        assert len(report.checked) == sum(1 for c in parse_custom_operator_payload(
            partition.payload.cmd_bytes).command_streams[0]
            if c.opcode in (cmd0.NPU_OP_CONV, cmd0.NPU_OP_DEPTHWISE))


def test_every_flipped_weight_byte_fails_whatever_the_inputs(ds_cnn, tmp_path):
    """One flipped byte at every 97th position of each partition's weight data, hashes
    rewritten: each fails through the executor verify runs for the twin, the host runtime and
    QEMU (the weight check runs before the stream's first invocation, whatever the samples)."""
    pte = copy_program(ds_cnn, tmp_path)
    twin = load_twin(pte)
    flips = caught = 0
    for index, partition in enumerate(twin.partitions):
        weights = partition.payload.weight_bytes
        for position in range(0, len(weights), 97):
            damaged = bytearray(weights)
            damaged[position] ^= 0x01
            partition_copy = replace(partition, payload=replace(
                partition.payload, weight_bytes=bytes(damaged)))
            executor = NpuExecutor("stream", "ethos-u55-128")
            arrays = [np.zeros(spec.shape, dtype=spec.numpy_type) for spec in partition.io.inputs]
            flips += 1
            try:
                executor.run(partition_copy, arrays, f"EthosUBackend {partition.delegate_name}")
            except NpuModelFault as error:
                assert partition.delegate_name in str(error)
                caught += 1
    assert flips == caught, f"{caught} of {flips} flips caught"
    assert flips == sum(-(-len(p.payload.weight_bytes) // 97) for p in twin.partitions)


@pytest.mark.parametrize("position", [0, 97 * 150, 97 * 296])
def test_a_flipped_weight_byte_fails_verify_on_every_method(ds_cnn, tmp_path, capsys, position):
    """The same through `verify` itself, the .pte rewritten (hashes too), for three of them."""
    pte = copy_program(ds_cnn, tmp_path)
    flip_weight_byte(pte, position)
    code = main(["verify", str(pte), "--samples", "1", "--format", "json"])
    report = json.loads(capsys.readouterr().out)
    methods = {m["name"]: m for m in report["methods"]}
    assert code == 4
    for name in ("twin", "host runtime", "QEMU Cortex-M55"):
        if methods[name]["outcome"] == "not-run":
            missing(methods[name]["detail"])
        assert methods[name]["outcome"] == "failed", methods[name]
        assert "weight data fails its check against the TOSA graph" in methods[name]["detail"]


def test_a_tosa_graph_the_weight_check_cannot_parse_leaves_the_verdict_to_the_reference_model(
        ds_cnn):
    """A damaged TOSA graph in the artifacts (about one random byte flip in seven breaks its
    parse here) is no weight mismatch and no internal error: the check reports every stream
    not checked, and the TOSA reference model, run next in its child process, judges the graph
    (tests/test_npu_verify.py: it crashes or refuses, one line, exit 2)."""
    partition = load_twin(ds_cnn).partitions[0]
    damaged = bytearray(partition.tosa_bytes)
    damaged[8:24] = b"\xff" * 16  # the root table's offsets
    report = check_partition_weights(partition.payload, bytes(damaged))
    assert report.checked == () and report.checked_bytes == 0
    assert report.unchecked[0].startswith("every stream: the partition's TOSA graph does not "
                                          "parse (")
    assert report.data_bytes == report.weight_bytes > 0


def test_a_check_firmware_runs_the_stream_check_on_the_device(ds_cnn, tmp_path):
    """`orchestrate firmware --profile check`: the firmware checks each Ethos-U55 invocation
    before the driver submits it (templates/npu_stream_check.c, linked around
    ethosu_invoke_v3). DS-CNN as compiled runs to the twin's bytes; with its first convolution's
    OFM base moved past the scratch (the same project relinked with that program), the Cortex-M55
    on QEMU refuses it in the host checker's words, and the invocation never reaches the NPU."""
    pte, conv = _past_the_scratch(ds_cnn, tmp_path / "tampered", "base")
    check_firmware_refuses_on_the_device(ds_cnn, pte, conv, tmp_path / "fw")
