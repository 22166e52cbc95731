"""SIGTERM and Ctrl-C stop the command-line run without unwinding (orchestrator/termination.py).

The handler used to raise an exception where the process was; CI caught a SIGTERM that arrived
in Python code torch had called from C++ that cannot pass an exception on, and the process
aborted (`terminate called after throwing an instance of 'python_error'`, exit -6) with its
temporary folders left behind. These tests hold what the handler does instead, on a small
process with no torch: its children end, its scratch and staging folders go, a publish in
progress completes, one line, the exit code. `test_files_are_data.py` holds the same on a real
compile.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_SCRIPT = textwrap.dedent("""
    import os, signal, subprocess, sys, tempfile, time
    from pathlib import Path
    from orchestrator import termination

    folder, mode, sig = Path(sys.argv[1]), sys.argv[2], getattr(signal, sys.argv[3])
    termination.install("demo")
    child = subprocess.Popen(["sleep", "60"])
    grandchild = subprocess.Popen(["sh", "-c", "sleep 60 & wait"])
    (folder / "pids").write_text(f"{child.pid} {grandchild.pid}")
    while len(termination.descendants(os.getpid())) < 3:  # sh has started its sleep
        time.sleep(0.01)
    scratch = Path(tempfile.mkdtemp())
    (scratch / "half-written").write_text("x")
    (folder / "scratch").write_text(str(scratch))
    if mode == "staging":
        with termination.removed_on_stop(
                lambda: tempfile.mkdtemp(dir=folder, prefix=".stage-")) as staging:
            (staging / "half").write_text("half")
            # the stop can come while a noisy upstream call's stderr is redirected (the
            # compile's capture does): its line still reaches the run's stderr
            import contextlib, io
            with contextlib.redirect_stderr(io.StringIO()):
                os.kill(os.getpid(), sig)
                time.sleep(30)
    else:  # a publish in progress
        with termination.deferred():
            os.kill(os.getpid(), sig)
            time.sleep(0.3)
            (folder / "out.pte").write_text("new")
        time.sleep(30)
    print("not stopped")
""")


def _stopped(tmp_path: Path, mode: str, signame: str) -> subprocess.CompletedProcess:
    private_tmp = tmp_path / "tmp"
    private_tmp.mkdir()
    (tmp_path / "out.pte").write_text("earlier")
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-c", _SCRIPT, str(tmp_path), mode, signame],
                            cwd=ROOT, capture_output=True, text=True, timeout=60,
                            env={**os.environ, "TMPDIR": str(private_tmp)})
    assert time.monotonic() - started < 20, "the stop waited for the sleeps"
    assert "not stopped" not in result.stdout
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "`demo` stopped" in lines[0], result.stderr
    scratch = Path((tmp_path / "scratch").read_text())
    assert scratch.is_relative_to(private_tmp) and not scratch.exists()
    assert not list(private_tmp.iterdir()), "the run's scratch folder is left"
    time.sleep(0.2)
    for pid in map(int, (tmp_path / "pids").read_text().split()):
        assert not _alive(pid), f"child {pid} still runs"
    return result


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_sigterm_removes_staging_and_scratch_and_ends_the_children(tmp_path):
    result = _stopped(tmp_path, "staging", "SIGTERM")
    assert result.returncode == 143
    assert "terminated (SIGTERM)" in result.stderr
    assert not list(tmp_path.glob(".stage-*")), "the staging folder is left"
    assert (tmp_path / "out.pte").read_text() == "earlier"


def test_ctrl_c_during_a_publish_lets_it_finish(tmp_path):
    result = _stopped(tmp_path, "publish", "SIGINT")
    assert result.returncode == 130
    assert "interrupted" in result.stderr
    assert "outputs already being written finished first" in result.stderr
    assert (tmp_path / "out.pte").read_text() == "new"


def test_grandchildren_are_found():
    from orchestrator.termination import descendants

    shell = subprocess.Popen(["sh", "-c", "sleep 30 & wait"])
    try:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not descendants(shell.pid):
            time.sleep(0.05)
        below_shell = descendants(shell.pid)
        family = descendants(os.getpid())
        assert len(below_shell) == 1, below_shell
        assert family.index(shell.pid) < family.index(below_shell[0]), family
    finally:
        for pid in descendants(shell.pid):
            os.kill(pid, 9)
        shell.wait()
