"""ETDump profiles (`.etdp`): written from the runner firmware's trace, read from any device.

The file is ExecuTorch's ETDump (its devtools/etdump/etdump_schema_flatcc.fbs), written and read
with ExecuTorch's own serializer (`executorch.devtools.etdump.serialize`), so ExecuTorch's
Inspector reads ours and we read what ETDumpGen writes on a board. What a profile holds, as
ETDumpGen records it:

- one RunData per inference, named "Execute" (Method::execute's event block), its
  bundled_input_index the BundleIO case;
- per instruction, profile events whose chain_index and instruction_id are the instruction's
  chain and index in it: `native_call_<operator>` (the kernel, as the generated registration
  names its scope: `quantized_conv2d.out`, without namespace), then OPERATOR_CALL (the whole
  instruction: argument unboxing, kernel, dispatch); for a delegate, DELEGATE_CALL and any scope
  the backend opens inside it (EthosUBackend::execute(), ...); events with a delegate debug id
  are inside a delegate and kept out of the per-instruction figures;
- the whole inference, Method::execute.

ETDump's schema has no field for the clock. Ours says it in the Method::execute event's
`delegate_debug_metadata` (ETDumpGen leaves it empty there): a JSON object with the writer, the
clock and its unit and the program's SHA-256. A profile without it is in the ticks of the
device's `et_pal_current_ticks()` (on Arm's executor runner, the PMU cycle counter), which the
report says. Under QEMU (`-icount shift=0`) the runner's clock is calibrated to instructions
retired: QEMU's virtual clock advances 1 ns per instruction, so the Inspector's default reading
in ns is the instruction count too; never cycles.

Files are size-prefixed, as ETDumpGen writes them and the Inspector reads them; an unprefixed
one (`serialize_to_etdump_flatcc`'s own output) is read too.
"""

from __future__ import annotations

import json
import os
import statistics
import struct
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from orchestrator.errors import UserError

IDENTIFIER = b"ED00"  # etdump_schema_flatcc.fbs file_identifier
RUN_NAME = "Execute"
OPERATOR_CALL = "OPERATOR_CALL"
DELEGATE_CALL = "DELEGATE_CALL"
METHOD_EXECUTE = "Method::execute"
KERNEL_PREFIX = "native_call_"
WRITER = "orchestrate verify --qemu --profile"


@dataclass(frozen=True)
class Clock:
    """What a profile's times count."""

    unit: str  # instructions | cycles | ticks
    text: str  # the words every printed figure carries


QEMU_ICOUNT = Clock("instructions", "instructions retired, QEMU -icount")
DWT_CYCLES = Clock("cycles", "cycles, DWT")
DEVICE_TICKS = Clock("ticks", "device ticks: the profile does not name its clock "
                              "(et_pal_current_ticks(); Arm's executor runner counts PMU cycles)")


@dataclass(frozen=True)
class ProfiledCall:
    """One instruction of one inference as the profile timed it."""

    chain: int
    instruction: int
    kind: str  # OPERATOR_CALL or DELEGATE_CALL
    kernel: str  # the kernel's operator (native_call_ scope), e.g. quantized_conv2d.out; "" if none
    duration: int  # in the profile's clock
    kernel_duration: int | None  # the kernel's scope alone


@dataclass(frozen=True)
class ProfiledRun:
    case: int | None  # the BundleIO case (bundled_input_index), None when not given
    calls: tuple[ProfiledCall, ...]
    total: int | None  # Method::execute, the whole inference


@dataclass(frozen=True)
class Profile:
    path: str
    clock: Clock
    writer: str | None  # who wrote it, when the profile says (ours do)
    program_sha256: str | None  # the program it profiles, when the profile says
    runs: tuple[ProfiledRun, ...]

    def medians(self) -> tuple[ProfiledCall, ...]:
        """Each instruction's median over the runs (in the order the first run that has it
        ran it); the kernel's median only when every run timed the kernel."""
        found: dict[tuple[int, int], list[ProfiledCall]] = {}
        for run in self.runs:
            for call in run.calls:
                found.setdefault((call.chain, call.instruction), []).append(call)
        medians = []
        for calls in found.values():
            kernels = [c.kernel_duration for c in calls if c.kernel_duration is not None]
            medians.append(ProfiledCall(
                calls[0].chain, calls[0].instruction, calls[0].kind, calls[0].kernel,
                int(statistics.median_low(c.duration for c in calls)),
                int(statistics.median_low(kernels)) if len(kernels) == len(calls) else None))
        return tuple(medians)

    def total(self) -> int | None:
        """The whole inference's (Method::execute) median over the runs that timed it."""
        totals = [run.total for run in self.runs if run.total is not None]
        return int(statistics.median_low(totals)) if totals else None


