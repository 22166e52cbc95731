"""What a model spec names, decided without loading it (no torch): a zoo name, a model file
(`file.py`, `file.py:factory`), an exported program (`.pt2`), a TFLite flatbuffer (`.tflite`) or
an ONNX model (`.onnx`). The CLI checks a spec with this before anything heavy is imported, so a
typo is answered at once; the loader
(orchestrator/sources/loader.py) decides with the same function, so one spec has one message."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from examples.zoo_index import find, zoo_names
from orchestrator.errors import UserError

MODEL_FORMS = (
    "a zoo name, path/to/file.py:factory, a .py defining ModelUnderTest and ModelInputs, a .pt2, "
    "a .tflite or an .onnx"
)


@dataclass(frozen=True)
class ModelSpec:
    kind: str  # "zoo" | "factory" | "model-file" | "pt2" | "tflite" | "onnx"
    name: str  # the zoo name, else the file's path as given
    file: Path | None = None  # resolved, for the file forms
    attribute: str | None = None  # the factory's name (`file.py:factory`)


def existing_file(path: str, what: str) -> Path:
    resolved = Path(path).expanduser().resolve()
    if not resolved.is_file():
        raise UserError(f"{what} not found: {resolved}; check the path")
    return resolved


def model_spec(spec: str) -> ModelSpec:
    """The form `spec` is in, with its file checked to exist; a UserError names what is wrong."""
    entry = find(spec)
    if entry is not None:
        return ModelSpec("zoo", entry.name)
    file_part, sep, attribute = spec.rpartition(":")
    if sep and file_part.endswith(".py") and attribute.isidentifier():
        return ModelSpec("factory", file_part, existing_file(file_part, "model file"), attribute)
    if spec.endswith(".py"):
        return ModelSpec("model-file", spec, existing_file(spec, "model file"))
    if spec.endswith(".pt2"):
        return ModelSpec("pt2", spec, existing_file(spec, "exported program"))
    if spec.endswith(".tflite"):
        return ModelSpec("tflite", spec, existing_file(spec, "TFLite model"))
    if spec.endswith(".onnx"):
        return ModelSpec("onnx", spec, existing_file(spec, "ONNX model"))
    if Path(spec).exists():
        raise UserError(f"model '{spec}' has an unsupported file type; give {MODEL_FORMS}")
    raise UserError(f"unknown model '{spec}': zoo models are {', '.join(zoo_names())}; "
                    f"otherwise give {MODEL_FORMS}")
