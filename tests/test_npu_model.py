"""The Ethos-U55/U65 functional model (npu_driver.ethos_u) executes Vela's command streams
byte for byte as the TOSA reference model executes the partitions' TOSA graphs.

Programs (compiled once per session through the shared `compiles` fixture): DS-CNN on U55-128,
ResNet-8 on U65-256 (elementwise adds, the U65's fast scratch) and the edge-case model of
tests/npu_edge_models.py on U55-64 (16 SHRAM banks: LUTs not reserved); and, lowered through
ExecuTorch's Arm backend directly because the orchestrator quantizes to int8 only, a model with
16-bit activations on U55-256 (int16 convolutions, 32-bit accumulators and OFMs, interpolating
int16 LUTs). Every NPU partition is
run on seeded random inputs over the whole input range; outputs must be equal bytes. Tampered
payloads must change the output bytes (or be refused with an error naming the command), and an
unknown opcode must be refused by name and word offset.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from npu_driver.ethos_u import (CommandStreamError, ConfigMismatch, NpuModelError,
                                UnmodelledCommand, execute, parse_custom_operator_payload,
                                run_npu_partition, run_partition)
from npu_driver.payload import EthosUPayload
from npu_driver.tosa_twin import run_tosa

EDGES = str(Path(__file__).with_name("npu_edge_models.py")) + ":all_edges"
PROGRAMS = {"ds-cnn@u55-128": ("ds-cnn", "ethos-u55-128"),
            "resnet8@u65-256": ("resnet8", "ethos-u65-256"),
            "edges@u55-64": (EDGES, "ethos-u55-64")}
SAMPLES = 3


@pytest.fixture(scope="module")
def programs(compiles):
    from orchestrator.verification.twin import load_twin

    loaded = {}
    for key, (model, npu) in PROGRAMS.items():
        pte = compiles.get(model, npu=npu, write=True)[1]
        loaded[key] = (load_twin(pte), pte, npu)
    return loaded


@pytest.fixture(scope="module")
def int16_partitions():
    from tests.npu_edge_models import int16_edges, lower_a16w8
    from npu_driver.payload import parse_payload
    from npu_driver.tosa_twin import graph_io

    return [(tosa, parse_payload(payload), graph_io(tosa))
            for tosa, payload in lower_a16w8(int16_edges, "ethos-u55-256")]


def test_16_bit_activations_match_tosa_byte_for_byte(int16_partitions):
    assert int16_partitions
    rng = np.random.default_rng(99)
    kinds = set()
    for tosa, payload, io in int16_partitions:
        assert {spec.numpy_type for spec in io.inputs} == {"int16"}
        precisions = {c.param & 0xC for c in _commands(payload) if c.name == "NPU_SET_IFM_PRECISION"}
        assert 0x4 in precisions and 0x8 in precisions  # 16-bit and 32-bit IFMs
        for _ in range(SAMPLES):
            arrays = [rng.integers(-32768, 32768, size=spec.shape).astype(spec.numpy_type)
                      for spec in io.inputs]
            expected = [a.tobytes() for a in run_tosa(tosa, io, arrays)]
            got, counters = run_partition(payload, arrays, "ethos-u55-256")
            for index, (e, g) in enumerate(zip(expected, got)):
                assert e == g, f"int16 output {index}: {_first_difference(e, g)}"
            assert counters.hazards == []
            kinds.update(counters.operations)
    assert {"conv", "depthwise", "pool.max", "elementwise.add", "elementwise.mul",
            "lut"} <= kinds


def _inputs(partition, rng):
    arrays = []
    for spec in partition.io.inputs:
        info = np.iinfo(spec.numpy_type)
        arrays.append(rng.integers(info.min, info.max, size=spec.shape, endpoint=True)
                      .astype(spec.numpy_type))
    return arrays


def _first_difference(expected: bytes, got: bytes) -> str:
    a = np.frombuffer(expected, np.uint8)
    b = np.frombuffer(got, np.uint8)
    index = int(np.flatnonzero(a != b)[0])
    return f"byte {index}: TOSA {a[index]:#04x}, model {b[index]:#04x}"


@pytest.mark.parametrize("key", list(PROGRAMS))
def test_every_npu_partition_matches_tosa_byte_for_byte(programs, key):
    twin, _, npu = programs[key]
    assert twin.partitions, f"{key} has no NPU partition"
    rng = np.random.default_rng(1234)
    for partition in twin.partitions:
        distinct = set()
        for _ in range(SAMPLES):
            arrays = _inputs(partition, rng)
            expected = [a.tobytes() for a in run_tosa(partition.tosa_bytes, partition.io, arrays)]
            got, counters = run_partition(partition.payload, arrays, npu)
            for index, (e, g) in enumerate(zip(expected, got)):
                assert len(e) == len(g)
                assert e == g, (f"{key} {partition.delegate_name} output {index}: "
                                f"{_first_difference(e, g)}")
                distinct.update(g)
        # the outputs carry information (a model saturating everything would compare equal)
        assert len(distinct) > 8, f"{partition.delegate_name}: only {len(distinct)} byte values"
        assert counters.operations and counters.commands > 10
        assert counters.hazards == [], counters.hazards[:1]


def test_macs_counted_from_the_commands_equal_the_plans_npu_macs(programs):
    for key in ("ds-cnn@u55-128", "resnet8@u65-256"):
        twin, pte, npu = programs[key]
        plan = json.loads((pte.parent / f"{pte.stem}.artifacts" / "plan.json").read_text())
        rng = np.random.default_rng(0)
        macs = sum(run_partition(p.payload, _inputs(p, rng), npu)[1].macs
                   for p in twin.partitions)
        assert macs == plan["summary"]["macs"]["npu"], key


def _commands(payload: EthosUPayload):
    cop = parse_custom_operator_payload(payload.cmd_bytes)
    return [c for stream in cop.command_streams for c in stream]


def test_edge_model_exercises_the_edge_cases(programs):
    """The edge model's streams do contain what it is meant to test (else its byte equality
    would prove less than it claims)."""
    twin, _, npu = programs["edges@u55-64"]
    seen = {"pads": set(), "stride2": False, "dilation": False, "upscale": set(),
            "broadcast": set(), "scalar": False, "lut_dma": False, "ops": set()}
    rng = np.random.default_rng(0)
    for partition in twin.partitions:
        for command in _commands(partition.payload):
            name, param = command.name, command.param
            if name.startswith("NPU_SET_IFM_PAD_") and param:
                seen["pads"].add(name.rsplit("_", 1)[1])
            if name == "NPU_SET_KERNEL_STRIDE":
                seen["stride2"] |= bool(param & 3)
                seen["dilation"] |= bool(param & 0x18)
            if name == "NPU_SET_IFM_UPSCALE" and param:
                seen["upscale"].add(param)
            if name == "NPU_SET_IFM2_BROADCAST":
                seen["broadcast"].update(bit for bit in (1, 2, 4) if param & bit)
                seen["scalar"] |= bool(param & 0x80)
            if name == "NPU_SET_DMA0_DST_REGION" and param & 0x100:
                seen["lut_dma"] = True
        seen["ops"].update(run_partition(partition.payload, _inputs(partition, rng),
                                         npu)[1].operations)
    assert seen["pads"] == {"TOP", "LEFT", "BOTTOM", "RIGHT"}
    assert seen["stride2"] and seen["dilation"] and seen["scalar"] and seen["lut_dma"]
    assert seen["upscale"] == {1, 2}  # nearest and zeros
    assert seen["broadcast"] >= {1, 2}
    assert {"conv", "depthwise", "pool.average", "pool.max", "elementwise.add",
            "elementwise.mul", "elementwise.sub", "elementwise.min", "elementwise.max",
            "elementwise.abs", "pool.reduce_sum", "lut"} <= seen["ops"]


# -- tampering ------------------------------------------------------------------------------

def _partition(programs, key="ds-cnn@u55-128", index=0):
    twin, _, npu = programs[key]
    return twin.partitions[index], npu


def _reference(partition, seed=5):
    arrays = _inputs(partition, np.random.default_rng(seed))
    expected = [a.tobytes() for a in run_tosa(partition.tosa_bytes, partition.io, arrays)]
    return arrays, expected


def _tampered_result(payload: EthosUPayload, arrays, npu):
    try:
        return run_partition(payload, arrays, npu)[0]
    except NpuModelError as error:
        return error


def _assert_detected(result, expected, what):
    if isinstance(result, NpuModelError):
        assert "at word" in str(result), f"{what}: error does not name the command: {result}"
        return
    assert result != expected, f"{what}: the tampered payload still matches TOSA"


def _with_cmd_word(payload: EthosUPayload, word_index: int, value: int) -> EthosUPayload:
    data = bytearray(payload.cmd_bytes)
    struct.pack_into("<I", data, 4 * word_index, value & 0xFFFFFFFF)
    return EthosUPayload(bytes(data), payload.weight_bytes, payload.scratch_bytes,
                         payload.inputs, payload.outputs)


def _origin_in_weights(trace, region, address):
    """Follow DMA copies back to the weight region (0) byte a scratch byte came from."""
    for i in range(len(trace) - 1, -1, -1):
        access = trace[i]
        if (access.kind == "write" and access.what == "DMA destination"
                and access.region == region and access.lowest <= address <= access.highest):
            source = trace[i - 1]
            assert source.what == "DMA source"
            return source.region, source.lowest + address - access.lowest
    return region, address


@pytest.mark.parametrize("what", ["weight stream", "scale/bias read"])
def test_a_tampered_weight_or_scale_byte_changes_the_output(programs, what):
    partition, npu = _partition(programs)
    arrays, expected = _reference(partition)
    got, counters = run_partition(partition.payload, arrays, npu, trace=True)
    assert got == expected
    reads = [a for a in counters.trace if a.what.startswith(what)]
    assert reads
    read = reads[1]  # the second convolution's stream
    # middle of a weight stream; for scales the MSB of channel 0's 32-bit scale (byte 8)
    offset = (read.lowest + read.highest) // 2 if what == "weight stream" else read.lowest + 8
    region, address = _origin_in_weights(counters.trace, read.region, offset)
    assert region == 0, "the weights and scales come from the payload's weight data"
    weights = bytearray(partition.payload.weight_bytes)
    weights[address] ^= 0x10
    tampered = EthosUPayload(partition.payload.cmd_bytes, bytes(weights),
                             partition.payload.scratch_bytes, partition.payload.inputs,
                             partition.payload.outputs)
    _assert_detected(_tampered_result(tampered, arrays, npu), expected, what)


@pytest.mark.parametrize("register, key", [
    ("NPU_SET_OFM_SCALE", "resnet8@u65-256"),  # the elementwise add's and avg pool's scale
    ("NPU_SET_IFM_STRIDE_Y", "ds-cnn@u55-128"),
    ("NPU_SET_OFM_STRIDE_X", "ds-cnn@u55-128"),
    ("NPU_SET_IFM_BASE0", "ds-cnn@u55-128"),  # a region offset
    ("NPU_SET_DMA0_SRC", "ds-cnn@u55-128"),  # a region offset into the weight data
])
def test_a_tampered_register_changes_the_output(programs, register, key):
    partition, npu = _partition(programs, key)
    arrays, expected = _reference(partition)
    assert run_partition(partition.payload, arrays, npu)[0] == expected
    commands = [c for c in _commands(partition.payload) if c.name == register]
    assert commands, f"{key} sets no {register}"
    command = commands[len(commands) // 2]
    # a scale flips its bit 30 (about halving or doubling it), an address or stride moves by 16
    value = command.payload ^ (1 << 30) if register == "NPU_SET_OFM_SCALE" else command.payload + 16
    tampered = _with_cmd_word(partition.payload, command.offset + 1, value)
    _assert_detected(_tampered_result(tampered, arrays, npu), expected, register)


def test_a_tampered_scale_shift_changes_the_output(programs):
    """The 6-bit shift of OFM_SCALE lives in the command word's parameter, not the payload."""
    partition, npu = _partition(programs, "resnet8@u65-256")
    arrays, expected = _reference(partition)
    command = [c for c in _commands(partition.payload) if c.name == "NPU_SET_OFM_SCALE"][0]
    word = struct.unpack_from("<I", partition.payload.cmd_bytes, 4 * command.offset)[0]
    tampered = _with_cmd_word(partition.payload, command.offset, word ^ (1 << 16))
    _assert_detected(_tampered_result(tampered, arrays, npu), expected, "OFM_SCALE shift")


