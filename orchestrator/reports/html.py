"""One self-contained HTML page per plan (and per sweep) that opens offline.

Drawn as inline SVG with a few lines of inline script for sorting: no network at view time and
no plotting library to vendor (the charts are bars on one time or configuration axis, which SVG
rects draw directly; a library would add hundreds of kilobytes to every report for that).

The page renders the plan's JSON (`Plan.to_json()`, plan.schema.json) and the platform's memory
regions; it computes nothing the plan does not state. Every figure keeps its source.
"""

from __future__ import annotations

import html
import math

from orchestrator.reports.layer_error_overlay import (SNR_BANDS, layer_tip, row_layers,
                                                      snr_colour, source_text)

_COLOURS = {"npu": "#2e7d32", "cmsis-nn": "#1565c0", "portable": "#ef6c00"}
_HIDDEN = ("boundary-quantize", "boundary-dequantize", "layout", "npu-invocation", "requantize")

_STYLE = """
body{font:14px system-ui,sans-serif;margin:24px;color:#222}
h1{font-size:20px}h2{font-size:16px;margin-top:28px}
table{border-collapse:collapse;font-size:12px;width:100%;table-layout:fixed}
th,td{border:1px solid #ccc;padding:3px 6px;text-align:left;vertical-align:top;
overflow-wrap:anywhere}
th{background:#f0f0f0;cursor:pointer;user-select:none}
td.num{text-align:right;font-variant-numeric:tabular-nums}
svg{display:block;width:100%;height:auto}
.legend span{display:inline-block;margin-right:14px}
.swatch{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:-2px}
.note{color:#555;font-size:12px}
@media print{body{margin:0;font-size:10px}table{font-size:8px}th{cursor:auto}
tr,svg{break-inside:avoid}a{color:inherit}}
"""
# The op table's column widths (percent of the page): the names and reasons get the room.
_OP_COLUMNS = (("#", 3), ("node", 12), ("op", 10), ("kind", 6), ("where", 6), ("kernel", 10),
               ("out", 6), ("dtypes", 9), ("MACs", 6), ("cost (us)", 5), ("source", 6),
               ("precision", 5), ("reasons", 16))
_OP_COLUMNS_WITH_SNR = (*_OP_COLUMNS[:-1], ("reasons", 11), ("SNR (dB)", 5))

# What each column, kind, placement and source means: the headers' and cells' tooltips, and the
# legend under the op table (the text report's legend says the same).
_COLUMN_TIPS = {
    "kind": "op = an op of your model; the others are work the compile added (hover a cell)",
    "precision": "a8w8 = int8 activations and weights; a16w8 = int16 activations, int8 weights "
                 "(--precision); float = a portable kernel between a dequantize and a quantize",
    "where": "npu pN = inside NPU partition N; cmsis-nn = CMSIS-NN kernel on the CPU; portable = "
             "ExecuTorch's portable kernel on the CPU",
    "dtypes": "the dtype of each input, then the output's (as the engine computes them: an NPU "
              "op's in the Q dtypes)",
    "cost (us)": "estimated time per inference at the plan's clocks; 0 for an NPU op Vela fused "
                 "into the layer before it",
    "source": "where the cost comes from",
    "SNR (dB)": "measured (verify --per-layer-error): the final output's SNR with only this op's "
                "layer quantized; hover a cell for the layer's figures",
}
_KIND_TIPS = {
    "op": "an op of your model",
    "boundary-quantize": "(edge) quantize: a float value (model input or a float CPU result) "
                         "meets an int8 consumer",
    "boundary-dequantize": "(edge) dequantize: int8 back to float for the model output or a "
                           "float CPU consumer",
    "layout": "a dim-order copy the compile inserted so a kernel reads the layout it assumes",
    "npu-invocation": "the EthosUBackend call that runs the partition (start-up and copies)",
    "requantize": "where an int8 value meets an int16 consumer or back (--precision): a RESCALE "
                  "inside an NPU partition, a dequantize and a quantize on the CPU",
}
_SOURCE_TIPS = {
    "vela": "Vela's estimate (its per-layer cycles; the partition's total on the invocation row)",
    "model:transition": "orchestrate's transition model (CPU<->NPU hand-over, quantize/dequantize)",
    "model:portable": "orchestrate's portable-kernel cost model",
    "model:mve": "orchestrate's CMSIS-NN cost model, MVE tier",
    "model:dsp": "orchestrate's CMSIS-NN cost model, DSP tier",
    "model:scalar": "orchestrate's CMSIS-NN cost model, scalar tier",
    "model:memory": "reads at the placed region's speed (platform YAML cpu_read)",
    "measured": "measured",
}


