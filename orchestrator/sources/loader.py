"""Where models and calibration data come from: one loader for every form a user can name.

Model specs, tried in this order:
  - a zoo name (`ds-cnn`, `ds_cnn`, ...; see examples/zoo.py);
  - `path/to/file.py:factory`, where `factory()` returns `(nn.Module, example_inputs)`;
  - `path/to/file.py` defining `ModelUnderTest` (a module instance) and `ModelInputs` (a tuple
    of tensors), the convention of ExecuTorch's backends/arm/scripts/aot_arm_compiler.py;
  - `path/to/program.pt2`, an ExportedProgram saved with torch.export.save, loaded as data: a
    model .py is code and runs, a .pt2 never runs anything (orchestrator/sources/pt2.py);
  - `path/to/model.tflite`, a TFLite flatbuffer read as data and rebuilt as a module with the
    file's weights and, for a full-integer file, its quantization (tflite_file.py,
    tflite_module.py).

Data a user gives beside the model: calibration samples (`load_calibration`) and labelled sets
to measure accuracy on (`load_dataset`).

Every way a spec or a calibration file can be wrong raises `UserError` with one line that names
the offender and says what to do; nothing here lets a raw traceback reach the user.
"""

import importlib.util
import re
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from examples import zoo
from orchestrator.errors import UserError, describe_error, one_line
from orchestrator.sources.pt2 import read_exported_program
from orchestrator.sources.onnx_module import build_onnx
from orchestrator.sources.specs import model_spec
from orchestrator.sources.tflite_file import read_tflite
from orchestrator.sources.tflite_module import build
from partitioners.module_forms import buffers_kept

_CALIBRATION_SUFFIXES = (".pt", ".pth", ".npz")
_NPZ_INPUT_KEY = re.compile(r"input(\d+)")
@dataclass(frozen=True)
class LoadedModel:
    """An eval-mode module with the example inputs it is exported with, and where it came from."""

    name: str
    module: nn.Module
    example_inputs: tuple[Tensor, ...]
    source: str  # e.g. "zoo:ds-cnn", "file:/abs/p.py:factory", "pt2:/abs/x.pt2"
    kind: str  # "classifier" | "autoencoder" | "detector" | "unknown"
    notes: tuple[str, ...] = ()  # what loading changed that the user should know (train mode)
    # A full-integer .tflite's own quantization (orchestrator/sources/tflite_module.py): the
    # quantize stage pins every tensor the file quantizes to the file's scale and zero point.
    quantization: Any = None


@dataclass(frozen=True)
class Calibration:
    """Samples for post-training quantization, each a tuple with one tensor per model input."""

    samples: tuple[tuple[Tensor, ...], ...]
    generated: bool
    source: str
    warning: str | None
    # How the quantizer turns them into ranges (orchestrator/compilation/observers.py).
    method: str = "histogram"
    # Modules given another precision than int8, ((module, "a16w8"), ...): which dtype the
    # quantizer gives their activations (orchestrator/compilation/precision.py).
    precision: tuple[tuple[str, str], ...] = ()


def load_model(spec: str) -> LoadedModel:
    """Resolve a model spec (see the module docstring) into a `LoadedModel`."""
    form = model_spec(spec)
    if form.kind == "zoo":
        entry = zoo.lookup(form.name)
        module, example_inputs = entry.factory()
        return LoadedModel(entry.name, module, example_inputs, f"zoo:{entry.name}", entry.kind)
    if form.kind == "factory":
        return _load_factory(form.file, form.attribute)
    if form.kind == "model-file":
        return _load_model_under_test(form.file)
    if form.kind == "tflite":
        return _load_tflite(form.file)
    if form.kind == "onnx":
        return _load_onnx(form.file)
    return _load_exported_program(form.file)


def _load_tflite(path: Path) -> LoadedModel:
    """A .tflite file rebuilt as a module with the file's weights (read as data, never run)."""
    return _rebuilt(path, "tflite", *build(read_tflite(path)),
                    f"every tensor keeps the scale and zero point {path.name} gives it")


def _load_onnx(path: Path) -> LoadedModel:
    """An .onnx file rebuilt as a module with the file's weights (read as data, never run)."""
    return _rebuilt(path, "onnx", *build_onnx(path), "every tensor its QuantizeLinear/"
                    "DequantizeLinear pairs quantize keeps their scale and zero point")