def test_a_missing_dma_wait_is_reported_as_a_hazard(programs):
    """DMA_WAIT 0 before a convolution whose weights the DMA brings becomes DMA_WAIT 1: the
    output of in-order execution is unchanged, but the device may run the convolution while
    its weights are still arriving, which the model reports."""
    partition, npu = _partition(programs)
    arrays, expected = _reference(partition)
    commands = _commands(partition.payload)
    waits = [c for c in commands if c.name == "NPU_OP_DMA_WAIT"]
    wait = waits[1]
    tampered = _with_cmd_word(partition.payload, wait.offset, (1 << 16) | wait.opcode.value)
    got, counters = run_partition(tampered, arrays, npu)
    assert got == expected
    assert len(counters.hazards) == 1
    following = next(c for c in commands if c.offset > wait.offset)
    assert counters.hazards[0].startswith(f"{following.name} at word {following.offset} reads")
    assert "no DMA_WAIT orders them" in counters.hazards[0]


def test_an_unknown_opcode_is_refused_by_number_and_word_offset(programs):
    partition, npu = _partition(programs)
    arrays, _ = _reference(partition)
    victim = [c for c in _commands(partition.payload) if c.name == "NPU_OP_CONV"][1]
    tampered = _with_cmd_word(partition.payload, victim.offset, 0x0004)  # cmd0 opcode 0x004
    with pytest.raises(CommandStreamError) as error:
        run_partition(tampered, arrays, npu)
    assert f"unknown cmd0 opcode 0x004 at word {victim.offset}" in str(error.value)
    tampered = _with_cmd_word(partition.payload, victim.offset, 0x4000 | 0x07F)  # cmd1 0x07f
    with pytest.raises(CommandStreamError, match=f"unknown cmd1 opcode 0x07f at word "
                                                 f"{victim.offset}"):
        run_partition(tampered, arrays, npu)


