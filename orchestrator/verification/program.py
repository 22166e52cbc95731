"""What a verification reads from disk, read once: the program and its artifacts as data.

`verify` opens a `.pte` once (`orchestrator.verification.twin.load_twin`: its bytes, its
ProgramView, the hash-checked manifest of its artifacts folder, and its Ethos-U partitions with
their payloads, TOSA graphs and graph I/O) and hands that one value to every method; the
reference programs beside it are read at most once per value (`TwinProgram.reference`). This
module holds the parts of that view the NPU executor needs too (`NpuPartition`), and the error
every reader raises for a program or folder it refuses (`TwinError`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from kernels.program_view import ProgramView
from npu_driver.payload import EthosUPayload, PayloadError, parse_payload
from npu_driver.tosa_twin import TosaGraphIO, TosaTwinError, check_against_payload, graph_io
from orchestrator.artifacts.manifest import MANIFEST_NAME, Manifest, artifacts_dir_for
from orchestrator.errors import UserError
from orchestrator.sources.pt2 import read_exported_program

ETHOS_U_BACKEND = "EthosUBackend"


class TwinError(UserError):
    """The program cannot be verified as given (missing or mismatched artifacts, bad input)."""


@dataclass(frozen=True)
class NpuPartition:
    """An Ethos-U delegate with the TOSA graph Vela compiled for it."""

    index: int
    delegate_name: str  # lowered_module_<k>, from the manifest
    tosa_relpath: str
    payload: EthosUPayload
    tosa_bytes: bytes
    io: TosaGraphIO


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def load_partitions(pte_path: Path, view: ProgramView,
                    manifest: Manifest | None) -> tuple[NpuPartition, ...]:
    """Every Ethos-U delegate of `view` resolved, by its payload's SHA-256, to the manifest's
    partition and its hash-checked TOSA graph; the graph's I/O checked against the payload's."""
    if not view.delegates:
        return ()
    if manifest is None:
        manifest_path = artifacts_dir_for(pte_path) / MANIFEST_NAME
        raise TwinError(f"refusing to verify: {pte_path.name} has {len(view.delegates)} Ethos-U "
                        f"delegate(s) but {manifest_path} is missing; the twin needs the "
                        "artifacts folder `orchestrate compile` writes next to the .pte")
    partitions = []
    for delegate in view.delegates:
        index = delegate.index
        if delegate.backend != ETHOS_U_BACKEND:
            raise TwinError(f"delegate {index} targets backend {delegate.backend}; the twin runs "
                            f"{ETHOS_U_BACKEND} delegates only")
        if not delegate.inline:
            raise TwinError(f"delegate {index}'s payload is not inline after deserialization")
        payload_bytes = delegate.payload
        digest = _sha256(payload_bytes)
        entry = manifest.partition_of_payload(digest)
        if entry is None:
            raise TwinError(f"refusing to verify: delegate {index} of {pte_path.name} (payload "
                            f"sha256 {digest[:16]}) is not in {MANIFEST_NAME}; the artifacts "
                            "folder belongs to a different compile")
        tosa_path = manifest.file(entry.tosa)
        if not tosa_path.is_file():
            raise TwinError(f"refusing to verify: TOSA artifact {entry.tosa} of delegate "
                            f"{entry.delegate} is missing from {manifest.folder}")
        tosa_bytes = tosa_path.read_bytes()
        actual = _sha256(tosa_bytes)
        if actual != entry.tosa_sha256:
            raise TwinError(f"refusing to verify: TOSA artifact {entry.tosa} does not match "
                            f"delegate {entry.delegate} (sha256 {actual[:16]} != "
                            f"{entry.tosa_sha256[:16]})")
        try:
            payload = parse_payload(payload_bytes)
            io = graph_io(tosa_bytes)
            check_against_payload(io, payload, f"{entry.delegate} ({entry.tosa})")
        except (PayloadError, TosaTwinError) as error:
            raise TwinError(f"refusing to verify: {error}") from None
        partitions.append(NpuPartition(index, entry.delegate, entry.tosa, payload,
                                       tosa_bytes, io))
    return tuple(partitions)


def load_reference(path: Path):
    """A reference program from the artifacts folder, loaded as data: an artifacts folder may
    come from someone else, and nothing in it may run code (see read_exported_program)."""
    import torchao.quantization.pt2e  # noqa: F401 - registers quantized_decomposed for loading  # lazy: heavy (torchao)

    if not path.is_file():
        raise TwinError(f"refusing to verify: reference program {path} is missing; re-run "
                        "`orchestrate compile` to write the artifacts folder")
    program = read_exported_program(
        path, "re-run `orchestrate compile` to rewrite the artifacts folder")
    return program, program.module(check_guards=False)
