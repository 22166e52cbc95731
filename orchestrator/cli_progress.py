"""Which stage a long command is in, on stderr (the CLI's progress lines)."""

from __future__ import annotations

import sys
import time


class Progress:
    """Which stage a long command is in and for how long, on stderr: on a terminal one line
    rewritten in place; otherwise (a CI log, a redirect) one line per finished stage with the
    elapsed time, so a compile of minutes shows where it is."""

    def __init__(self, enabled: bool, terminal: bool = True):
        self.enabled, self.terminal = enabled, terminal
        self._clock = time.perf_counter
        self._start = self._clock()

    def __call__(self, stage: str, event: str, seconds: float) -> None:
        if not self.enabled:
            return
        elapsed = self._clock() - self._start
        if not self.terminal:
            if event != "start":
                sys.stderr.write(f"[{elapsed:6.1f}s] {stage} done ({seconds:.1f}s)\n")
                sys.stderr.flush()
            return
        if event == "start":
            sys.stderr.write(f"\r\x1b[K[{elapsed:6.1f}s] {stage} ...")
        else:
            sys.stderr.write(f"\r\x1b[K[{elapsed:6.1f}s] {stage} done ({seconds:.1f}s)")
        sys.stderr.flush()

    def finish(self) -> None:
        if self.enabled and self.terminal:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()


def progress_of(args) -> Progress:
    return Progress(not getattr(args, "quiet", False), sys.stderr.isatty())


class SweepProgress(Progress):
    """A line per finished configuration: "[  12.3s] 3/6 ds-cnn on ethos-u55-128"."""

    def __init__(self, total: int, enabled: bool, warning: str | None = None):
        super().__init__(enabled, sys.stderr.isatty())
        self.total, self.done, self.warning = total, 0, warning

    def __call__(self, label: str, event: str, seconds: float) -> None:
        if event == "checked" and self.warning:  # after the checks: a refusal prints alone
            print(self.warning, file=sys.stderr)
        if self.enabled and event == "done":
            self.done += 1
            sys.stderr.write(f"[{self._clock() - self._start:6.1f}s] {self.done}/{self.total} "
                             f"{label}\n")
            sys.stderr.flush()
