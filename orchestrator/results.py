"""What the API's verbs return beyond a Plan: typed values the CLI prints and a script reads.

Each value holds what was found; its text and JSON views are its own methods (as a Plan's
`to_text`/`to_json`), so the CLI prints them and a script reads the fields. Errors a verdict
implies (`Verification.error`) are returned, not raised: the caller prints first, then exits.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.errors import NotRun, OrchestrateError, VerificationFailure

if TYPE_CHECKING:  # verification and firmware import torch: named here for the types only
    from orchestrator.device_runs.combined import CombinedVerdict
    from orchestrator.firmware.footprint import Footprint
    from orchestrator.verification.methods import MethodResult

# `verify_all(method=...)`: the CLI's --runtime choices, --qemu and --fvp.
VERIFY_METHODS = ("auto", "twin", "executorch", "both", "qemu", "fvp")
_PICKED_BY_NAME = ("qemu", "fvp")  # asked for by name: not running is the user's answer


@dataclass(frozen=True)
class ProfileRun:
    """`verify --qemu --profile`: the ETDump written and what it says, line by line."""

    path: Path
    lines: tuple[str, ...]


@dataclass(frozen=True)
class Verification:
    """The methods `verify_all` ran on a `.pte` and their verdict.

    `method` "auto" asks every method this machine has and `combined` is their one verdict;
    otherwise `results` are the methods named, in order, stopping at the first that could not
    run or could not check in full."""

    pte: Path
    method: str
    results: tuple["MethodResult", ...]
    combined: "CombinedVerdict | None" = None
    profile: ProfileRun | None = None

    @property
    def passed(self) -> bool:
        """Nothing failed and every method asked for ran in full (exit 0)."""
        return self.error() is None

    @property
    def verdict(self) -> str:
        if self.combined is not None:
            return self.combined.verdict
        return "; ".join(result.detail for result in self.results)

    def error(self, require_device: bool = False) -> OrchestrateError | None:
        """The error the verdict means (NotRun: exit 5, VerificationFailure: exit 4), or None.
        `require_device`: a pass by the twin alone is "not run" (method "auto")."""
        if self.combined is not None:
            verdict = self.combined
            if verdict.outcome == "failed":
                return VerificationFailure(verdict.verdict)
            if verdict.exit_code == 5 or (require_device and verdict.outcome == "twin-only"):
                return NotRun({"twin-only": f"--require-device: {verdict.verdict}",
                               "inconclusive": f"not run meaningfully: {verdict.verdict}"}.get(
                                   verdict.outcome, verdict.verdict))
            return None
        failures = [r.detail for r in self.results if r.outcome == "failed"]
        if failures:  # a failure decides, whatever else could not run
            return VerificationFailure("; ".join(failures))
        for result in self.results:
            if result.outcome == "not-run":
                hint = ("; nothing was run (verify without --qemu/--fvp runs every method this "
                        "machine has)" if self.method in _PICKED_BY_NAME else "")
                return NotRun(f"not run: {result.detail}{hint}")
            if result.outcome in ("partial", "inconclusive"):
                return NotRun(f"not checked in full: {result.detail}"
                              if result.outcome == "partial"
                              else f"not run meaningfully: {result.detail}")
        return None


def method_report(result: "MethodResult") -> dict:
    """One method's JSON report (or, for a method without one, its outcome)."""
    return result.report or {"method": result.name, "outcome": result.outcome,
                             "detail": result.detail}


@dataclass(frozen=True)
class FirmwareProject:
    """What `firmware` wrote: the project folder, its record, the ELF when built and, with
    `run`, the run on QEMU against the host twin."""

    folder: Path
    record: dict
    elf: Path | None  # None when not built
    run_lines: tuple[str, ...] = ()
    run_passed: bool | None = None  # None when not run

    def summary(self) -> str:
        record = self.record
        libraries = ", ".join(f"{k} {len(v)}" for k, v in record["kernel_libraries"].items())
        return (f"wrote {self.folder}: {record['profile']} firmware project for "
                f"{record['program']} on {record['platform']} ({record['cpu']}), "
                f"{len(record['operators'])} operators ({libraries})")


@dataclass(frozen=True)
class FirmwareSize:
    """The flash and RAM of a built firmware project (from its linker map), per component."""

    folder: Path
    record: dict
    footprint: "Footprint"

    def to_text(self) -> str:
        from orchestrator.firmware.footprint import render_text  # lazy: heavy (torch)

        return render_text(self.footprint, self.record)

    def to_json(self) -> str:
        from orchestrator.firmware.footprint import render_json  # lazy: heavy (torch)

        return render_json(self.footprint, self.record)

    def plan_lines(self) -> list[str]:
        """The plan report's firmware section."""
        from orchestrator.firmware.footprint import plan_section  # lazy: heavy (torch)

        return plan_section(self.folder, self.record, self.footprint)

    def plan_json(self) -> dict:
        """plan.json's `summary.firmware`."""
        from orchestrator.firmware.footprint import plan_json  # lazy: heavy (torch)

        return plan_json(self.folder, self.record, self.footprint)


@dataclass(frozen=True)
class SourceTree:
    """A third-party source tree a native build uses: where it is found and its commits."""

    name: str
    folder: Path
    origin: str  # how it was found: an argument, a variable, the shared folder, the cache
    present: bool
    fetched_commit: str | None  # what `sources fetch` recorded there
    pinned_commit: str


@dataclass(frozen=True)
class Sources:
    trees: tuple[SourceTree, ...]
    hint: str  # how to get a missing tree

    @property
    def missing(self) -> int:
        return sum(not tree.present for tree in self.trees)


@dataclass(frozen=True)
class CacheEntry:
    name: str
    size_bytes: int


@dataclass(frozen=True)
class CacheFolder:
    """One cache root, its entries and their sizes (as they were before a clear)."""

    root: Path
    entries: tuple[CacheEntry, ...]
    cleared: bool

    @property
    def total_bytes(self) -> int:
        return sum(entry.size_bytes for entry in self.entries)


@dataclass(frozen=True)
class ZooModel:
    name: str
    description: str
    kind: str


@dataclass(frozen=True)
class PlatformInfo:
    name: str
    cpu: str
    cpu_hz: float
    npus: tuple[str, ...]
    npu_default: str | None
    npu_hz: float | None


@dataclass(frozen=True)
class CpuInfo:
    name: str
    tier: str


@dataclass(frozen=True)
class Known:
    """What `orchestrate list` shows: zoo models, platforms with their NPUs, CPUs with tiers."""

    models: tuple[ZooModel, ...]
    platforms: tuple[PlatformInfo, ...]
    cpus: tuple[CpuInfo, ...]

    def to_json(self) -> dict:
        as_json = asdict(self)
        for platform in as_json["platforms"]:
            platform["npus"] = list(platform["npus"])
        return {key: list(value) for key, value in as_json.items()}
