"""Run a self-checking .bpte on a Corstone FVP and read the verdict from the runner's log.

How the model gets in: the FVP's `--data FILE@ADDRESS` places the .bpte at the platform's
`fvp.load_address`, and ExecuTorch's arm_executor_runner, built with that address as
ET_MODEL_PTE_ADDR and with ET_BUNDLE_IO=ON, runs it from there and compares the outputs with the
references bundled in it. We chose this over the semihosting runner (`-C cpu0.semihosting-*`, the
file named on a semihosting command line) because one runner ELF then serves every model, the FVP
needs no access to the host's files, there is no 256-character semihosting command-line limit,
and it is the configuration ExecuTorch's CI runs (`run.sh --bundleio --pte_placement=0x38000000`).

The log format is that of examples/arm/executor_runner/arm_executor_runner.cpp and
arm_perf_monitor.cpp in ExecuTorch: `ET_LOG` lines look like
`I [executorch:arm_perf_monitor.cpp:172 StopMeasurements()] ethosu_pmu_cycle_cntr :  1234 (...)`.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from platforms.platform import Platform, PlatformError

FVP_DIR_ENV = "ORCHESTRATE_FVP_DIR"
RUNNER_ELF_ENV = "ORCHESTRATE_RUNNER_ELF"

# ExecuTorch's run_fvp.sh default; large models on the cycle-accurate NPU model need minutes.
DEFAULT_TIMEOUT_S = 600

# The FVP enforces `--timelimit` itself; this is how long we then wait for it to exit (model
# start-up and teardown take a few seconds) before killing it.
_EXIT_GRACE_S = 30

_ET_LOG = re.compile(r"^(?P<level>[DIWEF]) \[executorch:[^\]]*\]\s?(?P<message>.*)$")
_PASS = re.compile(r"Test_result:\s*PASS|Bundle verification passed|Model output match expected", re.IGNORECASE)
_FAIL = re.compile(r"Test_result:\s*FAIL|Bundle verification failed|Model output don't match expected", re.IGNORECASE)
# What ExecuTorch's run_fvp.sh and runner_utils.py treat as a failed simulation, besides ET_LOG
# levels E (error) and F (fatal): the FVP's own errors, a CPU fault, its time limit.
_PROBLEM = re.compile(
    r"^Error:|\[critical\]|hard ?fault|Assertion|Simulation is stopping\. Reason: CPU time has been exceeded",
    re.IGNORECASE,
)
_COMPLETE = re.compile(r"Program complete, exiting")
_PMU_EVENTS = re.compile(r"Ethos-U PMU Events:\s*\[(?P<names>[^\]]*)\]")
_NPU_CYCLE_COUNTER = "ethosu_pmu_cycle_cntr"
_NPU_CYCLES = re.compile(r"\bNPU cycles\s*:\s*(?P<value>\d+)", re.IGNORECASE)
_CPU_CYCLES = re.compile(
    r"\bCPU cycles\s*:\s*(?P<value>\d+)|^Inference runtime:\s*(?P<runtime>\d+) CPU cycles", re.IGNORECASE
)
# `name : N` or `name : sub : N` (e.g. `ethos-u : cycle_cnt : N cycles`); only names that count
# cycles or PMU events are kept, so allocator sizes do not end up among counters.
_COUNTER = re.compile(r"^(?P<name>[A-Za-z][\w-]*(?:\s*:\s*[A-Za-z][\w-]*)?)\s*:\s*(?P<value>\d+)\b")
_COUNTER_NAME = re.compile(r"pmu|cntr|cycle", re.IGNORECASE)
_MEMORY = re.compile(
    r"^(?P<name>model_pte_\w+|method_allocator_\w+|planned_fast_\w+|temp_allocator|input_file_allocator_used)"
    r"\s*:\s*(?P<value>\d+)"
)


class FvpUnavailable(RuntimeError):
    """The FVP check cannot run here; the CLI reports "not run" (exit 5), never a pass."""


class FvpNotFound(FvpUnavailable):
    """No FVP binary for the requested platform and NPU: the check is reported as not run."""

    def __init__(self, detail: str = ""):
        super().__init__("not run: no FVP found" + (f" ({detail})" if detail else ""))


class RunnerElfNotFound(FvpUnavailable):
    """No arm_executor_runner ELF was named: the FVP check is reported as not run."""

    def __init__(self) -> None:
        super().__init__(f"not run: no runner ELF (pass --runner-elf or set ${RUNNER_ELF_ENV}; "
                         "build one with ExecuTorch's examples/arm/run.sh --bundleio "
                         "--build_only for the program's NPU)")


@dataclass(frozen=True)
class FvpResult:
    """What one FVP run of a .bpte showed.

    passed is True when the bundle check passed and nothing went wrong, False on a failed check or
    any error, None when the log holds no verdict (e.g. a runner built without BundleIO).
    cycles are the Ethos-U PMU's active-cycle count (the FVP models the NPU cycle-accurately);
    cpu_cycles are the Cortex-M cycles the runner reports, which the FVP does not model faithfully.
    """

    passed: bool | None
    pass_lines: tuple[str, ...]
    fail_lines: tuple[str, ...]
    errors: tuple[str, ...]
    pmu: Mapping[str, int]  # counter name in the log -> count, e.g. ethosu_pmu_cntr0
    pmu_events: Mapping[str, int]  # Ethos-U event name -> count, when the runner names its counters
    cycles: int | None
    cpu_cycles: int | None
    memory_bytes: Mapping[str, int]  # the runner's allocator report, e.g. method_allocator_planned
    completed: bool  # the runner reached "Program complete, exiting."
    log: str = field(repr=False, default="")

    def summary(self) -> str:
        cycles = f", {self.cycles:,} NPU cycles" if self.cycles is not None else ""
        if self.passed:
            return f"PASS{cycles}"
        if self.passed is None:
            return f"no verdict: the log has no bundle check result{cycles}"
        first = (self.fail_lines + self.errors)[0]
        return f"FAIL: {first}{cycles}"


def find_fvp(platform: Platform, npu_name: str, search_path: str | Sequence[str | Path] | None = None) -> Path | None:
    """The FVP binary for this platform and NPU: first in $ORCHESTRATE_FVP_DIR (an FVP install
    directory, or several separated like PATH), then on `search_path` (default: PATH)."""
    binary = platform.fvp_spec(npu_name).binary
    directories: list[Path] = []
    for entry in os.environ.get(FVP_DIR_ENV, "").split(os.pathsep):
        if entry:
            root = Path(entry).expanduser()
            # FVP installers put the binaries in <install>/models/<host-toolchain>/.
            directories += [root, *sorted(root.glob("models/*"))]
    found = shutil.which(binary, path=os.pathsep.join(str(d) for d in directories)) if directories else None
    if found is None:
        if search_path is None:
            path = None
        elif isinstance(search_path, str):
            path = search_path
        else:
            path = os.pathsep.join(str(p) for p in search_path)
        found = shutil.which(binary, path=path)
    return Path(found).resolve() if found else None


def find_runner_elf(option: str | Path | None) -> Path | None:
    """The arm_executor_runner ELF named by `option`, else by $ORCHESTRATE_RUNNER_ELF, else None.
    A name that points at no file raises: a typo must not quietly skip verification.

    The ELF must be built for the platform's NPU family with BundleIO and with the platform's
    `fvp.load_address` as its PTE address, e.g. `examples/arm/run.sh --target=ethos-u55-128
    --bundleio --pte_placement=0x38000000 --build_only` in an ExecuTorch checkout."""
    for value, origin in ((option, "runner ELF"), (os.environ.get(RUNNER_ELF_ENV), f"${RUNNER_ELF_ENV}")):
        if value:
            path = Path(value).expanduser()
            if not path.is_file():
                raise FileNotFoundError(f"{origin} {path} does not exist")
            return path.resolve()
    return None


def fvp_command(
    platform: Platform,
    npu_name: str,
    fvp_binary: str | Path,
    runner_elf: str | Path,
    bpte_path: str | Path,
    timeout_s: int,
) -> list[str]:
    """The FVP argv (no shell) that runs `bpte_path` with `runner_elf` on `npu_name`, from the
    platform's argument templates. Raises PlatformError if the .bpte does not fit where it is loaded."""
    spec = platform.fvp_spec(npu_name)
    if not isinstance(timeout_s, int) or isinstance(timeout_s, bool) or timeout_s <= 0:
        raise PlatformError(f"FVP timeout must be a positive number of seconds, got {timeout_s!r}")
    bpte = Path(bpte_path)
    region = platform.memory(platform.fvp_load_region)
    room_bytes = region.base_address + region.size_bytes - platform.fvp_load_address
    bpte_bytes = bpte.stat().st_size
    if bpte_bytes > room_bytes:
        raise PlatformError(
            f"{bpte} is {bpte_bytes} bytes but {platform.name} loads it at {platform.fvp_load_address:#x} "
            f"in {region.name}, which has room for {room_bytes} bytes"
        )
    values = {
        "macs": platform.npu_macs(npu_name),
        "elf": str(runner_elf),
        "bpte": str(bpte),
        "load_address": f"{platform.fvp_load_address:#x}",
        "timeout_s": timeout_s,
    }
    return [str(fvp_binary), *(token.format(**values) for token in spec.args)]