def _source_tip(source: str) -> str:
    return "; ".join(_SOURCE_TIPS.get(part, part) for part in source.split("+"))


_SCRIPT = r"""
window.addEventListener('error', function (e) {
  document.body.dataset.errors = (document.body.dataset.errors || '') + e.message + ';';
});
document.querySelectorAll('table.sortable').forEach(function (table) {
  table.querySelectorAll('th').forEach(function (th, col) {
    th.addEventListener('click', function () {
      var body = table.tBodies[0];
      var rows = Array.prototype.slice.call(body.rows);
      var asc = th.dataset.order !== 'asc';
      rows.sort(function (a, b) {
        var x = a.cells[col].dataset.value || a.cells[col].textContent;
        var y = b.cells[col].dataset.value || b.cells[col].textContent;
        var nx = parseFloat(x), ny = parseFloat(y);
        var c = (!isNaN(nx) && !isNaN(ny)) ? nx - ny : x.localeCompare(y);
        return asc ? c : -c;
      });
      rows.forEach(function (r) { body.appendChild(r); });
      th.dataset.order = asc ? 'asc' : 'desc';
    });
  });
});
var sortBy = /^#sort=(\d+)$/.exec(location.hash);
if (sortBy) {
  var th = document.querySelectorAll('table.sortable th')[parseInt(sortBy[1], 10)];
  if (th) { th.click(); th.click(); }  // descending
}
document.body.dataset.bars = document.querySelectorAll('svg .bar').length;
// What is wider than the window (the browser test reads it at 1366 x 768).
var limit = document.documentElement.clientWidth + 1;
document.body.dataset.overflow = Array.prototype.filter.call(
  document.body.querySelectorAll('*'), function (el) {
    return el.getBoundingClientRect().right > limit;
  }).length;
document.body.dataset.ready = '1';
"""


def _e(value) -> str:
    return html.escape(str(value), quote=True)


def _us(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e6:,.1f} us"


def _page(title: str, body: str) -> str:
    return (f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{_e(title)}</title><style>{_STYLE}</style></head><body>{body}"
            f"<script>{_SCRIPT}</script></body></html>\n")


def _legend() -> str:
    items = "".join(f"<span><i class=\"swatch\" style=\"background:{c}\"></i>{_e(p)}</span>"
                    for p, c in _COLOURS.items())
    return (f"<p class=\"legend\">{items}<span>lighter: hidden work (boundary quantize/"
            "dequantize, layout copy, NPU invocation)</span></p>")


def _reason_text(op: dict) -> str:
    labels = ("not NPU", "not CMSIS-NN")
    parts = [f"{labels[min(i, 1)]}: {r['message']}" + (f" [{r['value']}]" if r.get("value") else "")
             for i, r in enumerate(op["reasons"])]
    parts += [f"device fault: {f['message']}" for f in op.get("device_faults", [])]
    return "; ".join(parts)


