"""`orchestrate compare MODEL.tflite`: our program and the incumbent's, side by side on the same
target and the same QEMU machine.

- Ours: the file compiled by orchestrate (the import of orchestrator/sources/), run on QEMU by
  our runner (BundleIO: the device's outputs byte-checked against the twin's on the same inputs).
- The incumbent's: `vela FILE.tflite` for an NPU target (the flags our partitions get), the plain
  file for a CPU-only one, run by TensorFlow Lite Micro with its CMSIS-NN kernels (and its
  Ethos-U kernel over the same core driver and NPU bridge) on the same QEMU machine
  (platforms/qemu_tflm.py).

Every figure names its source: Vela's estimates from its summary CSVs (both sides), QEMU's
instruction counts (-icount: executed instructions, not cycles), TFLM's own arena report, file
sizes. A figure this machine cannot produce is absent and says why. The numerics compare the two
programs' outputs on the same random inputs in the file's own types.
"""

from __future__ import annotations

import html
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from kernels.native.errors import QemuUnavailable
from orchestrator.comparison.firmware import (INCUMBENT_SOURCE, OURS_SOURCE, ReleaseImage,
                                              component_lines, release_images)
from orchestrator.comparison.npu import NpuFigures, incumbent_npu, ours_npu
from orchestrator.device_runs.combined import load_program
from orchestrator.device_runs.qemu import (fast_scratch_bytes, installed_platform,
                                           qemu_on_checked_pte, qemu_profile)
from orchestrator.device_runs.qemu_npu import StreamNpuHandler
from orchestrator.errors import NotRun, UserError
from orchestrator.sources.tflite_file import read_tflite
from orchestrator.sources.tflite_module import int8_inputs
from orchestrator.target import resolve_target
from platforms.qemu_tflm import run_tflite_on_qemu

SEED = 7
QEMU_SOURCE = "measured: QEMU -icount, executed instructions per inference (median), not cycles"


@dataclass(frozen=True)
class Figure:
    """One row: a figure for both sides, what it is, and where it comes from."""

    name: str
    ours: float | int | None
    incumbent: float | int | None
    source: str
    unit: str = ""
    lower_is_better: bool = True  # a cost; False for a count where more is better
    why_absent: str = ""  # a side's figure is None: why

    @property
    def ratio(self) -> float | None:
        if self.ours is None or self.incumbent in (None, 0):
            return None
        return self.ours / self.incumbent

    @property
    def we_lose(self) -> bool:
        ratio = self.ratio
        if ratio is None:
            return False
        return ratio > 1.0 if self.lower_is_better else ratio < 1.0

    def to_json(self) -> dict:
        return {"figure": self.name, "ours": self.ours, "incumbent": self.incumbent,
                "ratio": None if self.ratio is None else round(self.ratio, 4),
                "unit": self.unit, "source": self.source, "we_lose": self.we_lose,
                **({"absent": self.why_absent} if self.why_absent else {})}


@dataclass(frozen=True)
class Numerics:
    cases: int
    values: int
    differing: int
    max_steps: int
    first: str | None

    def text(self) -> str:
        if self.values == 0:
            return "not compared: no outputs from one side"
        if self.differing == 0:
            return f"equal: {self.values:,} output values on {self.cases} inputs, byte for byte"
        return (f"{self.differing:,} of {self.values:,} output values differ on {self.cases} "
                f"inputs, at most {self.max_steps} steps (first: {self.first})")


