"""An on-disk cache of capture + quantization, keyed by content.

Capture and quantization take most of a small model's compile (DS-CNN: about 5 s and 8 s of
20 s here), and they depend on neither the NPU size nor a placement policy: one quantized
program serves every Ethos-U55/U65 configuration of a sweep, and a re-plan with a changed
policy. The key is a SHA-256 over everything they read:

- the model: the source of every module class in it (or a GraphModule's code, or a .pt2's
  bytes), every submodule's plain settings (stride, padding, a scale: what a constructor
  argument sets), every parameter and buffer (bytes), the example inputs' shapes and dtypes;
- the calibration samples (bytes), the calibration method (the activation observer:
  orchestrator/compilation/observers.py) and the modules' precisions (--precision:
  orchestrator/compilation/precision.py);
- the quantizer: EthosUQuantizer with the NPU family's TOSA specification, or CortexMQuantizer;
- the export layout (channels_last), the torch / executorch / torchao versions, and the host
  numerics settings (orchestrator/numerics.py);
- the source of the project's own rewrites before quantizing (REWRITE_SOURCES): an entry made
  before a change to them is not served after it.

A model whose class source cannot be read is not cached. Entries are written atomically and read
back with the same safe loader as any `.pt2` (orchestrator/sources/loader.py). `ORCHESTRATE_CACHE=off`
disables the cache; `ORCHESTRATE_CACHE=/path` moves it (default: $ORCHESTRATE_CACHE_DIR, the root
the host-runtime and firmware builds are cached in too, else $XDG_CACHE_HOME/orchestrate or
~/.cache/orchestrate). Entries are content-addressed files, so a shared folder serves several
machines.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import os
import shutil
import sys
import tempfile
from importlib import metadata
from pathlib import Path

import torch

from kernels.cache_root import cache_root
from orchestrator import numerics
from orchestrator.artifacts.pt2_bytes import pt2_bytes, remember
from orchestrator.errors import UserError
from orchestrator.sources.pt2 import read_exported_program
from orchestrator.target import compile_spec
from orchestrator.termination import removed_on_stop
from orchestrator.compilation import recurrent_steps, shared_constants
from partitioners import module_forms, quantizable, repeated_steps
from partitioners.records import Workaround

FORMAT = "3"  # 2: entries carry the SHA-256 of their files; 3: and the rewrites made before quantizing


_ROOT = Path(__file__).resolve().parents[2]
# The project's code that shapes what capture + quantization produce (model-level legalizations,
# pre-quantization rewrites, the capture and quantize stages): part of the key, so an entry made
# before a change to any of them is never served after it.
REWRITE_SOURCES = ("partitioners/quantizable.py", "partitioners/legalize.py",
                   "orchestrator/compilation/pipeline.py",
                   "orchestrator/compilation/observers.py",
                   "orchestrator/compilation/precision.py",
                   "orchestrator/compilation/program_state.py",
                   "orchestrator/compilation/file_quantization.py",
                   "orchestrator/sources/tflite_module.py",
                   "orchestrator/sources/tflite_pools.py",
                   "orchestrator/sources/onnx_module.py")


def cache_dir() -> Path | None:
    setting = os.environ.get("ORCHESTRATE_CACHE", "")
    if setting.lower() in ("off", "0", "no", "false"):
        return None
    if setting:
        return Path(setting)
    return cache_root()  # the same root as the host-runtime and firmware build caches


def _module_code(module: torch.nn.Module) -> bytes | None:
    sources = []
    seen: set[type] = set()
    for sub in module.modules():
        if isinstance(sub, torch.fx.GraphModule):
            sources.append(sub.code)
            continue
        # Each class's source once: which module is which class, in which order, is in
        # _module_config; reading torch's Conv2d source again per layer cost seconds.
        if type(sub) in seen:
            continue
        seen.add(type(sub))
        try:
            sources.append(inspect.getsource(type(sub)))
        except (OSError, TypeError):
            return None
    return "\n".join(sources).encode()


_PLAIN = (int, float, str, bool, type(None))


def _plain(value) -> bool:
    if isinstance(value, _PLAIN):
        return True
    return isinstance(value, (tuple, list)) and all(_plain(v) for v in value)


def _module_config(module: torch.nn.Module) -> bytes:
    """Every submodule's own settings that are neither code nor tensors: a ConvTranspose2d's
    stride and padding, a user module's `self.scale = 2.0`. Two factories building one class
    with other constructor arguments (`nn.ConvTranspose2d(4, 2, 4, stride=2, padding=0)` and
    `padding=1`: the same source, the same weight shapes) shared one cache entry without them."""
    lines = []
    for name, sub in module.named_modules():
        settings = sorted((key, repr(value)) for key, value in vars(sub).items()
                          if not key.startswith("_") and _plain(value))
        lines.append(f"{name}:{type(sub).__qualname__}:{settings}")
    return "\n".join(lines).encode()


def _tensor_bytes(tensor: torch.Tensor) -> bytes:
    tensor = tensor.detach().cpu().contiguous()
    header = f"{tensor.dtype}{tuple(tensor.shape)}".encode()
    if not tensor.numel():
        return header
    return header + tensor.reshape(-1).view(torch.uint8).numpy().tobytes()


@functools.lru_cache(maxsize=1)
def _rewrites_digest() -> str:
    """The code of the rewrites before capture and quantization (partitioners/module_forms.py,
    partitioners/quantizable.py) and of the merge after it
    (orchestrator/compilation/shared_constants.py), and the tying of a recurrence's steps to one
    quantization (orchestrator/compilation/recurrent_steps.py, partitioners/repeated_steps.py):
    a changed rewrite changes what the quantizer sees, and the merge and the tying what is
    stored, so they are part of the key."""
    digest = hashlib.sha256()
    for module in (module_forms, quantizable, shared_constants, recurrent_steps, repeated_steps):
        digest.update(Path(module.__file__).read_bytes())
    return digest.hexdigest()[:16]


def quantizer_config(target) -> str:
    rewrites = f"rewrites:{_rewrites_digest()}"
    if not target.npu:
        return f"CortexMQuantizer+{rewrites}:{target.tier}"
    return f"EthosUQuantizer:{compile_spec(target).tosa_spec}:per-channel-symmetric+{rewrites}"


def quantized_key(model, calibration, target, channels_last: bool,
                  rewrites: bool = True, per_step: bool = True) -> str | None:
    """The cache key of capture + quantization, or None when the model cannot be keyed."""
    code = _module_code(model.module)
    if code is None:
        return None
    digest = hashlib.sha256()
    digest.update(f"orchestrate-cache {FORMAT}\n".encode())
    digest.update(code)
    digest.update(_module_config(model.module))
    if model.source.startswith("pt2:"):
        digest.update(Path(model.source[4:]).read_bytes())
    for prefix in ("tflite:", "onnx:"):  # the rebuilt module's closures hold the options
        if model.source.startswith(prefix):
            digest.update(Path(model.source[len(prefix):]).read_bytes())
    if getattr(model, "quantization", None) is not None:
        digest.update(model.quantization.digest_text().encode())
    for name, tensor in [*model.module.state_dict().items()]:
        digest.update(name.encode())
        digest.update(_tensor_bytes(tensor))
    for x in model.example_inputs:
        digest.update(f"input {x.dtype} {tuple(x.shape)}".encode())
    for sample in calibration.samples:
        for x in sample:
            digest.update(_tensor_bytes(x))
    digest.update(f"calibration method {calibration.method}".encode())
    if calibration.precision:  # without it the key is the one made before precisions existed
        digest.update(f"precision {sorted(calibration.precision)}".encode())
    digest.update(quantizer_config(target).encode())
    if not per_step:  # a policy's `recurrences: whole`: each step quantized on its own
        digest.update(b"recurrences whole")
    if not rewrites:  # compile(legalize=False): upstream's quantization, without our rewrites
        digest.update(b"no pre-quantization rewrites")
    digest.update(f"channels_last={channels_last}".encode())
    for source in REWRITE_SOURCES:  # our own rewrites before quantizing: a change re-keys
        path = _ROOT / source
        digest.update(path.read_bytes() if path.is_file() else f"no {source}".encode())
    for package in ("torch", "executorch", "torchao"):
        digest.update(f"{package}={metadata.version(package)}".encode())
    digest.update(repr(sorted(numerics.state()["settings"].items())).encode())
    return digest.hexdigest()


_FILES = ("float.pt2", "quantized.pt2", "workarounds.json")
_DIGESTS = "sha256.json"


def _digests(folder: Path) -> dict[str, str]:
    return {name: hashlib.sha256((folder / name).read_bytes()).hexdigest() for name in _FILES}


def _discard(entry: Path, why: str) -> None:
    print(f"orchestrate: warning: cache entry {entry.name[:16]} discarded ({why}); it is "
          "recomputed and replaced", file=sys.stderr)
    shutil.rmtree(entry, ignore_errors=True)


def load(key: str):
    """(float program, quantized program, pre-quantization workarounds) from the cache, or None.
    An entry whose files do not match the SHA-256 recorded when it was written, or that does not
    load, is discarded with a warning (the caller recomputes it and `store` writes it again)."""
    folder = cache_dir()
    entry = folder / "quantized" / key if folder else None
    if entry is None or not entry.is_dir():
        return None
    try:
        recorded = json.loads((entry / _DIGESTS).read_text())
        if recorded != _digests(entry):
            _discard(entry, "its files do not match their recorded SHA-256")
            return None
    except (OSError, ValueError):
        _discard(entry, "incomplete")
        return None
    # The quantized programs hold quantized_decomposed ops: their library must be registered
    # before deserializing (a CPU-only compile never imported it before reading the cache).
    import torchao.quantization.pt2e.quantize_pt2e  # noqa: F401  # lazy: heavy (torchao)
    from executorch.exir.dialects._ops import ops  # noqa: F401  # lazy: heavy (executorch)

    try:
        remedy = f"delete {entry} (a damaged cache entry)"

        fixes = tuple(Workaround(*(str(part) for part in fix)) for fix in
                      json.loads((entry / "workarounds.json").read_text()))
        programs = []
        for name in ("float.pt2", "quantized.pt2"):
            data = (entry / name).read_bytes()
            if hashlib.sha256(data).hexdigest() != recorded.get(name):
                _discard(entry, "its files changed since their SHA-256 was checked")
                return None
            program = read_exported_program(entry / name, remedy, data)
            remember(program, data)  # the artifacts reuse the entry's own bytes
            programs.append(program)
        return (*programs, fixes)
    except (UserError, OSError, ValueError, TypeError) as error:
        _discard(entry, f"it does not load: {str(error)[:120]}")
        return None


def store(key: str, float_program, quantized_program, workarounds=()) -> None:
    """Write an entry atomically; a cache that cannot be written is skipped silently."""
    folder = cache_dir()
    if folder is None:
        return
    final = folder / "quantized" / key
    if final.exists():
        return
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        with removed_on_stop(lambda: tempfile.mkdtemp(prefix=".entry-", dir=final.parent)) \
                as tmp:
            (tmp / "float.pt2").write_bytes(pt2_bytes(float_program))
            (tmp / "quantized.pt2").write_bytes(pt2_bytes(quantized_program))
            (tmp / "workarounds.json").write_text(json.dumps(
                [[fix.node, fix.upstream, fix.message] for fix in workarounds]))
            (tmp / _DIGESTS).write_text(json.dumps(_digests(tmp)))
            os.replace(tmp, final)
    except OSError:
        shutil.rmtree(locals().get("tmp", final.parent / ".none"), ignore_errors=True)
