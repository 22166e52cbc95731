"""Hybrid CPU+NPU programs on QEMU's Corstone-300: the runner firmware links ExecuTorch's
EthosUBackend and the Ethos-U core driver, whose device layer (runner/npu/ethosu_bridge.c) hands
each command stream over semihosting to the host, where the Ethos-U55/U65 functional model runs
it (platforms/qemu_npu_bridge.py, orchestrator/device_runs/qemu_npu.py).

One firmware build per module (the `firmware` fixture; cached across sessions by
platforms/firmware_recipe.py). Under CI=true a missing toolchain, QEMU or source tree fails these tests
(tests/device_tools.py); locally it skips them.
"""

from __future__ import annotations

import pytest

from orchestrator.cli import main
from platforms import qemu_npu_bridge as bridge
from tests.tampering import copy_program, flip_used_weight_byte
from tests.device_tools import npu_line, qemu_or_missing, verify_qemu_passes

PARTITION = "lowered_module_0"
METHOD = "Cortex-M55 on QEMU + Ethos-U55 functional model over semihosting"


# ---------------------------------------------------------------------------------------------
# The protocol, host side (no QEMU)


def _request(sequence=1, **options):
    return bridge.pack_request(sequence, b"COP1" + bytes(12), [b"w" * 32, b"\0" * 16, b""],
                               stream_offset=4, stream_words=2, **options)


def test_a_request_parses_into_its_payload_and_regions():
    request = bridge.parse_request(_request(3), 3)
    assert request.sequence == 3 and request.payload.startswith(b"COP1")
    assert [len(r) for r in request.regions] == [32, 16, 0]
    assert (request.stream_offset, request.stream_words) == (4, 2)


@pytest.mark.parametrize("data, expected, match", [
    (_request(1, magic=0x46464F45), 1, "magic 0x46464f45.*not from the runner"),
    (_request(1, version=2), 1, "protocol version 2; this host speaks version 1"),
    (_request(1), 2, "request 1 when request 2 was due: stale"),
    (_request(7), 2, "request 7 when request 2 was due: foreign"),
    (_request(1)[:-3], 1, "bytes; its header says"),
    (b"ONPQ", 1, "shorter than its"),
])
def test_a_stale_foreign_or_malformed_request_is_refused(data, expected, match):
    with pytest.raises(bridge.BridgeProtocolError, match=match):
        bridge.parse_request(data, expected)


def test_the_reply_carries_only_the_regions_the_npu_writes():
    magic, version, sequence, status, regions = bridge.parse_reply(
        bridge.pack_reply(5, 0, [b"w" * 8, b"s" * 4, b"f" * 2]))
    assert (magic, version, sequence, status) == (bridge.REPLY_MAGIC, bridge.VERSION, 5, 0)
    assert regions == [b"", b"ssss", b"ff"]  # the weights are never written back
    assert bridge.parse_reply(bridge.pack_reply(5, 1, [b"w", b"s", b"f"]))[4] == [b"", b"", b""]


def _exchange(server, data: bytes) -> bytes:
    """What the firmware does: write a request, close, read the reply."""
    with open(server.request_path, "wb") as request:
        request.write(data)
    with open(server.reply_path, "rb") as reply:
        return reply.read()


def test_the_server_runs_the_handler_and_refuses_a_stale_request(tmp_path):
    seen = []

    def handler(payload, regions):
        seen.append(payload)
        regions[1][:] = b"x" * len(regions[1])
        return 42

    with bridge.BridgeServer(tmp_path, handler) as server:
        first = bridge.parse_reply(_exchange(server, _request(1)))
        stale = bridge.parse_reply(_exchange(server, _request(1)))  # request 2 was due
    assert first[2:4] == (1, 0) and first[4][1] == b"x" * 16
    assert stale[3] != 0 and stale[4] == []  # a failed invoke, nothing written
    assert server.log.invocations == 1 and server.log.commands == 42 and len(seen) == 1
    assert any("request 1 when request 2 was due: stale" in e for e in server.log.errors)