def test_a_known_but_unmodelled_command_is_refused_by_name(programs):
    partition, npu = _partition(programs)
    arrays, _ = _reference(partition)
    victim = [c for c in _commands(partition.payload) if c.name == "NPU_SET_ACTIVATION"][0]
    tampered = _with_cmd_word(partition.payload, victim.offset, (3 << 16) | victim.opcode.value)
    with pytest.raises(UnmodelledCommand, match="activation function TANH is not modelled"):
        run_partition(tampered, arrays, npu)
    victim = [c for c in _commands(partition.payload) if c.name == "NPU_OP_CONV"][0]
    tampered = _with_cmd_word(partition.payload, victim.offset, 0x0001)  # NPU_OP_IRQ
    with pytest.raises(UnmodelledCommand, match=f"NPU_OP_IRQ at word {victim.offset}"):
        run_partition(tampered, arrays, npu)


def test_a_stream_compiled_for_another_npu_is_refused(programs):
    partition, _ = _partition(programs)
    arrays, _ = _reference(partition)
    with pytest.raises(ConfigMismatch, match="128 MACs/cycle \\(stream\\) vs 256"):
        run_partition(partition.payload, arrays, "ethos-u55-256")


def test_execute_mutates_the_regions_the_driver_hands_over(programs):
    """The host driver's callback shape: command stream + base-address regions, in place."""
    partition, npu = _partition(programs)
    arrays, expected = _reference(partition)
    payload = partition.payload
    scratch = bytearray(payload.scratch_bytes)
    vela = payload.inputs[0]
    scratch[vela.offset:vela.offset + vela.nbytes] = arrays[0].tobytes()
    regions = [memoryview(payload.weight_bytes), memoryview(scratch), memoryview(bytearray())]
    counters = execute(payload.cmd_bytes, regions, npu)
    out = payload.outputs[0]
    assert bytes(scratch[out.offset:out.offset + out.nbytes]) == expected[0]
    assert counters.dma_bytes["region0->region1"] > 0
    assert counters.written_bytes[1] >= out.nbytes