def _timeline(ops: list[dict]) -> str:
    """One inference: every plan row a bar of its estimated time, CPU and NPU lanes."""
    width, lane_h, left = 1100, 34, 60
    total = sum((op["cost"] or {}).get("seconds", 0.0) or 0.0 for op in ops) or 1e-9
    scale = (width - left - 10) / total
    x = float(left)
    bars, spans = [], []
    for index, op in enumerate(ops):
        cost = op["cost"] or {}
        seconds = cost.get("seconds") or 0.0
        w = max(seconds * scale, 1.0)
        lane = 0 if op["placement"] == "npu" else 1
        y = 20 + lane * (lane_h + 8)
        colour = _COLOURS.get(op["placement"], "#777")
        opacity = "0.45" if op["kind"] in _HIDDEN else "0.95"
        tip = (f"#{index} {op['name']} ({op['op']}): {op['placement']}"
               f"{' p' + str(op['partition']) if op['partition'] is not None else ''}, "
               f"{_us(seconds)} ({cost.get('source', 'no estimate')})")
        reason = _reason_text(op)
        if reason:
            tip += f"\n{reason}"
        spans.append((x, y, w, op["name"]))
        bars.append(f"<rect class=\"bar\" data-row=\"{index}\" x=\"{x:.2f}\" y=\"{y}\" "
                    f"width=\"{w:.2f}\" height=\"{lane_h}\" fill=\"{colour}\" "
                    f"fill-opacity=\"{opacity}\" stroke=\"#fff\" stroke-width=\"0.5\">"
                    f"<title>{_e(tip)}</title></rect>")
        x += seconds * scale
    height = 20 + 2 * (lane_h + 8) + 40
    axis_y = 20 + 2 * (lane_h + 8) + 2
    step = _tick_step(total)
    ticks = []
    value = 0.0
    while value <= total * 1.0001:
        tx = left + value * scale
        ticks.append(f"<line x1=\"{tx:.2f}\" y1=\"{axis_y}\" x2=\"{tx:.2f}\" "
                     f"y2=\"{axis_y + 5}\" stroke=\"#555\"/><text x=\"{tx:.2f}\" "
                     f"y=\"{axis_y + 17}\" font-size=\"10\" text-anchor=\"middle\">"
                     f"{_e(_time_label(value))}</text>")
        value += step
    axis = (f"<line x1=\"{left}\" y1=\"{axis_y}\" x2=\"{width - 10}\" y2=\"{axis_y}\" "
            f"stroke=\"#555\"/>{''.join(ticks)}"
            f"<text x=\"{width - 10}\" y=\"{height - 2}\" font-size=\"11\" "
            f"text-anchor=\"end\">time in one inference: {_e(_us(total))} (sum of the rows' "
            "estimates)</text>")
    labels = []
    for x0, y0, w, name in sorted(spans, key=lambda s: -s[2])[:5]:
        if w >= 60:  # room for a label inside the bar
            labels.append(f"<text x=\"{x0 + 3:.2f}\" y=\"{y0 + lane_h / 2 + 4}\" "
                          f"font-size=\"10\" fill=\"#fff\" pointer-events=\"none\">"
                          f"{_e(name[:int(w / 6)])}</text>")
    axis += "".join(labels)
    lanes = (f"<text x=\"4\" y=\"{20 + lane_h / 2 + 4}\" font-size=\"12\">NPU</text>"
             f"<text x=\"4\" y=\"{20 + lane_h + 8 + lane_h / 2 + 4}\" font-size=\"12\">CPU</text>")
    return (f"<svg id=\"timeline\" viewBox=\"0 0 {width} {height}\" "
            f"style=\"max-width:{width}px\" xmlns=\"http://www.w3.org/2000/svg\" "
            f"role=\"img\">{lanes}{''.join(bars)}{axis}</svg>")


def _tick_step(total: float) -> float:
    """A round step (1, 2 or 5 x 10^k seconds) giving four to ten ticks over `total`."""
    if total <= 0:
        return 1.0
    raw = total / 6
    power = 10 ** math.floor(math.log10(raw))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= raw)


def _time_label(seconds: float) -> str:
    if seconds == 0:
        return "0"
    return f"{seconds * 1e3:g} ms" if seconds >= 1e-3 else f"{seconds * 1e6:g} us"


def _op_table(ops: list[dict], layer_error: dict | None = None) -> str:
    """The sortable op table; with a per-layer error report, one more column: the SNR of the
    layer each op belongs to, in its band's colour."""
    columns_shown = _OP_COLUMNS if layer_error is None else _OP_COLUMNS_WITH_SNR
    head = [name for name, _ in columns_shown]
    layers = row_layers(ops, layer_error) if layer_error is not None else {}
    rows = []
    for index, op in enumerate(ops):
        cost = op["cost"] or {}
        seconds = cost.get("seconds")
        where = op["placement"] + (f" p{op['partition']}" if op["partition"] is not None else "")
        where_tip = (f"inside NPU partition {op['partition']}" if op["partition"] is not None
                     else _COLUMN_TIPS["where"])
        cells = [f"<td class=\"num\" data-value=\"{index}\">{index}</td>",
                 f"<td>{_e(op['name'])}</td>", f"<td>{_e(op['op'])}</td>",
                 f"<td title=\"{_e(_KIND_TIPS.get(op['kind'], op['kind']))}\">"
                 f"{_e(op['kind'])}</td>",
                 f"<td style=\"color:{_COLOURS.get(op['placement'], '#222')}\" "
                 f"title=\"{_e(where_tip)}\">{_e(where)}</td>",
                 f"<td>{_e(op['kernel'] or '')}</td>",
                 f"<td>{_e('x'.join(str(d) for d in op['output_shape']))}</td>",
                 f"<td>{_e(op['dtypes'])}</td>",
                 f"<td class=\"num\" data-value=\"{op['macs']}\">{op['macs']:,}</td>",
                 f"<td class=\"num\" data-value=\"{seconds or 0}\">"
                 f"{'-' if seconds is None else f'{seconds * 1e6:,.1f}'}</td>",
                 f"<td title=\"{_e(_source_tip(cost.get('source', '')))}\">"
                 f"{_e(cost.get('source', ''))}</td>", f"<td>{_e(op.get('precision') or '')}</td>",
                 f"<td>{_e(_reason_text(op))}</td>"]
        if layer_error is not None:
            cells.append(_snr_cell(layers.get(index)))
        rows.append(f"<tr>{''.join(cells)}</tr>")
    columns = "".join(f"<col style=\"width:{share}%\">" for _, share in columns_shown)
    return (f"<table id=\"ops\" class=\"sortable\"><colgroup>{columns}</colgroup><thead><tr>"
            f"{''.join(_header(h) for h in head)}</tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table>"
            "<p class=\"note\">Hover a header or a cell for what it means. "
            + "; ".join(f"{_e(kind)}: {_e(tip)}" for kind, tip in _KIND_TIPS.items()
                        if kind != "op") + ".</p>")


