"""Which floats on a rounding boundary a device rounded to the other side, found from its outputs.

The host runtime logs every value it writes, so where its float kernels round a value to the
other side of a quantize's boundary the twin takes that value (floats.py). A device on QEMU logs
no intermediates: a failed BundleIO case gives only a digest of each output's bytes (FNV-1a,
runner.cpp). The Cortex-M build of the same portable kernels can still round apart from both
the twin and the host (it contracts a multiply and an add into one rounding, and links newlib's
`expf`).

`flips_matching` looks for the floats that explain such a case: every element of a float that a
quantize reads and that lies within the summation-order bound of its rounding boundary
(x / scale within that bound of k + 0.5) is a candidate; the twin is run with one candidate moved
across its boundary, then with two, each moved float given to the twin as a device's float
(floats.py: within the bound, or it is not taken). A set whose outputs have the device's digests
byte for byte explains the case; the search is bounded (MAX_CANDIDATES), and finds nothing where
the difference is anything else.
"""

from __future__ import annotations

import itertools
import math

import torch

from orchestrator.verification.floats import float_bound, reduction_length
from orchestrator.verification.twin import TwinProgram
from platforms.runner_protocol import fnv1a64

QUANTIZE = "cortex_m::quantize_per_tensor.out"
MAX_CANDIDATES = 12  # single moves of each, pairs among them: at most 78 twin runs a case
_BOUNDARY_ULPS = 64  # the boundary's float32 and the quantize's own rounding are this close


def _candidates(twin: TwinProgram, run) -> list[tuple[int, int, int, torch.Tensor]]:
    """(instruction writing the float, its EValue, flat element, the float just across the
    boundary), nearest the boundary first."""
    writer = {index: entry for entry in run.op_trace for index in entry.outputs}
    found = []
    for entry in run.op_trace:
        if entry.op != QUANTIZE or not entry.inputs:
            continue
        source = entry.inputs[0]
        producer = writer.get(source)
        x = run.intermediates.get(source)
        if producer is None or producer.kind != "kernel" or x is None or \
                x.dtype != torch.float32 or not x.numel():
            continue
        call = twin.view.instructions[entry.instruction]
        scale = float(twin.view.values[call.args[1]].scalar)
        bound = float_bound(x, reduction_length(run, producer))
        inverse = torch.tensor(1.0) / torch.tensor(scale, dtype=torch.float32)
        flat = x.reshape(-1)
        steps = flat.double() / scale
        distance = (steps - steps.floor() - 0.5).abs() * scale
        for element in torch.nonzero(distance <= bound).reshape(-1).tolist():
            moved = _across(flat[element], inverse, steps[element])
            if moved is not None and abs(float(moved) - float(flat[element])) <= bound:
                found.append((float(distance[element]), producer.instruction, source, element,
                              moved))
    found.sort(key=lambda c: c[0])
    return [c[1:] for c in found[:MAX_CANDIDATES]]


def _across(x: torch.Tensor, inverse: torch.Tensor, steps) -> torch.Tensor | None:
    """The float32 nearest `x` that the quantize (x * (1 / scale) in float32, rounded) takes to
    the neighbouring step: from the boundary's float32, a few ulps either way."""
    upward = float(steps - steps.floor()) < 0.5  # the nearer boundary is above x
    boundary = (math.floor(float(steps)) + 0.5) * (1.0 / float(inverse))
    away = torch.tensor(math.inf if upward else -math.inf)
    back = -away
    step = torch.round(x * inverse)
    moved = torch.tensor(boundary, dtype=torch.float32)
    for _ in range(_BOUNDARY_ULPS):  # onto the far side
        if torch.round(moved * inverse) != step:
            break
        moved = torch.nextafter(moved, away)
    else:
        return None
    for _ in range(_BOUNDARY_ULPS):  # and as near x as it stays there
        nearer = torch.nextafter(moved, back)
        if torch.round(nearer * inverse) == step:
            return moved
        moved = nearer
    return None


def flips_matching(twin: TwinProgram, program_inputs, digests, npu) -> dict | None:
    """`device_floats` for `twin.run` whose outputs have `digests` (the device's, by output),
    or None when no set of at most two boundary moves gives them."""
    if not digests or any(d is None for d in digests):
        return None
    run = twin.run(program_inputs, keep_intermediates=True, npu=npu())
    candidates = _candidates(twin, run)
    for size in (1, 2):
        for chosen in itertools.combinations(candidates, size):
            floats: dict[int, list[torch.Tensor]] = {}
            for instruction, value, element, moved in chosen:
                entry = next(e for e in run.op_trace if e.instruction == instruction)
                tensors = floats.setdefault(instruction, [
                    run.intermediates[i].clone().contiguous() for i in entry.outputs])
                target = tensors[list(entry.outputs).index(value)].reshape(-1)
                target[element] = moved
            given = {k: tuple(v) for k, v in floats.items()}
            trial = twin.run(program_inputs, npu=npu(), device_floats=given)
            if trial.took and all(
                    fnv1a64(data) == digest
                    for data, digest in zip(trial.output_bytes, digests)):
                return given
    return None
