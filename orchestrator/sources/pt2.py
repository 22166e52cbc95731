"""A `.pt2` (an ExportedProgram saved with torch.export.save) read as data: checked against
everything that could run code when loaded (`read_exported_program`), for a user's model given
as a `.pt2` and for the reference programs of an artifacts folder, which may come from
someone else. A refusal is one line naming the offender and what to do (UserError)."""

import contextlib
import io
import json
import logging
import os
import re
from pathlib import Path
from typing import Any

import torch
from torch._export.verifier import Verifier

from orchestrator.errors import UserError, describe_error

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



def read_exported_program(path: Path, remedy: str,
                          data: bytes | None = None) -> torch.export.ExportedProgram:
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
        data = path.read_bytes() if data is None else data  # `data`: path's bytes, already read
    except OSError as exc:
        raise UserError(f"{path} cannot be read ({describe_error(exc)}); check the file") from exc
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
            f"{path} could not be loaded as an ExportedProgram ({describe_error(exc)[:300]}); {remedy}"
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
                f"({describe_error(exc)[:200]}); {remedy}"
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
            raise self.refuse(member, f"it cannot be read ({describe_error(exc)[:200]})") from exc

    def read_json(self, member: str) -> Any:
        try:
            return json.loads(self.read(member))
        except ValueError as exc:
            raise self.refuse(member, f"it is not valid JSON ({describe_error(exc)[:200]})") from exc

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