@dataclass(frozen=True)
class Comparison:
    model: str
    target: str  # "corstone300 + ethos-u55-128 (cortex-m55)"
    machine: str  # what ran both: the QEMU machine and core
    ours_method: str
    incumbent_method: str
    figures: tuple[Figure, ...]
    numerics: Numerics
    notes: tuple[str, ...] = field(default=())

    def to_json(self) -> dict:
        return {"model": self.model, "target": self.target, "machine": self.machine,
                "ours": self.ours_method, "incumbent": self.incumbent_method,
                "figures": [f.to_json() for f in self.figures],
                "numerics": {"cases": self.numerics.cases, "values": self.numerics.values,
                             "differing": self.numerics.differing,
                             "max_steps": self.numerics.max_steps,
                             "first": self.numerics.first, "text": self.numerics.text()},
                "notes": list(self.notes)}

    def text(self, colour: bool = False) -> str:
        def cell(value, unit) -> str:
            if value is None:
                return "-"
            return f"{value:,}{unit}" if isinstance(value, int) else f"{value:,.2f}{unit}"

        lines = [f"compare {self.model} on {self.target}, both on {self.machine}",
                 f"  ours:      {self.ours_method}",
                 f"  incumbent: {self.incumbent_method}",
                 f"{'figure':34} {'ours':>14} {'incumbent':>14} {'ratio':>7}  source"]
        for figure in self.figures:
            ratio = "-" if figure.ratio is None else f"{figure.ratio:.3f}"
            mark = " worse" if figure.we_lose else ""
            if colour and figure.we_lose:
                ratio, mark = f"\x1b[31m{ratio}\x1b[0m", f"\x1b[31m{mark}\x1b[0m"
            source = figure.source + (f"; {figure.why_absent}" if figure.why_absent else "")
            lines.append(f"{figure.name:34} {cell(figure.ours, figure.unit):>14} "
                         f"{cell(figure.incumbent, figure.unit):>14} {ratio:>7}{mark}  {source}")
        lines.append(f"numerics: {self.numerics.text()}")
        lines += [f"note: {note}" for note in self.notes]
        lines.append("ratio = ours / incumbent; 'worse' marks a figure where we lose")
        return "\n".join(lines)

    def html(self) -> str:
        rows = []
        for figure in self.figures:
            ratio = "-" if figure.ratio is None else f"{figure.ratio:.3f}"
            style = ' class="worse"' if figure.we_lose else ""
            rows.append(
                f"<tr><td>{html.escape(figure.name)}</td><td>{_html_value(figure.ours)}</td>"
                f"<td>{_html_value(figure.incumbent)}</td><td{style}>{ratio}</td>"
                f"<td>{html.escape(figure.source)}"
                f"{html.escape('; ' + figure.why_absent) if figure.why_absent else ''}</td></tr>")
        notes = "".join(f"<li>{html.escape(n)}</li>" for n in self.notes)
        return (
            "<!doctype html><html><head><meta charset='utf-8'><title>orchestrate compare "
            f"{html.escape(self.model)}</title><style>body{{font-family:sans-serif}}"
            "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 6px}"
            "td.worse{background:#f8d0d0;color:#900}</style></head><body>"
            f"<h1>{html.escape(self.model)} on {html.escape(self.target)}</h1>"
            f"<p>Both on {html.escape(self.machine)}.<br>Ours: {html.escape(self.ours_method)}"
            f"<br>Incumbent: {html.escape(self.incumbent_method)}</p><table><tr><th>figure</th>"
            "<th>ours</th><th>incumbent</th><th>ours / incumbent</th><th>source</th></tr>"
            + "".join(rows) + "</table>"
            f"<p>Numerics: {html.escape(self.numerics.text())}</p><ul>{notes}</ul>"
            "</body></html>\n")


# The figures a table across targets shows, one column pair each (compare --npus).
TABLE_FIGURES = (("cycles_npu", "cycles_npu"), ("CPU instructions per inference", "instructions"),
                 ("tensor arena bytes", "arena B"), ("model file bytes", "file B"),
                 ("release flash bytes", "release flash B"),
                 ("release RAM bytes (without the stack)", "release RAM B"))


def comparison_table(comparisons, colour: bool = False) -> str:
    """One row per comparison (a target): each figure ours / incumbent and its ratio, and the
    outputs; a figure no comparison has is left out. Sources: each comparison's own report."""
    shown = [(name, label) for name, label in TABLE_FIGURES
             if any(f.name == name for c in comparisons for f in c.figures)]
    header = f"{'target':44}" + "".join(f" {label + ' ours/inc':>26} {'ratio':>7}"
                                         for _, label in shown) + "  outputs"
    lines = [f"compare {comparisons[0].model if comparisons else ''}: ratio = ours / incumbent"
             ", 'worse' marks where we lose; cycles: Vela estimates; instructions: QEMU -icount "
             "(measured); arena: as each runtime allocated it; release figures: linker maps",
             header]
    for comparison in comparisons:
        figures = {f.name: f for f in comparison.figures}
        row = f"{comparison.target[:44]:44}"
        for name, _ in shown:
            figure = figures.get(name)
            pair = "-" if figure is None else (
                f"{'-' if figure.ours is None else f'{figure.ours:,}'} / "
                f"{'-' if figure.incumbent is None else f'{figure.incumbent:,}'}")
            ratio = "-" if figure is None or figure.ratio is None else f"{figure.ratio:.3f}"
            if figure is not None and figure.we_lose:
                ratio = f"\x1b[31m{ratio}\x1b[0m" if colour else f"{ratio}!"
            row += f" {pair:>26} {ratio:>7}"
        numerics = comparison.numerics
        row += ("  equal" if numerics.values and not numerics.differing else
                f"  {numerics.differing} differ" if numerics.values else "  -")
        lines.append(row)
    lines.append("'!' marks a figure where we lose; `compare FILE --npu NAME` gives one target's "
                 "every figure with its source")
    return "\n".join(lines)