def _snr_cell(layer: dict | None) -> str:
    if layer is None:
        return ("<td class=\"num\" data-value=\"\" title=\"no layer of its own (hidden work, "
                "or an op of the model's forward with no module)\">-</td>")
    snr = layer["alone_snr_db"]
    text = "exact" if snr is None else f"{snr:.1f}"
    return (f"<td class=\"num snr\" data-value=\"{'' if snr is None else f'{snr:.3f}'}\" "
            f"style=\"background:{snr_colour(snr)};color:#fff\" title=\"{_e(layer_tip(layer))}\">"
            f"{_e(text)}</td>")


def _snr_legend(layer_error: dict) -> str:
    items = "".join(f"<span><i class=\"swatch\" style=\"background:{colour}\"></i>"
                    f"{_e(label)}</span>" for _, colour, label in SNR_BANDS)
    return (f"<p class=\"legend\" id=\"snr-legend\">SNR of the final output with only the "
            f"op's layer quantized: {items}</p><p class=\"note\">{_e(source_text(layer_error))}"
            "</p>")


def _layer_table(layer_error: dict) -> str:
    """The per-layer report, worst first, each layer in its band's colour."""
    rows = []
    for rank, layer in enumerate(layer_error["layers"], 1):
        snr, at = layer["alone_snr_db"], layer["at_output_snr_db"]
        rows.append(
            f"<tr><td class=\"num\">{rank}</td><td>{_e(layer['where'])}</td>"
            f"<td class=\"num\" data-value=\"{layer['clipped']}\">{layer['clipped']:.2%}</td>"
            f"<td class=\"num\" data-value=\"{at if at is not None else ''}\">"
            f"{'-' if at is None else f'{at:.1f}'}</td>"
            f"<td class=\"num snr\" data-value=\"{snr if snr is not None else ''}\" "
            f"style=\"background:{snr_colour(snr)};color:#fff\">"
            f"{'exact' if snr is None else f'{snr:.1f}'}</td>"
            f"<td class=\"num\" data-value=\"{layer['share_of_error']}\">"
            f"{layer['share_of_error']:.1%}</td></tr>")
    head = "".join(f"<th>{_e(h)}</th>" for h in (
        "#", "layer", "clipped", "SNR at output (dB)", "SNR alone (dB)", "share of error"))
    return (f"<table id=\"layers\" class=\"sortable\"><thead><tr>{head}</tr></thead><tbody>"
            f"{''.join(rows)}</tbody></table><p class=\"note\">clipped: the float values at the "
            "layer's output outside the int8 range of its scale and zero point; SNR at output: "
            "the quantized reference against the float model there; SNR alone: the final output "
            "with only this layer quantized (its output and its weights); share: of the whole "
            "program's output error power.</p>")


def _header(name: str) -> str:
    tip = _COLUMN_TIPS.get(name)
    return f"<th title=\"{_e(tip)}\">{_e(name)}</th>" if tip else f"<th>{_e(name)}</th>"


