"""The Ethos-U85's weights checked without inputs: every weight and scale stream of a U85
partition decoded in the U85's own formats (npu_driver/ethos_u/u85_weights.py: SWD streams one
per core, FWD streams shared by the cores, 2:4 sparse, part-kernel-first with stride phases,
depthwise; 32-bit scale records), each required to be the stream Vela's encoder writes for what
it decodes to (u85_mlw.py), and compared with the TOSA graph's constants as Vela lowered
them. One flipped byte at every 97th position of DS-CNN's U85-256 weight data (hashes
rewritten as tests/tampering.py does) fails verify naming the partition, all of them; correct
programs on U85-128, 256, 512 and 2048 pass with every weight byte accounted for."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from npu_driver.ethos_u import check_partition_weights, mlw, u85_mlw
from npu_driver.ethos_u.mlw import WeightStreamError
from npu_driver.ethos_u.u85_checker import check_u85_stream
from npu_driver.ethos_u.u85_weights import (U85WeightLayout, decode_fwd, decode_scales,
                                            decode_stream, encode_fwd, weight_order)
from orchestrator.cli import main
from orchestrator.verification.npu import NpuExecutor, NpuModelFault
from orchestrator.verification.twin import load_twin
from tests.npu_edge_models import model_spec
from tests.tampering import copy_program, flip_weight_byte, verify_fails_on_every_method

PARTITION = "lowered_module_0"
NPU = "ethos-u85-256"


@pytest.fixture(scope="module")
def ds_cnn(compiles):
    return compiles.get("ds-cnn", platform="corstone320", npu=NPU, write=True)[1]


def _fully_checked(pte, npu: str, data_bytes: int = 0) -> list:
    """Every partition's weight data checked but `data_bytes` in all, which IFMs read."""
    reports = []
    for partition in load_twin(pte).partitions:
        report = check_partition_weights(partition.payload, partition.tosa_bytes, npu)
        assert report.checked_bytes + report.data_bytes == report.weight_bytes, report.summary()
        reports.append(report)
    assert sum(report.data_bytes for report in reports) == data_bytes
    return reports


def test_every_weight_byte_of_ds_cnn_u85_is_checked_against_the_tosa_graph(ds_cnn):
    """Its 6 convolutions and 4 depthwise convolutions: the first a 2:4 sparse, part-kernel-
    first stride-2 SWD stream, the depthwise ones SWD, the 1x1 ones FWD."""
    (report,) = _fully_checked(ds_cnn, NPU)
    assert not report.unchecked and len(report.checked) == 10
    assert report.padding_bytes == report.data_bytes == 0


@pytest.mark.parametrize("model,npu", [("ds-cnn", "ethos-u85-128"), ("ds-cnn", "ethos-u85-512"),
                                       ("ds-cnn", "ethos-u85-2048"),
                                       ("resnet8", "ethos-u85-2048"),
                                       ("mixed", "ethos-u85-256"),
                                       (model_spec("strided_edges"), "ethos-u85-256")],
                         ids=["ds-cnn-128", "ds-cnn-512", "ds-cnn-2048", "resnet8-2048",
                              "mixed-256", "strided-edges-256"])
def test_correct_u85_programs_pass_the_weight_check(compiles, model, npu):
    """One SWD stream per core on the U85-512 (2) and 2048 (4), the FWD streams of
    part-kernel-first convolutions interleaved across the cores (ResNet-8), a stride-4 pad-1
    convolution (strided_edges), which Vela splits into one accumulating 1x1 operation per tap
    (each checked against its tap of the TOSA kernel), and constants Vela stores for OP_SCALAR
    operands (checked as TOSA constants; the mixed model): every weight byte checked. The
    mixed model's one exception: the 256 B of fill that Vela stores for the explicit pad the
    compile puts before its stride-4 convolution (partitioners/quantizable.py
    strided_conv_padding_explicit), which the pad reads as an IFM; executing the stream checks
    it."""
    pte = compiles.get(model, platform="corstone320", npu=npu, write=True)[1]
    reports = _fully_checked(pte, npu, data_bytes=256 if model == "mixed" else 0)
    assert all(report.checked and not report.unchecked for report in reports)
    taps = sum(" taps " in line for report in reports for line in report.checked)
    assert taps == (16 if "strided_edges" in model else 0)