def _html_value(value) -> str:
    if value is None:
        return "-"
    return f"{value:,}" if isinstance(value, int) else f"{value:,.2f}"


def file_operators(path: Path) -> tuple[str, ...]:
    """The operator codes of a .tflite (builtin names, custom codes such as "ethos-u"), read as
    data with Vela's flatbuffer bindings."""
    from ethosu.vela.tflite.BuiltinOperator import BuiltinOperator  # lazy: heavy (ethosu.vela)
    from ethosu.vela.tflite.Model import Model  # lazy: heavy (ethosu.vela)

    names = {value: name for name, value in vars(BuiltinOperator).items()
             if not name.startswith("_")}
    model = Model.GetRootAsModel(Path(path).read_bytes(), 0)
    found = set()
    for i in range(model.OperatorCodesLength()):
        code = model.OperatorCodes(i)
        builtin = max(code.BuiltinCode(), code.DeprecatedBuiltinCode())
        name = names.get(builtin, str(builtin))
        found.add((code.CustomCode() or b"").decode("utf-8", "replace")
                  if name == "CUSTOM" else name)
    return tuple(sorted(found))


# Our kernels by the TFLite operator they compute, to set the two per-operator profiles side by
# side (an operator we run with a kernel of another name keeps its own row).
_KERNEL_OPERATOR = {
    "quantized_conv2d": "CONV_2D", "quantized_depthwise_conv2d": "DEPTHWISE_CONV_2D",
    "quantized_linear": "FULLY_CONNECTED", "quantized_avg_pool2d": "AVERAGE_POOL_2D",
    "quantized_max_pool2d": "MAX_POOL_2D", "softmax": "SOFTMAX", "quantized_add": "ADD",
    "quantized_mul": "MUL", "pad": "PAD", "constant_pad_nd": "PAD", "mean": "MEAN",
    "view_copy": "RESHAPE",
}
PER_OP_SOURCE = ("measured: QEMU -icount per operator, first inference (ours: the runner's "
                 "trace build; TFLM: its MicroProfiler)")


