"""Public architectures (torchvision's code, random weights) through compile and verify on every
target a user would try: a cell per (model, target), each PASS on device code or a one-line
refusal, never a crash.

    python benchmarks/public_models.py --torchvision DIR [--torchvision DIR2 ...] [--models a,b]
        [--targets u55-128,m55]
        [--size 64] [--work DIR]

torchvision is not a dependency: `pip install --no-deps --target DIR torchvision==0.28.0 pillow`
gives the model code. Its compiled operators (`torchvision::nms`) do not load with torch 2.13, and
its package `__init__` registers fake kernels for them, so the factories below import the model
code without running that `__init__` (`_torchvision`); no model here calls those operators.

Inputs are 1x3xSxS images (`--size`, default 64: a microcontroller's camera, not ImageNet's 224),
seeded, uniform in [-1, 1); weights are torchvision's random initialisation under seed 0. Each
cell runs, as a user would:

    orchestrate compile benchmarks/public_models.py:NAME -o CELL.pte --npu NPU [--cpu CPU]
    orchestrate verify CELL.pte --qemu

and records the exit codes, the compile's NPU coverage and verify's verdict line. A cell is
PASS (verify --qemu exit 0), REFUSED (one line and a documented exit code: 2 user error, 5 not
run), FAIL (verify finds a numerical failure, exit 4) or CRASH (anything else: a traceback, a
signal). A program that does not fit its platform's memories (compile warns; verify says so in
one line and exits 4) is REFUSED.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGETS = {"u55-128": ["--npu", "ethos-u55-128"],
           "u85-256": ["--platform", "corstone320", "--npu", "ethos-u85-256"],
           "m55": ["--npu", "none"],
           "m4": ["--npu", "none", "--cpu", "cortex-m4"]}
MODELS = ("mobilenet_v2", "mobilenet_v3_small", "shufflenet_v2_x0_5", "squeezenet1_1",
          "mnasnet0_5", "efficientnet_b0")
SIZE = int(os.environ.get("PUBLIC_MODELS_SIZE", "64"))


def _without_init(package: str, install: str) -> None:
    """Make `package` importable without running its `__init__` (module docstring): a bare
    package module over its folder, so its submodules import as usual. `install` says how to
    get it when it is missing."""
    if package in sys.modules:
        return
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"{package} is not importable: {install}, and give DIR with "
                         "--torchvision")
    module = types.ModuleType(package)
    module.__path__ = list(spec.submodule_search_locations)
    module.__file__ = spec.origin
    sys.modules[package] = module


def _torchvision():
    """torchvision's model package, imported without the package `__init__`."""
    _without_init("torchvision", "pip install --no-deps --target DIR torchvision==0.28.0 pillow")
    import torchvision.models as models  # lazy: the stub above first

    return models


def _image():
    """The 1x3xSIZExSIZE input every image model takes: seeded, uniform in [-1, 1)."""
    import torch

    generator = torch.Generator().manual_seed(0)
    return torch.rand(1, 3, SIZE, SIZE, generator=generator) * 2 - 1


def _factory(name: str):
    def build():
        import torch

        torch.manual_seed(0)
        model = getattr(_torchvision(), name)(num_classes=10).eval()
        return model, (_image(),)

    build.__name__ = name
    build.__doc__ = f"torchvision's {name} (10 classes, random weights), 1x3x{SIZE}x{SIZE}"
    return build


for _name in MODELS:
    globals()[_name] = _factory(_name)


def _torchaudio_models():
    """torchaudio's model package, imported as torchvision's is (its compiled extension does not
    load with torch 2.13 either)."""
    _without_init("torchaudio", "pip install --no-deps --target DIR torchaudio")
    from torchaudio.models import wav2letter  # lazy: the stub above first

    return wav2letter


def wav2letter():
    """torchaudio's Wav2Letter over 13 MFCC features, 10 classes, 64 frames (23 M weights)."""
    import torch

    torch.manual_seed(0)
    model = _torchaudio_models().Wav2Letter(num_classes=10, input_type="mfcc",
                                            num_features=13).eval()
    generator = torch.Generator().manual_seed(0)
    return model, (torch.rand(1, 13, 64, generator=generator) * 2 - 1,)


def vit():
    """torchvision's VisionTransformer at a microcontroller's size: 64x64 images in 8x8
    patches, 2 encoder layers of 4 heads, width 64, MLP 128, 10 classes (nn.MultiheadAttention,
    LayerNorm, GELU: the public model code, the configuration ours)."""
    import torch

    _torchvision()
    from torchvision.models.vision_transformer import VisionTransformer  # lazy: the stub first

    torch.manual_seed(0)
    model = VisionTransformer(image_size=SIZE, patch_size=8, num_layers=2, num_heads=4,
                              hidden_dim=64, mlp_dim=128, num_classes=10).eval()
    # torchvision starts the head at zero (it is trained from there): every output would be 0,
    # which any program matches
    torch.nn.init.normal_(model.heads.head.weight, std=0.1)
    torch.nn.init.normal_(model.heads.head.bias, std=0.1)
    return model, (_image(),)


