"""The coverage report of `orchestrate plan`: the views (terminal table, Markdown, JSON) of the
placements, their costs and the summary (the summary itself, the model: summary.py).

Formats: a terminal table (fits 100 columns: long reasons wrap), Markdown, and JSON following
`plan.schema.json` (versioned by `schema_version`). Every figure names its source: `vela` (Vela's
estimate), `model:<tier>` / `model:portable` / `model:transition` (our cost models), `executorch`
(the memory plan of the serialized program), `platform` (the platform YAML).
"""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import torch
from tabulate import tabulate

from orchestrator.compilation.precision import output_widths
from orchestrator.reports.summary import Summary
from partitioners.cpu import ORIGIN_KEY
from partitioners.npu import partition_span
from platforms.memory_placement import BOUND_SOURCE, arena_bound_bytes

SCHEMA_VERSION = "1.0"
SCHEMA_PATH = Path(__file__).with_name("plan.schema.json")


def _where(row) -> str:
    if row.placement == "npu":
        return f"NPU p{row.partition}"
    if row.placement == "cmsis-nn":
        return f"CMSIS-NN/{row.tier}"
    return "portable"


def _shape(shape) -> str:
    return "x".join(str(s) for s in shape) if shape else "-"


_SHORT_DTYPE = {"float32": "f32", "int8": "i8", "int16": "i16", "int32": "i32", "bool": "bool",
                "int64": "i64", "uint8": "u8"}


def _out_dtype(row) -> str:
    return _SHORT_DTYPE.get(row.out_dtype, row.out_dtype)


def _short_op(op: str) -> str:
    for prefix in ("aten.", "quantized_decomposed.", "dim_order_ops.", "cortex_m."):
        op = op.replace(prefix, "")
    return op.replace(".default", "").replace(".Tensor", "").replace(".self", "")


def _cost_cell(row, sep: str = " ", short: bool = False) -> str:
    """The row's time and its source; an NPU op Vela gives no cycles of its own (it fused the op
    into the layer before it) says "fused", not a zero."""
    if row.cost is None:
        return "-"
    source = short_source(row.cost.source) if short else row.cost.source
    if row.placement == "npu" and row.kind != "npu-invocation" and row.cost.seconds == 0 \
            and row.cost.source == "vela":
        return f"fused{sep}{source}"
    return f"{row.cost.seconds * 1e6:,.1f}us{sep}{source}"


def _reasons(row) -> list[str]:
    parts = []
    if row.placement != "npu":
        for i, reason in enumerate(row.reasons):
            parts.append(("not NPU: " if i == 0 else "not CMSIS-NN: ") + reason.text())
    if row.fused:
        parts.append("fused into this kernel: " + ", ".join(row.fused))
    for fault in row.device_faults:
        parts.append(f"DEVICE FAULT ({fault.check}): {fault.message}")
    return parts


HIDDEN_LABELS = {"boundary-quantize": "quantize (edge)", "boundary-dequantize": "dequantize (edge)",
                 "layout": "layout copy", "npu-invocation": "NPU invocation",
                 "requantize": "requantize"}
_SOURCE_ABBREVIATION = {"vela": "V", "model:transition": "T", "model:portable": "P",
                        "model:scalar": "S", "model:dsp": "D", "model:mve": "M", "measured": "meas",
                        "model:memory": "R"}
TABLE_LEGEND = (
    "legend: NPU pN = inside NPU partition N (its ops' times are Vela's per-layer cycles; fused = "
    "Vela gives the op no cycles of its own: it fused it into the layer before it or removed it; "
    "the partition's 'NPU invocation' row adds its start-up and copies); (edge) = a quantize or dequantize where a float value meets int8 "
    "(program input/output, a float CPU op); layout copy = a dim-order copy the compile inserted "
    "so a kernel reads the layout it assumes; transitions = CPU<->NPU hand-overs per inference; "
    "MAC utilisation = the MACs the partition does over the NPU's MACs x its Vela cycles")
SOURCE_LEGEND = ("cost source: V = Vela estimate; M/D/S = orchestrate CMSIS-NN cost model for the "
                 "MVE/DSP/Scalar tier; P = portable-kernel model; T = transition model "
                 "(cost_models/data/cpu_cost.yaml); R = reads at the placed region's speed "
                 "(platform YAML cpu_read); nothing here is measured")


def short_source(source: str) -> str:
    """The table's letters; a part a calibration scaled ends in '*', one it raised to its
    instruction estimate in '^' (calibration_legend)."""
    parts = []
    for part in source.split("+"):
        base, calibrated, _ = part.partition(" (calibrated: ")
        base, raised, _ = base.partition(" (raised to instructions: ")
        parts.append(_SOURCE_ABBREVIATION.get(base, base) + ("*" if calibrated else "")
                     + ("^" if raised else ""))
    return "+".join(parts)