def _memory_map(memory: dict, regions: list[dict]) -> str:
    """Each region of the platform, what the plan placed in it, and what is left."""
    width, bar_h = 700, 22
    parts, y = [], 10
    for region in regions:
        size = region["size_bytes"] or 1
        placed = [m for m in memory["items"] if m["region"] == region["name"] and m["fits"]]
        x = 160.0
        parts.append(f"<text x=\"4\" y=\"{y + 15}\" font-size=\"12\">{_e(region['name'])} "
                     f"({size:,} B)</text>")
        for item in placed:
            w = max(item["bytes"] / size * (width - 170), 1.0)
            parts.append(f"<rect class=\"mem\" x=\"{x:.2f}\" y=\"{y}\" width=\"{w:.2f}\" "
                         f"height=\"{bar_h}\" fill=\"#6a1b9a\" fill-opacity=\"0.7\">"
                         f"<title>{_e(item['item'])}: {item['bytes']:,} B "
                         f"({_e(item['source'])})</title></rect>")
            x += w
        used = sum(m["bytes"] for m in placed)
        parts.append(f"<rect x=\"{x:.2f}\" y=\"{y}\" width=\"{max(width - 10 - x, 0):.2f}\" "
                     f"height=\"{bar_h}\" fill=\"#eee\"><title>free: {size - used:,} B"
                     f"</title></rect>")
        label = ", ".join(f"{m['item'].split(' (')[0]} {m['bytes']:,} B" for m in placed)
        parts.append(f"<text x=\"{width + 4}\" y=\"{y + 15}\" font-size=\"11\">"
                     f"{_e(label or 'empty')}; free {size - used:,} B</text>")
        y += bar_h + 10
    misfits = [m for m in memory["items"] if not m["fits"]]
    note = "".join(f"<p class=\"note\">does not fit: {_e(m['item'])} ({m['bytes']:,} B)</p>"
                   for m in misfits)
    return (f"<svg id=\"memory\" viewBox=\"0 0 {width + 420} {y}\" "
            f"style=\"max-width:{width + 420}px\" xmlns=\"http://www.w3.org/2000/svg\">"
            f"{''.join(parts)}</svg>{note}")


def _arena_note(memory: dict) -> str:
    """The arena as planned beside its lower bound from the tensors' lifetimes."""
    bound = memory.get("arena_live_bytes_bound")
    if bound is None:
        return ""
    return (f"<p class=\"note\">arena {memory['arena_bytes']:,} B "
            f"({_e(memory.get('arena_bytes_source') or 'planned')}); {bound:,} B "
            f"{_e(memory.get('arena_live_bytes_bound_source') or '')}</p>")


def render_plan_html(plan_json: dict, regions: list[dict], title: str | None = None,
                     layer_error: dict | None = None) -> str:
    """`plan_json`: Plan.to_json(); `regions`: the platform's memories (name, size_bytes, kind);
    `layer_error`: a per-layer error report (LayerErrorReport.to_json()) to colour the ops by."""
    summary = plan_json["summary"]
    latency = summary.get("latency") or {}
    platform = plan_json["platform"]
    title = title or f"orchestrate plan: {plan_json['model']['name']}"
    head = (f"<h1>{_e(title)}</h1><p>{_e(platform['platform'])}: {_e(platform['cpu'])} "
            f"({_e(platform['isa_tier'])}) + {_e(platform['npu'] or 'no NPU')}, io "
            f"{_e(platform['io'])}. NPU MAC coverage {summary['npu_mac_coverage_pct']:.1f}%, "
            f"{summary['npu_partitions']} NPU partition(s); estimated latency "
            f"{_e(_us(latency.get('seconds')))} ({_e(latency.get('source') or '-')}); nothing "
            "here is measured.</p>")
    if plan_json["calibration"].get("warning"):
        head += f"<p class=\"note\">{_e(plan_json['calibration']['warning'])}</p>"
    if layer_error is not None:
        head += _snr_legend(layer_error)
    # After the op table, the first sortable one (the `#sort=N` hook counts its columns).
    tail = ""
    if layer_error is not None:
        tail += ("<h2>Per-layer quantization error</h2>" + _snr_legend(layer_error)
                 + _layer_table(layer_error))
    ranges = summary.get("activation_ranges")
    if ranges:
        tail += "<h2>Activation ranges</h2>" + _ranges_table(ranges)
    body = (head + "<h2>One inference</h2>" + _legend() + _timeline(plan_json["ops"])
            + "<p class=\"note\">Hover a bar for the op, its estimate and its source, and why it "
            "is not in a better place. Sources: vela = Vela's estimate, model:* = orchestrate's "
            "cost models.</p>"
            + "<h2>Memory</h2>" + _memory_map(summary["memory"], regions)
            + _arena_note(summary["memory"])
            + "<h2>Every op (click a column to sort)</h2>"
            + _op_table(plan_json["ops"], layer_error) + tail)
    return _page(title, body)


