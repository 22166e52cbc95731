"""Calibration that matches the data: the calibration method (`--calibration-method`), each
activation's scale and clipping rate in the plan, and the plan coloured by the measured
per-layer error; on the digits models trained here (examples/digits.py)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import jsonschema
import pytest
import torch

from orchestrator import api
from orchestrator.cli import main
from orchestrator.errors import UserError
from orchestrator.request import CALIBRATION_METHODS, Request

DIGITS = "examples/digits.py"


@pytest.fixture(scope="module")
def sets(tmp_path_factory):
    """(calibration.npz: 256 training images, validation.npz: the 360 held out, labelled)."""
    from examples.digits import write_sets

    return write_sets(tmp_path_factory.mktemp("digits"))


@pytest.fixture(scope="module")
def calibration(sets):
    return sets[0]


@pytest.fixture(scope="module")
def cnn_plans(calibration):
    """The digits CNN on the Ethos-U55-128, planned with upstream's histogram (the default) and
    with min-max calibration, on 256 training images."""
    return {method: api.plan(Request(f"{DIGITS}:cnn", npu="ethos-u55-128",
                                     calibration=str(calibration), calibration_method=method))
            for method in ("histogram", "minmax")}


def _scales(plan) -> dict[str, float]:
    return {p.node: p.scale for p in plan.summary.activation_ranges.points}


def test_the_default_calibration_method_is_upstreams_own_config():
    """Without the option the quantizers get upstream's configs themselves (the same objects),
    so a program compiled before the option existed compiles to the same bytes
    (tests/test_golden.py checks the zoo's)."""
    from executorch.backends.arm.quantizer import get_symmetric_quantization_config
    from executorch.backends.cortex_m.quantizer import quantization_configs as configs

    from orchestrator.compilation import observers

    assert Request("x").calibration_method == "histogram"
    assert observers.ethos_u_config("histogram") is \
        get_symmetric_quantization_config(is_per_channel=True)
    held = [p.quantization_config for p in observers.cortex_m_quantizer("histogram").quantizers
            if hasattr(p, "quantization_config")]
    assert held == [configs.INT8_PER_CHANNEL_CONFIG, configs.INT8_PER_TENSOR_CONFIG]
    assert all(observers.contract().values()), observers.contract()


def test_minmax_swaps_only_the_activation_observer():
    from executorch.backends.cortex_m.quantizer import quantization_configs as configs
    from torchao.quantization.pt2e import MinMaxObserver, PerChannelMinMaxObserver

    from orchestrator.compilation import observers

    config = observers.ethos_u_config("minmax")
    assert config.output_activation.observer_or_fake_quant_ctr.p.func is MinMaxObserver
    assert config.output_activation.observer_or_fake_quant_ctr.p.keywords == {"eps": 2 ** -16}
    assert config.input_activation is config.output_activation  # shared, as upstream's are
    assert config.weight.observer_or_fake_quant_ctr.p.func is PerChannelMinMaxObserver
    per_channel, per_tensor = [p.quantization_config for p in
                               observers.cortex_m_quantizer("minmax").quantizers
                               if hasattr(p, "quantization_config")]
    assert per_channel.output_activation is per_tensor.input_activation
    assert per_tensor.output_activation.observer_or_fake_quant_ctr is MinMaxObserver
    assert per_channel.weight is configs.INT8_PER_CHANNEL_CONFIG.weight
    assert type(per_channel) is type(configs.INT8_PER_CHANNEL_CONFIG)  # its softmax/pool rules


def test_histogram_and_minmax_choose_different_scales(cnn_plans):
    histogram, minmax = (_scales(cnn_plans[m]) for m in ("histogram", "minmax"))
    assert histogram.keys() == minmax.keys() == {"x", "relu", "relu_1", "flatten", "linear"}
    differ = {node for node in histogram if abs(histogram[node] - minmax[node]) > 1e-6}
    assert {"relu", "relu_1"} <= differ, (histogram, minmax)
    # histogram trims the ReLUs' tails: a smaller scale than the whole range min-max keeps
    assert histogram["relu_1"] < minmax["relu_1"] * 0.99
    assert len(cnn_plans["histogram"].compiled.pte_bytes) == \
        len(cnn_plans["minmax"].compiled.pte_bytes)
    assert cnn_plans["histogram"].compiled.pte_bytes != cnn_plans["minmax"].compiled.pte_bytes


def _recounted(plan, samples) -> dict[str, tuple[int, int]]:
    """Clipped and total float values at each point, recounted from the float model's own
    intermediate values (torch.fx.Interpreter) and the quantized reference's quantize nodes."""
    float_module = plan.compiled.captured.program.module(check_guards=False)
    quantized = plan.compiled.quantized.program.module(check_guards=False)
    qparams = {n.args[0].name: n.args[1:5] for n in quantized.graph.nodes
               if "quantize_per_tensor" in str(n.target) and "dequantize" not in str(n.target)
               and isinstance(n.args[0], torch.fx.Node)}
    counts = {name: [0, 0] for name in qparams}
    for sample in samples:
        env = {}

        class Keep(torch.fx.Interpreter):
            def run_node(self, node):
                env[node.name] = super().run_node(node)
                return env[node.name]

        with torch.no_grad():
            Keep(float_module).run(*sample)
        for name, (scale, zero_point, low, high) in qparams.items():
            codes = torch.round(env[name] / scale) + zero_point
            counts[name][0] += int(((codes < low) | (codes > high)).sum())
            counts[name][1] += env[name].numel()
    return {name: tuple(c) for name, c in counts.items()}


@pytest.mark.parametrize("method", ["histogram", "minmax"])
def test_the_reported_clipping_rate_is_a_recount(cnn_plans, method):
    plan = cnn_plans[method]
    ranges = plan.summary.activation_ranges
    assert (ranges.method, ranges.samples) == (method, 256)
    recount = _recounted(plan, plan.compiled.calibration.samples)
    for point in ranges.points:
        assert (point.clipped, point.values) == recount[point.node], point
        assert point.clipping_rate == recount[point.node][0] / recount[point.node][1]
    if method == "minmax":  # its range is every calibration value's
        assert all(point.clipped == 0 for point in ranges.points)
    else:  # 3 of the first ReLU's 131,072 values and 5 of the second's 65,536
        assert {p.node: p.clipped for p in ranges.points} == \
            {"x": 0, "relu": 3, "relu_1": 5, "flatten": 5, "linear": 0}
    document = plan.to_json()
    assert document["calibration"]["method"] == method
    jsonschema.validate(document, json.loads(
        (Path(__file__).parents[1] / "orchestrator/reports/plan.schema.json").read_text()))
    by_node = {p["node"]: p for p in document["summary"]["activation_ranges"]["points"]}
    for point in ranges.points:
        assert by_node[point.node]["clipping_rate"] == point.clipping_rate
        assert by_node[point.node]["scale"] == point.scale
    text = plan.to_text()
    assert f"activation ranges ({method} calibration on 256 sample(s)" in text
    relu = next(p for p in ranges.points if p.node == "relu_1")
    assert f"{relu.clipping_rate:.2%}" in text.split("activation ranges")[1]
    page = plan.to_html()
    assert "<h2>Activation ranges</h2>" in page and f"{relu.scale:.4g}" in page


def test_the_method_is_part_of_the_cache_key(calibration):
    from orchestrator.artifacts.cache import quantized_key
    from orchestrator.sources.loader import load_calibration, load_model
    from orchestrator.target import resolve_target

    model = load_model(f"{DIGITS}:mlp")
    samples = load_calibration(str(calibration), model.example_inputs)
    target = resolve_target("corstone300", npu="none")
    keys = {m: quantized_key(model, replace(samples, method=m), target, True)
            for m in CALIBRATION_METHODS}
    assert len(set(keys.values())) == len(CALIBRATION_METHODS)


def test_a_cpu_only_program_is_calibrated_by_the_method(calibration, tmp_path):
    """CPU-only (CortexMQuantizer): min-max clips none of the calibration values, the program
    compiles and the manifest records the method."""
    plan = api.plan(Request(f"{DIGITS}:mlp", npu="none", calibration=str(calibration),
                            calibration_method="minmax"))
    ranges = plan.summary.activation_ranges
    assert ranges.method == "minmax" and len(ranges.points) >= 3
    assert all(point.clipped == 0 and point.values > 0 for point in ranges.points)
    written = api.write_program(plan, tmp_path / "mlp.pte")
    manifest = json.loads((written.artifacts / "manifest.json").read_text())
    assert manifest["calibration"]["method"] == "minmax"


def test_generated_samples_report_no_ranges():
    """Generated samples say nothing about the data: no ranges, and plan.json as before."""
    plan = api.plan(Request(f"{DIGITS}:mlp", npu="none"))
    assert plan.compiled.calibration.generated and plan.summary.activation_ranges is None
    assert "activation_ranges" not in plan.to_json()["summary"]
    assert "activation ranges" not in plan.to_text()


def test_a_calibration_method_not_offered_is_one_line_exit_2(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["plan", f"{DIGITS}:cnn", "--calibration-method", "percentile"])
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "--calibration-method" in error and "'percentile'" in error
    with pytest.raises(UserError, match="histogram, minmax, moving-average"):
        api.plan(Request(f"{DIGITS}:cnn", calibration_method="percentile"))


def test_per_layer_error_colours_the_plan_and_the_explorer_overlay(cnn_plans, sets, tmp_path,
                                                                   capsys):
    from orchestrator.reports.layer_error_overlay import snr_colour

    pte = tmp_path / "cnn.pte"
    api.write_program(cnn_plans["histogram"], pte)
    page, overlay = tmp_path / "cnn.html", tmp_path / "cnn-explorer.json"
    assert main(["verify", str(pte), "--per-layer-error", "--dataset", str(sets[1]),
                 "--samples", "64", "--format", "json", "--html", str(page),
                 "--model-explorer", str(overlay)]) == 0
    out = capsys.readouterr().out
    report = json.loads(out[out.index("{"):])
    layers = {layer["node"]: layer for layer in report["layers"]}
    html = page.read_text()
    assert "measured: per-layer error on 64 sample(s)" in html
    ops = json.loads((pte.with_suffix(".artifacts") / "plan.json").read_text())["ops"]
    # every op of a layer's modules carries its layer's SNR, in its band's colour
    for node, modules in (("relu", {"features.0", "features.1"}),
                          ("relu_1", {"features.2", "features.3"}), ("linear", {"classifier"})):
        snr = layers[node]["alone_snr_db"]
        assert set(layers[node]["modules"]) == modules
        cell = (f"data-value=\"{snr:.3f}\" style=\"background:{snr_colour(snr)};color:#fff\"")
        assert html.count(cell) == sum(op["module"] in modules for op in ops) >= 1, node
    # on held-out images the classifier clips: its band is not the convolutions'
    assert layers["linear"]["clipped"] > 0 and layers["linear"]["alone_snr_db"] < 40
    assert snr_colour(layers["linear"]["alone_snr_db"]) != snr_colour(layers["relu"]["alone_snr_db"])
    # one NPU partition: one delegate call, at the worst SNR of its layers
    nodes = json.loads(overlay.read_text())
    (graph,) = nodes.values()
    worst = min(layer["alone_snr_db"] for layer in report["layers"] if layer["modules"])
    assert list(graph["results"].values()) == [{"value": round(worst, 2),
                                                "bgColor": snr_colour(worst)}]


def test_html_without_per_layer_error_is_refused(tmp_path, capsys):
    assert main(["verify", str(tmp_path / "x.pte"), "--html", str(tmp_path / "x.html")]) == 2
    assert "add --per-layer-error" in capsys.readouterr().err
