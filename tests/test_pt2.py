"""A saved `.pt2` ExportedProgram as a model: it compiles and verifies like any other source."""

from __future__ import annotations

import torch
from torch import nn

from orchestrator.cli import main
from orchestrator.sources.loader import load_model


class _SmallConv(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x)))
        return self.head(y.mean((2, 3)))


def _small_conv() -> nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        module = _SmallConv()
        with torch.no_grad():
            module.bn.running_mean.normal_(0.0, 0.1)
            module.bn.running_var.uniform_(0.5, 1.5)
    return module


def _files(folder) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


def test_static_pt2_compiles_and_verifies(tmp_path, capsys):
    source = tmp_path / "small.pt2"
    torch.export.save(torch.export.export(_small_conv().eval(), (torch.randn(1, 3, 16, 16),)),
                      source)
    pte = tmp_path / "small.pte"

    assert main(["compile", str(source), "--npu", "none", "-o", str(pte)]) == 0
    assert pte.is_file() and (tmp_path / "small.artifacts" / "manifest.json").is_file()
    assert main(["verify", str(pte), "--samples", "2"]) == 0
    assert "verify" in capsys.readouterr().out


def test_pt2_with_a_dynamic_batch_is_refused_asking_for_static_shapes(tmp_path, capsys):
    source = tmp_path / "dynamic.pt2"
    program = torch.export.export(_small_conv().eval(), (torch.randn(2, 3, 16, 16),),
                                  dynamic_shapes=({0: torch.export.Dim("batch")},))
    torch.export.save(program, source)
    before = _files(tmp_path)

    assert main(["compile", str(source), "--npu", "none", "-o", str(tmp_path / "d.pte")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("orchestrate: error: ")
    assert "input 'x' has a dynamic dimension 0" in err and "export with static shapes" in err
    assert _files(tmp_path) == before


def test_loaded_pt2_module_accepts_eval_and_keeps_its_outputs(tmp_path):
    module = _small_conv().eval()
    example = torch.randn(1, 3, 16, 16)
    path = tmp_path / "small.pt2"
    torch.export.save(torch.export.export(module, (example,)), path)

    loaded = load_model(str(path))

    assert loaded.module.eval() is loaded.module and not loaded.module.training
    torch.testing.assert_close(loaded.module(example), module(example))


def test_pt2_exported_in_training_mode_runs_as_its_eval_mode_model(tmp_path):
    module = nn.Sequential(_small_conv(), nn.Dropout(0.5))
    example = torch.randn(1, 3, 16, 16)
    path = tmp_path / "train.pt2"
    torch.export.save(torch.export.export(module.train(), (example,)), path)

    loaded = load_model(str(path))

    # Batch statistics and active dropout would make two runs differ from the eval model.
    torch.testing.assert_close(loaded.module(example), module.eval()(example))