def calibration_legend(sources) -> str | None:
    """'* = ...' and '^ = ...' for the calibration files the given cost sources name, or None."""
    sources = [source or "" for source in sources]
    lines = []
    for tag, text in (("calibrated", "* = the cost model's cycles scaled by the calibration {} "
                       "(fitted to measured profiles: `orchestrate calibrate`)"),
                      ("raised to instructions", "^ = the cost model's cycles raised to the "
                       "instructions {} estimates for the kernel (QEMU -icount profiles: "
                       "`orchestrate calibrate`): the model had fewer cycles than instructions")):
        names = list(dict.fromkeys(m.group(1) for source in sources
                                   for m in re.finditer(rf"\({tag}: ([^)]+)\)", source)))
        if names:
            lines.append(text.format(", ".join(names)))
    return "; ".join(lines) or None


def _ellipsize(text: str, width: int) -> str:
    """Keep both ends of a long node name: the numbered suffix tells nodes apart."""
    if len(text) <= width:
        return text
    head = (width - 1) // 2
    return text[:head] + "~" + text[len(text) - (width - 1 - head):]


def _wrap_name(text: str, width: int) -> str:
    """A long node or op name over several lines of `width`, broken after underscores and
    dots where it can: the whole name stays readable and searchable (no "~" cut)."""
    if len(text) <= width:
        return text
    lines, current = [], ""
    for piece in re.split(r"(?<=[_.])", text):
        while len(piece) > width:
            if current:
                lines.append(current)
                current = ""
            lines.append(piece[:width])
            piece = piece[width:]
        if len(current) + len(piece) > width:
            lines.append(current)
            current = piece
        else:
            current += piece
    if current:
        lines.append(current)
    return "\n".join(lines)


def _collapsed(rows, recurrences):
    """(row number, row) pairs, with each unrolled recurrence's rows replaced by one entry
    (first row number, Recurrence)."""
    spans = {r.first_row: r for r in recurrences if r.rows}
    out, skip_to = [], -1
    for i, row in enumerate(rows):
        if i <= skip_to:
            continue
        if i in spans:
            out.append((i, spans[i]))
            skip_to = spans[i].last_row
            continue
        out.append((i, row))
    return out


def _recurrence_why(rows, rec) -> list[str]:
    """The distinct reasons of a collapsed recurrence's rows, each with how many rows give it."""
    counts: dict[str, int] = {}
    for row in rows[rec.first_row:rec.last_row + 1]:
        for line in _reasons(row):
            counts[line] = counts.get(line, 0) + 1
    return [f"{line} (x{n})" if n > 1 else line for line, n in counts.items()]


def tflite_origin(model, row) -> dict | None:
    """The TFLite operator and tensor a row came from (a model read from a .tflite)."""
    origin = getattr(model.module, "origin", None) if model is not None else None
    if not origin or not row.module:
        return None
    found = origin.get(row.module.split(".")[0])
    if found is None:
        return None
    index, opcode, tensor, name = found
    return {"format": getattr(model.module, "origin_format", "TFLite"), "operator": index,
            "opcode": opcode, "tensor": tensor, "tensor_name": name}


def _origin_text(found: dict) -> str:
    name = found["tensor_name"]
    name = name if len(name) <= 48 else name[:45] + "..."
    if found["format"] == "ONNX":
        return f"from ONNX {found['opcode']} (node {found['operator']}), output '{name}'"
    return (f"from TFLite {found['opcode']} (operator {found['operator']}), output tensor "
            f"{found['tensor']} '{name}'")


