"""Where models and calibration data come from: one loader for every form a user can name.

Model specs, tried in this order:
  - a zoo name (`ds-cnn`, `ds_cnn`, ...; see examples/zoo.py);
  - `path/to/file.py:factory`, where `factory()` returns `(nn.Module, example_inputs)`;
  - `path/to/file.py` defining `ModelUnderTest` (a module instance) and `ModelInputs` (a tuple
    of tensors), the convention of ExecuTorch's backends/arm/scripts/aot_arm_compiler.py;
  - `path/to/program.pt2`, an ExportedProgram saved with torch.export.save, loaded as data: a
    model .py is code and runs, a .pt2 never runs anything (`read_exported_program`).

Every way a spec or a calibration file can be wrong raises `UserError` with one line that names
the offender and says what to do; nothing here lets a raw traceback reach the user.
"""

import contextlib
import importlib.util
import io
import json
import logging
import os
import re
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch._export.verifier import Verifier

from examples import zoo
from orchestrator.errors import UserError
from orchestrator.sources.specs import model_spec

_CALIBRATION_SUFFIXES = (".pt", ".pth", ".npz")
_NPZ_INPUT_KEY = re.compile(r"input(\d+)")
_FORCE_WEIGHTS_ONLY = "TORCH_FORCE_WEIGHTS_ONLY_LOAD"
# Names in a .pt2's program description end up in generated Python source (fx codegen pastes
# get_attr targets into `getattr(self, "...")`, placeholder targets into the signature).
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_]+(?:[.\-][A-Za-z0-9_]+)*", re.ASCII)
_NAME_KEYS = frozenset({"name", "as_name", "parameter_name", "buffer_name", "tensor_constant_name",
                        "custom_obj_name", "user_input_name", "forward_arg_names"})
_NAME_MAPS = frozenset({"tensor_values", "sym_int_values", "sym_bool_values", "sym_float_values"})
_TARGET_KEYS = frozenset({"target", "as_operator"})
# What torch's serializer writes for a call: an op overload, an operator/math builtin, a sym op.
_OPERATOR_NAME = re.compile(
    r"torch\.ops\.[A-Za-z_]\w*\.[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)?|_operator\.[a-z_]+|"
    r"math\.[a-z_]+|torch\.(?:_?sym_\w+)",
    re.ASCII,
)


@dataclass(frozen=True)
class LoadedModel:
    """An eval-mode module with the example inputs it is exported with, and where it came from."""

    name: str
    module: nn.Module
    example_inputs: tuple[Tensor, ...]
    source: str  # e.g. "zoo:ds-cnn", "file:/abs/p.py:factory", "pt2:/abs/x.pt2"
    kind: str  # "classifier" | "autoencoder" | "detector" | "unknown"
    notes: tuple[str, ...] = ()  # what loading changed that the user should know (train mode)


@dataclass(frozen=True)
class Calibration:
    """Samples for post-training quantization, each a tuple with one tensor per model input."""

    samples: tuple[tuple[Tensor, ...], ...]
    generated: bool
    source: str
    warning: str | None


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
    return _load_exported_program(form.file)


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
        raise UserError(f"calibration path not found: {resolved}; check the --calibration path")
    if not samples:
        raise UserError(f"calibration {resolved} holds no samples; save at least one")
    return Calibration(samples, generated=False, source=source, warning=None)


def _one_line(text: str) -> str:
    """Collapse a message that may span lines (e.g. a chained error) into one line."""
    return " ".join(text.split())