A16W8 = ("feature_extractor.0=a16w8,feature_extractor.4=a16w8,"
         "feature_extractor.5.depthwise=a16w8,classifier=a16w8")


@pytest.mark.parametrize("npu", ["ethos-u85-256", "ethos-u85-2048"])
def test_16_bit_activations_pass_the_weight_check(tmp_path, npu):
    """DS-CNN with some layers at 16-bit activations: 16-bit weight orders (the depthwise
    padding of 2 taps per 10 on the U85-256, 6 on the U85-2048; 2:4 sparse part-kernel-first
    and FWD streams) and the 48-bit accumulator's scale records (48-bit bias, 15-bit scale)."""
    pte = tmp_path / "a16.pte"
    assert main(["compile", "ds-cnn", "--platform", "corstone320", "--npu", npu,
                 "--precision", A16W8, "-o", str(pte)]) == 0
    (partition,) = load_twin(pte).partitions
    check = check_u85_stream(partition.payload.cmd_bytes, [
        len(partition.payload.weight_bytes), partition.payload.scratch_bytes, None], npu, (2,))
    assert {r.layout.ifm_bits for r in check.weights} == {8, 16}
    assert {s.layout.acc48 for s in check.scales} == {False, True}
    report = check_partition_weights(partition.payload, partition.tosa_bytes, npu)
    assert report.checked_bytes == report.weight_bytes and not report.unchecked, \
        report.summary()