def _rows_table(rows, markdown: bool, recurrences=(), model=None) -> str:
    """Markdown: one table with every column. Terminal: the op table, then the reasons keyed
    by row number, so both fit 100 columns however long a reason is. An unrolled recurrence's
    rows collapse into one line in the terminal table (`recurrences` empty: every row)."""
    if markdown:
        table = [[i, r.name if r.kind == "op" else f"{r.name} [{r.kind}]", _short_op(r.op),
                  ", ".join(_shape(x) for x in r.input_shapes) or "-",
                  f"{_shape(r.output_shape)} {_out_dtype(r)}", r.dtypes, r.precision or "-",
                  f"{r.macs:,}", _where(r), r.kernel or "", _cost_cell(r),
                  "<br>".join(_reasons(r) + [_origin_text(o) for o in [tflite_origin(model, r)]
                                             if o])]
                 for i, r in enumerate(rows)]
        return tabulate(table, ["#", "node", "op", "in", "out", "dtypes", "precision", "MACs",
                                "where", "kernel", "cost", "why not better"], tablefmt="github")
    table, why = [], []
    # A reason every CPU row shares (no NPU on the target) is said once, not on every row.
    firsts = [_reasons(r)[0] for r in rows if r.placement != "npu" and _reasons(r)]
    folded = firsts[0] if firsts and len(firsts) > 1 and len(set(firsts)) == 1 and \
        len(firsts) == sum(1 for r in rows if r.placement != "npu") else None
    if folded is not None:
        why.append(["all", textwrap.fill(f"all {len(firsts)} CPU rows: {folded}", 90)])
    # The precision column only when the program has more than one (--precision): an int8
    # program's plan keeps its node names whole (22 wide) instead of a column of "a8w8".
    mixed = len({r.precision for r in rows if r.precision}) > 1
    node_width, op_width = (17, 16) if mixed else (22, 16)
    for i, r in _collapsed(rows, recurrences):
        if not hasattr(r, "placement"):  # a collapsed recurrence
            last = r.last_row
            macs = sum(x.macs for x in rows[i:last + 1])
            seconds = sum(x.cost.seconds for x in rows[i:last + 1] if x.cost is not None)
            # a recurrence cut into one NPU partition per step names them as a span (p0-p13)
            npu = sorted({x.partition for x in rows[i:last + 1] if x.placement == "npu"})
            where = sorted({_where(x).replace("CMSIS-NN/", "CMSIS/") for x in rows[i:last + 1]
                            if x.placement != "npu"} | ({f"NPU {partition_span(npu)}"} if npu
                                                       else set()))
            sources = "+".join(sorted({short_source(x.cost.source) for x in rows[i:last + 1]
                                       if x.cost is not None}))
            kinds = "/".join(sorted({x.precision for x in rows[i:last + 1] if x.precision}))
            table.append([f"{i}-{last}", _ellipsize(f"{r.path} ({r.type})", node_width),
                          _ellipsize(f"{r.steps} steps, {r.rows} ops", op_width), "-",
                          kinds or "-",
                          f"{macs:,}",
                          _ellipsize(", ".join(where), 14), f"{seconds * 1e6:,.1f}us {sources}"])
            for line in _recurrence_why(rows, r):
                why.append([f"{i}-{last}", textwrap.fill(line, 90)])
            continue
        op = _short_op(r.op) if r.kind == "op" else f"{HIDDEN_LABELS[r.kind]}"
        cost = _cost_cell(r, short=True)
        table.append([i, _wrap_name(r.name, node_width), _wrap_name(op, op_width),
                      f"{_shape(r.output_shape)} {_out_dtype(r)}", r.precision or "-",
                      f"{r.macs:,}", _where(r).replace("CMSIS-NN/", "CMSIS/"), cost])
        for line in _reasons(r):
            if line == folded:
                continue
            why.append([i, textwrap.fill(line, 90)])
        if r.placement == "cmsis-nn" and r.kernel:
            why.append([i, textwrap.fill(f"kernel: {r.kernel}", 90)])
        found = tflite_origin(model, r)
        if found is not None:
            why.append([i, textwrap.fill(_origin_text(found), 90)])
    headers = ["#", "node", "op", "out", "prec", "MACs", "where", "cost (source)"]
    align = ["right", "left", "left", "left", "left", "right", "left", "right"]
    if not mixed:
        table = [row[:4] + row[5:] for row in table]
        headers, align = headers[:4] + headers[5:], align[:4] + align[5:]
    text = tabulate(table, headers, tablefmt="simple", disable_numparse=True, colalign=align)
    if why:
        text += ("\n\nwhy each CPU op is not in a better place, and the TFLite operator each "
                 "op came from (# = row above):\n" if getattr(getattr(model, "module", None),
                                                              "origin", None) else
                 "\n\nwhy each CPU op is not in a better place (# = row above):\n")
        text += tabulate(why, ["#", "reason (from the check that decided)"], tablefmt="simple")
    return text