def run_bpte(
    platform: Platform,
    npu_name: str,
    bpte_path: str | Path,
    runner_elf: str | Path | None = None,
    timeout_s: int = DEFAULT_TIMEOUT_S,
    search_path: str | Sequence[str | Path] | None = None,
) -> FvpResult:
    """Find the FVP and the runner, run the .bpte, return what happened. Raises FvpNotFound or
    RunnerElfNotFound (both FvpUnavailable) when the check cannot run here."""
    fvp_binary = find_fvp(platform, npu_name, search_path)
    if fvp_binary is None:
        raise FvpNotFound(f"{platform.fvp_spec(npu_name).binary} is not on PATH nor in "
                          f"${FVP_DIR_ENV}; `orchestrate doctor` shows what this machine can run")
    elf = find_runner_elf(runner_elf)
    if elf is None:
        raise RunnerElfNotFound()
    return run_fvp(fvp_command(platform, npu_name, fvp_binary, elf, bpte_path, timeout_s), timeout_s)


def run_fvp(cmd: Sequence[str], timeout_s: int) -> FvpResult:
    """Run the FVP and parse what the runner printed. Raises FvpNotFound if the binary is missing."""
    extra_errors: list[str] = []
    try:
        completed = subprocess.run(
            list(cmd),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=timeout_s + _EXIT_GRACE_S,
            check=False,
        )
        output = completed.stdout
        if completed.returncode != 0:
            extra_errors.append(f"FVP exited with code {completed.returncode}")
    except FileNotFoundError:
        raise FvpNotFound(f"{cmd[0]} does not exist") from None
    except subprocess.TimeoutExpired as expired:
        output = expired.stdout or b""
        extra_errors.append(f"FVP still running {_EXIT_GRACE_S} s after its {timeout_s} s time limit; killed")
    text = output.decode("utf-8", errors="replace") if isinstance(output, bytes) else output
    return _parse(text, tuple(extra_errors))