def _rebuilt(path: Path, kind: str, module, example_inputs, quantization,
             kept: str) -> LoadedModel:
    """A model file's rebuilt module as a LoadedModel, its note saying where the quantization
    comes from (`kept`: what the file's own quantization keeps)."""
    note = (f"quantization from the file: {kept}" if quantization is not None else
            f"{path.name} is a float model: quantized by calibration like any PyTorch model")
    return LoadedModel(path.stem, module, example_inputs, f"{kind}:{path}", "unknown",
                       notes=(note,), quantization=quantization)


def load_calibration(
    path: str | None,
    example_inputs: tuple[Tensor, ...],
    n_generated: int = 8,
    seed: int = 0,
) -> Calibration:
    """Read calibration samples from a .pt/.npz file or a folder of them, or generate some.

    A stored array may hold one sample (exactly an example input's shape) or N samples stacked
    on a new leading dim; when the example input's batch dim is 1, N samples may also be
    stacked along that batch dim. Each sample keeps the example input's shape.
    """
    if path is None:
        return _generated_calibration(example_inputs, n_generated, seed)
    resolved = Path(path).expanduser().resolve()
    if resolved.is_dir():
        files = sorted(p for p in resolved.iterdir() if p.suffix in _CALIBRATION_SUFFIXES)
        if not files:
            raise UserError(
                f"calibration folder {resolved} has no .pt or .npz files; put the samples there "
                "or point --calibration at a file"
            )
        samples = tuple(s for f in files for s in _read_calibration_file(f, example_inputs))
        source = f"folder:{resolved} ({len(files)} files)"
    elif resolved.is_file():
        samples = _read_calibration_file(resolved, example_inputs)
        source = f"file:{resolved}"
    else:
        raise UserError(f"calibration path not found: {resolved}; check the path")
    if not samples:
        raise UserError(f"calibration {resolved} holds no samples; save at least one")
    return Calibration(samples, generated=False, source=source, warning=None)


@dataclass(frozen=True)
class Dataset:
    """A labelled (or unlabelled) set to measure a program's accuracy on: samples as
    `load_calibration` reads them, and one integer class label per sample (None: no labels,
    a regression or an autoencoder, judged by its error against the float model)."""

    samples: tuple[tuple[Tensor, ...], ...]
    labels: Tensor | None  # int64 [N]
    source: str


def load_dataset(path: str, example_inputs: tuple[Tensor, ...],
                 labels: str | None = "labels") -> Dataset:
    """Read a labelled set: a .pt (a dict of tensors) or .npz file, or a folder of them, whose
    array named `labels` (or the name `labels` gives) holds one integer class per sample and
    whose other arrays are the inputs as `--calibration` takes them (input0, input1, ... or
    one unnamed array). `labels` may instead name a file (.pt/.npz/.npy) of labels; None: no
    labels. Checked as data: no pickled code, shapes against the model's inputs, one label
    per sample, integer labels."""
    resolved = Path(path).expanduser().resolve()
    files = (sorted(p for p in resolved.iterdir() if p.suffix in _CALIBRATION_SUFFIXES)
             if resolved.is_dir() else [resolved] if resolved.is_file() else [])
    if not files:
        raise UserError(f"dataset {resolved} is not a .pt/.npz file or a folder of them; check "
                        "the --dataset path")
    label_file = None
    if labels is not None and Path(labels).suffix in (".pt", ".pth", ".npz", ".npy") and \
            Path(labels).expanduser().is_file():
        label_file = Path(labels).expanduser().resolve()
    key = None if label_file is not None or labels is None else labels
    samples: list[tuple[Tensor, ...]] = []
    found: list[Tensor] = []
    for file in files:
        arrays = _named_arrays(file)
        if key is None:
            arrays.pop("labels", None)  # an array named labels is never an input
        else:
            if key not in arrays:
                raise UserError(f"dataset {file} has no array named '{key}' ({', '.join(arrays)}); "
                                "store the labels under that name, or give --labels FILE or "
                                "--labels none")
            found.append(arrays.pop(key))
        samples.extend(_samples_from_named_arrays(arrays, file, example_inputs))
    if not samples:
        raise UserError(f"dataset {resolved} holds no samples; save at least one")
    if label_file is not None:
        arrays = ({"labels": torch.from_numpy(np.load(label_file, allow_pickle=False))}
                  if label_file.suffix == ".npy" else _named_arrays(label_file))
        if len(arrays) != 1:
            raise UserError(f"labels file {label_file} holds {len(arrays)} arrays; save one")
        found = list(arrays.values())
    label_tensor = None
    if found:
        label_tensor = torch.cat([t.reshape(-1) if t.dim() <= 1 or t.shape[-1] == 1
                                  else t for t in found])
        if label_tensor.dim() != 1 or label_tensor.dtype.is_floating_point or \
                label_tensor.dtype == torch.bool:
            raise UserError(f"the labels of {resolved} are {label_tensor.dtype} of shape "
                            f"{_shape(tuple(label_tensor.shape))}; save one integer class per "
                            "sample")
        if len(label_tensor) != len(samples):
            raise UserError(f"dataset {resolved} has {len(samples)} samples and "
                            f"{len(label_tensor)} labels; give one label per sample")
        label_tensor = label_tensor.to(torch.int64)
    source = f"{'folder' if resolved.is_dir() else 'file'}:{resolved}"
    return Dataset(tuple(samples), label_tensor, source)


