"""Files are data: hostile or damaged inputs end in one line and a clean exit, never run code,
crash the tool or change its output silently; the command line behaves under pipes and signals.

Each case here failed before its fix: a "billion laughs" platform YAML ran past 60 s at 3.7 GB,
a non-UTF-8 one was an internal error, a damaged cache entry was used silently, the CPU-only
cache never hit, `orchestrate size x | head -1` ended in BrokenPipeError, SIGTERM printed
nothing, and there was no `--version` or `list`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _cli(*argv: str, timeout: int = 300, env: dict | None = None,
         cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", *argv], cwd=cwd or ROOT,
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def _one_line(done: subprocess.CompletedProcess, code: int, *needles: str) -> None:
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == code, (done.returncode, done.stderr[-2000:])
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    for needle in needles:
        assert needle in lines[0], lines[0]


def _laughs(levels: int = 9, width: int = 10) -> str:
    text = "l0: &l0 [" + ", ".join(["lol"] * width) + "]\n"
    for level in range(1, levels):
        text += f"l{level}: &l{level} [" + ", ".join([f"*l{level - 1}"] * width) + "]\n"
    return text


@pytest.mark.parametrize("option", ["--platform", "--policy", "--calibration-costs"])
def test_a_billion_laughs_yaml_is_refused_at_once(tmp_path, option):
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(_laughs())
    start = time.perf_counter()
    done = _cli("plan", "ds-cnn", option, str(bomb), timeout=120)
    _one_line(done, 2, "bomb.yaml", "aliases")
    assert time.perf_counter() - start < 60


def test_a_non_utf8_platform_yaml_names_the_file(tmp_path):
    latin = tmp_path / "soc.yaml"
    latin.write_bytes("name: caf\xe9\n".encode("latin-1"))
    _one_line(_cli("plan", "ds-cnn", "--platform", str(latin)), 2, "soc.yaml", "not UTF-8")


def test_version_and_list():
    from importlib import metadata

    version = _cli("--version")
    assert version.returncode == 0 and metadata.version("orchestrate") in version.stdout
    assert "executorch 1.5.1" in version.stdout
    listing = _cli("list", "--format", "json")
    data = json.loads(listing.stdout)
    assert {"ds-cnn", "mixed"} <= {m["name"] for m in data["models"]}
    corstone300 = next(p for p in data["platforms"] if p["name"] == "corstone300")
    assert "ethos-u55-128" in corstone300["npus"] and corstone300["cpu"] == "cortex-m55"
    assert {"name": "cortex-m33", "tier": "dsp"} in data["cpus"]


def test_a_closed_pipe_ends_quietly():
    pipeline = subprocess.run(
        f"{sys.executable} -m orchestrator.cli list | head -1", shell=True, cwd=ROOT,
        capture_output=True, text=True, timeout=120, executable="/bin/bash",
        env={**os.environ, "PYTHONUNBUFFERED": "0"})
    assert pipeline.stdout.startswith("zoo models")
    assert "BrokenPipe" not in pipeline.stderr and "internal error" not in pipeline.stderr


def test_sigterm_stops_a_compile_and_leaves_nothing_behind(tmp_path):
    """SIGTERM mid-compile: exit 143, one line, no temporary or staging folder, and the earlier
    output untouched."""
    out = tmp_path / "m.pte"
    out.write_bytes(b"earlier output")
    private_tmp = tmp_path / "tmp"  # the compile's own TMPDIR: nothing else writes there
    private_tmp.mkdir()
    process = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "compile", "ds-cnn",
                                "-o", str(out), "--quiet"], cwd=ROOT, stderr=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True,
                               env={**os.environ, "ORCHESTRATE_CACHE": "off",
                                    "TMPDIR": str(private_tmp)})
    time.sleep(6)  # inside capture or quantization
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 143, err[-2000:]
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "terminated" in lines[0], err[-2000:]
    assert out.read_bytes() == b"earlier output"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".orchestrate-")]
    leftovers = [p.name for p in private_tmp.iterdir()]
    assert not leftovers, leftovers


def test_a_damaged_cache_entry_is_replaced_and_the_pte_is_unchanged(tmp_path, capsys,
                                                                   monkeypatch):
    """One flipped byte in a cached quantized program: discarded with a warning, recomputed,
    replaced; the .pte equals a clean compile's. The CPU-only entry is served on a rerun."""
    from orchestrator.artifacts import cache
    from orchestrator.compilation.pipeline import compile_model
    from orchestrator.sources.loader import load_calibration, load_model
    from orchestrator.target import resolve_target

    # The session's cache stays the session's: this test's own folder, restored after.
    monkeypatch.setenv("ORCHESTRATE_CACHE", str(tmp_path / "cache"))
    model = load_model("deep-autoencoder")
    calibration = load_calibration(None, model.example_inputs)
    target = resolve_target("corstone300", npu="none")
    clean = compile_model(model, calibration, target)
    assert not clean.cache_hit
    again = compile_model(model, calibration, target)
    assert again.cache_hit and again.pte_bytes == clean.pte_bytes  # CPU-only entries load
    (entry,) = (tmp_path / "cache" / "quantized").iterdir()
    damaged = entry / "quantized.pt2"
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0xFF
    damaged.write_bytes(bytes(data))
    capsys.readouterr()
    recomputed = compile_model(model, calibration, target)
    assert "cache entry" in capsys.readouterr().err
    assert not recomputed.cache_hit and recomputed.pte_bytes == clean.pte_bytes
    served = compile_model(model, calibration, target)
    assert served.cache_hit and served.pte_bytes == clean.pte_bytes  # the entry was replaced
    assert cache.cache_dir() == tmp_path / "cache"


