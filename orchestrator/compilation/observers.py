"""Calibration methods: upstream's quantizers with the activation observer of your choice.

Both upstream quantizers observe activations with torchao's `HistogramObserver`
(ExecuTorch 1.5.1: the Arm backend's `get_symmetric_quantization_config`, which EthosUQuantizer
is given, and the Cortex-M backend's `INT8_ACTIVATION_PER_TENSOR_QSPEC`, which every
CortexMQuantizer config uses): it searches the histogram of the calibration values for the
range with the least L2 rounding error, so it may clip a tail. `--calibration-method` swaps that
one observer and keeps the rest of upstream's config (dtypes, integer ranges, eps, the weight
and bias specs, the Cortex-M softmax and pooling rules):

| method | observer | range of an activation |
|---|---|---|
| histogram (default) | upstream's config unchanged | the histogram's least-error range |
| minmax | MinMaxObserver | every calibration value: nothing clips on them |
| moving-average | MovingAverageMinMaxObserver (constant 0.01) | the running average of each sample's min and max |

torchao 0.18 has no percentile observer, so none is offered. The weights keep upstream's
(per-channel) min-max observers whatever the method.

The CortexMQuantizer takes its per-tensor config as an argument but builds its convolutions'
per-channel config itself (`INT8_PER_CHANNEL_CONFIG`, in its `quantizers` list): that one is
found by identity and replaced, and `contract()` says whether it is still there to find.
"""

from __future__ import annotations

from dataclasses import replace

from executorch.backends.arm.quantizer import get_symmetric_quantization_config
from executorch.backends.cortex_m.quantizer import quantization_configs as configs
from executorch.backends.cortex_m.quantizer.quantizer import CortexMQuantizer
from torchao.quantization.pt2e import (HistogramObserver, MinMaxObserver,
                                       MovingAverageMinMaxObserver)

from orchestrator.request import CALIBRATION_METHODS, DEFAULT_CALIBRATION_METHOD

OBSERVERS = {"histogram": HistogramObserver, "minmax": MinMaxObserver,
             "moving-average": MovingAverageMinMaxObserver}
assert tuple(OBSERVERS) == CALIBRATION_METHODS


def _observed(spec, method: str, swapped: dict):
    """`spec` with its observer swapped for the method's, keeping its keyword arguments (eps).
    One upstream spec becomes one new spec (`swapped`, by identity): the quantizers compare the
    specs at an edge to share one observer between a producer and its consumers, and the
    observer constructors compare by identity."""
    if spec is None:
        return None
    if id(spec) not in swapped:
        constructor = spec.observer_or_fake_quant_ctr
        keywords = dict(getattr(getattr(constructor, "p", None), "keywords", None) or {})
        observer = OBSERVERS[method]
        swapped[id(spec)] = replace(spec, observer_or_fake_quant_ctr=(
            observer.with_args(**keywords) if keywords else observer))
    return swapped[id(spec)]


def with_activation_observer(config, method: str, swapped: dict | None = None):
    """An upstream QuantizationConfig with its activation observers swapped (the default method:
    the config itself, so the program is upstream's byte for byte). Configs swapped with one
    `swapped` dict keep sharing the specs they shared."""
    if method == DEFAULT_CALIBRATION_METHOD:
        return config
    swapped = {} if swapped is None else swapped
    return replace(config, input_activation=_observed(config.input_activation, method, swapped),
                   output_activation=_observed(config.output_activation, method, swapped))


def ethos_u_config(method: str):
    """The config EthosUQuantizer is given: upstream's per-channel symmetric one."""
    return with_activation_observer(get_symmetric_quantization_config(is_per_channel=True),
                                    method)


def cortex_m_quantizer(method: str):
    """CortexMQuantizer observing activations by `method` (every config it uses)."""
    if method == DEFAULT_CALIBRATION_METHOD:
        return CortexMQuantizer()
    shared: dict = {}  # both configs observe activations with one upstream spec
    quantizer = CortexMQuantizer(per_tensor_config=with_activation_observer(
        configs.INT8_PER_TENSOR_CONFIG, method, shared))
    replaced = 0
    for part in quantizer.quantizers:
        if getattr(part, "quantization_config", None) is configs.INT8_PER_CHANNEL_CONFIG:
            part.quantization_config = with_activation_observer(
                configs.INT8_PER_CHANNEL_CONFIG, method, shared)
            replaced += 1
    if replaced != 1:
        raise RuntimeError(f"CortexMQuantizer holds {replaced} per-channel configs where "
                           "ExecuTorch 1.5.1 holds one: orchestrator/compilation/observers.py "
                           "needs updating for this version")
    return quantizer


def contract() -> dict[str, object]:
    """What this module relies on upstream for, each True when it holds."""
    ethos = get_symmetric_quantization_config(is_per_channel=True)
    holders = [p for p in CortexMQuantizer().quantizers
               if getattr(p, "quantization_config", None) is configs.INT8_PER_CHANNEL_CONFIG]
    return {
        "Ethos-U activations observed by HistogramObserver":
            ethos.output_activation.observer_or_fake_quant_ctr.p.func is HistogramObserver,
        "Cortex-M activations observed by HistogramObserver":
            configs.INT8_ACTIVATION_PER_TENSOR_QSPEC.observer_or_fake_quant_ctr
            is HistogramObserver,
        "CortexMQuantizer holds INT8_PER_CHANNEL_CONFIG once": len(holders) == 1,
    }