def test_typed_io_wrapper_returns_tosa_shaped_arrays(programs):
    partition, npu = _partition(programs, "resnet8@u65-256")
    arrays, expected = _reference(partition)
    outputs, _ = run_npu_partition(partition, arrays, npu)
    for spec, array, e in zip(partition.io.outputs, outputs, expected):
        assert array.shape == spec.shape and array.dtype.name == spec.numpy_type
        assert array.tobytes() == e


def test_weight_decoder_equals_vela_mlw_codec_on_every_stream(programs):
    """The model's MLW decoder (which refuses malformed streams instead of exiting the process
    as Vela's C decoder does) gives exactly `ethosu.mlw_codec.decode`'s weights."""
    from ethosu import mlw_codec

    from npu_driver.ethos_u import mlw

    streams = 0
    for twin, _, npu in programs.values():
        rng = np.random.default_rng(0)
        for partition in twin.partitions:
            counters = run_partition(partition.payload, _inputs(partition, rng), npu,
                                     trace=True)[1]
            for stream in counters.weight_streams:
                ours = mlw.decode(stream)
                assert ours.tolist() == list(mlw_codec.decode(bytearray(stream)))
                streams += 1
    assert streams > 20


def test_a_malformed_weight_stream_is_an_error_not_an_exit(programs):
    from npu_driver.ethos_u import WeightStreamError, mlw

    with pytest.raises(WeightStreamError, match="ends inside"):
        mlw.decode(bytes([0x00, 0x00]))  # ZDIV 0, then SLICELEN runs out of bits
    with pytest.raises(WeightStreamError, match="invalid zero-run divisor"):
        mlw.decode(bytes([0x04, 0x00, 0x00, 0x00]))  # ZDIV 4


