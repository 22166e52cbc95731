"""One self-contained HTML page per plan (and per sweep) that opens offline.

Drawn as inline SVG with a few lines of inline script for sorting: no network at view time and
no plotting library to vendor (the charts are bars on one time or configuration axis, which SVG
rects draw directly; a library would add hundreds of kilobytes to every report for that).

The page renders the plan's JSON (`Plan.to_json()`, plan.schema.json) and the platform's memory
regions; it computes nothing the plan does not state. Every figure keeps its source.
"""

from __future__ import annotations

import html

_COLOURS = {"npu": "#2e7d32", "cmsis-nn": "#1565c0", "portable": "#ef6c00"}
_HIDDEN = ("boundary-quantize", "boundary-dequantize", "layout", "npu-invocation")

_STYLE = """
body{font:14px system-ui,sans-serif;margin:24px;color:#222}
h1{font-size:20px}h2{font-size:16px;margin-top:28px}
table{border-collapse:collapse;font-size:12px}
th,td{border:1px solid #ccc;padding:3px 6px;text-align:left;vertical-align:top}
th{background:#f0f0f0;cursor:pointer;user-select:none}
td.num{text-align:right;font-variant-numeric:tabular-nums}
.legend span{display:inline-block;margin-right:14px}
.swatch{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:-2px}
.note{color:#555;font-size:12px}
"""

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
    bars = []
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
        bars.append(f"<rect class=\"bar\" data-row=\"{index}\" x=\"{x:.2f}\" y=\"{y}\" "
                    f"width=\"{w:.2f}\" height=\"{lane_h}\" fill=\"{colour}\" "
                    f"fill-opacity=\"{opacity}\" stroke=\"#fff\" stroke-width=\"0.5\">"
                    f"<title>{_e(tip)}</title></rect>")
        x += seconds * scale
    height = 20 + 2 * (lane_h + 8) + 24
    axis = (f"<text x=\"{left}\" y=\"{height - 6}\" font-size=\"11\">0</text>"
            f"<text x=\"{width - 10}\" y=\"{height - 6}\" font-size=\"11\" "
            f"text-anchor=\"end\">{_e(_us(total))} (sum of the rows' estimates)</text>")
    lanes = (f"<text x=\"4\" y=\"{20 + lane_h / 2 + 4}\" font-size=\"12\">NPU</text>"
             f"<text x=\"4\" y=\"{20 + lane_h + 8 + lane_h / 2 + 4}\" font-size=\"12\">CPU</text>")
    return (f"<svg id=\"timeline\" width=\"{width}\" height=\"{height}\" "
            f"xmlns=\"http://www.w3.org/2000/svg\" role=\"img\">{lanes}{''.join(bars)}{axis}</svg>")


def _op_table(ops: list[dict]) -> str:
    head = ["#", "node", "op", "kind", "where", "kernel", "out", "dtypes", "MACs", "cost (us)",
            "source", "reasons"]
    rows = []
    for index, op in enumerate(ops):
        cost = op["cost"] or {}
        seconds = cost.get("seconds")
        where = op["placement"] + (f" p{op['partition']}" if op["partition"] is not None else "")
        cells = [f"<td class=\"num\" data-value=\"{index}\">{index}</td>",
                 f"<td>{_e(op['name'])}</td>", f"<td>{_e(op['op'])}</td>",
                 f"<td>{_e(op['kind'])}</td>",
                 f"<td style=\"color:{_COLOURS.get(op['placement'], '#222')}\">{_e(where)}</td>",
                 f"<td>{_e(op['kernel'] or '')}</td>",
                 f"<td>{_e('x'.join(str(d) for d in op['output_shape']))}</td>",
                 f"<td>{_e(op['dtypes'])}</td>",
                 f"<td class=\"num\" data-value=\"{op['macs']}\">{op['macs']:,}</td>",
                 f"<td class=\"num\" data-value=\"{seconds or 0}\">"
                 f"{'-' if seconds is None else f'{seconds * 1e6:,.1f}'}</td>",
                 f"<td>{_e(cost.get('source', ''))}</td>", f"<td>{_e(_reason_text(op))}</td>"]
        rows.append(f"<tr>{''.join(cells)}</tr>")
    return (f"<table id=\"ops\" class=\"sortable\"><thead><tr>"
            f"{''.join(f'<th>{_e(h)}</th>' for h in head)}</tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table>")


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
    return (f"<svg id=\"memory\" width=\"{width + 420}\" height=\"{y}\" "
            f"xmlns=\"http://www.w3.org/2000/svg\">{''.join(parts)}</svg>{note}")


def render_plan_html(plan_json: dict, regions: list[dict], title: str | None = None) -> str:
    """`plan_json`: Plan.to_json(); `regions`: the platform's memories (name, size_bytes, kind)."""
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
    body = (head + "<h2>One inference</h2>" + _legend() + _timeline(plan_json["ops"])
            + "<p class=\"note\">Hover a bar for the op, its estimate and its source, and why it "
            "is not in a better place. Sources: vela = Vela's estimate, model:* = orchestrate's "
            "cost models.</p>"
            + "<h2>Memory</h2>" + _memory_map(summary["memory"], regions)
            + "<h2>Every op (click a column to sort)</h2>" + _op_table(plan_json["ops"]))
    return _page(title, body)


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
        return (f"<h2>{_e(label)}</h2><svg width=\"{width}\" height=\"{height}\" "
                f"xmlns=\"http://www.w3.org/2000/svg\">{''.join(parts)}</svg>")

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