@dataclass(frozen=True)
class TraceEvent:
    """One scope of the runner's trace, in its clock's ticks (start on its timeline): the
    writer's input, so this module needs no platform type."""

    case: int
    instruction: int  # -1 for the whole inference (METHOD_EXECUTE)
    kind: str  # OPERATOR_CALL, DELEGATE_CALL, a backend's scope, METHOD_EXECUTE
    kernel: str
    start_ticks: int
    ticks: int
    kernel_start_ticks: int = 0
    kernel_ticks: int = 0


def etdump_bytes(events: Iterable[TraceEvent], clock: Clock, per_tick: float,
                 program_sha256: str, details: Mapping[str, str] | None = None) -> bytes:
    """The ETDump of a trace: one run per inference (each ends with its METHOD_EXECUTE event),
    times in `clock` (ticks x `per_tick`), size-prefixed."""
    from executorch.devtools.etdump import (  # lazy: heavy (torch, executorch)
        schema_flatcc as schema)
    from executorch.devtools.etdump.serialize import (  # lazy: heavy (torch, executorch)
        serialize_to_etdump_flatcc)

    def at(ticks: int) -> int:
        return round(ticks * per_tick)

    def profile_event(name: str, chain: int, instruction: int, start: int, ticks: int,
                      metadata: bytes = b""):
        return schema.Event(
            profile_event=schema.ProfileEvent(
                name=name, chain_index=chain, instruction_id=instruction,
                delegate_debug_id_int=-1, delegate_debug_id_str="",
                delegate_debug_metadata=metadata, start_time=at(start),
                end_time=at(start + ticks)),
            allocation_event=None, debug_event=None)

    metadata = json.dumps({"writer": WRITER, "clock": clock.text, "unit": clock.unit,
                           "program_sha256": program_sha256, **(details or {})}).encode()
    runs, pending = [], []
    for event in events:
        if event.kind == METHOD_EXECUTE:
            # ETDumpGen leaves Method::execute's chain unset and its debug handle 0.
            pending.append(profile_event(METHOD_EXECUTE, -1, 0, event.start_ticks, event.ticks,
                                         metadata))
            runs.append(schema.RunData(name=RUN_NAME, bundled_input_index=event.case,
                                       allocators=[], events=pending))
            pending = []
            continue
        if event.kernel:
            pending.append(profile_event(KERNEL_PREFIX + event.kernel, 0, event.instruction,
                                         event.kernel_start_ticks, event.kernel_ticks))
        pending.append(profile_event(event.kind, 0, event.instruction, event.start_ticks,
                                     event.ticks))
    if not runs:
        raise ValueError("the trace has no whole inference (Method::execute): no profile")
    flat = serialize_to_etdump_flatcc(schema.ETDumpFlatCC(version=0, run_data=runs))
    return struct.pack("<I", len(flat)) + flat