def _named_arrays(path: Path) -> dict[str, Tensor]:
    if path.suffix == ".npz":
        return _read_npz(path)
    if path.suffix in (".pt", ".pth"):
        data = _read_pt(path)
        if isinstance(data, dict) and all(isinstance(k, str) for k in data):
            return dict(data)
        raise UserError(f"dataset file {path} holds a {type(data).__name__}; save a dict of "
                        "tensors (inputs and labels) with torch.save")
    raise UserError(f"dataset file {path} is neither .pt nor .npz; save it in one of those")


def _import_file(path: Path) -> Any:
    """Execute a user's .py file as a fresh module and return it."""
    # A unique name so that two user files both called model.py never share a module.
    module_name = f"_orchestrate_user_{path.stem}_{uuid.uuid4().hex[:8]}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise UserError(f"{path} cannot be imported as a Python module; check it is a .py file")
    module = importlib.util.module_from_spec(spec)
    # Registered before exec because dataclasses and pickling look the module up by name.
    sys.modules[module_name] = module
    # The file's folder goes on sys.path for the import only, so that `import my_layers`
    # next to the model file works as it does when the user runs the file directly.
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as exc:
        del sys.modules[module_name]
        raise UserError(
            f"importing {path} raised {describe_error(exc)}; fix the file (run it with python to see "
            "the traceback)"
        ) from exc
    finally:
        if str(path.parent) in sys.path:
            sys.path.remove(str(path.parent))
    return module


def _as_input_tuple(value: Any) -> tuple[Tensor, ...] | None:
    """Example inputs as a tuple of tensors; a bare tensor or a list is accepted, else None."""
    if isinstance(value, Tensor):
        return (value,)
    if isinstance(value, (tuple, list)) and value and all(isinstance(v, Tensor) for v in value):
        return tuple(value)
    return None


def _type_name(value: Any) -> str:
    if isinstance(value, (tuple, list)):
        return f"{type(value).__name__} of ({', '.join(type(v).__name__ for v in value)})"
    return type(value).__name__


def _load_factory(path: Path, attribute: str) -> LoadedModel:
    source = f"file:{path}:{attribute}"
    factory = getattr(_import_file(path), attribute, None)
    if factory is None:
        raise UserError(
            f"{path} defines no '{attribute}'; define {attribute}() returning "
            "(nn.Module, example_inputs_tuple)"
        )
    if not callable(factory):
        raise UserError(f"{source} is a {type(factory).__name__}, not a function; make it callable")
    try:
        result = factory()
    except (Exception, SystemExit) as exc:
        raise UserError(f"{source}() raised {describe_error(exc)}; fix the factory") from exc
    if not (isinstance(result, (tuple, list)) and len(result) == 2):
        raise UserError(
            f"{source}() returned {_type_name(result)}; it must return "
            "(nn.Module, example_inputs_tuple)"
        )
    module, raw_inputs = result
    example_inputs = _as_input_tuple(raw_inputs)
    if not isinstance(module, nn.Module) or example_inputs is None:
        raise UserError(
            f"{source}() returned ({type(module).__name__}, {_type_name(raw_inputs)}); it must "
            "return (nn.Module, tuple of tensors)"
        )
    return _user_model(path.stem, module, example_inputs, source)