def _summary_lines(compiled, s: Summary) -> list[str]:
    t = compiled.target
    engines = {"npu": "in NPU partitions", "cmsis-nn": "on CMSIS-NN", "portable": "on portable"}
    hidden = "; ".join(
        f"{engines[engine]}: " + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items()))
        for engine, kinds in sorted((s.hidden_by_engine or {}).items()))
    lines = [
        f"ops: NPU {s.ops['npu']}, CMSIS-NN {s.ops['cmsis-nn']}, portable {s.ops['portable']}"
        + (f"  (plus hidden work rows, counted where they run: {hidden})" if hidden else ""),
        f"MACs: NPU {s.macs['npu']:,}, CMSIS-NN {s.macs['cmsis-nn']:,}, portable {s.macs['portable']:,}"
        f"  -> NPU MAC coverage {s.npu_mac_coverage_pct:.1f}%",
        f"NPU partitions: {s.npu_partitions}, CPU<->NPU transitions: {s.transitions}",
    ]
    if compiled.calibration.precision:
        lines.append(precision_line(compiled.placements, compiled.calibration.precision,
                                    output_widths(compiled.quantized.program.graph_module)))
    for k, u in sorted(s.npu_utilisation.items()):
        traffic = ", ".join(f"{m} {b:,} B" for m, b in s.npu_traffic.get(k, {}).items() if b)
        lines.append(f"  partition p{k}: MAC utilisation {100 * u:.1f}%, traffic per inference: "
                     f"{traffic or '-'} (vela)")
    if s.latency_seconds is not None:
        lines.append(
            f"estimated latency: {s.latency_seconds * 1e3:.3f} ms end to end, CPU and NPU serialized "
            f"(NPU {s.per_placement_seconds['npu'] * 1e3:.3f} ms, CMSIS-NN "
            f"{s.per_placement_seconds['cmsis-nn'] * 1e3:.3f} ms, portable "
            f"{s.per_placement_seconds['portable'] * 1e3:.3f} ms) at CPU {t.cpu_hz / 1e6:g} MHz"
            + (f", NPU {t.npu_hz / 1e6:g} MHz" if t.npu_hz else "") + f"; source {s.latency_source}")
    if s.instructions is not None:
        lines.append(f"estimated instructions retired by the CPU: {s.instructions:,} per "
                     f"inference (the model's cycles x instructions per cycle, "
                     f"{s.instructions_source}; the unit of a QEMU profile, not cycles)")
    scratch = (f", its largest CMSIS-NN scratch buffer {s.cmsis_scratch_bytes:,} B"
               if s.cmsis_scratch_bytes else "")
    lines.append(f".pte: {s.pte_bytes:,} B, weights {s.weight_bytes:,} B "
                 f"({'executorch + vela' if t.npu else 'executorch'}); arena {s.arena_bytes:,} B "
                 f"(planned{_bound_text(compiled)}{scratch})"
                 + (f"; NPU scratch {s.npu_scratch_bytes:,} B (vela)" if t.npu else ""))
    lines.append(_io_line(compiled))
    lines.extend(_state_lines(compiled))
    for m in s.memory:
        verdict = "fits" if m.fits else "DOES NOT FIT"
        region = (f"{m.region} ({m.region_bytes:,} B {'of' if m.fits else 'free in'} it)"
                  if m.region else "no region may hold it")
        lines.append(f"  {m.item}: {m.bytes:,} B ({m.source}) -> {region}: {verdict}")
    for region, (size, _) in t.platform.reserved.items():
        lines.append(f"  firmware's own use of {region}: {size:,} B (reserved in the platform "
                     "YAML; nothing is placed there)")
    lines.append(f"memory verdict: {'fits' if s.fits else 'DOES NOT FIT'} ({t.platform.name}, platform YAML)")
    lines.extend(_placement_lines(s.placement, t))
    for w in compiled.workarounds:
        lines.append(f"workaround applied to {w.node}: {w.upstream}: {w.message}")
    lines.append(f"operators to register ({len(s.operators)}): "
                 + (", ".join(s.operators) or "none (every op runs inside an NPU partition)"))
    run = compiled.device_run
    if run is not None and run.ran:
        lines.append(run.line())
        for refusal in run.legalized:
            lines.append(f"  refused by the real runtime, then legalized: {refusal}")
    if s.device_faults:
        lines.append(f"static device check: {len(s.device_faults)} fault(s) (the device kernel "
                     "libraries and the portable dim-order rules): " + "; ".join(s.device_faults))
    elif run is None or not run.ran:
        lines.append((run.line() + "; " if run is not None else "")
                     + "static device check: no fault found (every operator has a kernel, the "
                     "dim-order rules the tool knows hold)")
    if s.missing_operators is not None:
        lines.append("runner ops check: " + ("all present" if not s.missing_operators else
                                             "MISSING " + ", ".join(s.missing_operators)))
    return lines


