"""State in the program (orchestrator/compilation/program_state.py): a streaming model's buffers,
updated in place on every frame, compile to ExecuTorch mutable buffers that carry from one
`execute` to the next, start from the module's initial values, and verify frame by frame."""

from __future__ import annotations

import pytest
import torch
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

from orchestrator import api
from orchestrator.cli import main
from orchestrator.firmware import run_on_qemu
from orchestrator.compilation import program_state
from orchestrator.compilation.observers import cortex_m_quantizer
from orchestrator.sources.loader import load_model
from orchestrator.verification.twin import load_twin
from orchestrator.verification.twin_verify import as_tuple, reference_states
from tests.device_tools import host_runtime_or_missing, qemu_or_missing

MODEL = "examples/streaming.py:kws"


_SHIFT = """
import torch
from torch import nn
from examples.streaming import CausalConv1d, RunningMean


class Shift(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = CausalConv1d(4, 8, 3)
        self.conv.state.fill_(0.5)  # a non-zero initial state, seen in the program's bytes
        self.pool = RunningMean(8)

    def forward(self, frame):
        return self.pool(torch.relu(self.conv(frame))).flatten(1)


def shift():
    torch.manual_seed(0)
    return Shift().eval(), (torch.randn(1, 4, 1),)
"""


def _shift_file(folder) -> str:
    path = folder / "shift.py"
    path.write_text(_SHIFT)
    return f"{path}:shift"


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """The streaming keyword spotter, CPU-only Cortex-M55: (.pte path, loaded twin)."""
    pte = tmp_path_factory.mktemp("stream") / "kws.pte"
    api.compile(MODEL, pte, npu="none")
    return pte, load_twin(pte)


def _frames(count: int, seed: int = 1):
    generator = torch.Generator().manual_seed(seed)
    return [(torch.randn(1, 40, 1, generator=generator),) for _ in range(count)]


def test_upstream_conversion_makes_the_state_read_a_constant_and_ours_keeps_it(tmp_path):
    """PT2E's `convert_pt2e` folds every quantize of a module attribute (meant for weights): the
    state's read becomes an int8 constant of its initial value, so no frame would ever read what
    the last one wrote. Ours keeps that quantize an op on the state buffer."""
    loaded = load_model(_shift_file(tmp_path))
    module, inputs = loaded.module, loaded.example_inputs
    program = torch.export.export(module, inputs, strict=True)

    def quantize_reads_of_state(converted):
        reads = 0
        for node in converted.graph.nodes:
            if node.op == "call_function" and "quantize_per_tensor" in str(node.target) \
                    and "dequantize" not in str(node.target):
                source = node.args[0]
                if source.op == "get_attr" and "state" in str(source.target):
                    reads += 1
        return reads

    def prepared():
        unlifted = program.module(check_guards=False)
        states = program_state.States(program, unlifted)
        ready = prepare_pt2e(unlifted, cortex_m_quantizer("histogram"))
        with torch.no_grad(), states.calibrating():
            for _ in range(4):
                ready(*inputs)
        return ready, states

    upstream, _ = prepared()
    assert quantize_reads_of_state(convert_pt2e(upstream)) == 0
    ours, states = prepared()
    assert states.names == ("conv.state", "pool.mean")
    assert quantize_reads_of_state(program_state.converted(ours, states)) == 1


def test_the_program_starts_from_the_modules_initial_state(tmp_path):
    """The emitter writes each state's initial value (upstream writes only its shape: the device
    would start from whatever its arena held), and the trial runs of loading and capturing leave
    the module's state as it was."""
    spec = _shift_file(tmp_path)
    loaded = load_model(spec)
    assert float(loaded.module.conv.state.min()) == 0.5  # the loader's trial run left it
    pte = tmp_path / "shift.pte"
    api.compile(spec, pte, npu="none")
    twin = load_twin(pte)
    states = twin.view.state_values
    # the conv's ring buffer int8 (4x2: read by the cat, written from it, one scale), the mean
    # float (8x1: read by a multiply, written by an add)
    assert [(v.dtype, v.nbytes) for v in states] == [(torch.int8, 8), (torch.float32, 32)]
    (_, read), _ = reference_states(twin)
    stored = torch.frombuffer(bytearray(twin.view.mutable_buffers[states[0].buffer][:8]),
                              dtype=torch.int8)
    assert torch.allclose((stored.float() - read[1]) * read[0], torch.full((8,), 0.5),
                          atol=read[0] / 2)
    mean = twin.view.mutable_buffers[states[1].buffer][:32]
    assert torch.equal(torch.frombuffer(bytearray(mean), dtype=torch.float32), torch.zeros(8))