def compare(tflite: str | Path, compile_program, *, platform: str = "corstone300",
            npu: str | None = None, cpu: str | None = None, samples: int = 4,
            work_dir: str | Path | None = None, timeout_s: int = 900, per_op: bool = False,
            firmware: bool = False, progress=None) -> Comparison:
    """Compile `tflite` both ways for the target, run both on QEMU on `samples` random inputs,
    and compare (see the module); `compile_program` is the API's `compile` (this room sits
    below the API and does not import it); `per_op` adds each side's instructions per TFLite
    operator kind, from a profiled run of each (our runner's trace build, TFLM's MicroProfiler);
    `firmware` adds both release images' flash and RAM from their linker maps
    (orchestrator/comparison/firmware.py)."""
    say = progress or (lambda _line: None)
    tflite = Path(tflite)
    if tflite.suffix != ".tflite" or not tflite.is_file():
        raise UserError(f"compare takes a .tflite file; '{tflite}' is not one")
    graph = read_tflite(tflite)
    if not graph.full_integer:
        raise UserError(f"{tflite.name} is a float model; compare runs a full-integer file "
                        "(int8 inputs and outputs), as the incumbent deploys it")
    target = resolve_target(platform, npu, cpu)
    on_npu = bool(target.npu)
    with tempfile.TemporaryDirectory(prefix="orchestrate-compare-") as scratch:
        work = Path(work_dir) if work_dir is not None else Path(scratch)
        work.mkdir(parents=True, exist_ok=True)
        say(f"compiling {tflite.name} with orchestrate")
        options = {"platform": platform, "npu": npu or ("none" if not on_npu else None),
                   "cpu": cpu}
        result = compile_program(str(tflite), work / "ours.pte",
                                 **{k: v for k, v in options.items() if v is not None})
        twin = load_program(result.pte)
        manifest_target = twin.require_manifest().target
        device_platform = installed_platform(manifest_target)
        figures: list[Figure] = []
        notes: list[str] = []
        incumbent_file = tflite
        if on_npu:
            say(f"compiling {tflite.name} with vela (the incumbent)")
            ours_vela = ours_npu(result.plan)
            theirs_vela = incumbent_npu(tflite, target, work / "incumbent")
            incumbent_file = work / "incumbent" / f"{tflite.stem}_vela.tflite"
            figures += _npu_figures(ours_vela, theirs_vela)

        cases = int8_inputs(graph, samples, SEED)
        twin_inputs = [tuple(_nchw(x) for x in case) for case in cases]
        say(f"running our program on QEMU ({samples} inputs)")
        ours_instructions = ours_arena = None
        ours_error = ""
        try:
            ran = qemu_on_checked_pte(twin, device_platform, timeout_s, samples=samples,
                                      inputs=twin_inputs)
            if ran.passed:
                ours_instructions = ran.instructions
                allocator = re.search(r"method_allocator_used : (\d+)", ran.log)
                # EthosUBackend takes each invocation's NPU scratch from the temp allocator
                # (TFLM's lies in its arena): the largest partition's, from its payload
                scratch = max((p.payload.scratch_bytes for p in twin.partitions), default=0)
                ours_arena = (sum(size for _, size, _, _ in ran.planned_buffers)
                              + (int(allocator[1]) if allocator else 0) + scratch) or None
            else:
                ours_error = "our program failed on QEMU: " + "; ".join(ran.errors)[:300]
            ours_method = ran.method
            machine = ran.core
        except (NotRun, QemuUnavailable) as error:
            ours_error = str(error).removeprefix("not run: ")
            ours_method = machine = "not run"
        ours_outputs = [_twin_outputs(twin, inputs) for inputs in twin_inputs] \
            if not ours_error else []

        say(f"running the incumbent in TFLM on QEMU ({samples} inputs)")
        theirs_instructions = theirs_arena = None
        theirs_error = ""
        theirs_outputs: list = []
        operators = file_operators(incumbent_file)
        try:
            handler = StreamNpuHandler(target.npu) if on_npu else None
            tflm = run_tflite_on_qemu(
                incumbent_file, operators, [b"".join(x.tobytes() for x in case) for case in cases],
                device_platform, cpu=manifest_target.get("cpu") or None,
                npu=target.npu if on_npu else None, npu_handler=handler,
                npu_fast_scratch_bytes=fast_scratch_bytes(device_platform, manifest_target)
                if on_npu else 0, timeout_s=timeout_s)
            incumbent_method = tflm.method
            if tflm.ok:
                theirs_instructions = tflm.median_instructions
                theirs_arena = tflm.arena_used_bytes
                theirs_outputs = [_split_outputs(graph, data) for data in tflm.outputs]
            else:
                theirs_error = "the incumbent failed on QEMU: " + "; ".join(tflm.errors)[:400]
        except QemuUnavailable as error:
            incumbent_method = "TensorFlow Lite Micro: not run"
            theirs_error = str(error).removeprefix("not run: ")

        figures.append(Figure(
            "CPU instructions per inference", ours_instructions, theirs_instructions,
            QEMU_SOURCE, why_absent="; ".join(e for e in (ours_error, theirs_error) if e)))
        figures.append(Figure(
            "tensor arena bytes", ours_arena, theirs_arena,
            "measured on the device: ours, the planned buffers plus the method allocator's "
            "use (the runtime's structures), as our runner logged them, plus the largest NPU "
            "scratch the Ethos-U backend takes from the temp allocator (from the payload); "
            "TFLM's arena_used_bytes() after AllocateTensors (tensors, NPU scratch and "
            "interpreter structures)",
            " B",
            why_absent="; ".join(e for e in (ours_error, theirs_error) if e)))
        figures.append(Figure(
            "model file bytes", len(result.compiled.pte_bytes), incumbent_file.stat().st_size,
            "file sizes: our .pte; the incumbent's " +
            ("Vela-compiled .tflite" if on_npu else ".tflite"), " B"))
        if per_op and not ours_error and not theirs_error:
            say("profiling both programs per operator on QEMU")
            figures += _per_operator(twin, device_platform, manifest_target, incumbent_file,
                                     operators, cases[:1], timeout_s, on_npu, target.npu)
        if firmware:
            say("building both release images (and running them on QEMU without an NPU)")
            ours_image, theirs_image, why = release_images(
                Path(result.pte), incumbent_file, operators, device_platform, work,
                cpu=manifest_target.get("cpu") or None, npu=target.npu if on_npu else None,
                arena_used_bytes=theirs_arena,
                npu_handler=StreamNpuHandler(target.npu) if on_npu else None,
                fast_scratch_bytes=fast_scratch_bytes(device_platform, manifest_target)
                if on_npu else 0, timeout_s=timeout_s)
            figures += _release_figures(ours_image, theirs_image, "; ".join(why))
            notes += component_lines(ours_image, theirs_image)
            if work_dir is None:
                notes.append("our release project was built in a temporary folder, removed "
                             "now: --work DIR keeps it (and its map)")
        numerics = _numerics(ours_outputs, theirs_outputs)
        if ours_error and not ours_outputs:
            notes.append(ours_error)
        if theirs_error:
            notes.append(theirs_error)
    return Comparison(
        model=tflite.name,
        target=(f"{platform} + {target.npu or 'no NPU'} "
                f"({manifest_target.get('cpu') or target.cpu})"),
        machine=machine, ours_method=ours_method, incumbent_method=incumbent_method,
        figures=tuple(figures), numerics=numerics, notes=tuple(notes))