def state_json(compiled) -> dict | None:
    """The state a program carries from one run to the next (its mutable buffers:
    orchestrator/compilation/program_state.py), None without: each buffer's bytes and where it
    lives, and the values whose planned bytes overlap one (none: the state survives)."""
    view = compiled.program_view
    if not view.state_values:
        return None
    regions = {a.mem_id: a.region for a in compiled.arenas}
    return {"bytes": view.state_bytes,
            "source": "ExecuTorch memory plan (mutable buffers, initial values in the .pte)",
            "buffers": [{"value": v.index, "bytes": v.nbytes, "dtype": str(v.dtype).replace(
                "torch.", ""), "sizes": list(v.sizes), "mem_id": v.mem_id,
                "offset": v.mem_offset, "region": regions.get(v.mem_id)}
                for v in view.state_values],
            "shared_with": [list(pair) for pair in view.state_shared_with()]}


def _state_lines(compiled) -> list[str]:
    state = state_json(compiled)
    if state is None:
        return []
    where = ", ".join(f"{b['bytes']:,} B {b['dtype']} {'x'.join(map(str, b['sizes']))} at "
                      f"{b['region'] or 'arena'} +{b['offset']:,}" for b in state["buffers"])
    kept = ("no other value is planned over it, so it survives from one run to the next"
            if not state["shared_with"] else
            f"SHARED with value(s) {', '.join(str(o) for _, o in state['shared_with'])}: "
            "what they write there is lost from the state")
    return [f"state: {state['bytes']:,} B in {len(state['buffers'])} buffer(s) carried from one "
            f"run to the next (initial values in the .pte; a method reload resets them): "
            f"{where}; {kept} ({state['source']})"]


def _bound_text(compiled) -> str:
    bound = arena_bound_bytes(compiled.arenas)
    if bound is None:
        return ""
    return f"; {bound:,} B lower bound from lifetimes, the peak of bytes live at one instruction"


def _io_line(compiled) -> str:
    choice = compiled.io_choice
    if choice is None:
        return (f"I/O: {compiled.target.io} (as asked; --io auto also compiles the other I/O "
                "type and reports both arenas)")
    figures = ", ".join(f"{io} I/O arena {choice.arena_bytes[io]:,} B, .pte "
                        f"{choice.pte_bytes[io]:,} B" for io in sorted(choice.arena_bytes))
    return (f"I/O: {choice.chosen}, chosen by --io auto: {choice.reason}; {figures} (measured: "
            "ExecuTorch memory plan of each compiled program)")


def _placement_lines(p, target) -> list[str]:
    if p is None:
        return []
    weights = p.weights_region or "-"
    read = ("calibrated flash streaming rate" if p.weights_cycles_per_byte is None
            else f"{p.weights_cycles_per_byte:g} cycles/B")
    if len(p.arenas) > 1:
        activations = f"activations in {len(p.arenas)} arenas (below)"
    else:
        activations = f"activations from {p.arena_region or '-'}" + (
            f" ({p.arena_cycles_per_byte:g} cycles/B)" if p.arena_cycles_per_byte is not None
            else "")
    lines = [f"memory policy {p.policy.source}: CPU weights read from {weights} ({read}), "
             + activations]
    if len(p.arenas) > 1:
        first = p.arenas[0][0]
        parts = ", ".join(
            f"{a.mem_id} -> {a.region} {a.bytes:,} B, {a.tensors} tensors"
            + (f", {cost:g} cycles/B" if cost is not None else "") for a, cost, _ in p.arenas)
        lines.append(
            f"  activations split over {len(p.arenas)} arenas (ExecuTorch planned buffers, mem_id): "
            f"{parts}; {first.region} had {first.budget:,} B for them, so it keeps the tensors with "
            "the most CPU traffic (bytes x reads and writes per inference) that fit with "
            "ExecuTorch's reuse and the rest went on to the next region; each op's activation "
            "reads are costed at their arena's speed")
    if p.weights_copied:
        hottest = ", ".join(f"{name} -{cycles:,}" for name, cycles in p.hottest)
        lines.append(
            f"  weights copied {p.image_region} -> {weights} at boot: estimated -{p.gain_cycles:,} "
            f"CPU cycles (-{p.gain_cycles / target.cpu_hz * 1e3:.3f} ms) per inference vs "
            f"reading them in place (cost model; region read figures from the platform YAML); "
            f"most gained: {hottest or '-'}")
    return lines