def _timm_factory(name: str):
    def build():
        import torch

        _without_init("torchvision", "pip install --no-deps --target DIR torchvision==0.28.0 "
                                     "pillow")
        try:
            import timm  # lazy: optional, and after the stub
        except ImportError:
            raise SystemExit("timm is not importable: pip install --no-deps --target DIR timm, "
                             "and give DIR with --torchvision") from None
        torch.manual_seed(0)
        return timm.create_model(name, num_classes=10, pretrained=False).eval(), (_image(),)

    build.__name__ = name
    build.__doc__ = f"timm's {name} (10 classes, random weights), 1x3x{SIZE}x{SIZE}"
    return build


# Beyond the first matrix: architectures no test here was written against.
LATER_TORCHVISION = ("regnet_x_400mf", "googlenet")
LATER_TIMM = ("mobilenetv4_conv_small", "lcnet_050")
for _name in LATER_TORCHVISION:
    globals()[_name] = _factory(_name)
for _name in LATER_TIMM:
    globals()[_name] = _timm_factory(_name)
# timm is not a dependency: `pip install --no-deps --target DIR timm`, given with --torchvision DIR
# (timm imports torchvision's transforms, which the stub serves)
mobilevit_xxs = _timm_factory("mobilevit_xxs")


def resnet1d():
    """A 1-D ResNet of basic blocks (Conv1d, BatchNorm1d, identity adds) over 256 samples: the
    newcomer's model of issue 61 (tests/peer_symptom_models.py)."""
    from tests.peer_symptom_models import resnet1d as build

    return build()


EXTRA = ("resnet1d", "wav2letter", "vit", "mobilevit_xxs", *LATER_TORCHVISION, *LATER_TIMM)


def _cell(name: str, target: str, work: Path, env: dict) -> dict:
    pte = work / f"{name}-{target}.pte"
    started = time.monotonic()
    compile_run = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "compile",
         f"{Path(__file__).resolve()}:{name}", "-o", str(pte), *TARGETS[target]],
        cwd=ROOT, capture_output=True, text=True, env=env)
    cell = {"model": name, "target": target, "compile_exit": compile_run.returncode,
            "compile": _last_line(compile_run.stderr if compile_run.returncode
                                  else compile_run.stdout)}
    if compile_run.returncode == 0:
        verify_run = subprocess.run(
            [sys.executable, "-m", "orchestrator.cli", "verify", str(pte), "--qemu"],
            cwd=ROOT, capture_output=True, text=True, env=env)
        cell["verify_exit"] = verify_run.returncode
        lines = (verify_run.stdout + verify_run.stderr).splitlines()
        cases = [line.strip() for line in lines if line.strip().startswith("case ")]
        verdict = [line for line in lines if "verdict" in line or "PASSED" in line
                   or "FAILED" in line or line.startswith("orchestrate:")]
        cell["verify"] = (verdict[-1].strip() if verdict else
                          f"{sum(': PASS' in c for c in cases)} of {len(cases)} cases PASS on "
                          f"QEMU ({cases[0].split(', ', 1)[-1]} in case 0)" if cases else
                          _last_line(verify_run.stderr))
        code = verify_run.returncode
    else:
        code = compile_run.returncode
    crashed = "Traceback" in compile_run.stderr or code < 0 or code == 1
    no_fit = "does not fit" in cell.get("verify", "") + cell["compile"]
    cell["outcome"] = ("PASS" if code == 0 else "CRASH" if crashed else
                       "REFUSED" if no_fit else
                       "FAIL" if code == 4 or "FAILED" in cell.get("verify", "") else "REFUSED")
    cell["seconds"] = round(time.monotonic() - started, 1)
    return cell


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--torchvision", type=Path, action="append", default=[],
                        help="a folder holding torchvision (pip install --no-deps --target DIR "
                        "torchvision==0.28.0 pillow) or torchaudio; repeatable")
    parser.add_argument("--models", default=",".join(MODELS + EXTRA))
    parser.add_argument("--targets", default=",".join(TARGETS))
    parser.add_argument("--size", type=int, default=SIZE)
    parser.add_argument("--work", type=Path, default=Path("public-models"))
    parser.add_argument("--json", type=Path, help="write the cells as JSON")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PUBLIC_MODELS_SIZE": str(args.size)}
    if args.torchvision:
        env["PYTHONPATH"] = os.pathsep.join(
            [*(str(d.resolve()) for d in args.torchvision), str(ROOT),
             env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    cells = []
    for name in args.models.split(","):
        for target in args.targets.split(","):
            cell = _cell(name, target, args.work, env)
            cells.append(cell)
            print(f"{name:<20} {target:<8} {cell['outcome']:<8} {cell['seconds']:>7.1f} s  "
                  f"{cell.get('verify') or cell['compile']}", flush=True)
            if args.json:
                args.json.write_text(json.dumps(cells, indent=1) + "\n")
    counts = {o: sum(c["outcome"] == o for c in cells) for o in ("PASS", "REFUSED", "FAIL", "CRASH")}
    print("cells: " + ", ".join(f"{v} {k}" for k, v in counts.items()))
    return 0 if not counts["CRASH"] and not counts["FAIL"] else 1


if __name__ == "__main__":
    sys.exit(main())