def test_frames_carry_the_state_and_match_the_module_stepped(compiled):
    """Frame after frame the twin equals the quantized reference stepped one frame per call
    (within one output step), the same frame twice gives different outputs (the state moved),
    and `reset` starts the stream again."""
    _, twin = compiled
    twin.reset()
    _, quantized = twin.reference("quantized.pt2")
    frames = _frames(30)
    outs = [twin.run(f).outputs[0] for f in frames]
    with torch.no_grad():
        refs = [as_tuple(quantized(*f))[0] for f in frames]
    scale = float(twin.config["output0_scale"]) if "output0_scale" in twin.config else None
    worst = max(float((o - r).abs().max()) for o, r in zip(outs, refs))
    assert worst <= (scale or 0.05) * 1.01
    again = twin.run(frames[-1]).outputs[0]
    assert not torch.equal(again, outs[-1])
    twin.reset()
    assert torch.equal(twin.run(frames[0]).outputs[0], outs[0])


def test_the_host_runtime_carries_the_state_and_reset_reloads_it(compiled):
    """The host build runs CMSIS-NN's C path: the twin computes that path to compare."""
    from dataclasses import replace

    from kernels.reference import HOST_TIER

    twin = replace(compiled[1], isa_tier=HOST_TIER, carried={}, references={})
    frames = _frames(6)
    expected = [twin.run(f).outputs[0] for f in frames]
    with host_runtime_or_missing() as runtime:
        got = [runtime.run(twin.pte_bytes, f).outputs[0] for f in frames]
        runtime.reset(twin.pte_bytes)
        first = runtime.run(twin.pte_bytes, frames[0]).outputs[0]
    assert all(torch.equal(g, e) for g, e in zip(got, expected))
    assert torch.equal(first, expected[0])


def test_verify_frames_runs_every_frame_on_qemu_byte_exact(compiled):
    """`verify --frames N`: the twin, the host runtime and the M55 on QEMU each run the N frames
    in order from the initial state; QEMU's outputs equal the twin's on every frame."""
    host_runtime_or_missing().close()
    qemu_or_missing()
    pte, _ = compiled
    verification = api.verify_all(pte, "auto", samples=12, qemu_samples=12)
    by = {r.name: r for r in verification.results}
    qemu = by["QEMU Cortex-M55"]
    assert qemu.outcome == "passed" and "12 BundleIO case(s) byte-exact" in qemu.detail
    assert by["twin"].outcome == "passed" and by["host runtime"].outcome == "passed"
    assert "frames, in order from the initial state" in verification.verdict
    assert "1,104 B of state" in verification.verdict


def test_the_plan_shows_the_states_bytes_and_where_they_live(compiled):
    """plan.json's memory.state: each buffer's bytes, its region and offset, and no other value
    planned over it (the state survives between runs); the sizes are the model's buffers."""
    import json

    pte, _ = compiled
    plan = json.loads((pte.parent / "kws.artifacts" / "plan.json").read_text())
    state = plan["summary"]["memory"]["state"]
    # the ring buffers int8 (40x2 of the first causal conv, 64x4 and 64x8 of the dilations 2
    # and 4), the running mean float (read by a multiply, written by an add: two scales)
    assert sorted((b["dtype"], b["bytes"]) for b in state["buffers"]) == [
        ("float32", 256), ("int8", 80), ("int8", 256), ("int8", 512)]
    assert state["bytes"] == 1104 and state["shared_with"] == []
    assert {b["region"] for b in state["buffers"]} == {"dtcm"}


