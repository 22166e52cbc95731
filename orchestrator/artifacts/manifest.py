"""The one reader and writer of `out.artifacts/manifest.json`.

`Manifest.load(pte)` is how every verify method, harness and report reads an artifacts folder:
it checks the manifest's structure, the `.pte`'s SHA-256 and the SHA-256 of every file the
manifest lists, and resolves each path the manifest names inside its own folder; the first
problem is one UserError naming the file and what to do. Nothing reads manifest.json elsewhere
(tests/test_architecture.py). `manifest_json(compiled, partitions)` is what `compile` writes.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

from kernels.safe_files import DataFileError, load_json
from orchestrator import numerics
from orchestrator.errors import UserError

MANIFEST_VERSION = 1
MANIFEST_NAME = "manifest.json"


def artifacts_dir_for(pte_path: Path) -> Path:
    """The artifacts folder `compile` writes beside `pte_path`: `<stem>.artifacts/`."""
    pte_path = Path(pte_path)
    return pte_path.with_name(pte_path.stem + ".artifacts")


def package_versions() -> dict[str, str]:
    versions = {}
    for package in ("orchestrate", "torch", "executorch", "ethos-u-vela", "tosa-tools", "torchao"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = "not installed"
    return versions


def manifest_json(compiled, partitions) -> dict:
    """The manifest of a compile (without "files", which the writer adds once every file is
    in the folder). `partitions`: partitioners.npu.DelegatePartition in delegate order."""
    return {
        "manifest_version": MANIFEST_VERSION,
        "model": {"name": compiled.model.name, "source": compiled.model.source,
                  "inputs": [list(x.shape) for x in compiled.model.example_inputs],
                  **_model_file(compiled.model.source)},
        "calibration": {"source": compiled.calibration.source,
                        "samples": len(compiled.calibration.samples),
                        "generated": compiled.calibration.generated,
                        "method": compiled.calibration.method,
                        "precision": dict(compiled.calibration.precision)},
        "target": compiled.target.to_json(),
        "versions": package_versions(),
        "host_numerics": numerics.state(),
        "pte": {"sha256": hashlib.sha256(compiled.pte_bytes).hexdigest(),
                "bytes": len(compiled.pte_bytes),
                "arena_bytes": compiled.arena_bytes,
                "non_const_buffer_sizes": list(compiled.program_view.non_const_buffer_sizes)},
        "io_quantization": {k: (v if isinstance(v, (int, float, str)) else str(v))
                            for k, v in compiled.io_quant.items()},
        "partitions": [{"index": p.index, "delegate": p.delegate_name,
                        "payload_sha256": p.payload_sha256, "tosa_sha256": p.tosa_sha256,
                        "tosa": f"partitions/p{p.index}/model.tosa",
                        "vela_dir": f"partitions/p{p.index}/vela"} for p in partitions],
        "boundaries": [{"tensor": b.tensor, "direction": b.direction, "delegate": b.delegate,
                        "dim_order": list(b.cpu_dim_order), "consistent": b.consistent}
                       for b in compiled.boundaries],
    }


def _model_file(source: str) -> dict:
    """A model file's SHA-256 (a .tflite is also a reference, TFLM, that verify runs: only the
    bytes this program was compiled from may judge it)."""
    for prefix in ("tflite:", "onnx:"):
        if source.startswith(prefix):
            return {"file_sha256": hashlib.sha256(
                Path(source[len(prefix):]).read_bytes()).hexdigest()}
    return {}


def inside(folder: Path, relative: str, action: str = "verify") -> Path:
    """`folder / relative`, refusing a path that leaves the folder (absolute, `..`, a link out)."""
    candidate = (folder / relative)
    if Path(relative).is_absolute() or ".." in Path(relative).parts or \
            not candidate.resolve().is_relative_to(folder.resolve()):
        raise UserError(f"refusing to {action}: {folder / MANIFEST_NAME} names {relative!r}, "
                        "which is outside its artifacts folder")
    return candidate


@dataclass(frozen=True)
class PartitionEntry:
    """One Ethos-U delegate as compile recorded it; paths are relative to the folder."""

    index: int
    delegate: str
    payload_sha256: str
    tosa_sha256: str
    tosa: str


@dataclass(frozen=True)
class BoundaryEntry:
    """A tensor crossing between the CPU and an NPU partition, with the CPU side's dim order."""

    tensor: str
    direction: str  # "cpu->npu" | "npu->cpu"
    delegate: str
    dim_order: tuple[int, ...]
    consistent: bool


# (key path, expected type) every manifest must have; anything else is read where it is used.
_REQUIRED: tuple[tuple[tuple[str, ...], type | tuple[type, ...]], ...] = (
    (("manifest_version",), int), (("pte",), dict), (("pte", "sha256"), str),
    (("target",), dict), (("partitions",), list), (("files",), dict),
)