def _structure_lines(s: Summary) -> list[str]:
    lines = []
    for rec in s.recurrences:
        lines.append("recurrence: " + rec.line())
    named = [g for g in s.modules if g.path]
    if len(named) > 1:
        top = sorted(named, key=lambda g: -g.seconds)[:8]
        lines.append(f"by source module (nn_module_stack; {len(named)} modules, the "
                     f"{len(top)} costliest by estimate):")
        for g in top:
            where = ", ".join(f"{k} {v}" for k, v in sorted(g.placements.items()))
            lines.append(f"  {g.path} ({g.type}): {g.rows} rows ({g.first_row}-{g.last_row}), "
                         f"{g.macs:,} MACs, {g.seconds * 1e3:.3f} ms est.; {where}")
    return lines


def clock_line(target) -> str:
    """The clocks every time in the plan is at, and where they come from."""
    platform = target.platform

    def origin(hz: int, default_hz: int, source: str) -> str:
        if hz != default_hz:
            return "given on the command line or in the policy"
        first = " ".join(source.split()).split(". ")[-1].rstrip(".") if source else ""
        return f"the {platform.name} platform YAML" + (f" ({first})" if first else "")

    parts = [f"CPU {target.cpu_hz / 1e6:g} MHz: "
             f"{origin(target.cpu_hz, platform.cpu_hz, platform.cpu_hz_source)}"]
    if target.npu_hz:
        parts.append(f"NPU {target.npu_hz / 1e6:g} MHz: "
                     f"{origin(target.npu_hz, platform.npu_hz, platform.npu_hz_source)}")
    return "clocks: " + "; ".join(parts) + "; every time below is at these clocks (--cpu-hz " \
        "400MHz / --npu-hz for your part)"


def activation_range_lines(summary: Summary) -> list[str]:
    """Each activation quantization point's scale and clipping rate on the calibration data
    (none when the plan was calibrated on generated samples)."""
    ranges = summary.activation_ranges
    if ranges is None:
        return []
    head = (f"activation ranges ({ranges.method} calibration on {ranges.samples} sample(s), "
            f"{ranges.source}): each value the program rounds to int8, its scale and zero "
            "point, the float interval they cover, the calibration values seen there and the "
            "share of them outside that interval (clipped)")
    table = [["node (layer)", "scale", "zp", "int8 covers", "seen", "clipped"]]
    for point in ranges.points:
        low, high = point.range
        seen = "-" if point.low is None else f"{point.low:.3g} .. {point.high:.3g}"
        rate = point.clipping_rate
        table.append([point.where[:36], f"{point.scale:.4g}", str(point.zero_point),
                      f"{low:.3g} .. {high:.3g}", seen,
                      "-" if rate is None else f"{rate:.2%}"])
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    lines = [head]
    for row in table:
        lines.append("  " + "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w)
                                      for i, (cell, w) in enumerate(zip(row, widths))))
    return lines


def render_text(compiled, rows, summary: Summary, width: int = 100,
                all_rows: bool = False) -> str:
    header = (f"orchestrate plan: {compiled.model.name} ({compiled.model.source}) on "
              f"{compiled.target.describe()}")
    if compiled.target.npu:
        header += f"; Vela {compiled.target.system_config} / {compiled.target.memory_mode}"
    def wrap(line: str) -> str:
        indent = " " * (len(line) - len(line.lstrip()) + 4)
        return textwrap.fill(line, width, subsequent_indent=indent, break_on_hyphens=False)

    out = [wrap(header), wrap(clock_line(compiled.target))]
    if compiled.calibration.warning:
        out.append(wrap("warning: " + compiled.calibration.warning))
    out.extend(wrap(f"note: {note}") for note in model_notes(compiled, rows))
    out.append(_rows_table(rows, markdown=False,
                           recurrences=() if all_rows else summary.recurrences,
                           model=compiled.model))
    if summary.recurrences and not all_rows:
        out.append("(each unrolled recurrence is one line above; --all-rows lists its ops)")
    out.append("")
    out.extend(wrap(line) for line in _structure_lines(summary) + _summary_lines(compiled, summary))
    ranges = activation_range_lines(summary)
    if ranges:
        out += [wrap(ranges[0]), *ranges[1:]]
    hint = io_hint(compiled, rows)
    if hint:
        out.append(wrap(f"hint: {hint}"))
    out.append(wrap(SOURCE_LEGEND))
    legend = calibration_legend(r.cost.source for r in rows if r.cost is not None)
    if legend:
        out.append(wrap(legend))
    out.append(wrap(TABLE_LEGEND))
    return "\n".join(out)


def model_notes(compiled, rows) -> list[str]:
    """What loading and quantization did to the model that its rows do not show."""
    notes = list(compiled.model.notes) + list(compiled.lowered.policy_unmatched)
    norms = sum(1 for m in compiled.model.module.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm))
    shown = sum(1 for r in rows if "batch_norm" in r.op)
    if norms > shown:
        notes.append(f"{norms - shown} BatchNorm layer(s) were folded into the convolution or "
                     "linear layer before them during quantization, so they have no row")
    return notes