def test_int8_io_with_state_is_refused_in_one_line(tmp_path, capsys):
    """Upstream's QuantizeOutputs numbers the outputs with the state's write-backs among them
    (the model's output 0 would be named output4): refused, nothing written."""
    from orchestrator.cli import main

    pte = tmp_path / "shift.pte"
    code = main(["compile", _shift_file(tmp_path), "--npu", "none", "--io", "int8", "-o",
                 str(pte), "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and not pte.exists()
    assert err[-1].startswith("orchestrate: error: --io int8 is not possible for a program "
                              "with state yet")


_RING4 = """
import torch
from torch import nn


class Ring4(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 8, (1, 3))
        self.register_buffer("state", torch.zeros(1, 4, 1, 2))

    def forward(self, frame):
        window = torch.cat([self.state, frame], dim=3)
        self.state.copy_(window[:, :, :, 1:])
        return torch.relu(self.conv(window)).flatten(1)


def ring4():
    torch.manual_seed(0)
    return Ring4().eval(), (torch.randn(1, 4, 1, 1),)
"""


def test_a_4d_state_is_written_back_in_its_buffers_dim_order(tmp_path, monkeypatch):
    """A 4-D ring buffer is channels-last (the capture's layout); the slice written back is not.
    Upstream's write-back `copy_` between the two dim orders is refused by the runtime (U55-128:
    the cat and slice in the partition, the write-back on the CPU); with the copy into the
    buffer's order first, the program runs its frames and QEMU agrees with the twin."""
    from orchestrator.compilation.device_check import DeviceRefusal

    model = tmp_path / "ring4.py"
    model.write_text(_RING4)
    with monkeypatch.context() as patched:
        patched.setattr(program_state, "written_in_buffer_order", lambda program: ())
        with pytest.raises(DeviceRefusal, match=r"tensors_have_same_dim_order\(in, src\)"):
            api.compile(f"{model}:ring4", tmp_path / "upstream.pte", npu="ethos-u55-128")
    pte = tmp_path / "ring4.pte"
    api.compile(f"{model}:ring4", pte, npu="ethos-u55-128")
    host_runtime_or_missing().close()
    qemu_or_missing()
    verification = api.verify_all(pte, "auto", samples=6, qemu_samples=6)
    assert {r.name: r.outcome for r in verification.results
            if r.outcome != "not-run"} == {"twin": "passed", "host runtime": "passed",
                                            "QEMU Cortex-M55": "passed"}, verification.verdict


def test_the_twin_reports_the_streams_drift_against_the_float_model(compiled):
    """Output 0 against the float model stepped on its own state, per tenth of the frames: a
    figure per window, each finite and positive here."""
    from orchestrator.verification.twin_verify import render_text, verify

    pte, twin = compiled
    report = verify(twin, samples=20)
    stream = report.stream
    assert stream["frames"] == 20 and stream["window_frames"] == 2
    assert len(stream["snr_db_by_window"]) == 10
    assert all(5.0 < snr < 60.0 for snr in stream["snr_db_by_window"])
    assert "stream: 20 frames in order from the initial state" in render_text(report)


def test_compile_says_the_state_it_carries(tmp_path, capsys):
    from orchestrator.cli import main

    pte = tmp_path / "shift.pte"
    assert main(["compile", _shift_file(tmp_path), "--npu", "none", "-o", str(pte)]) == 0
    out = capsys.readouterr().out
    # the conv's ring buffer int8 4x2 (8 B), the running mean float 8x1 (32 B)
    assert "state: 40 B in 2 buffer(s) carried from one run to the next" in out


def test_a_state_whose_initial_data_is_missing_is_refused_in_one_line(compiled, tmp_path):
    """The .pte is data: a state value naming initial data its mutable segment lacks is a
    one-line TwinError, not an index error."""
    import dataclasses

    from orchestrator.compilation.upstream_exir import read_pte, write_pte
    from orchestrator.verification.program import TwinError

    pte, _ = compiled
    original = read_pte(pte.read_bytes())
    cut = dataclasses.replace(original, mutable_data=original.mutable_data[:1])
    broken = tmp_path / "broken.pte"
    broken.write_bytes(write_pte(cut))
    with pytest.raises(TwinError, match=r"broken.pte: state value \d+ names initial data"):
        load_twin(broken)


def test_firmware_runs_the_frames_in_turn_and_model_reset_starts_the_stream_again(
        compiled, tmp_path, capsys):
    """`firmware --inputs FILE --run`: the example main feeds the file's frames in order to one
    loaded method (the state carried on the device: the same frame twice gives different
    outputs), each frame's outputs have the twin's bytes (stepped through the same frames), and
    after model_reset() the first frame gives its first outputs again. A file with fewer frames
    than --frames asks for is refused in one line, with nothing written."""
    qemu_or_missing()
    pte, _ = compiled
    frame = torch.randn(1, 40, 1, generator=torch.Generator().manual_seed(5))
    torch.save([(frame,), (frame,), (frame * 0.5,)], tmp_path / "stream.pt")
    assert main(["firmware", str(pte), "-o", str(tmp_path / "short"), "--inputs",
                 str(tmp_path / "stream.pt"), "--frames", "4", "--no-build"]) == 2
    assert "holds 3 sample(s)" in capsys.readouterr().err
    assert not (tmp_path / "short").exists()
    made = api.firmware_project(pte, tmp_path / "fw", inputs=str(tmp_path / "stream.pt"),
                                run=True)
    assert made.run_passed, made.run_lines
    assert made.record["example_frames"] == 3 and made.record["state_bytes"] == 1104
    macros = dict(line.split()[1:3] for line in
                  (tmp_path / "fw" / "model" / "model_io.h").read_text().splitlines()
                  if line.startswith("#define MODEL_STATE_BYTES"))
    assert macros == {"MODEL_STATE_BYTES": "1104"}
    run = run_on_qemu(tmp_path / "fw")
    assert len(run.frames) == 3 and len(run.frame_ticks) == 3
    assert run.frames[1] != run.frames[0]  # the same frame again: the state moved on
    assert run.after_reset == run.frames[0]
    assert "model_reset: 0" in run.log
    assert [line.split(":")[0] for line in made.run_lines[1:]] == \
        ["frame 0", "frame 1", "frame 2", "after model_reset(), frame 0 again"]