def test_the_real_executorch_runtime_runs_with_the_model_as_its_npu(programs):
    """ExecuTorch's EthosUBackend (host build) hands each invocation's command stream and base
    regions to the model (`invocation_handler`): the program's outputs equal those of the same
    runtime with the TOSA reference model standing in for the NPU. A U65 program compiled for
    Dedicated_Sram needs a fast scratch the host build (like a firmware that does not define
    `ethosu_fast_scratch`) gives as 0 bytes: the stream checker refuses the first DMA into it
    before anything runs."""
    import torch

    from tests.device_tools import missing

    from kernels.runtime import HostRuntime, RuntimeFailure, RuntimeUnavailable, ensure_library
    from kernels.runtime import find_sources
    from npu_driver.ethos_u import invocation_handler
    from orchestrator.device_runs.runtime_verify import npu_handler
    from orchestrator.verification.twin_verify import device_inputs

    try:
        library = ensure_library(find_sources())
    except RuntimeUnavailable as error:
        missing(str(error))
    twin, pte, _ = programs["ds-cnn@u55-128"]
    rng = np.random.default_rng(3)
    with HostRuntime(library) as runtime:
        invocations = []
        for _ in range(2):
            sample = tuple(torch.tensor(rng.uniform(-1, 1, size=spec.sizes), dtype=torch.float32)
                           for spec in twin.input_specs)
            inputs = device_inputs(twin, sample)
            tosa = runtime.run(pte, inputs, npu=npu_handler(twin, twin.npu_executor("tosa")))
            model = runtime.run(pte, inputs, npu=invocation_handler(on_counters=invocations.append))
            assert all(torch.equal(a, b) for a, b in zip(tosa.outputs, model.outputs))
        assert len(invocations) == 4 and all(c.macs for c in invocations)
        u65_twin, u65_pte, _ = programs["resnet8@u65-256"]
        sample = tuple(torch.tensor(rng.uniform(-1, 1, size=spec.sizes), dtype=torch.float32)
                       for spec in u65_twin.input_specs)
        with pytest.raises(RuntimeFailure, match="StreamRefused: NPU_OP_DMA_START at word .* of "
                                                 "region 2, which has 0 bytes"):
            runtime.run(u65_pte, device_inputs(u65_twin, sample), npu=invocation_handler())
