"""The plan coloured by measured per-layer quantization error (`verify --per-layer-error`).

A layer of the per-layer report (orchestrator/verification/layer_error.py) is one value the
quantized reference rounds to int8 with the int8 weights that compute it; it names the source
modules of its ops (`modules`). A plan row shows a layer's figures when its own source module
(`module`, from the same nn_module_stack) is one of them: a convolution's row and its ReLU's row
both show the layer that ends at the ReLU. A row of the model's own forward (a `torch.flatten`)
or of hidden work has no module and no colour; the layer table lists every layer.

The colour is the layer's "alone" SNR: the final output's SNR with only that layer quantized,
the one-layer-at-a-time figure that ranks where the accuracy goes. The bands are fixed, so two
reports read alike.
"""

from __future__ import annotations

import math

# (lowest SNR in dB, colour, label), best first: the overlay's legend.
SNR_BANDS = ((40.0, "#2e7d32", "40 dB or more"), (30.0, "#827717", "30 to 40 dB"),
             (20.0, "#ef6c00", "20 to 30 dB"), (-math.inf, "#c62828", "under 20 dB"))
EXACT_COLOUR = "#2e7d32"  # no error at all (an exact layer's SNR is infinite)


def snr_colour(snr_db: float | None) -> str:
    """The band colour of an SNR (None: exact, no error)."""
    if snr_db is None:
        return EXACT_COLOUR
    return next(colour for low, colour, _ in SNR_BANDS if snr_db >= low)


def source_text(report: dict) -> str:
    """What the figures are, for every legend: 'measured: per-layer error on N samples (...)'."""
    return (f"measured: per-layer error on {report['samples']} sample(s) ({report['inputs']}); "
            f"whole quantized reference vs float: SNR {_db(report['program_snr_db'])} dB")


def _db(value: float | None) -> str:
    return "exact" if value is None else f"{value:.1f}"


def _at(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} dB"


def row_layers(ops: list[dict], report: dict) -> dict[int, dict]:
    """Plan row index -> the layer (report JSON) whose source modules include the row's own;
    a module two layers name shows the worse of them."""
    by_module: dict[str, dict] = {}
    for layer in report["layers"]:
        for module in layer.get("modules", ()):
            held = by_module.get(module)
            if held is None or _worse(layer, held):
                by_module[module] = layer
    return {index: by_module[op["module"]] for index, op in enumerate(ops)
            if op.get("module") and op["module"] in by_module}


def _worse(layer: dict, other: dict) -> bool:
    mine, theirs = layer["alone_snr_db"], other["alone_snr_db"]
    return mine is not None and (theirs is None or mine < theirs)


def layer_tip(layer: dict) -> str:
    """The hover text of a coloured op."""
    return (f"layer {layer['where']}: final output SNR with only this layer quantized "
            f"{_db(layer['alone_snr_db'])} dB ({layer['share_of_error']:.1%} of the program's "
            f"output error power); SNR at its output {_at(layer['at_output_snr_db'])}; "
            f"clipped {layer['clipped']:.2%}; scale {layer['scale']:.4g}, zero point "
            f"{layer['zero_point']}")