class FewValues(torch.nn.Module):
    """Two 1x1 convolutions whose weights take 3 and 15 values: Vela writes their FWD
    streams with a 2-bit and a 4-bit LUT (the zoo's random weights always give RAW codes)."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Conv2d(32, 32, 1)
        self.b = torch.nn.Conv2d(32, 32, 1)
        with torch.no_grad():
            self.a.weight.copy_(torch.randint(-1, 2, self.a.weight.shape).float())
            self.b.weight.copy_(torch.randint(-7, 8, self.b.weight.shape).float() / 7)
            self.a.weight[:, 0] = self.b.weight[:, 0] = 1.0  # every channel's scale alike

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def few_values():
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        return FewValues().eval(), (torch.rand(1, 32, 8, 8) * 2 - 1,)


@pytest.mark.parametrize("model,expected", [
    (f"{__file__}:few_values", {"FWD LUT2", "FWD LUT4"}),
    (f"{Path(__file__).with_name('npu_edge_models.py')}:conv_edges", {"dilation 2", "FWD RAW"})],
    ids=["few_values", "conv_edges"])
def test_vela_streams_of_every_fwd_code_width_and_of_a_dilated_kernel_pass(tmp_path, model,
                                                                           expected):
    pte = tmp_path / "model.pte"
    assert main(["compile", model, "--platform", "corstone320", "--npu", NPU, "-o",
                 str(pte)]) == 0
    (partition,) = load_twin(pte).partitions
    payload = partition.payload
    check = check_u85_stream(payload.cmd_bytes, [len(payload.weight_bytes),
                                                 payload.scratch_bytes, None], NPU, (2,))
    seen = {f"dilation {r.layout.dilation_x}" for r in check.weights}
    modes = {0: "LUT4", 1: "RAW", 2: "LUT2"}  # header bits 0 (RAW) and 1 (SMALL_LUT)
    seen |= {f"FWD {modes.get(payload.weight_bytes[r.base] & 3)}"
             for r in check.weights if r.layout.fast}
    assert expected <= seen
    report = check_partition_weights(payload, partition.tosa_bytes, NPU)
    assert not report.unchecked and report.checked_bytes + report.data_bytes == \
        report.weight_bytes, report.summary()


def test_every_flipped_u85_weight_byte_fails_whatever_the_inputs(ds_cnn, tmp_path):
    """One flipped byte at every 97th position of the weight data, hashes rewritten: each
    fails in the executor verify runs for every method, before the TOSA graph computes the
    partition, naming it."""
    partition = load_twin(ds_cnn).partitions[0]
    weights = partition.payload.weight_bytes
    flips = caught = 0
    for position in range(0, len(weights), 97):
        damaged = bytearray(weights)
        damaged[position] ^= 0x01
        copy = replace(partition, payload=replace(partition.payload,
                                                  weight_bytes=bytes(damaged)))
        executor = NpuExecutor("auto", NPU)
        flips += 1
        try:
            executor.check_u85(copy, f"EthosUBackend {partition.delegate_name}")
        except NpuModelFault as error:
            assert partition.delegate_name in str(error)
            assert "weight data fails its check against the TOSA graph" in str(error)
            caught += 1
    assert flips == caught == -(-len(weights) // 97), f"{caught} of {flips} flips caught"


@pytest.mark.parametrize("position", [97 * 3, 97 * 200])
def test_a_flipped_u85_weight_byte_fails_verify_on_every_method(ds_cnn, tmp_path, capsys,
                                                                  position):
    """Through `verify` itself, the .pte rewritten (hashes too): in the sparse SWD stream of
    the first convolution and in an FWD stream; the twin, the host runtime and the QEMU
    bridge all refuse it before the TOSA graph computes the partition."""
    pte = copy_program(ds_cnn, tmp_path)
    flip_weight_byte(pte, position)
    verify_fails_on_every_method(pte, capsys, PARTITION,
                                 "weight data fails its check against the TOSA graph")


def test_the_weight_check_is_in_the_verdict_of_an_intact_u85_program(ds_cnn):
    executor = NpuExecutor("auto", NPU)
    assert "weights checked against the TOSA graph" in executor.method
    executor.check_u85(load_twin(ds_cnn).partitions[0], f"EthosUBackend {PARTITION}")
    figures = executor.tally.to_json()[PARTITION]
    assert figures["weight_check"].startswith("10 weight/scale stream(s) equal to the TOSA")
    assert figures["weight_streams_not_checked"] == []


def test_a_swd_bit_that_changes_no_weight_is_refused(ds_cnn):
    """Bits the MLW decoder reads past without changing a weight (WTRUNC in an uncompressed
    slice or one whose quotients stay below 2, a zero written as +0 instead of Vela's -0,
    unary bits after a slice's last weight): the stream is compared with the one Vela's
    encoder writes for what it decodes to (u85_mlw.py), so each is refused."""
    payload = load_twin(ds_cnn).partitions[0].payload
    check = check_u85_stream(payload.cmd_bytes, [len(payload.weight_bytes),
                                                 payload.scratch_bytes, None], NPU, (2,))
    read = next(r for r in check.weights if r.layout.traversal == "depthwise")
    stream = payload.weight_bytes[read.base:read.base + read.length]
    values = mlw.decode(stream, strict=True)
    assert u85_mlw.encode(values) == stream
    silent = 0
    for bit in range(1400):
        damaged = bytearray(stream)
        damaged[bit // 8] ^= 1 << (bit % 8)
        try:
            same = np.array_equal(mlw.decode(bytes(damaged), strict=True), values)
        except WeightStreamError:
            continue
        if same:
            silent += 1
            with pytest.raises(WeightStreamError, match="not the one Vela's encoder writes"):
                decode_stream(bytes(damaged), read.layout, "here")
    assert silent >= 10


def _layout(**changes) -> U85WeightLayout:
    base = dict(ofm_depth=20, kernel_h=3, kernel_w=3, ifm_depth=24, ofm_block_depth=16,
                ifm_block_depth=64, traversal="depth_first", ifm_bits=8, stride_y=1,
                stride_x=1, dilation_y=1, dilation_x=1, ofm_ublock_depth=8, macs=256,
                fast=False, sparse=False)
    return U85WeightLayout(**{**base, **changes})


@pytest.mark.parametrize("changes", [
    {}, {"traversal": "part_kernel", "ifm_block_depth": 16, "stride_y": 2, "stride_x": 2},
    {"traversal": "depthwise", "ifm_depth": 1}, {"macs": 2048, "ofm_ublock_depth": 16,
                                                 "fast": True, "traversal": "part_kernel",
                                                 "ifm_block_depth": 16},
    {"traversal": "part_kernel", "ifm_block_depth": 16, "ifm_bits": 16}])
def test_the_order_feeds_every_weight_of_the_kernel_exactly_once(changes):
    """Over all of an operation's streams (one per core for SWD), each OHWI weight is fed
    once; the rest are the zeros the encoder pads with."""
    layout = _layout(**changes)
    streams = range(layout.streams)
    order = np.concatenate([weight_order(replace(layout, stream=s)) for s in streams])
    fed = np.sort(order[order >= 0])
    assert np.array_equal(fed, np.arange(int(np.prod(layout.shape()))))


@pytest.mark.parametrize("values,width", [([3, -1, 3, 0, -1] * 7, 2),
                                          (list(range(-8, 8)) * 3, 4),
                                          (list(range(-100, 100)), 8),
                                          (list(range(40, 250)), 8)])
def test_fwd_streams_decode_each_code_width_and_refuse_any_other_bits(values, width):
    """FWD: a 2-bit LUT for up to 4 distinct weights, a 4-bit LUT for up to 16, raw bytes
    (with the zero adjustment for weights above 127) beyond; a stream differing from the one
    the encoder writes for its weights, by any bit, is refused."""
    stream = encode_fwd(np.array(values))
    assert len(stream) == 32 * -(-(256 + len(values) * width) // 256)
    assert list(decode_fwd(stream, len(values))) == values
    refused = 0
    for bit in range(0, len(stream) * 8, 7):
        damaged = bytearray(stream)
        damaged[bit // 8] ^= 1 << (bit % 8)
        try:
            decoded = decode_fwd(bytes(damaged), len(values))
        except WeightStreamError:
            refused += 1
        else:
            assert list(decoded) != values  # a change the weight check compares and sees
    assert refused > 0


def test_scale_records_refuse_reserved_bits_and_stray_records():
    record = (-5).to_bytes(4, "little", signed=True) + (1 << 30).to_bytes(4, "little") + \
        bytes([33, 0])
    stream = record * 3 + bytes(10 * 13)
    bias, scale, shift = decode_scales(stream, 3, 16, False, "here")
    assert list(bias) == [-5] * 3 and list(scale) == [1 << 30] * 3 and list(shift) == [33] * 3
    for at, bit in ((7, 0x80), (8, 0x40), (9, 0x01), (35, 0x01)):
        damaged = bytearray(stream)
        damaged[at] ^= bit
        with pytest.raises(WeightStreamError, match="here: "):
            decode_scales(bytes(damaged), 3, 16, False, "here")


def test_a_pad_fill_vela_rounds_up_to_16_bytes_is_data_not_a_fault(compiles, capsys):
    """ExecuTorch's own pad_rank4_all_dims on U85-256 (benchmarks/peer_cases.py): Vela stores
    the pad's fill, the zero point, in the weight data in 16-byte units, 128 B of which the
    stream's pooling reads 126. The 2 bytes it does not read are the same fill, which failed
    verify ("non-zero bytes that no command reads") before; they are read as data now."""
    pte = compiles.get("benchmarks/peer_cases.py:case_pad_rank4_all_dims",
                       platform="corstone320", npu=NPU, write=True)[1]
    (report,) = _fully_checked(pte, NPU, data_bytes=128)
    assert report.weight_bytes == 128 and not report.unchecked
    assert main(["verify", str(pte), "--runtime", "twin", "--samples", "1"]) == 0