def io_hint(compiled, rows) -> str | None:
    """With float I/O: what `--io int8` would save (the quantize/dequantize rows at the
    program's inputs and outputs, and the fp32 I/O buffers), from the cost model."""
    if compiled.target.io != "float":
        return None
    program = compiled.final_program
    user_inputs = set(program.graph_signature.user_inputs)
    edge, buffer_bytes = set(), 0
    for node in program.graph.nodes:
        if node.op == "placeholder" and node.name in user_inputs and "val" in node.meta:
            users = [u for u in node.users if "quantize_per_tensor" in str(u.target)
                     and "dequantize" not in str(u.target)]
            if users:
                edge.update(u.meta.get(ORIGIN_KEY, u.name) for u in users)
                buffer_bytes += node.meta["val"].numel() * 3  # fp32 -> int8
        if node.op == "output":
            for value in node.args[0]:
                if getattr(value, "op", None) == "call_function" and \
                        "dequantize_per_tensor" in str(value.target):
                    edge.add(value.meta.get(ORIGIN_KEY, value.name))
                    buffer_bytes += value.meta["val"].numel() * 3 if "val" in value.meta else 0
    edge_rows = [r for r in rows if r.name in edge]
    if not edge_rows:
        return None
    seconds = sum(r.cost.seconds for r in edge_rows if r.cost is not None)
    return (f"--io int8 would remove the {len(edge_rows)} quantize/dequantize row(s) at the "
            f"program's inputs and outputs, about {seconds * 1e3:.3f} ms per inference at these "
            f"clocks (transition model), and up to {buffer_bytes:,} B of fp32 I/O buffers; the "
            "application then passes int8 tensors, quantized with the scale and zero point "
            "`compile --io int8` prints (--io auto compiles both and keeps the smaller arena)")


def render_markdown(compiled, rows, summary: Summary) -> str:
    out = [f"# orchestrate plan: {compiled.model.name} on {compiled.target.describe()}", ""]
    if compiled.calibration.warning:
        out += [f"> warning: {compiled.calibration.warning}", ""]
    out.append(_rows_table(rows, markdown=True, model=compiled.model))
    out += ["", "## Summary", ""]
    out += [f"- {line.strip()}" for line in _structure_lines(summary)
            + _summary_lines(compiled, summary)]
    ranges = activation_range_lines(summary)
    if ranges:
        out += ["", "## Activation ranges", "", ranges[0], "", "```", *ranges[1:], "```"]
    return "\n".join(out) + "\n"


def _cost_json(cost):
    return None if cost is None else cost.to_json()


def to_json(compiled, rows, summary: Summary) -> dict:
    document = _document(compiled, rows, summary)
    if summary.instructions is not None:  # only with a calibration: default plans unchanged
        document["summary"]["instructions"] = {
            "estimate": summary.instructions, "source": summary.instructions_source,
            "unit": "instructions retired (the unit of a QEMU profile): the CPU rows and the CPU's side of each NPU invocation"}
    if summary.activation_ranges is not None:  # only with calibration data given
        document["summary"]["activation_ranges"] = summary.activation_ranges.to_json()
    return document


def precision_line(rows, pairs, outputs=()) -> str:
    """The ops per precision, the requantizes, where they run, and each model output's width
    (`outputs`: int8, int16 where a raised module computes it, float) (--precision)."""
    counts: dict[str, int] = {}
    for row in rows:
        if row.kind == "op" and row.precision:
            counts[row.precision] = counts.get(row.precision, 0) + 1
    where: dict[str, int] = {}
    for row in rows:
        if row.kind == "requantize":
            place = f"NPU p{row.partition}" if row.placement == "npu" else "CPU"
            where[place] = where.get(place, 0) + 1
    given = ", ".join(f"{module}={precision}" for module, precision in pairs)
    return (f"precision ({given}): ops " + ", ".join(f"{p} {n}" for p, n in sorted(counts.items()))
            + "; int8<->int16 requantizes: "
            + (", ".join(f"{n} on {p}" for p, n in sorted(where.items())) or "none")
            + ("; model output " + ", ".join(f"{i}: {w}" for i, w in enumerate(outputs))
               if outputs else ""))


