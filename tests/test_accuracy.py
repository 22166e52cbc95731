"""`verify --dataset`: accuracy against labels on models trained here (examples/digits.py,
scikit-learn's bundled digits), by the float model, the quantized reference, the twin, the host
runtime and QEMU, on an NPU target and CPU-only; the accuracy gates; a labelled set read as
data."""

from __future__ import annotations

import json

import numpy as np
import pytest

from orchestrator.cli import main
from tests.device_tools import host_runtime_or_missing, qemu_or_missing

DIGITS = "examples/digits.py"
SAMPLES = "120"  # of the 360 held out: enough to tell a trained model from a broken one


@pytest.fixture(scope="module")
def sets(tmp_path_factory):
    from examples.digits import write_sets

    return write_sets(tmp_path_factory.mktemp("digits"))


@pytest.fixture(scope="module")
def programs(sets, tmp_path_factory):
    """The CNN on the Ethos-U55-128 and the MLP CPU-only on the Cortex-M55, calibrated on
    training images."""
    folder = tmp_path_factory.mktemp("digits-programs")
    built = {}
    for name, factory, npu in (("cnn-u55", "cnn", "ethos-u55-128"), ("mlp-m55", "mlp", "none")):
        pte = folder / f"{name}.pte"
        assert main(["compile", f"{DIGITS}:{factory}", "--npu", npu, "--calibration",
                     str(sets[0]), "-o", str(pte), "--quiet"]) == 0
        built[name] = pte
    return built


def _report(capsys, *args) -> tuple[int, dict]:
    code = main(["verify", *map(str, args), "--format", "json"])
    out = capsys.readouterr().out
    return code, json.loads(out[out.index("{"):])


@pytest.mark.parametrize("name", ["cnn-u55", "mlp-m55"])
def test_a_trained_model_keeps_its_accuracy_on_every_method(programs, sets, capsys, name):
    host_runtime_or_missing().close()
    qemu_or_missing()
    code, report = _report(capsys, programs[name], "--dataset", sets[1], "--samples", SAMPLES)
    assert code == 0, report["verdict"]
    by = {m["method"]: m for m in report["methods"]}
    assert set(by) == {"float model", "quantized reference", "twin", "host runtime",
                       "QEMU Cortex-M55"}
    assert by["float model"]["top1_pct"] >= 85  # the model learnt the digits
    for method in ("quantized reference", "twin", "host runtime"):
        assert by[method]["samples"] == int(SAMPLES)
        assert abs(by[method]["top1_pct"] - by["float model"]["top1_pct"]) <= 3, by[method]
    assert by["host runtime"]["note"].startswith("every output byte-equal to the twin's")
    # the host computes CMSIS-NN's C path, not the M55's MVE form: its row says so
    assert by["host runtime"]["label"] == "host runtime (C path)"
    assert by["QEMU Cortex-M55"]["label"] == "QEMU Cortex-M55"
    assert by["QEMU Cortex-M55"]["samples"] == 4
    assert "BundleIO byte-exact against the twin" in by["QEMU Cortex-M55"]["note"]
    # the device's figures are the twin's for the M55's own (MVE) kernels
    assert report["judge"] == "twin" and report["outcome"] == "passed"
    per_class = by["twin"]["per_class"]
    assert sum(c["samples"] for c in per_class.values()) == int(SAMPLES)


def test_an_accuracy_budget_the_program_misses_exits_4(programs, sets, capsys):
    code = main(["verify", str(programs["mlp-m55"]), "--dataset", str(sets[1]), "--samples",
                 "40", "--runtime", "twin", "--min-accuracy", "99.9"])
    captured = capsys.readouterr()
    assert code == 4
    assert "--min-accuracy 99.9%" in captured.err and captured.err.count("\n") == 1
    code = main(["verify", str(programs["mlp-m55"]), "--dataset", str(sets[1]), "--samples",
                 "40", "--runtime", "twin", "--min-accuracy", "50", "--max-accuracy-drop", "20"])
    assert code == 0, capsys.readouterr().out


def test_without_labels_the_error_against_the_float_model_is_reported(programs, sets, capsys):
    code, report = _report(capsys, programs["mlp-m55"], "--dataset", sets[1], "--labels",
                           "none", "--samples", "20", "--runtime", "twin")
    assert code == 0 and report["labelled"] is False
    twin = next(m for m in report["methods"] if m["method"] == "twin")
    assert twin["top1_pct"] is None and twin["snr_db_vs_float"] > 10
    assert twin["max_abs_error_vs_float"] > 0