def read_profile(path: str | Path) -> Profile:
    """An `.etdp` from any device, read with ExecuTorch's ETDump reader; UserError (one line)
    when it is missing, unreadable, not an ETDump or holds no operator events."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"profile '{path}' not found; give an .etdp written by `orchestrate "
                        "verify --qemu --profile` or by ExecuTorch's ETDumpGen on a device")
    try:
        data = path.read_bytes()
    except OSError as error:
        raise UserError(f"profile '{path}' cannot be read ({error.strerror})") from None
    size_prefixed = _size_prefixed(data)
    if size_prefixed is None:
        raise UserError(f"profile '{path}' is not an ETDump (no '{IDENTIFIER.decode()}' file "
                        "identifier); give an .etdp written by `orchestrate verify --qemu "
                        "--profile` or by ETDumpGen")
    etdump = _deserialize(data, size_prefixed, path)
    runs, clock, writer, sha = [], DEVICE_TICKS, None, None
    for run in etdump.run_data or ():
        profiled = _run(run.events or (), run.bundled_input_index)
        if profiled is None:
            continue
        runs.append(profiled[0])
        said = profiled[1]
        if said:
            clock = Clock(str(said.get("unit", "ticks")), str(said.get("clock", clock.text)))
            writer = str(said.get("writer") or "") or None
            sha = str(said.get("program_sha256") or "") or None
    if not runs:
        raise UserError(f"profile '{path}' has no operator events (OPERATOR_CALL or "
                        "DELEGATE_CALL): record it with ETDumpGen's profiling on, or with "
                        "`orchestrate verify --qemu --profile`")
    return Profile(str(path), clock, writer, sha, tuple(runs))


def _size_prefixed(data: bytes) -> bool | None:
    """True for a size-prefixed ETDump, False for an unprefixed one, None for anything else."""
    if len(data) >= 12 and data[8:12] == IDENTIFIER and \
            struct.unpack_from("<I", data)[0] == len(data) - 4:
        return True
    if len(data) >= 8 and data[4:8] == IDENTIFIER:
        return False
    return None


def _deserialize(data: bytes, size_prefixed: bool, path: Path):
    """ExecuTorch's reader runs flatc, which prints its own complaint on a damaged file: that
    goes to a pipe, and the user gets one line."""
    from executorch.devtools.etdump.serialize import (  # lazy: heavy (torch, executorch)
        deserialize_from_etdump_flatcc)

    saved = os.dup(2)
    with tempfile.TemporaryFile() as errors:
        os.dup2(errors.fileno(), 2)
        try:
            return deserialize_from_etdump_flatcc(data, size_prefixed=size_prefixed)
        except Exception as error:  # noqa: BLE001 - flatc's failure, or a JSON it half wrote
            errors.seek(0)
            said = " ".join(errors.read().decode(errors="replace").split())[:160]
            raise UserError(f"profile '{path}' is damaged: ExecuTorch's ETDump reader could not "
                            f"parse it ({said or type(error).__name__})") from None
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def _duration(start: int, end: int) -> int:
    """end - start; a 32-bit device clock that wrapped once counts on (as the Inspector does)."""
    if end >= start:
        return end - start
    if start < 2 ** 32 and end < 2 ** 32:
        return end + 2 ** 32 - start
    raise UserError(f"a profile event ends ({end}) before it starts ({start}) on a 64-bit clock")


def _run(events, case: int | None) -> tuple[ProfiledRun, dict] | None:
    """A RunData's instructions (summed over repeated calls of one instruction), its whole
    inference and what its Method::execute metadata says; None without operator events."""
    order: list[tuple[int, int]] = []
    kind: dict[tuple[int, int], str] = {}
    spent: dict[tuple[int, int], int] = {}
    kernels: dict[tuple[int, int], tuple[str, int]] = {}
    total, said = None, {}
    for event in events:
        profile = event.profile_event
        if profile is None:
            continue
        if profile.delegate_debug_id_int not in (-1, None) or profile.delegate_debug_id_str:
            continue  # inside a delegate: the DELEGATE_CALL holds it
        name = profile.name or ""
        duration = _duration(int(profile.start_time), int(profile.end_time))
        key = (int(profile.chain_index), int(profile.instruction_id))
        if name == METHOD_EXECUTE:
            total = (total or 0) + duration
            said = _metadata(profile.delegate_debug_metadata) or said
        elif name in (OPERATOR_CALL, DELEGATE_CALL) and key[0] >= 0:
            if key not in kind:
                order.append(key)
            kind[key] = name
            spent[key] = spent.get(key, 0) + duration
        elif name.startswith(KERNEL_PREFIX) and key[0] >= 0:
            previous = kernels.get(key, ("", 0))[1]
            kernels[key] = (name[len(KERNEL_PREFIX):], previous + duration)
    if not order:
        return None
    calls = tuple(ProfiledCall(chain, instruction, kind[(chain, instruction)],
                               kernels.get((chain, instruction), ("", 0))[0],
                               spent[(chain, instruction)],
                               kernels[(chain, instruction)][1]
                               if (chain, instruction) in kernels else None)
                  for chain, instruction in order)
    return ProfiledRun(case if case is not None and case >= 0 else None, calls, total), said


def _metadata(raw) -> dict:
    """Our writer's JSON in Method::execute's delegate_debug_metadata; {} for anything else."""
    if not raw:
        return {}
    try:
        said = json.loads(bytes(raw).decode())
    except (UnicodeDecodeError, ValueError):
        return {}
    return said if isinstance(said, dict) and str(said.get("writer", "")).startswith(
        "orchestrate") else {}