def _per_operator(twin, device_platform, manifest_target, incumbent_file, operators, cases,
                  timeout_s, on_npu, npu) -> list[Figure]:
    """Instructions per TFLite operator kind on each side (first inference)."""
    ours: dict[str, int] = {}
    profile = qemu_profile(twin, device_platform, timeout_s, samples=1)
    for entry in profile.result.trace:
        # the calls themselves; a backend's own scope inside a delegate call is part of it
        if (entry.case != 0 or entry.instructions is None
                or entry.kind not in ("OPERATOR_CALL", "DELEGATE_CALL")):
            continue
        kernel = entry.kernel.removesuffix(".out")
        name = "ethos-u" if entry.kind == "DELEGATE_CALL" else _KERNEL_OPERATOR.get(kernel,
                                                                                    kernel)
        ours[name] = ours.get(name, 0) + entry.instructions
    theirs: dict[str, int] = {}
    tflm = run_tflite_on_qemu(
        incumbent_file, operators, [b"".join(x.tobytes() for x in case) for case in cases],
        device_platform, cpu=manifest_target.get("cpu") or None, npu=npu if on_npu else None,
        npu_handler=StreamNpuHandler(npu) if on_npu else None,
        npu_fast_scratch_bytes=fast_scratch_bytes(device_platform, manifest_target)
        if on_npu else 0, profile=True, timeout_s=timeout_s)
    for tag, count in (tflm.operators[0] if tflm.ok and tflm.operators else ()):
        theirs[tag] = theirs.get(tag, 0) + count
    names = sorted(set(ours) | set(theirs), key=lambda n: -max(ours.get(n, 0), theirs.get(n, 0)))
    return [Figure(f"  instructions in {name}", ours.get(name), theirs.get(name), PER_OP_SOURCE,
                   why_absent="" if name in ours and name in theirs else
                   ("the incumbent has no such operator" if name in ours else
                    "our program has no such operator"))
            for name in names]