def test_a_labelled_set_is_checked_as_data(programs, sets, tmp_path, capsys):
    pte = str(programs["mlp-m55"])
    assert main(["verify", pte, "--dataset", str(sets[1]), "--labels", "target"]) == 2
    assert "has no array named 'target' (input0, labels)" in capsys.readouterr().err
    short = tmp_path / "short.npz"
    with np.load(sets[1]) as data:
        np.savez(short, input0=data["input0"][:10], labels=data["labels"][:9])
    assert main(["verify", pte, "--dataset", str(short)]) == 2
    assert "10 samples and 9 labels" in capsys.readouterr().err
    floats = tmp_path / "floats.npz"
    with np.load(sets[1]) as data:
        np.savez(floats, input0=data["input0"][:4], labels=data["labels"][:4] + 0.5)
    assert main(["verify", pte, "--dataset", str(floats)]) == 2
    assert "save one integer class per sample" in capsys.readouterr().err
    assert main(["verify", pte, "--min-accuracy", "90"]) == 2
    assert "add --dataset FILE" in capsys.readouterr().err


def test_the_per_layer_error_ranks_the_layers_of_a_trained_model(programs, sets, capsys):
    """Every activation quantization point with the int8 weights that compute it, worst first;
    on the digits CNN the quantized logits (the classifier's output) carry most of the error:
    quantized alone they explain over half of the whole program's error power."""
    code, report = _report(capsys, programs["cnn-u55"], "--per-layer-error", "--dataset",
                           sets[1], "--samples", "60")
    assert code == 0
    layers = report["layers"]
    assert len(layers) == 5
    shares = [layer["share_of_error"] for layer in layers]
    assert shares == sorted(shares, reverse=True) and shares[0] > 0.5
    top = layers[0]
    assert top["node"] == "linear" and top["weights"] == ["linear"]
    assert abs(top["alone_snr_db"] - report["program_snr_db"]) < 3
    assert {layer["node"] for layer in layers} == {"x", "relu", "relu_1", "flatten", "linear"}
    conv = next(layer for layer in layers if layer["node"] == "relu")
    assert conv["weights"] == ["conv2d"] and conv["at_output_snr_db"] > 20
    # calibrated on training images of the same kind: the input's range holds every value
    x = next(layer for layer in layers if layer["node"] == "x")
    assert x["clipped"] == 0 and 0 <= max(layer["clipped"] for layer in layers) < 0.05


def test_the_per_layer_error_of_a_conv_whose_batchnorm_was_folded(tmp_path, capsys):
    """Conv2d(bias=False) + BatchNorm2d with no activation (every MobileNetV2 projection): the
    quantized reference folds the BatchNorm into the convolution (a bias appears), the float
    model keeps both. The report used to raise IndexError (the folded bias had no argument to
    replace), and before that ranked the layer with shares of thousands of percent (its folded
    weights fed to the unfolded BatchNorm, its output rounded before it)."""
    import orchestrator

    model = tmp_path / "bn.py"
    model.write_text(
        "import torch\nfrom torch import nn\n\n\nclass M(nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n"
        "        self.conv = nn.Conv2d(8, 16, 1, bias=False)\n        self.bn = nn.BatchNorm2d(16)\n"
        "        self.conv2 = nn.Conv2d(16, 8, 3, padding=1)\n\n"
        "    def forward(self, x):\n        return self.conv2(self.bn(self.conv(x)))\n\n\n"
        "def model():\n    torch.manual_seed(0)\n    m = M()\n    with torch.no_grad():\n"
        "        m.bn.running_mean.uniform_(-1, 1)\n        m.bn.running_var.uniform_(0.5, 2)\n"
        "        m.bn.weight.uniform_(0.5, 2)\n    return m.eval(), (torch.randn(1, 8, 8, 8),)\n")
    pte = tmp_path / "bn.pte"
    orchestrator.compile(f"{model}:model", pte, npu="none")
    code, report = _report(capsys, pte, "--per-layer-error")
    assert code == 0
    conv = next(layer for layer in report["layers"] if layer["weights"] == ["conv2d"])
    assert conv["at_output_snr_db"] > 25 and conv["alone_snr_db"] > 25
    assert all(0 <= layer["share_of_error"] <= 1 for layer in report["layers"])
