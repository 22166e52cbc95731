"""The MLPerf Tiny models as a yardstick for the CPU cost model.

predict_mlperf() runs the four MLPerf Tiny models (ExecuTorch's PyTorch ports) through
op_shapes_from_module and cmsis_nn_cost. fit() is the routine that produced the calibrated
figures in data/cpu_cost.yaml; it is kept to be re-run when the model or the public figures
change, and the YAML, not this module, holds its results.

    PYTHONPATH=. python -m cost_models.calibration     # prints fitted figures per core
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from executorch.examples.models.mlperf_tiny import (DeepAutoEncoder, DSCNNKWS, MobileNetV1025,
                                                    ResNet8)

from cost_models.cpu import (
    CmsisNNRates,
    CycleTerms,
    cmsis_nn_cost,
    cmsis_nn_terms,
    load_cpu_cost_data,
)
from cost_models.op_shapes import OpShape, op_shapes_from_module


@dataclass(frozen=True)
class MlperfModel:
    name: str  # as in executorch/examples/models/mlperf_tiny/<name>.py
    task: str  # MLPerf Tiny benchmark: kws, vww, ic, ad
    input_shape: tuple[int, ...]
    build: Callable[[], torch.nn.Module]


def _models() -> tuple[MlperfModel, ...]:
    # Input shapes are the ones each port's get_example_inputs() uses.
    return (
        MlperfModel("ds_cnn", "kws", (1, 1, 49, 10), DSCNNKWS),
        MlperfModel("mobilenet_v1_025", "vww", (1, 3, 96, 96), MobileNetV1025),
        MlperfModel("resnet8", "ic", (1, 3, 32, 32), ResNet8),
        MlperfModel("deep_autoencoder", "ad", (1, 640), DeepAutoEncoder),
    )


MLPERF_MODELS: tuple[str, ...] = ("ds_cnn", "mobilenet_v1_025", "resnet8", "deep_autoencoder")


@functools.cache
def mlperf_op_shapes(model_name: str) -> tuple[OpShape, ...]:
    """The int8-deployment ops of one MLPerf Tiny model (one float forward pass, cached)."""
    for model in _models():
        if model.name == model_name:
            module = model.build().eval()
            return tuple(op_shapes_from_module(module, (torch.zeros(model.input_shape),)))
    raise ValueError(f"unknown MLPerf Tiny model {model_name!r}; known: {', '.join(MLPERF_MODELS)}")


def predict_mlperf(cpu: str, cpu_hz: int) -> dict[str, float]:
    """Predicted CMSIS-NN inference seconds of each MLPerf Tiny model on `cpu` at cpu_hz."""
    return {
        name: sum(cmsis_nn_cost(op, cpu, cpu_hz).seconds for op in mlperf_op_shapes(name))
        for name in MLPERF_MODELS
    }


def _summed_terms(model_name: str, cpu: str) -> CycleTerms:
    terms = [cmsis_nn_terms(op, cpu) for op in mlperf_op_shapes(model_name)]
    return CycleTerms(
        fixed_cycles=sum(t.fixed_cycles for t in terms),
        mac_work=sum(t.mac_work for t in terms),
        output_elements=sum(t.output_elements for t in terms),
        streamed_weight_bytes=sum(t.streamed_weight_bytes for t in terms),
    )


def _nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Non-negative least squares by trying every set of active variables (3 unknowns: 8 sets)."""
    best, best_residual = None, np.inf
    n = a.shape[1]
    for free in itertools.product((True, False), repeat=n):
        cols = [i for i in range(n) if free[i]]
        x = np.zeros(n)
        if cols:
            x[cols] = np.linalg.lstsq(a[:, cols], b, rcond=None)[0]
        if (x < 0).any():
            continue
        residual = float(np.sum((a @ x - b) ** 2))
        if residual < best_residual - 1e-15:
            best, best_residual = x, residual
    assert best is not None  # the all-zero solution is always feasible
    return best


def fit(cpu: str) -> CmsisNNRates:
    """Fit conv_macs_per_cycle, per_output_cycles and weight_bytes_per_cycle of `cpu` to its
    calibration points with role "fit".

    The model is linear in (1/conv_macs_per_cycle, per_output_cycles, 1/weight_bytes_per_cycle)
    once the sourced figures (tier kernels, op overhead) are fixed, so this is a non-negative
    least squares on relative error: each point weighs the same whatever its latency.

    per_output_cycles is bounded below by the tier's per_output_floor_cycles (saturate + store,
    a physical minimum, not fitted): the floor's cycles are moved to the known side of each
    equation, the NNLS solves for the excess over the floor (>= 0), and the floor is added back.
    """
    data = load_cpu_cost_data()
    floor = data.tiers[data.cores[cpu].tier].per_output_floor_cycles
    points = [p for p in data.calibration if p.core == cpu and p.role == "fit"]
    if len(points) < 3:
        raise ValueError(f"fit({cpu!r}) needs 3 fit points, the YAML has {len(points)}")
    rows, rhs = [], []
    for point in points:
        terms = _summed_terms(point.model, cpu)
        measured_cycles = point.latency_s * point.cpu_hz
        # Dividing each equation by its measured cycles makes the residuals relative errors.
        rows.append(
            [v / measured_cycles for v in (terms.mac_work, terms.output_elements, terms.streamed_weight_bytes)]
        )
        known_cycles = terms.fixed_cycles + floor * terms.output_elements
        rhs.append((measured_cycles - known_cycles) / measured_cycles)
    inv_macs, per_output_excess, inv_bytes = _nnls(np.array(rows), np.array(rhs))
    if inv_macs == 0 or inv_bytes == 0:
        raise ValueError(f"fit({cpu!r}): the points leave a MAC or weight-streaming rate unbounded")
    return CmsisNNRates(
        conv_macs_per_cycle=float(1.0 / inv_macs),
        per_output_cycles=float(floor + per_output_excess),
        weight_bytes_per_cycle=float(1.0 / inv_bytes),
        op_overhead_cycles=data.cmsis_nn[cpu].op_overhead_cycles,
    )


def calibrated_cores() -> tuple[str, ...]:
    return tuple(dict.fromkeys(p.core for p in load_cpu_cost_data().calibration))


if __name__ == "__main__":
    for core in calibrated_cores():
        rates = fit(core)
        print(
            f"{core}: conv_macs_per_cycle={rates.conv_macs_per_cycle:.3f} "
            f"per_output_cycles={rates.per_output_cycles:.2f} "
            f"weight_bytes_per_cycle={rates.weight_bytes_per_cycle:.3f}"
        )