def parse_runner_log(text: str) -> FvpResult:
    """Read an arm_executor_runner log (as the FVP prints it on its UART) into an FvpResult."""
    return _parse(text, ())


def _parse(text: str, extra_errors: tuple[str, ...]) -> FvpResult:
    pass_lines: list[str] = []
    fail_lines: list[str] = []
    errors: list[str] = []
    pmu: dict[str, int] = {}
    memory_bytes: dict[str, int] = {}
    event_names: list[str] = []
    npu_cycles_line: int | None = None
    cpu_cycles: int | None = None
    completed = False

    # The FVP's UART writes CRLF line ends (run_fvp.sh strips the CR with sed).
    for raw_line in text.splitlines():
        line = raw_line.rstrip("\r").strip()
        if not line:
            continue
        logged = _ET_LOG.match(line)
        level, message = (logged["level"], logged["message"].strip()) if logged else ("", line)

        if _FAIL.search(message):
            fail_lines.append(line)
            continue
        if _PASS.search(message):
            pass_lines.append(line)
            continue
        if level in ("E", "F") or _PROBLEM.search(line):
            errors.append(line)
            continue
        if _COMPLETE.search(message):
            completed = True
            continue
        if events := _PMU_EVENTS.search(message):
            event_names = [name.strip() for name in events["names"].split(",") if name.strip()]
            continue
        if cpu := _CPU_CYCLES.search(message):
            cpu_cycles = int(cpu["value"] or cpu["runtime"])
        if npu := _NPU_CYCLES.search(message):
            npu_cycles_line = int(npu["value"])
        if memory := _MEMORY.match(message):
            memory_bytes[memory["name"]] = int(memory["value"])
            continue
        if counter := _COUNTER.match(message):
            name = re.sub(r"\s*:\s*", ":", counter["name"])
            if _COUNTER_NAME.search(name):
                pmu[name] = int(counter["value"])

    pmu_events = {
        name: pmu[f"ethosu_pmu_cntr{index}"]
        for index, name in enumerate(event_names)
        if f"ethosu_pmu_cntr{index}" in pmu
    }
    all_errors = tuple(errors) + extra_errors
    if fail_lines or all_errors:
        passed: bool | None = False
    elif pass_lines:
        passed = True
    else:
        passed = None
    return FvpResult(
        passed=passed,
        pass_lines=tuple(pass_lines),
        fail_lines=tuple(fail_lines),
        errors=all_errors,
        pmu=MappingProxyType(pmu),
        pmu_events=MappingProxyType(pmu_events),
        cycles=pmu.get(_NPU_CYCLE_COUNTER, npu_cycles_line),
        cpu_cycles=cpu_cycles,
        memory_bytes=MappingProxyType(memory_bytes),
        completed=completed,
        log=text,
    )
