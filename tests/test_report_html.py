"""The HTML report: one self-contained page, checked as text and in a real headless browser."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.device_tools import missing


@pytest.fixture(scope="module")
def mixed_plan(compiles):
    from orchestrator.planning.planner import make_plan

    return make_plan(compiles.get("mixed", "corstone300", "ethos-u55-128")[0])


def _browser() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    return None


def _artifacts_dir(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("ORCHESTRATE_TEST_ARTIFACTS", tmp_path))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def test_the_page_is_self_contained_with_one_bar_per_plan_row(mixed_plan):
    page = mixed_plan.to_html()
    assert page.count('class="bar"') == len(mixed_plan.rows)
    # Offline: no external script, style, image or font.
    assert not re.search(r'(src|href)\s*=\s*"(https?:)?//', page)
    assert "<script src" not in page and "@import" not in page
    # Every bar's tooltip names its figure's source.
    tips = re.findall(r'<rect class="bar"[^>]*><title>([^<]*)</title>', page)
    assert len(tips) == len(mixed_plan.rows)
    assert all("(vela" in t or "(model:" in t or "no estimate" in t for t in tips)
    assert "arm_convolve_s8" in page and "stride (4, 4)" in page


def test_every_abbreviation_in_the_op_table_has_a_tooltip(mixed_plan):
    """A newcomer hovers "npu p1", "boundary-quantize" or "vela+model:transition" and reads what
    it means; the headers of the terse columns say what they hold."""
    page = mixed_plan.to_html()
    table = page[page.index('<table id="ops"'):]
    rows = re.findall(r"<tr><td class=\"num\".*?</tr>", table)
    assert len(rows) == len(mixed_plan.rows)
    for row, plan_row in zip(rows, mixed_plan.rows):
        where = re.search(r'title="([^"]*)">(npu p\d+|cmsis-nn|portable)</td>', row)
        assert where, row
        if plan_row.partition is not None:
            assert where[1] == f"inside NPU partition {plan_row.partition}"
        kind = re.search(rf'<td title="([^"]+)">{re.escape(plan_row.kind)}</td>', row)
        assert kind and kind[1] != plan_row.kind, row
        if plan_row.cost is not None:
            source = re.search(rf'<td title="([^"]+)">{re.escape(plan_row.cost.source)}</td>', row)
            assert source and ("Vela" in source[1] or "model" in source[1]), row
    for header in ("kind", "where", "dtypes", "cost (us)", "source"):
        assert re.search(rf'<th title="[^"]+">{re.escape(header)}</th>', table), header


def test_compile_writes_the_report_into_the_artifacts(compiles):
    _, pte = compiles.get("mixed", "corstone300", "ethos-u55-128", write=True)
    page = (pte.with_name(pte.stem + ".artifacts") / "report.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and 'id="timeline"' in page


def _dump_dom(browser: str, url: str) -> str:
    result = subprocess.run([browser, "--headless=new", "--no-sandbox", "--disable-gpu",
                             "--virtual-time-budget=2000", "--dump-dom", url],
                            capture_output=True, text=True, timeout=120)
    return result.stdout


def test_the_page_renders_in_a_headless_browser_without_errors(mixed_plan, tmp_path):
    browser = _browser()
    if browser is None:
        missing("no chromium on PATH (apt-get install chromium)")
    folder = _artifacts_dir(tmp_path)
    page = folder / "mixed_u55_plan.html"
    page.write_text(mixed_plan.to_html())
    dom = _dump_dom(browser, page.as_uri())
    body = re.search(r"<body([^>]*)>", dom).group(1)
    assert 'data-ready="1"' in body, dom[:500]
    assert f'data-bars="{len(mixed_plan.rows)}"' in body
    assert "data-errors" not in body
    # Sorting by the cost column (9), descending: the costliest row comes first.
    dom = _dump_dom(browser, page.as_uri() + "#sort=9")
    first = re.search(r'<tbody><tr><td class="num" data-value="(\d+)"', dom).group(1)
    costliest = max(range(len(mixed_plan.rows)),
                    key=lambda i: (mixed_plan.rows[i].cost.seconds if mixed_plan.rows[i].cost else 0))
    assert int(first) == costliest
    screenshot = folder / "mixed_u55_plan.png"
    subprocess.run([browser, "--headless=new", "--no-sandbox", "--disable-gpu",
                    "--window-size=1250,1000", f"--screenshot={screenshot}", page.as_uri()],
                   capture_output=True, timeout=120)
    assert screenshot.is_file() and screenshot.stat().st_size > 10_000


def test_the_page_fits_a_1366_pixel_window_and_the_timeline_has_an_axis(mixed_plan, tmp_path):
    """At 1366 x 768 no element is wider than the window (the op table wraps, the charts
    scale); the timeline has ticks with time labels and names its largest bars; the page has
    a print stylesheet."""
    browser = _browser()
    if browser is None:
        missing("no chromium on PATH (apt-get install chromium)")
    page = tmp_path / "plan.html"
    text = mixed_plan.to_html()
    page.write_text(text)
    result = subprocess.run([browser, "--headless=new", "--no-sandbox", "--disable-gpu",
                             "--window-size=1366,768", "--virtual-time-budget=2000",
                             "--dump-dom", page.as_uri()], capture_output=True, text=True,
                            timeout=120)
    body = re.search(r"<body([^>]*)>", result.stdout).group(1)
    assert 'data-ready="1"' in body, result.stdout[:500]
    assert 'data-overflow="0"' in body, body
    timeline = text.split('<svg id="timeline"', 1)[1].split("</svg>", 1)[0]
    assert timeline.count("<line ") >= 4 and re.search(r">\d+(\.\d+)? (us|ms)</text>", timeline)
    costliest = max(mixed_plan.rows, key=lambda r: r.cost.seconds if r.cost else 0)
    assert f'pointer-events="none">{costliest.name[:8]}' in timeline
    assert "@media print" in text


def test_the_sweep_page_plots_every_configuration():
    from orchestrator.reports.html import render_sweep_html

    rows = [{"npu": "ethos-u55-64", "cpu": "cortex-m55", "latency_seconds": 0.004,
             "pte_bytes": 40_000, "arena_bytes": 9_000, "npu_scratch_bytes": 1_000},
            {"npu": "none", "cpu": "cortex-m55", "latency_seconds": 0.02, "pte_bytes": 41_000,
             "arena_bytes": 20_000, "npu_scratch_bytes": 0}]
    page = render_sweep_html(rows, "sweep")
    assert page.count('class="bar"') == 3 * len(rows)  # latency, flash, RAM
    assert "4.000 ms" in page and "20,000 B" in page
