"""The same inputs give the same .pte bytes whatever vector ISA the host's float kernels pick."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _compile(out: Path, env_overrides: dict) -> tuple[str, dict]:
    env = {**os.environ, **env_overrides, "ORCHESTRATE_CACHE": "off"}
    subprocess.run([sys.executable, "-m", "orchestrator.cli", "compile", "mixed", "--npu",
                    "ethos-u55-128", "-o", str(out), "--quiet"], cwd=ROOT, env=env, check=True,
                   capture_output=True, timeout=600)
    manifest = json.loads((out.with_name(out.stem + ".artifacts") / "manifest.json").read_text())
    return hashlib.sha256(out.read_bytes()).hexdigest(), manifest["host_numerics"]


def test_pte_bytes_do_not_depend_on_the_float_kernels_the_host_would_pick(tmp_path):
    # Unpinned, this machine's AVX-512 kernels and AVX2 (or SSE) ones calibrate `mixed` to
    # different scales, hence different bytes: the failure another machine saw. The pin in
    # orchestrator/numerics.py overrides what the environment asks for.
    native, numerics = _compile(tmp_path / "native.pte", {})
    capped, _ = _compile(tmp_path / "capped.pte", {"ATEN_CPU_CAPABILITY": "default",
                                                  "ONEDNN_MAX_CPU_ISA": "SSE41",
                                                  "MKL_CBWR": "AUTO"})
    assert native == capped
    assert numerics["reproducible"] is True and numerics["threads"] == 1
    if " avx2 " in Path("/proc/cpuinfo").read_text().replace("\n", " "):
        assert numerics["aten_cpu_capability"] == "AVX2"