def _load_model_under_test(path: Path) -> LoadedModel:
    source = f"file:{path}"
    loaded = _import_file(path)
    missing = [name for name in ("ModelUnderTest", "ModelInputs") if not hasattr(loaded, name)]
    if missing:
        raise UserError(
            f"{path} defines no {' or '.join(missing)}; define ModelUnderTest (an nn.Module "
            "instance) and ModelInputs (a tuple of tensors), or name a factory as file.py:factory"
        )
    module = loaded.ModelUnderTest
    if isinstance(module, type) and issubclass(module, nn.Module):
        raise UserError(
            f"{path}: ModelUnderTest is the class {module.__name__}, not an instance; "
            f"write ModelUnderTest = {module.__name__}()"
        )
    if not isinstance(module, nn.Module):
        raise UserError(
            f"{path}: ModelUnderTest is a {type(module).__name__}; it must be an nn.Module instance"
        )
    example_inputs = _as_input_tuple(loaded.ModelInputs)
    if example_inputs is None:
        raise UserError(
            f"{path}: ModelInputs is a {_type_name(loaded.ModelInputs)}; it must be a tuple of tensors"
        )
    return _user_model(path.stem, module, example_inputs, source)


def _user_model(
    name: str, module: nn.Module, example_inputs: tuple[Tensor, ...], source: str
) -> LoadedModel:
    # Export captures whatever mode the module is in; a forgotten .eval() would bake
    # batch statistics and active dropout into the deployed graph.
    notes = (TRAIN_MODE_NOTE,) if module.training else ()
    module = module.eval()
    _check_forward(module, example_inputs, source)
    return LoadedModel(name, module, example_inputs, source, kind="unknown", notes=notes)


TRAIN_MODE_NOTE = ("the model was in train mode; it was switched to eval mode for export "
                   "(BatchNorm uses its running statistics, dropout is off), as a deployed "
                   "model runs")


def _check_forward(module: nn.Module, example_inputs: tuple[Tensor, ...], source: str) -> None:
    """Run the model once, so that a forward that fails or returns no tensor is reported in one
    line here rather than as an export failure or a crash in a later stage."""
    try:
        with torch.no_grad(), buffers_kept(module):  # a streaming model's state: untouched
            output = module(*example_inputs)
    except (Exception, SystemExit) as exc:
        raise UserError(
            f"{source}: forward on the example inputs raised {describe_error(exc)[:300]}; fix the "
            "model (run it with python to see the traceback)"
        ) from exc
    leaves = torch.utils._pytree.tree_leaves(output)
    if not leaves or not all(isinstance(leaf, Tensor) for leaf in leaves):
        returned = "None" if output is None else _type_name(output)[:120]
        raise UserError(f"{source}: forward returned {returned}; return a tensor or a tuple of tensors")


def _load_exported_program(path: Path) -> LoadedModel:
    program = read_exported_program(
        path, "save it with torch.export.save (static shapes, plain tensors) from this torch version"
    )
    return LoadedModel(
        path.stem, _ExportedModule(program), _exported_example_inputs(program, path),
        f"pt2:{path}", "unknown",
    )


class _ExportedModule(nn.Module):
    """A loaded ExportedProgram as a module that `.eval()` and re-export accept.

    `ExportedProgram.module()` raises NotImplementedError on `.train()`/`.eval()` ("Calling
    eval() is not supported yet"), and the capture stage calls `.eval()` on every model. Export
    already fixed the program's mode; `move_exported_model_to_eval` rewrites the dropout and
    batch-norm patterns of a program exported in training mode, so the flag is all that is left.
    """

    def __init__(self, program: torch.export.ExportedProgram):
        from torchao.quantization.pt2e import move_exported_model_to_eval  # lazy: heavy (torchao)

        super().__init__()
        # check_guards=False: with the default, torch 2.13 adds a `_guards_fn` submodule whose
        # call the quantizers cannot trace ("_guards_fn" errors in prepare_pt2e).
        self.program = move_exported_model_to_eval(program.module(check_guards=False))

    def forward(self, *args: Tensor) -> Any:
        return self.program(*args)

    def train(self, mode: bool = True) -> "_ExportedModule":
        self.training = mode
        return self


def _exported_example_inputs(program: torch.export.ExportedProgram, path: Path) -> tuple[Tensor, ...]:
    """The program's saved example inputs, else inputs synthesized from its placeholders."""
    saved = program.example_inputs
    if saved is not None:
        args, kwargs = saved
        inputs = _as_input_tuple(args)
        if inputs is not None and not kwargs:
            return inputs
    user_inputs = set(program.graph_signature.user_inputs)
    placeholders = [
        node for node in program.graph.nodes if node.op == "placeholder" and node.name in user_inputs
    ]
    generator = torch.Generator().manual_seed(0)
    synthesized = []
    for node in placeholders:
        value = node.meta.get("val")
        if not isinstance(value, Tensor):
            raise UserError(
                f"{path}: input '{node.name}' is a {type(value).__name__}, not a tensor; export "
                "the model with tensor inputs only"
            )
        if not all(isinstance(dim, int) for dim in value.shape):
            raise UserError(
                f"{path}: input '{node.name}' has dynamic shape {tuple(value.shape)}; export with "
                "static shapes for a microcontroller"
            )
        synthesized.append(_random_like(value.shape, value.dtype, generator))
    if not synthesized:
        raise UserError(f"{path} has no tensor inputs; export a model that takes at least one tensor")
    return tuple(synthesized)


