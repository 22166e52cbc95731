"""Costs through real plans: the per-op CPU model, summed over a compiled program, lands on the
public MLPerf Tiny figures it was calibrated against (Renesas EK-RA8D1, Cortex-M85 @ 480 MHz)."""

from __future__ import annotations

import dataclasses

import pytest

from orchestrator.planning.planner import make_plan

PUBLIC_M85_S = {"ds-cnn": 3.465e-3, "deep-autoencoder": 0.531e-3}  # MLPerf Tiny v1.2, measured


@pytest.mark.parametrize("model", sorted(PUBLIC_M85_S))
def test_cpu_only_plan_latency_on_m85_is_near_the_public_figure(compiles, model):
    from platforms.memory_placement import MemoryPolicy

    compiled, _ = compiles.get(model, "corstone300", "none", "cortex-m85")
    at_480mhz = dataclasses.replace(compiled.target, cpu_hz=480_000_000)
    # The calibration board read its weights in place from flash: plan them so.
    plan = make_plan(dataclasses.replace(compiled, target=at_480mhz),
                     memory_policy=MemoryPolicy(weights="in-place", source="in-place"))
    assert plan.summary.latency_source.split("+") == ["model:transition", "model:mve"]
    ratio = plan.summary.latency_seconds / PUBLIC_M85_S[model]
    assert 0.75 <= ratio <= 1.25, ratio


def test_cmsis_nn_row_costs_use_int8_bytes_not_the_logical_float_tensors(compiles):
    compiled, _ = compiles.get("deep-autoencoder", "corstone300", "none", "cortex-m85")
    first = next(r for r in compiled.placements if r.kind == "op")
    shape = first.info.op_shape
    assert shape.kind == "fully_connected" and shape.macs == 640 * 128
    assert shape.weight_bytes == 640 * 128 + 128 * 4  # int8 weights + int32 bias
    assert shape.input_bytes == 640 and shape.output_bytes == 128
