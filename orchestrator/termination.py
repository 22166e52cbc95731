"""SIGTERM and Ctrl-C on the command line: stop at once, remove what this run made, leave earlier
outputs as they were, one line, exit 143 (130 for Ctrl-C).

Python's own way, an exception raised from the signal handler, is not safe with torch loaded: the
handler runs at the next bytecode of whatever Python code is running, and when that code was
called from C++ that cannot pass an exception on (a destructor, a finalizer), the process aborts
(`terminate called after throwing an instance of 'python_error'`, SIGABRT) with nothing removed.
CI caught one such SIGTERM during a compile's capture. So the handler does the work itself and
ends the process without unwinding:

- the run's child processes (QEMU, Vela, compilers, the host runtime) get SIGTERM;
- the run's scratch folder goes: `install` points `tempfile` and the children's TMPDIR at a
  folder of this run, so every temporary file and folder the run or its tools make is inside;
- staging folders beside an output (`removed_on_stop`) go;
- the exit handlers run (work folders, open runtimes).

Publishing outputs (the renames that replace an earlier output) runs under `deferred()`: a signal
arriving there waits until the block has finished, so an output is either the earlier one or the
new one, never neither.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

_EXIT_CODES = {signal.SIGTERM: 143, signal.SIGINT: 130}
_CHILD_GRACE_SECONDS = 2.0


class _Run:
    command = ""
    staging: set[Path] = set()
    deferring = 0
    pending: int | None = None
    # The stderr the run started with: a stop may come while upstream's output is redirected
    # (quiet mode points fd 2 and sys.stderr elsewhere around noisy calls).
    stderr_fd: int | None = None


def install(command: str) -> None:
    """Make SIGTERM and SIGINT stop the `command` run as described above, and give the run its
    scratch folder (removed when the run ends, however it ends)."""
    _Run.command = command
    scratch = Path(tempfile.mkdtemp(prefix="orchestrate-run-"))
    tempfile.tempdir = str(scratch)
    os.environ["TMPDIR"] = str(scratch)
    atexit.register(shutil.rmtree, scratch, ignore_errors=True)
    try:
        _Run.stderr_fd = os.dup(2)
    except OSError:
        _Run.stderr_fd = None
    for signum in _EXIT_CODES:
        signal.signal(signum, _on_signal)


@contextmanager
def removed_on_stop(make: Callable[[], Path | str]) -> Iterator[Path]:
    """The path `make()` creates (a staging folder or file outside the scratch folder), removed
    if the run is stopped while the block runs; the block removes or publishes it otherwise.
    `make` runs with signals deferred, so no stop falls between creating and registering."""
    with deferred():
        path = Path(make())
        _Run.staging.add(path)
    try:
        yield path
    finally:
        _Run.staging.discard(path)


@contextmanager
def deferred() -> Iterator[None]:
    """A signal arriving inside the block stops the run when the block ends."""
    _Run.deferring += 1
    try:
        yield
    finally:
        _Run.deferring -= 1
        if _Run.deferring == 0 and _Run.pending is not None:
            _stop(_Run.pending, after_step=True)


def _on_signal(signum, frame) -> None:
    if _Run.deferring:
        _Run.pending = signum
        return
    _stop(signum)


def _stop(signum: int, after_step: bool = False) -> None:
    """`after_step`: the signal waited for a deferred step (a publish) to finish, so the outputs
    that step wrote are the new ones."""
    for signum_ in _EXIT_CODES:  # a second signal while stopping changes nothing
        signal.signal(signum_, signal.SIG_IGN)
    _end_children()
    for path in list(_Run.staging):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    atexit._run_exitfuncs()
    what = "terminated (SIGTERM)" if signum == signal.SIGTERM else "interrupted"
    outputs = ("outputs already being written finished first" if after_step
               else "earlier outputs left as they were")
    line = (f"orchestrate: {what}; `{_Run.command}` stopped, its temporary files removed and "
            f"{outputs}\n")
    try:
        if _Run.stderr_fd is not None:
            os.write(_Run.stderr_fd, line.encode())
        else:
            sys.stderr.write(line)
            sys.stderr.flush()
    except (OSError, ValueError):
        pass
    os._exit(_EXIT_CODES[signum])


def _end_children() -> None:
    """SIGTERM to every process this one started (and theirs), SIGKILL to what is left after a
    short grace. The tree is stopped first (SIGSTOP), walked again until it holds still, so a
    process that forks meanwhile cannot leave a child behind."""
    family: list[int] = []
    while True:
        found = [pid for pid in descendants(os.getpid()) if pid not in family]
        if not found:
            break
        for pid in found:
            _send(pid, signal.SIGSTOP)
        family += found
    for pid in family:
        _send(pid, signal.SIGTERM)
    for pid in family:
        _send(pid, signal.SIGCONT)
    deadline = time.monotonic() + _CHILD_GRACE_SECONDS
    while family and time.monotonic() < deadline:
        family = [pid for pid in family if _running(pid)]
        time.sleep(0.02)
    for pid in family:
        _send(pid, signal.SIGKILL)


def descendants(pid: int) -> list[int]:
    """The processes below `pid`, parents before children, from /proc (none where there is no
    /proc)."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            stat = Path("/proc", entry, "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 1 and fields[1].isdigit():
            children.setdefault(int(fields[1]), []).append(int(entry))
    found, queue = [], list(children.get(pid, []))
    while queue:
        child = queue.pop(0)
        found.append(child)
        queue.extend(children.get(child, []))
    return found


def _running(pid: int) -> bool:
    try:
        state = Path("/proc", str(pid), "stat").read_text().rsplit(")", 1)[-1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _send(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except OSError:
        pass