def _random_like(shape: torch.Size, dtype: torch.dtype, generator: torch.Generator) -> Tensor:
    if dtype.is_floating_point:
        return torch.randn(shape, generator=generator, dtype=dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=generator).bool()
    # Integer inputs are usually indices; zeros are valid for any table size.
    return torch.zeros(shape, dtype=dtype)


def _generated_calibration(
    example_inputs: tuple[Tensor, ...], n_generated: int, seed: int
) -> Calibration:
    if n_generated < 1:
        raise UserError(f"number of generated calibration samples is {n_generated}; use at least 1")
    generator = torch.Generator().manual_seed(seed)
    samples = tuple(
        tuple(_generated_input(example, generator) for example in example_inputs)
        for _ in range(n_generated)
    )
    return Calibration(
        samples,
        generated=True,
        source=f"generated:{n_generated} samples, seed {seed}",
        warning=(
            f"calibration: no --calibration given; using {n_generated} generated samples, so "
            "quantization ranges and accuracy figures are not representative"
        ),
    )


def _generated_input(example: Tensor, generator: torch.Generator) -> Tensor:
    if example.dtype.is_floating_point or example.dtype == torch.bool or example.numel() == 0:
        return _random_like(example.shape, example.dtype, generator)
    # Integer inputs are usually indices: stay inside the range the example input uses.
    low, high = int(example.min()), int(example.max()) + 1
    return torch.randint(low, high, example.shape, generator=generator, dtype=example.dtype)


def _read_calibration_file(
    path: Path, example_inputs: tuple[Tensor, ...]
) -> tuple[tuple[Tensor, ...], ...]:
    if path.suffix == ".npz":
        return _samples_from_named_arrays(_read_npz(path), path, example_inputs)
    if path.suffix in (".pt", ".pth"):
        return _samples_from_pt(_read_pt(path), path, example_inputs)
    raise UserError(f"calibration file {path} is neither .pt nor .npz; save samples in one of those")


def _read_pt(path: Path) -> Any:
    try:
        return torch.load(path, weights_only=True)
    except Exception as exc:
        raise UserError(
            f"calibration file {path} cannot be read by torch.load(weights_only=True) "
            f"({_weights_only_refusal(exc)}); save plain tensors, lists or tuples of tensors "
            "with torch.save"
        ) from exc


def _weights_only_refusal(exc: BaseException) -> str:
    """What torch's weights-only unpickler objected to, without the advice around it (its
    message suggests `weights_only=False`, which would run the file's code: never here)."""
    text = str(exc)
    if "WeightsUnpickler error:" not in text:
        return describe_error(exc)
    reason = text.split("WeightsUnpickler error:", 1)[1].split("Check the documentation", 1)[0]
    named = re.search(r"GLOBAL (\S+)", reason)
    if named:
        return f"it names {named.group(1)}, which is code, not tensor data"
    return f"not a tensor file torch.save wrote: {one_line(reason).rstrip('.')}"


def _read_npz(path: Path) -> dict[str, Tensor]:
    try:
        with np.load(path, allow_pickle=False) as archive:
            # Key order is the order the arrays were saved in, which np.savez preserves.
            return {key: torch.from_numpy(np.array(archive[key])) for key in archive.files}
    except Exception as exc:
        raise UserError(
            f"calibration file {path} cannot be read as .npz ({describe_error(exc)}); save it with "
            "numpy.savez"
        ) from exc