def test_the_manifest_cannot_name_the_program_verify_runs(tmp_path, compiles):
    """A manifest pointing at another platform file is data: QEMU/FVP runs use the installed
    platform of that name (or --platform), and an unknown name is refused, not loaded."""
    import shutil

    from orchestrator.device_runs.qemu import installed_platform
    from orchestrator.errors import UserError

    target = {"platform": "corstone300", "platform_file": str(tmp_path / "evil" / "p.yaml")}
    assert installed_platform(target).source_file.parent.name == "corstone300"
    with pytest.raises(UserError, match="not an installed platform"):
        installed_platform({"platform": str(tmp_path / "evil.yaml")})
    _, pte = compiles.get("ds-cnn", "corstone300", "none", write=True)
    copy = tmp_path / pte.name
    shutil.copy2(pte, copy)
    shutil.copytree(pte.with_name(pte.stem + ".artifacts"), tmp_path / (pte.stem + ".artifacts"))
    manifest = tmp_path / (pte.stem + ".artifacts") / "manifest.json"
    data = json.loads(manifest.read_text())
    data["files"]["../outside.txt"] = "0" * 64
    manifest.write_text(json.dumps(data))
    _one_line(_cli("verify", str(copy), "--runtime", "twin"), 2, "outside its artifacts folder")


def test_every_option_says_what_it_does():
    """Every option of every command has help text (a newcomer reads --help, not the code)."""
    import argparse

    from orchestrator.cli import build_parser

    missing = []

    def walk(parser, path):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, f"{path} {name}")
            elif action.dest in ("help", "version"):
                continue
            elif not action.help:
                missing.append(f"{path} {'/'.join(action.option_strings) or action.dest}: no help")
            elif action.option_strings and action.nargs != 0 and not action.required \
                    and "default" not in action.help:
                # An option that takes a value says what happens without it.
                missing.append(f"{path} {'/'.join(action.option_strings)}: no default named")

    walk(build_parser(), "orchestrate")
    assert not missing, missing


def test_plan_help_shows_an_example():
    from orchestrator.cli import build_parser

    parser = build_parser()
    plan = parser._subparsers._group_actions[0].choices["plan"]
    text = plan.format_help()
    assert "examples:" in text and "orchestrate plan ds-cnn" in text
    assert "docs/plan.md" in text


def test_the_plan_format_follows_the_output_extension(tmp_path):
    from orchestrator.cli import _plan_format
    from orchestrator.errors import UserError

    assert _plan_format(None, str(tmp_path / "plan.html")) == "html"
    assert _plan_format(None, str(tmp_path / "plan.json")) == "json"
    assert _plan_format(None, None) == "table"
    assert _plan_format("markdown", str(tmp_path / "plan.txt")) == "markdown"
    with pytest.raises(UserError, match="names a html file but --format is json"):
        _plan_format("json", str(tmp_path / "plan.html"))