def _document(compiled, rows, summary: Summary) -> dict:
    return {
        "schema_version": SCHEMA_VERSION,
        "model": {"name": compiled.model.name, "source": compiled.model.source,
                  "kind": compiled.model.kind},
        "platform": compiled.target.to_json(),
        "calibration": {"source": compiled.calibration.source,
                        "generated": compiled.calibration.generated,
                        "warning": compiled.calibration.warning,
                        "method": compiled.calibration.method,
                        "precision": dict(compiled.calibration.precision)},
        "ops": [{
            "name": r.name, "op": r.op, "kind": r.kind, "placement": r.placement,
            "partition": r.partition, "kernel": r.kernel, "isa_tier": r.tier,
            "input_shapes": [list(s) for s in r.input_shapes], "output_shape": list(r.output_shape),
            "dtypes": r.dtypes, "macs": r.macs,
            "reasons": [{"key": x.key, "check": x.check, "message": x.message, "value": x.value,
                         "debug": x.debug} for x in r.reasons],
            "fused": list(r.fused), "cost": _cost_json(r.cost),
            "device_faults": [{"check": f.check, "message": f.message} for f in r.device_faults],
            "module": r.module, "module_type": r.module_type, "precision": r.precision,
            **({"io_bytes": r.io_bytes} if r.kind == "npu-invocation" else {}),
            **({found.pop("format").lower(): found}
               if (found := tflite_origin(compiled.model, r)) else {}),
        } for r in rows],
        "summary": {
            "ops": summary.ops, "macs": summary.macs,
            "npu_mac_coverage_pct": summary.npu_mac_coverage_pct,
            "modules": [dict(g.__dict__) for g in summary.modules],
            "memory_placement": None if summary.placement is None else {
                "policy": summary.placement.policy.to_json(),
                "image_region": summary.placement.image_region,
                "weights_region": summary.placement.weights_region,
                "weights_cycles_per_byte": summary.placement.weights_cycles_per_byte,
                "weights_read_source": summary.placement.weights_source,
                "arena_region": summary.placement.arena_region,
                "arena_cycles_per_byte": summary.placement.arena_cycles_per_byte,
                "arenas": [{**arena.to_json(), "cycles_per_byte": cost, "read_source": source}
                           for arena, cost, source in summary.placement.arenas],
                "weights_copied": summary.placement.weights_copied,
                "gain_cycles": summary.placement.gain_cycles,
                "gain_source": "cost model (model:memory)",
                "hottest": [list(h) for h in summary.placement.hottest]},
            "recurrences": [{**rec.__dict__, "text": rec.line()} for rec in summary.recurrences],
            "npu_partitions": summary.npu_partitions, "transitions": summary.transitions,
            "hidden_rows": summary.hidden_rows,
            "npu_utilisation": {f"p{k}": v for k, v in summary.npu_utilisation.items()},
            "npu_traffic_bytes": {f"p{k}": v for k, v in summary.npu_traffic.items()},
            "latency": None if summary.latency_seconds is None else {
                "seconds": summary.latency_seconds, "cpu_cycles": summary.latency_cycles_cpu,
                "source": summary.latency_source,
                "per_placement_seconds": summary.per_placement_seconds},
            "memory": {
                "arena_bytes": summary.arena_bytes, "arena_bytes_source": "planned",
                "arena_live_bytes_bound": arena_bound_bytes(compiled.arenas),
                "arena_live_bytes_bound_source": BOUND_SOURCE,
                "npu_scratch_bytes": summary.npu_scratch_bytes,
                "cmsis_scratch_bytes": summary.cmsis_scratch_bytes, "pte_bytes": summary.pte_bytes,
                "weight_bytes": summary.weight_bytes, "fits": summary.fits,
                "items": [{"item": m.item, "bytes": m.bytes, "source": m.source,
                           "region": m.region, "region_bytes": m.region_bytes, "fits": m.fits}
                          for m in summary.memory],
                "reserved": [{"region": region, "bytes": size, "source": source}
                             for region, (size, source) in
                             compiled.target.platform.reserved.items()],
                "state": state_json(compiled)},
            "io": {"type": compiled.target.io,
                   "auto": None if compiled.io_choice is None else compiled.io_choice.to_json()},
            "operators": list(summary.operators),
            "device_faults": list(summary.device_faults),
            "device_run": None if compiled.device_run is None else compiled.device_run.to_json(),
            "workarounds": [{"node": w.node, "upstream": w.upstream, "message": w.message}
                            for w in compiled.workarounds],
            "notes": model_notes(compiled, rows),
            "missing_operators": None if summary.missing_operators is None
            else list(summary.missing_operators),
        },
    }


def render_json(compiled, rows, summary: Summary) -> str:
    return json.dumps(to_json(compiled, rows, summary), indent=2)