def _describe(exc: BaseException) -> str:
    message = _one_line(str(exc))
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


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
            f"importing {path} raised {_describe(exc)}; fix the file (run it with python to see "
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
        raise UserError(f"{source}() raised {_describe(exc)}; fix the factory") from exc
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
        with torch.no_grad():
            output = module(*example_inputs)
    except (Exception, SystemExit) as exc:
        raise UserError(
            f"{source}: forward on the example inputs raised {_describe(exc)[:300]}; fix the "
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


def read_exported_program(path: Path, remedy: str) -> torch.export.ExportedProgram:
    """Load a saved ExportedProgram, refusing every part of it that could run code when loaded.

    `torch.export.load` unpickles parts of an archive with `torch.load(weights_only=False)` (the
    sample inputs once a weights-only attempt fails, pickled weights and constants) or plain
    `pickle.loads` (opaque constants), loads AOTInductor shared libraries, evaluates symbolic
    shape strings with `sympy.sympify` (which calls `eval`) and pastes names into generated
    Python source. So the archive is checked first, with torch's own zip reader and on the very
    bytes that are then loaded: each pickled part must load with `torch.load(weights_only=True)`,
    and the program description may hold no symbolic shape, guard code, object constant or name
    that is not a plain identifier. The load itself runs with TORCH_FORCE_WEIGHTS_ONLY_LOAD set,
    so no torch.load inside it can unpickle an arbitrary object, and every call in the loaded
    graph must be a torch operator. `remedy` ends each message: what the user should do.
    """
    from torch.export.pt2_archive._package import load_pt2  # lazy: heavy (torch._dynamo, sympy)

    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UserError(f"{path} cannot be read ({_describe(exc)}); check the file") from exc
    _Pt2Check(path, data, remedy).run()
    # torch.export.load logs a full traceback at WARNING when the archive fails, then retries
    # a legacy format that reads the zip with a second parser and unpickles its parts;
    # load_pt2 is its first half, without that fallback.
    export_log = logging.getLogger("torch.export")
    previous_level = export_log.level
    export_log.setLevel(logging.ERROR)
    try:
        with _weights_only_unpickling():
            programs = load_pt2(io.BytesIO(data)).exported_programs
    except Exception as exc:
        raise UserError(
            f"{path} could not be loaded as an ExportedProgram ({_describe(exc)[:300]}); {remedy}"
        ) from exc
    finally:
        export_log.setLevel(previous_level)
    if "model" not in programs:
        raise UserError(f"{path} holds no program named 'model'; {remedy}")
    program = programs["model"]
    _check_graph_calls(program, path, remedy)
    return program


@contextlib.contextmanager
def _weights_only_unpickling():
    """Every torch.load in the block unpickles tensors and containers only (torch's own switch)."""
    previous = os.environ.get(_FORCE_WEIGHTS_ONLY)
    os.environ[_FORCE_WEIGHTS_ONLY] = "1"
    try:
        yield
    finally:
        if previous is None:
            del os.environ[_FORCE_WEIGHTS_ONLY]
        else:
            os.environ[_FORCE_WEIGHTS_ONLY] = previous


class _Pt2Check:
    """The archive checks of `read_exported_program`, each refusal naming the member."""

    def __init__(self, path: Path, data: bytes, remedy: str):
        from torch.export.pt2_archive._package import (  # lazy: heavy (torch._dynamo, sympy)
            PT2ArchiveReader)

        self.path, self.remedy = path, remedy
        try:
            self.archive = PT2ArchiveReader(io.BytesIO(data))
            self.names = self.archive.get_file_names()
        except Exception as exc:
            raise UserError(
                f"{path} is not a .pt2 archive written by torch.export.save "
                f"({_describe(exc)[:200]}); {remedy}"
            ) from exc

    def refuse(self, member: str, problem: str, fix: str | None = None) -> UserError:
        return UserError(
            f"{self.path}: refusing to load member {member[:120]!r}: {problem}; "
            f"{fix or self.remedy}"
        )

    def read(self, member: str) -> bytes:
        try:
            return self.archive.read_bytes(member)
        except Exception as exc:
            raise self.refuse(member, f"it cannot be read ({_describe(exc)[:200]})") from exc

    def read_json(self, member: str) -> Any:
        try:
            return json.loads(self.read(member))
        except ValueError as exc:
            raise self.refuse(member, f"it is not valid JSON ({_describe(exc)[:200]})") from exc

    def weights_only(self, member: str) -> None:
        content = self.read(member)
        if not content:
            return  # torch writes an empty member for a program saved without example inputs
        try:
            torch.load(io.BytesIO(content), weights_only=True)
        except Exception as exc:
            named = re.search(r"GLOBAL (\S+)", str(exc))
            detail = f"it names {named.group(1)}" if named else type(exc).__name__
            raise self.refuse(
                member, f"a pickle that torch.load(weights_only=True) refuses ({detail}), so "
                "loading it could run code"
            ) from exc

    def run(self) -> None:
        from torch.export.pt2_archive import constants as pt2  # lazy: heavy (torch._dynamo, sympy)

        names = self.names
        if len(set(names)) != len(names):
            duplicate = next(n for n in names if names.count(n) > 1)
            raise self.refuse(duplicate, "it appears twice, so readers may see different programs")
        for member in names:
            if member.startswith((pt2.AOTINDUCTOR_DIR, pt2.XL_MODEL_WEIGHTS_DIR)):
                raise self.refuse(member, "AOTInductor code or weights, which torch loads as "
                                  "native code or unchecked pickles")
        models = [n for n in names if n.startswith(pt2.MODELS_DIR)]
        if not models:
            raise UserError(
                f"{self.path} holds no {pt2.MODELS_FILENAME_FORMAT.format('model')}; {self.remedy}"
            )
        prefix, suffix = pt2.MODELS_FILENAME_FORMAT.split("{}")
        for member in models:
            model_name = member[len(prefix):-len(suffix)]
            if not member.endswith(suffix) or not _PLAIN_NAME.fullmatch(model_name):
                raise self.refuse(member, "it is not a program description (models/<name>.json)")
            self.program_json(member, self.read_json(member))
            self.weights_only(pt2.SAMPLE_INPUTS_FILENAME_FORMAT.format(model_name))
            self.payloads(model_name, pt2.WEIGHTS_DIR, pt2.WEIGHTS_CONFIG_FILENAME_FORMAT)
            self.payloads(model_name, pt2.CONSTANTS_DIR, pt2.CONSTANTS_CONFIG_FILENAME_FORMAT)

    def payloads(self, model_name: str, folder: str, config_format: str) -> None:
        """Weights or constants: pickled tensors must load weights-only; objects are refused."""
        from torch.export.pt2_archive import constants as pt2  # lazy: heavy (torch._dynamo, sympy)

        legacy = f"{folder}{model_name}.pt"  # one pickle of every tensor (torch < 2.8)
        if legacy in self.names:
            self.weights_only(legacy)
            return
        config_member = config_format.format(model_name)
        config = self.read_json(config_member)
        entries = config.get("config") if isinstance(config, dict) else None
        if not isinstance(entries, dict):
            raise self.refuse(config_member, "it is not a payload config")
        if _holds_symbolic(config):
            raise self.refuse(config_member, "it holds symbolic shapes (parsed by eval)")
        for fqn, entry in entries.items():
            payload = entry.get("path_name") if isinstance(entry, dict) else None
            if not isinstance(payload, str) or not _PLAIN_NAME.fullmatch(payload):
                raise self.refuse(config_member, f"it gives {fqn[:80]!r} no plain payload name")
            member = folder + payload
            if folder == pt2.CONSTANTS_DIR and not payload.startswith(
                pt2.TENSOR_CONSTANT_FILENAME_PREFIX
            ):
                raise self.refuse(member, "a pickled Python object, which runs code when loaded")
            if entry.get("use_pickle"):
                self.weights_only(member)

    def program_json(self, member: str, program: Any) -> None:
        """Refuse what the deserializer would turn into executed code (see read_exported_program)."""
        if not isinstance(program, dict) or not isinstance(program.get("graph_module"), dict):
            raise self.refuse(member, "it is not a serialized ExportedProgram")
        dynamic = _dynamic_input(program["graph_module"])
        if dynamic is not None:
            name, dim = dynamic
            raise UserError(
                f"{self.path}: input {name!r} has a dynamic dimension {dim}; export with static "
                "shapes (torch.export.export without dynamic_shapes) for a microcontroller"
            )
        if _holds_symbolic(program):
            raise self.refuse(
                member, "it holds symbolic (dynamic or data-dependent) shapes, which are parsed "
                "by eval", "export with static shapes for a microcontroller"
            )
        if program.get("guards_code"):
            raise self.refuse(member, "it carries guard code (Python source run by torch)",
                              "export with static shapes for a microcontroller")
        self.strings(member, program, None)

    def strings(self, member: str, value: Any, key: str | None) -> None:
        """Names must be plain identifiers and call targets torch operators, at any depth."""
        if isinstance(value, dict):
            if key in _NAME_MAPS:
                for name in value:
                    self.name(member, name)
            for child_key, child in value.items():
                if child_key == "as_custom_obj" or (child_key == "custom_obj_values" and child):
                    raise self.refuse(member, "it holds a custom object (a pickled TorchScript "
                                      "class)")
                self.strings(member, child, child_key)
        elif isinstance(value, list):
            for child in value:
                self.strings(member, child, key)
        elif isinstance(value, str):
            if key in _NAME_KEYS:
                self.name(member, value)
            elif key in _TARGET_KEYS and not _OPERATOR_NAME.fullmatch(value):
                raise self.refuse(member, f"it calls {value[:80]!r}, which is not a torch operator")
            elif "\r" in value:
                # Python source reads a bare carriage return as a line break.
                raise self.refuse(member, "it holds a string with a carriage return")

    def name(self, member: str, name: str) -> None:
        if not _PLAIN_NAME.fullmatch(name):
            raise self.refuse(member, f"it holds the name {name[:80]!r}, which is not a plain "
                              "identifier")


def _dynamic_input(graph_module: dict) -> tuple[str, int] | None:
    """(name, dim) of the first user input with a symbolic dimension, if any."""
    graph = graph_module.get("graph") or {}
    tensors = graph.get("tensor_values") or {}
    for spec in (graph_module.get("signature") or {}).get("input_specs") or []:
        argument = ((spec or {}).get("user_input") or {}).get("arg") or {}
        name = (argument.get("as_tensor") or {}).get("name")
        if not isinstance(name, str):
            continue
        for dim, size in enumerate((tensors.get(name) or {}).get("sizes") or []):
            if isinstance(size, dict) and "as_expr" in size:
                return name[:80], dim
    return None


def _holds_symbolic(value: Any) -> bool:
    """Symbolic sizes are strings that the deserializer parses with sympy.sympify (eval)."""
    if isinstance(value, dict):
        return "expr_str" in value or "as_expr" in value or any(
            _holds_symbolic(child) for child in value.values()
        )
    if isinstance(value, list):
        return any(_holds_symbolic(child) for child in value)
    return False


def _check_graph_calls(program: torch.export.ExportedProgram, path: Path, remedy: str) -> None:
    """Every call in the loaded graph is a torch operator or an arithmetic builtin that torch's
    export verifier allows. Torch runs the verifiers the archive names; this check does not
    depend on which."""
    builtins = set(Verifier().allowed_builtin_ops())
    operator_types = (torch._ops.OpOverload, torch._ops.HigherOrderOperator)
    for module in program.graph_module.modules():
        if not isinstance(module, torch.fx.GraphModule):
            continue
        for node in module.graph.nodes:
            allowed = node.op in ("placeholder", "get_attr", "output") or (
                node.op == "call_function"
                and (isinstance(node.target, operator_types) or node.target in builtins)
            )
            if not allowed:
                raise UserError(
                    f"{path}: refusing to run node '{node.name}' ({node.op} "
                    f"{str(node.target)[:80]}), which is not a torch operator; {remedy}"
                )


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
        return _describe(exc)
    reason = text.split("WeightsUnpickler error:", 1)[1].split("Check the documentation", 1)[0]
    named = re.search(r"GLOBAL (\S+)", reason)
    if named:
        return f"it names {named.group(1)}, which is code, not tensor data"
    return f"not a tensor file torch.save wrote: {_one_line(reason).rstrip('.')}"


def _read_npz(path: Path) -> dict[str, Tensor]:
    try:
        with np.load(path, allow_pickle=False) as archive:
            # Key order is the order the arrays were saved in, which np.savez preserves.
            return {key: torch.from_numpy(np.array(archive[key])) for key in archive.files}
    except Exception as exc:
        raise UserError(
            f"calibration file {path} cannot be read as .npz ({_describe(exc)}); save it with "
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