def _samples_from_pt(
    data: Any, path: Path, example_inputs: tuple[Tensor, ...]
) -> tuple[tuple[Tensor, ...], ...]:
    if isinstance(data, Tensor):
        return tuple(_split_inputs((data,), str(path), example_inputs))
    if isinstance(data, dict):
        return _samples_from_named_arrays(data, path, example_inputs)
    if isinstance(data, (list, tuple)):
        samples: list[tuple[Tensor, ...]] = []
        for index, item in enumerate(data):
            where = f"{path} item {index}"
            if isinstance(item, Tensor):
                samples.extend(_split_inputs((item,), where, example_inputs))
            elif isinstance(item, (list, tuple)) and all(isinstance(t, Tensor) for t in item):
                samples.extend(_split_inputs(tuple(item), where, example_inputs))
            else:
                raise UserError(
                    f"calibration {where} is a {_type_name(item)}; use a tensor or a tuple of "
                    "tensors (one per model input)"
                )
        return tuple(samples)
    raise UserError(
        f"calibration file {path} holds a {type(data).__name__}; save a tensor, a list of tensors "
        "or a list of tuples of tensors"
    )


def _samples_from_named_arrays(
    arrays: dict[str, Any], path: Path, example_inputs: tuple[Tensor, ...]
) -> tuple[tuple[Tensor, ...], ...]:
    """Arrays named input0, input1, ... are per-input batches; other names are batches of input 0."""
    for key, value in arrays.items():
        if not isinstance(value, Tensor):
            raise UserError(
                f"calibration {path} entry '{key}' is a {type(value).__name__}; store tensors only"
            )
    indexed = {int(m.group(1)): key for key in arrays if (m := _NPZ_INPUT_KEY.fullmatch(key))}
    if indexed and len(indexed) == len(arrays):
        expected = set(range(len(example_inputs)))
        if set(indexed) != expected:
            raise UserError(
                f"calibration {path} has arrays {', '.join(sorted(arrays))}; the model has "
                f"{len(example_inputs)} inputs, so name them input0..input{len(example_inputs) - 1}"
            )
        batches = tuple(arrays[indexed[i]] for i in range(len(example_inputs)))
        return tuple(_split_inputs(batches, str(path), example_inputs))
    if len(example_inputs) != 1:
        raise UserError(
            f"calibration {path} has unnamed arrays but the model has {len(example_inputs)} inputs; "
            f"name them input0..input{len(example_inputs) - 1} (numpy.savez(path, input0=..., ...))"
        )
    return tuple(
        sample
        for key, batch in arrays.items()
        for sample in _split_inputs((batch,), f"{path} array '{key}'", example_inputs)
    )


def _split_inputs(
    batches: tuple[Tensor, ...], where: str, example_inputs: tuple[Tensor, ...]
) -> list[tuple[Tensor, ...]]:
    """Split one batch per model input into samples, checking every shape against the examples."""
    if len(batches) != len(example_inputs):
        raise UserError(
            f"calibration {where} gives {len(batches)} tensor(s) per sample but the model has "
            f"{len(example_inputs)} inputs; save one tensor per input (a tuple per sample, or "
            ".npz arrays named input0, input1, ...)"
        )
    per_input = [
        _split_batch(batch, example, f"{where}" + (f" input {i}" if len(batches) > 1 else ""))
        for i, (batch, example) in enumerate(zip(batches, example_inputs))
    ]
    counts = {len(samples) for samples in per_input}
    if len(counts) != 1:
        raise UserError(
            f"calibration {where} has different sample counts per input ({sorted(counts)}); "
            "give every input the same number of samples"
        )
    return list(zip(*per_input))


def _split_batch(batch: Tensor, example: Tensor, where: str) -> list[Tensor]:
    expected = tuple(example.shape)
    got = tuple(batch.shape)
    batch = _cast_to(batch, example.dtype, where)
    if got == expected:
        return [batch]
    if len(got) == len(expected) + 1 and got[1:] == expected:
        return list(batch.unbind(0))
    if expected and expected[0] == 1 and len(got) == len(expected) and got[1:] == expected[1:]:
        return list(batch.split(1, dim=0))
    stacked = "x".join(["N", *map(str, expected[1:] if expected and expected[0] == 1 else expected)])
    raise UserError(
        f"calibration {where} has shape {_shape(got)}, expected {_shape(expected)} or {stacked} "
        "for N samples; save samples shaped like the model's example input"
    )


def _shape(shape: tuple[int, ...]) -> str:
    return "x".join(map(str, shape)) if shape else "scalar"


def _cast_to(tensor: Tensor, dtype: torch.dtype, where: str) -> Tensor:
    if tensor.dtype == dtype:
        return tensor
    # numpy arrays default to float64; any float precision is fine for calibration data.
    if tensor.dtype.is_floating_point and dtype.is_floating_point:
        return tensor.to(dtype)
    raise UserError(
        f"calibration {where} has dtype {tensor.dtype}, expected {dtype}; save it in the model's "
        "input dtype"
    )