def _release_figures(ours: ReleaseImage | None, theirs: ReleaseImage | None,
                     why: str) -> list[Figure]:
    maps = f"linker maps of release images: ours {OURS_SOURCE}; the incumbent's {INCUMBENT_SOURCE}"

    def value(image, name):
        return getattr(image, name) if image is not None else None

    ran = "; ".join(f"{side} {image.ran}" for side, image in (("ours", ours),
                                                              ("the incumbent's", theirs))
                    if image is not None and image.ran)
    stack_absent = why or ("" if ran else "an NPU image drives the NPU's registers, which QEMU "
                           "does not model: neither image ran")
    return [
        Figure("release flash bytes", value(ours, "flash_bytes"), value(theirs, "flash_bytes"),
               f"{maps}: code, read-only data, .data's initial values and the model", " B",
               why_absent=why),
        Figure("release code bytes (flash less the model)", value(ours, "code_bytes"),
               value(theirs, "code_bytes"), "the same linker maps", " B", why_absent=why),
        Figure("release RAM bytes (without the stack)", value(ours, "ram_bytes"),
               value(theirs, "ram_bytes"),
               "the same linker maps: .data, .bss and placed buffers; ours "
               f"{ours.ram_detail if ours else '-'}; the incumbent's "
               f"{theirs.ram_detail if theirs else '-'}", " B", why_absent=why),
        Figure("release stack high-water bytes", value(ours, "stack_used_bytes"),
               value(theirs, "stack_used_bytes"),
               f"measured on QEMU (stack painting) running each release image once ({ran})"
               if ran else "measured on QEMU (stack painting)", " B",
               why_absent=stack_absent),
    ]


def _npu_figures(ours: NpuFigures, theirs: NpuFigures) -> list[Figure]:
    source = "Vela estimate (summary CSV): ours per partition, summed; the incumbent's file"
    return [
        Figure("NPU operators (file's operators)", ours.npu_operators, theirs.npu_operators,
               "Vela summary, counted in the file's operators", lower_is_better=False),
        Figure("CPU operators (file's operators)", ours.cpu_operators, theirs.cpu_operators,
               "Vela summary, counted in the file's operators"),
        Figure("NPU partitions", ours.partitions, theirs.partitions,
               "ours: the program's Ethos-U delegates; incumbent: ethos-u operators"),
        Figure("cycles_npu", ours.cycles_npu, theirs.cycles_npu, source),
        Figure("cycles_total", ours.cycles_total, theirs.cycles_total, source),
        Figure("NPU SRAM bytes", ours.sram_bytes, theirs.sram_bytes,
               "Vela estimate: the largest partition's", " B"),
        Figure("NPU flash bytes", ours.flash_bytes, theirs.flash_bytes,
               "Vela estimate: weights and command streams", " B"),
    ]


def _nchw(array: np.ndarray):
    tensor = torch.from_numpy(np.ascontiguousarray(array))
    return tensor.permute(0, 3, 1, 2).contiguous() if array.ndim == 4 else tensor


def _twin_outputs(twin, inputs) -> list[np.ndarray]:
    """The twin's outputs (what the device's were checked against, byte for byte), NHWC."""
    run = twin.run(inputs, npu=twin.npu_executor("auto"))
    outputs = []
    for output in run.outputs:
        array = output.numpy()
        outputs.append(array.transpose(0, 2, 3, 1) if array.ndim == 4 else array)
    return outputs


def _split_outputs(graph, data: bytes) -> list[np.ndarray]:
    outputs, at = [], 0
    for index in graph.outputs:
        tensor = graph.tensors[index]
        size = int(np.prod(tensor.shape)) * np.dtype(tensor.dtype).itemsize
        outputs.append(np.frombuffer(data[at:at + size], dtype=tensor.dtype).reshape(tensor.shape))
        at += size
    return outputs


def _numerics(ours: list, theirs: list) -> Numerics:
    values = differing = worst = 0
    first = None
    if not ours or not theirs:
        return Numerics(len(ours) or len(theirs), 0, 0, 0, None)
    for case, (mine, other) in enumerate(zip(ours, theirs)):
        for slot, (a, b) in enumerate(zip(mine, other)):
            steps = np.abs(a.astype(np.int64).reshape(-1) - b.astype(np.int64).reshape(-1))
            values += steps.size
            differing += int((steps > 0).sum())
            worst = max(worst, int(steps.max(initial=0)))
            if first is None and steps.any():
                e = int(np.argmax(steps > 0))
                first = (f"input {case}, output {slot}, element {e}: ours "
                         f"{int(a.reshape(-1)[e])}, incumbent {int(b.reshape(-1)[e])}")
    return Numerics(len(ours), values, differing, worst, first)