def _ranges_table(ranges: dict) -> str:
    """Each activation quantization point's scale and clipping rate on the calibration data."""
    rows = []
    for point in ranges["points"]:
        low, high = point["int8_range"]
        rate = point["clipping_rate"]
        seen = "-" if point.get("min") is None else f"{point['min']:.4g} .. {point['max']:.4g}"
        rows.append(f"<tr><td>{_e(point['where'])}</td>"
                    f"<td class=\"num\" data-value=\"{point['scale']}\">{point['scale']:.4g}</td>"
                    f"<td class=\"num\">{point['zero_point']}</td>"
                    f"<td class=\"num\">{low:.4g} .. {high:.4g}</td><td class=\"num\">{seen}</td>"
                    f"<td class=\"num\" data-value=\"{rate if rate is not None else ''}\">"
                    f"{'-' if rate is None else f'{rate:.2%}'}</td></tr>")
    head = "".join(f"<th>{_e(h)}</th>" for h in ("layer", "scale", "zero point", "int8 covers",
                                                  "calibration values", "clipped"))
    return (f"<p class=\"note\">{_e(ranges['method'])} calibration on {ranges['samples']} "
            f"sample(s) ({_e(ranges['source'])}): each value the program rounds to int8 and the "
            "share of the calibration values outside the range its scale and zero point cover."
            f"</p><table id=\"ranges\" class=\"sortable\"><thead><tr>{head}</tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table>")


def render_sweep_html(rows: list[dict], title: str) -> str:
    """`rows`: orchestrator.sweeps.local.to_json rows: latency, flash and RAM per configuration."""
    width, bar_w, gap, height = 900, 46, 22, 180

    def chart(key: str, label: str, fmt) -> str:
        values = [r.get(key) or 0 for r in rows]
        top = max(values) or 1
        parts = []
        for i, (row, value) in enumerate(zip(rows, values)):
            x = 60 + i * (bar_w + gap)
            h = value / top * (height - 50)
            parts.append(f"<rect class=\"bar\" x=\"{x}\" y=\"{height - 30 - h:.2f}\" "
                         f"width=\"{bar_w}\" height=\"{max(h, 1):.2f}\" fill=\"#1565c0\">"
                         f"<title>{_e(row['npu'])}: {_e(fmt(value))}</title></rect>"
                         f"<text x=\"{x + bar_w / 2}\" y=\"{height - 14}\" font-size=\"10\" "
                         f"text-anchor=\"middle\">{_e(row['npu'].replace('ethos-', ''))}</text>"
                         f"<text x=\"{x + bar_w / 2}\" y=\"{height - 34 - h:.2f}\" "
                         f"font-size=\"10\" text-anchor=\"middle\">{_e(fmt(value))}</text>")
        return (f"<h2>{_e(label)}</h2><svg viewBox=\"0 0 {width} {height}\" "
                f"style=\"max-width:{width}px\" xmlns=\"http://www.w3.org/2000/svg\">"
                f"{''.join(parts)}</svg>")

    for row in rows:
        row.setdefault("ram_bytes", (row.get("arena_bytes") or 0) + (row.get("npu_scratch_bytes") or 0))
    body = (f"<h1>{_e(title)}</h1><p class=\"note\">Latency: the plan's estimate per configuration "
            "(sources in the table); flash: .pte bytes; RAM: ExecuTorch arena + the largest NPU "
            "scratch (Vela).</p>"
            + chart("latency_seconds", "Estimated latency", lambda v: f"{v * 1e3:.3f} ms")
            + chart("pte_bytes", "Flash (.pte bytes)", lambda v: f"{int(v):,} B")
            + chart("ram_bytes", "RAM (arena + NPU scratch)", lambda v: f"{int(v):,} B")
            + "<h2>Configurations</h2><table class=\"sortable\"><thead><tr>"
            + "".join(f"<th>{_e(k)}</th>" for k in rows[0]) + "</tr></thead><tbody>"
            + "".join("<tr>" + "".join(f"<td data-value=\"{_e(v)}\">{_e(v)}</td>"
                                       for v in r.values()) + "</tr>" for r in rows)
            + "</tbody></table>")
    return _page(title, body)


def platform_regions(platform) -> list[dict]:
    return [{"name": r.name, "size_bytes": r.size_bytes, "kind": r.kind} for r in platform.memories]


def plan_html(plan) -> str:
    return render_plan_html(plan.to_json(), platform_regions(plan.compiled.target.platform))