def test_an_untouched_region_is_not_written_back_over_an_alias_the_npu_wrote(tmp_path):
    """TFLM hands Vela's scratch and fast-scratch tensors as base addresses 1 and 2, which alias
    in Shared_Sram; the firmware writes back each region it gets, so an untouched copy of the
    fast scratch would undo what the NPU wrote through the scratch (the incumbent's autoencoder
    came back wrong before). Only what the NPU changed goes back."""

    def handler(payload, regions):
        regions[1][:] = b"x" * len(regions[1])
        return 1

    aliased = bridge.pack_request(1, b"COP1" + bytes(12), [b"w" * 32, b"\0" * 16, b"\0" * 16],
                                  stream_offset=4, stream_words=2)
    with bridge.BridgeServer(tmp_path, handler) as server:
        reply = bridge.parse_reply(_exchange(server, aliased))
    assert reply[3] == 0 and reply[4][1] == b"x" * 16
    assert reply[4][2] == b""  # the fast scratch: unchanged, not written back


def test_the_server_stops_when_no_firmware_ever_calls(tmp_path):
    server = bridge.BridgeServer(tmp_path, lambda payload, regions: 0).__enter__()
    server.stop()
    assert not server._thread.is_alive()


def test_each_platforms_runner_says_which_npu_and_core_qemu_runs():
    """The QEMU gate reads the platform's runner/firmware.yaml: the Corstone-300 bridge serves
    the U55/U65 for Cortex-M55 programs, the Corstone-320 one the U85 for Cortex-M85 programs;
    anything else is not run, with the reason."""
    from orchestrator.device_runs.qemu import qemu_unavailable_reason
    from platforms.platform import load_platform

    c300, c320 = load_platform("corstone300"), load_platform("corstone320")
    for npu in ("ethos-u55-128", "ethos-u65-256"):
        assert qemu_unavailable_reason({"npu": npu, "cpu": "cortex-m55"}, True, c300) is None
    assert qemu_unavailable_reason({"npu": "ethos-u85-256", "cpu": "cortex-m85"}, True,
                                   c320) is None
    reason = qemu_unavailable_reason({"npu": "ethos-u85-256", "cpu": "cortex-m55"}, True, c300)
    assert "serves ethos-u55, ethos-u65" in reason
    # A CPU-only Cortex-M33 program runs on QEMU's own M33 (platforms/qemu_machines/); a
    # hybrid one does not: that machine's runner serves no NPU.
    assert qemu_unavailable_reason({"npu": None, "cpu": "cortex-m33"}, False, c300) is None
    reason = qemu_unavailable_reason({"npu": "ethos-u55-128", "cpu": "cortex-m33"}, True, c300)
    assert "mps2-an505 has no Ethos-U" in reason and "serves no NPU" in reason


# ---------------------------------------------------------------------------------------------
# On QEMU


@pytest.fixture(scope="module")
def ds_cnn(compiles):
    return compiles.get("ds-cnn", npu="ethos-u55-128", write=True)[1]


@pytest.fixture(scope="module")
def firmware(ds_cnn):
    """The NPU build of the runner for ds-cnn's operators: built once for this module."""
    qemu_or_missing()
    from orchestrator.artifacts.manifest import Manifest
    from kernels.native.operators import read_operators
    from platforms.firmware_recipe import build_firmware

    return build_firmware(read_operators(Manifest.load(ds_cnn).file("operators.txt")),
                          npu_product="ethos-u55")


