"""Writing a compile's outputs: `out.pte` and, beside it, `out.artifacts/`.

    out.artifacts/
      manifest.json                    inputs, target, versions, hashes, sizes
      partitions/p<k>/model.tosa       the TOSA graph Vela compiled for delegate k
      partitions/p<k>/vela/            Vela's summary CSV, per-layer CSV and out_vela.npz
      plan.json                        the placement report (written by `compile`)
      operators.txt                    the operators the firmware must register (selective build)
      float.pt2, quantized.pt2         the captured float program and the quantized reference
                                       (convert_pt2e), which `verify` compares the .pte against

Partition k is the k-th Ethos-U delegate in the program's delegate list; the manifest records the
SHA-256 of its TOSA graph and of its delegate payload so the twin matches them by content.
Everything is written to a temporary sibling and renamed into place, so a failed run leaves no
half-written output.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import torch

from orchestrator import numerics
from orchestrator.errors import UserError
from orchestrator.files import atomic_write_bytes, publish_mode

MANIFEST_VERSION = 1


@dataclass(frozen=True)
class DelegatePartition:
    """An Ethos-U delegate of the final program, matched to the Vela call that produced it."""

    index: int
    delegate_name: str  # lowered_module_<k> in the edge program
    payload_sha256: str
    tosa_sha256: str
    tosa_bytes: bytes
    vela_dir: Path


def artifacts_dir_for(pte_path: Path) -> Path:
    return pte_path.with_name(pte_path.stem + ".artifacts")


def delegate_partitions(compiled) -> list[DelegatePartition]:
    """Ethos-U delegates in program order, each with the Vela run whose payload it carries."""
    by_payload = {run.payload_sha256: run for run in compiled.lowered.vela_runs}
    partitions = []
    for index, (name, lowered) in enumerate(_lowered_modules(compiled.final_program)):
        digest = hashlib.sha256(lowered.processed_bytes).hexdigest()
        run = by_payload.get(digest)
        if run is None:
            raise RuntimeError(f"delegate {name} has no matching Vela run (payload {digest[:12]})")
        partitions.append(DelegatePartition(index, name, digest, run.tosa_sha256, run.tosa_bytes,
                                            run.out_dir))
    return partitions


def _lowered_modules(program):
    graph_module = program.graph_module
    for node in graph_module.graph.nodes:
        if node.op == "call_function" and "executorch_call_delegate" in str(node.target):
            name = node.args[0].target
            yield name, getattr(graph_module, name)


def package_versions() -> dict[str, str]:
    versions = {}
    for package in ("orchestrate", "torch", "executorch", "ethos-u-vela", "tosa-tools", "torchao"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = "not installed"
    return versions


def manifest(compiled, partitions: list[DelegatePartition]) -> dict:
    plan = compiled.executorch_program.execution_plan[0]
    return {
        "manifest_version": MANIFEST_VERSION,
        "model": {"name": compiled.model.name, "source": compiled.model.source,
                  "inputs": [list(x.shape) for x in compiled.model.example_inputs]},
        "calibration": {"source": compiled.calibration.source,
                        "samples": len(compiled.calibration.samples),
                        "generated": compiled.calibration.generated},
        "target": compiled.target.to_json(),
        "versions": package_versions(),
        "host_numerics": numerics.state(),
        "pte": {"sha256": hashlib.sha256(compiled.pte_bytes).hexdigest(),
                "bytes": len(compiled.pte_bytes),
                "arena_bytes": compiled.arena_bytes,
                "non_const_buffer_sizes": [int(s) for s in plan.non_const_buffer_sizes]},
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


def _atomic_replace_dir(tmp: Path, final: Path) -> None:
    if final.exists():
        old = final.with_name(final.name + ".old")
        if old.exists():
            shutil.rmtree(old)
        final.rename(old)
        tmp.rename(final)
        shutil.rmtree(old)
    else:
        tmp.rename(final)


def write_outputs(compiled, pte_path: Path, extra_files: dict[str, bytes] | None = None) -> Path:
    """Write `pte_path` and its artifacts folder; returns the folder."""
    pte_path = Path(pte_path)
    if pte_path.suffix != ".pte":
        raise UserError(f"output '{pte_path}' must end in .pte; pass e.g. -o model.pte")
    parent = pte_path.parent if str(pte_path.parent) else Path(".")
    if not parent.is_dir():
        raise UserError(f"output folder '{parent}' does not exist; create it or choose another -o")
    partitions = delegate_partitions(compiled)
    art_final = artifacts_dir_for(pte_path)
    art_tmp = Path(tempfile.mkdtemp(prefix=".orchestrate-", dir=parent))
    try:
        for p in partitions:
            pdir = art_tmp / "partitions" / f"p{p.index}"
            (pdir / "vela").mkdir(parents=True)
            (pdir / "model.tosa").write_bytes(p.tosa_bytes)
            vela_out = p.vela_dir / "output"
            for item in sorted(vela_out.iterdir()):
                shutil.copy2(item, pdir / "vela" / item.name)
        (art_tmp / "manifest.json").write_text(json.dumps(manifest(compiled, partitions), indent=2))
        torch.export.save(compiled.captured.program, art_tmp / "float.pt2")
        torch.export.save(compiled.quantized.program, art_tmp / "quantized.pt2")
        for name, data in (extra_files or {}).items():
            (art_tmp / name).write_bytes(data)
        publish_mode(art_tmp)
        _atomic_replace_dir(art_tmp, art_final)
        atomic_write_bytes(pte_path, compiled.pte_bytes)
    except BaseException:
        shutil.rmtree(art_tmp, ignore_errors=True)
        raise
    return art_final
