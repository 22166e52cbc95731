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
half-written output. An existing artifacts folder is replaced only when it carries our
manifest.json; anything else in its place is refused, never renamed or deleted.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from importlib import metadata
from pathlib import Path

import torch

from orchestrator import numerics
from partitioners.npu import DelegatePartition, npu_delegates  # noqa: F401 - re-exported
from orchestrator.errors import UserError
from orchestrator.artifacts.files import check_output_file, folder_of, publish_mode, staged_write

MANIFEST_VERSION = 1


def artifacts_dir_for(pte_path: Path) -> Path:
    return pte_path.with_name(pte_path.stem + ".artifacts")


def delegate_partitions(compiled):
    """Ethos-U delegates in program order, each with the Vela run whose payload it carries."""
    return npu_delegates(compiled.final_program, compiled.lowered.vela_runs)


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


def inside(folder: Path, relative: str) -> Path:
    """`folder / relative`, refusing a path that leaves the folder (absolute, `..`, a link out)."""
    candidate = (folder / relative)
    if Path(relative).is_absolute() or ".." in Path(relative).parts or \
            not candidate.resolve().is_relative_to(folder.resolve()):
        raise UserError(f"refusing to verify: {folder / 'manifest.json'} names {relative!r}, "
                        "which is outside its artifacts folder")
    return candidate


def check_artifacts(pte_path: Path) -> dict:
    """The manifest beside `pte_path`, after checking the `.pte` and every file the manifest
    lists against their SHA-256; raises UserError naming the first that differs. Every verify
    method calls this before it reads anything."""
    from kernels.safe_files import DataFileError, load_json

    pte_path = Path(pte_path)
    folder = artifacts_dir_for(pte_path)
    manifest_path = folder / "manifest.json"
    if not pte_path.is_file() or not manifest_path.is_file():
        missing = pte_path if not pte_path.is_file() else manifest_path
        raise UserError(f"refusing to verify: {missing} is missing; re-run `orchestrate compile` "
                        "to write the .pte and its artifacts folder")
    try:
        written = load_json(manifest_path)
        expected = written["pte"]["sha256"]
        files = written.get("files", {})
        if not isinstance(files, dict):
            raise TypeError("files")
    except (DataFileError, KeyError, TypeError) as error:
        raise UserError(f"refusing to verify: {manifest_path} is not a manifest written by "
                        f"`orchestrate compile` ({error}); re-run `orchestrate compile`") from None
    actual = hashlib.sha256(pte_path.read_bytes()).hexdigest()
    if actual != expected:
        raise UserError(f"refusing to verify: {pte_path} does not match its artifacts (its "
                        f"SHA-256 is {actual[:12]}..., {manifest_path} records "
                        f"{str(expected)[:12]}...); re-run `orchestrate compile` to write both")
    for relative, digest in files.items():
        path = inside(folder, str(relative))
        if not path.is_file():
            raise UserError(f"refusing to verify: {path} is missing from the artifacts; re-run "
                            "`orchestrate compile`")
        if hashlib.sha256(path.read_bytes()).hexdigest() != digest:
            raise UserError(f"refusing to verify: {path} was changed after compiling (its "
                            f"SHA-256 differs from {manifest_path}); re-run `orchestrate "
                            "compile`")
    return written


def check_outputs(pte_path: Path, option: str = "-o") -> None:
    """Refuse, before compiling, a .pte path whose outputs cannot be written or would replace
    something this tool did not write."""
    pte_path = Path(pte_path)
    if pte_path.suffix != ".pte":
        raise UserError(f"{option} '{pte_path}' must end in .pte; pass e.g. {option} model.pte")
    folder = artifacts_dir_for(pte_path)
    check_output_file(pte_path, option, companions=[folder])
    _require_ours(folder, option)


def _is_ours(folder: Path) -> bool:
    """A real folder carrying the manifest.json that `write_outputs` writes."""
    if folder.is_symlink() or not folder.is_dir():
        return False
    try:
        written = json.loads((folder / "manifest.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(written, dict) and "manifest_version" in written and "pte" in written


def _require_ours(folder: Path, option: str) -> None:
    if (folder.exists() or folder.is_symlink()) and not _is_ours(folder):
        kind = "link" if folder.is_symlink() else "folder" if folder.is_dir() else "file"
        raise UserError(f"'{folder}' exists and is a {kind} orchestrate did not write (no "
                        f"manifest.json in it), so it will not be replaced; move it away or "
                        f"choose another {option}")


def _atomic_replace_dir(tmp: Path, final: Path) -> None:
    """Move `tmp` to `final`. An existing `final` must be ours; it moves into a fresh folder of
    our own (never a name a user may hold, such as final.old) and is deleted once `tmp` is in."""
    if not (final.exists() or final.is_symlink()):
        tmp.rename(final)
        return
    _require_ours(final, "-o")
    old = Path(tempfile.mkdtemp(prefix=".orchestrate-old-", dir=final.parent))
    final.rename(old / final.name)
    try:
        tmp.rename(final)
    except BaseException:
        (old / final.name).rename(final)
        old.rmdir()
        raise
    shutil.rmtree(old)


def write_outputs(compiled, pte_path: Path, extra_files: dict[str, bytes] | None = None) -> Path:
    """Write `pte_path` and its artifacts folder; returns the folder.

    `extra_files` defaults to what the plan contributes (plan.json, operators.txt), so no
    caller can write an artifacts folder without them."""
    pte_path = Path(pte_path)
    if extra_files is None:
        from orchestrator.planning.planner import make_plan

        extra_files = make_plan(compiled).artifact_files()
    check_outputs(pte_path)
    parent = folder_of(pte_path)
    partitions = delegate_partitions(compiled)
    art_final = artifacts_dir_for(pte_path)
    art_tmp = Path(tempfile.mkdtemp(prefix=".orchestrate-", dir=parent))
    pte_tmp = None
    try:
        for p in partitions:
            pdir = art_tmp / "partitions" / f"p{p.index}"
            (pdir / "vela").mkdir(parents=True)
            (pdir / "model.tosa").write_bytes(p.tosa_bytes)
            vela_out = p.vela_dir / "output"
            for item in sorted(vela_out.iterdir()):
                shutil.copy2(item, pdir / "vela" / item.name)
        torch.export.save(compiled.captured.program, art_tmp / "float.pt2")
        torch.export.save(compiled.quantized.program, art_tmp / "quantized.pt2")
        for name, data in (extra_files or {}).items():
            (art_tmp / name).write_bytes(data)
        written = manifest(compiled, partitions)
        # Every file verify may read, with its SHA-256 (checked before use: check_artifacts).
        written["files"] = {str(f.relative_to(art_tmp)): hashlib.sha256(f.read_bytes()).hexdigest()
                            for f in sorted(art_tmp.rglob("*")) if f.is_file()}
        (art_tmp / "manifest.json").write_text(json.dumps(written, indent=2))
        publish_mode(art_tmp)
        # Both are complete before either is renamed into place, so a failure leaves the old
        # pair (or nothing); a .pte and artifacts from different runs fail verify's hash check.
        pte_tmp = staged_write(pte_path, compiled.pte_bytes)
        _atomic_replace_dir(art_tmp, art_final)
        os.replace(pte_tmp, pte_path)
    except BaseException:
        shutil.rmtree(art_tmp, ignore_errors=True)
        if pte_tmp is not None:
            pte_tmp.unlink(missing_ok=True)
        raise
    return art_final