def _count_reads(monkeypatch, pte) -> dict:
    """Counters of every read of the program and its artifacts: the .pte's bytes, its parse,
    the manifest's hash check, each reference program."""
    from pathlib import Path

    from kernels.program_view import ProgramView
    from orchestrator.artifacts.manifest import Manifest
    from orchestrator.verification import twin

    counts = {"pte bytes": 0, "ProgramView.read": 0, "Manifest.load": 0}
    read_bytes, view_read, manifest_load = Path.read_bytes, ProgramView.read, Manifest.load.__func__
    load_reference = twin.load_reference

    def counted_read_bytes(self):
        counts["pte bytes"] += self.resolve() == Path(pte).resolve()
        return read_bytes(self)

    def counted_view_read(cls, data, *args, **kwargs):
        counts["ProgramView.read"] += 1
        return view_read(data, *args, **kwargs)

    def counted_manifest_load(cls, *args, **kwargs):
        counts["Manifest.load"] += 1
        return manifest_load(cls, *args, **kwargs)

    def counted_reference(path):
        counts[path.name] = counts.get(path.name, 0) + 1
        return load_reference(path)

    monkeypatch.setattr(Path, "read_bytes", counted_read_bytes)
    monkeypatch.setattr(ProgramView, "read", classmethod(counted_view_read))
    monkeypatch.setattr(Manifest, "load", classmethod(counted_manifest_load))
    monkeypatch.setattr(twin, "load_reference", counted_reference)
    return counts


def test_ds_cnn_on_the_ethos_u55_passes_verify_qemu_reading_its_files_once(
        ds_cnn, firmware, capsys, monkeypatch):
    """The QEMU method is handed the one view of the program `verify` read: the .pte is read,
    parsed and hash-checked once (the platform check, the bundle, the bridge's NPU partitions
    and the report all use it), the float reference (the bundle's inputs) loaded once."""
    counts = _count_reads(monkeypatch, ds_cnn)
    out = verify_qemu_passes(ds_cnn, capsys)
    assert counts == {"pte bytes": 1, "ProgramView.read": 1, "Manifest.load": 1,
                      "float.pt2": 1}, out
    assert f"method: {METHOD}" in out
    npu = npu_line(out)
    invocations, commands = (int(n.replace(",", "")) for n in
                             npu.removeprefix("npu: ").split(" invocation(s), ")[0:1]
                             + [npu.split(", ")[1].split(" ")[0]])
    assert invocations == 8 and commands > 0  # 4 cases x 2 partitions


def _tampered_weight(ds_cnn, folder):
    """A weight byte the first NPU operation reads, flipped, and the manifest's hashes
    recomputed (tests/tampering.py)."""
    pte = copy_program(ds_cnn, folder)
    flip_used_weight_byte(pte)
    return pte


def test_a_tampered_npu_weight_byte_fails_verify_qemu_naming_the_partition(
        ds_cnn, firmware, tmp_path, capsys):
    pte = _tampered_weight(ds_cnn, tmp_path)
    code = main(["verify", "--qemu", str(pte)])
    out = capsys.readouterr().out
    assert code == 4, out
    assert "FAIL" in out and f"npu error: NPU invocation 1: {PARTITION}" in out, out


def test_the_firmware_refuses_a_reply_to_another_request(ds_cnn, firmware, monkeypatch):
    """The firmware side of the protocol: a reply whose sequence number is not the request's
    fails the invoke with a log line saying so."""
    from orchestrator.device_runs.qemu import installed_platform, qemu_on_checked_pte
    from orchestrator.artifacts.manifest import Manifest

    real = bridge.pack_reply
    monkeypatch.setattr(bridge, "pack_reply",
                        lambda sequence, status, regions, **kw: real(sequence + 1, status,
                                                                      regions, **kw))
    platform = installed_platform(Manifest.load(ds_cnn).target)
    result = qemu_on_checked_pte(ds_cnn, platform, 300, samples=1)
    assert result.passed is False
    assert "reply refused: it answers request 2, not 1 (stale or foreign)" in result.log


@pytest.mark.parametrize("model", ["mobilenet-v1-025", "resnet8", "deep-autoencoder",
                                   "person-detector", "mixed"])
def test_the_zoo_on_the_ethos_u55_passes_verify_qemu(compiles, firmware, capsys, model):
    """The hybrid MLPerf Tiny models, the person detector and `mixed` (CPU ops between three NPU
    partitions) on U55-128: every BundleIO case byte-exact on the M55 with the NPU model."""
    pte = compiles.get(model, npu="ethos-u55-128", write=True)[1]
    npu = npu_line(verify_qemu_passes(pte, capsys))
    assert not npu.startswith("npu: 0 invocation"), npu