def _require(data: Any, path: tuple[str, ...], kind) -> None:
    value = data
    for key in path:
        if not isinstance(value, dict) or key not in value:
            raise TypeError(f"no '{'.'.join(path)}'")
        value = value[key]
    if not isinstance(value, kind) or isinstance(value, bool) and kind is int:
        raise TypeError(f"'{'.'.join(path)}' is not a {getattr(kind, '__name__', kind)}")


def _text(entry: dict, key: str, where: str) -> str:
    value = entry.get(key) if isinstance(entry, dict) else None
    if not isinstance(value, str):
        raise TypeError(f"{where} has no text '{key}'")
    return value


@dataclass(frozen=True)
class Manifest:
    """A checked artifacts folder: the `.pte` and every listed file match their SHA-256."""

    pte_path: Path
    folder: Path
    data: Mapping[str, Any]  # the manifest as written (read-only view)
    partitions: tuple[PartitionEntry, ...]
    boundaries: tuple[BoundaryEntry, ...]

    @property
    def path(self) -> Path:
        return self.folder / MANIFEST_NAME

    @property
    def target(self) -> Mapping[str, Any]:
        return self.data["target"]

    @property
    def isa_tier(self) -> str | None:
        tier = self.target.get("isa_tier")
        return tier if isinstance(tier, str) else None

    def file(self, relative: str) -> Path:
        """A file the manifest lists, inside the folder (hash-checked when loaded)."""
        return inside(self.folder, relative)

    def read(self, relative: str) -> bytes:
        return self.file(relative).read_bytes()

    def partition_of_payload(self, payload_sha256: str) -> PartitionEntry | None:
        return next((p for p in self.partitions if p.payload_sha256 == payload_sha256), None)

    @classmethod
    def load(cls, pte_path, action: str = "verify", pte_bytes: bytes | None = None) -> "Manifest":
        """The manifest beside `pte_path`, after checking the `.pte` and every file the
        manifest lists against their SHA-256; a UserError names the first that differs and
        says what it refuses to do (`action`). `pte_bytes`: the program as the caller already
        read it, so the bytes checked are the bytes it goes on to use."""
        pte_path = Path(pte_path)
        folder = artifacts_dir_for(pte_path)
        manifest_path = folder / MANIFEST_NAME
        if not pte_path.is_file() or not manifest_path.is_file():
            missing = pte_path if not pte_path.is_file() else manifest_path
            raise UserError(f"refusing to {action}: {missing} is missing; re-run `orchestrate "
                            "compile` to write the .pte and its artifacts folder")
        try:
            written = load_json(manifest_path)
            for path, kind in _REQUIRED:
                _require(written, path, kind)
            partitions = tuple(
                PartitionEntry(int(p.get("index", i)), _text(p, "delegate", f"partition {i}"),
                               _text(p, "payload_sha256", f"partition {i}"),
                               _text(p, "tosa_sha256", f"partition {i}"),
                               _text(p, "tosa", f"partition {i}"))
                for i, p in enumerate(written["partitions"]))
            boundaries = tuple(
                BoundaryEntry(_text(b, "tensor", "a boundary"), _text(b, "direction", "a boundary"),
                              _text(b, "delegate", "a boundary"),
                              tuple(int(d) for d in b.get("dim_order", ())),
                              bool(b.get("consistent", True)))
                for b in written.get("boundaries", []))
        except (DataFileError, KeyError, TypeError, ValueError, AttributeError) as error:
            raise UserError(f"refusing to {action}: {manifest_path} is not a manifest written by "
                            f"`orchestrate compile` ({error}); re-run `orchestrate compile`") \
                from None
        expected = written["pte"]["sha256"]
        actual = hashlib.sha256(pte_bytes if pte_bytes is not None
                                else pte_path.read_bytes()).hexdigest()
        if actual != expected:
            raise UserError(f"refusing to {action}: {pte_path} does not match its artifacts (its "
                            f"SHA-256 is {actual[:12]}..., {manifest_path} records "
                            f"{str(expected)[:12]}...); re-run `orchestrate compile` to write "
                            "both")
        for relative, digest in written["files"].items():
            path = inside(folder, str(relative), action)
            if not path.is_file():
                raise UserError(f"refusing to {action}: {path} is missing from the artifacts; "
                                "re-run `orchestrate compile`")
            if hashlib.sha256(path.read_bytes()).hexdigest() != digest:
                raise UserError(f"refusing to {action}: {path} was changed after compiling (its "
                                f"SHA-256 differs from {manifest_path}); re-run `orchestrate "
                                "compile`")
        return cls(pte_path, folder, MappingProxyType(written), partitions, boundaries)


def is_manifest_folder(folder: Path) -> bool:
    """A real folder carrying a manifest.json `compile` wrote (so it may be replaced)."""
    if folder.is_symlink() or not folder.is_dir():
        return False
    try:
        written = load_json(folder / MANIFEST_NAME)
    except DataFileError:
        return False
    return isinstance(written, dict) and "manifest_version" in written and "pte" in written
