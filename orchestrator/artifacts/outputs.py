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
from pathlib import Path

from orchestrator.artifacts.files import (check_outputs, folder_of, publish_mode, require_ours,
                                          staged_write, write_failed)
from orchestrator.artifacts.pt2_bytes import pt2_bytes
from orchestrator.termination import deferred, removed_on_stop
from orchestrator.artifacts.manifest import MANIFEST_NAME, artifacts_dir_for, manifest_json
from partitioners.npu import npu_delegates

def delegate_partitions(compiled):
    """Ethos-U delegates in program order, each with the Vela run whose payload it carries."""
    return npu_delegates(compiled.final_program, compiled.lowered.vela_runs)


def _atomic_replace_dir(tmp: Path, final: Path) -> None:
    """Move `tmp` to `final`. An existing `final` must be ours; it moves into a fresh folder of
    our own (never a name a user may hold, such as final.old) and is deleted once `tmp` is in."""
    if not (final.exists() or final.is_symlink()):
        tmp.rename(final)
        return
    require_ours(final, "-o")
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
        from orchestrator.planning.planner import make_plan  # lazy: heavy (executorch, vela)

        extra_files = make_plan(compiled).artifact_files()
    check_outputs(pte_path)
    parent = folder_of(pte_path)
    partitions = delegate_partitions(compiled)
    art_final = artifacts_dir_for(pte_path)
    pte_tmp = None
    with removed_on_stop(lambda: tempfile.mkdtemp(prefix=".orchestrate-", dir=parent)) as art_tmp:
        try:
            _fill_artifacts(compiled, art_tmp, partitions, extra_files)
            # Both are complete before either is renamed into place, so a failure leaves the
            # old pair (or nothing); a .pte and artifacts from different runs fail verify's
            # hash check. A stop during the renames waits for them.
            with removed_on_stop(lambda: staged_write(pte_path, compiled.pte_bytes)) as pte_tmp:
                with deferred():
                    _atomic_replace_dir(art_tmp, art_final)
                    os.replace(pte_tmp, pte_path)
        except BaseException as error:
            shutil.rmtree(art_tmp, ignore_errors=True)
            if pte_tmp is not None:
                pte_tmp.unlink(missing_ok=True)
            if isinstance(error, OSError) and error.errno is not None:
                raise write_failed(pte_path, error) from None
            raise
    return art_final


def _fill_artifacts(compiled, art_tmp: Path, partitions, extra_files: dict[str, bytes]) -> None:
    """The artifacts folder's files, into `art_tmp`."""
    for p in partitions:
        pdir = art_tmp / "partitions" / f"p{p.index}"
        (pdir / "vela").mkdir(parents=True)
        (pdir / "model.tosa").write_bytes(p.tosa_bytes)
        vela_out = p.vela_dir / "output"
        for item in sorted(vela_out.iterdir()):
            shutil.copy2(item, pdir / "vela" / item.name)
    (art_tmp / "float.pt2").write_bytes(pt2_bytes(compiled.captured.program))
    (art_tmp / "quantized.pt2").write_bytes(pt2_bytes(compiled.quantized.program))
    for name, data in (extra_files or {}).items():
        (art_tmp / name).write_bytes(data)
    written = manifest_json(compiled, partitions)
    # Every file verify may read, with its SHA-256 (checked before use: check_artifacts).
    written["files"] = {str(f.relative_to(art_tmp)): hashlib.sha256(f.read_bytes()).hexdigest()
                        for f in sorted(art_tmp.rglob("*")) if f.is_file()}
    (art_tmp / MANIFEST_NAME).write_text(json.dumps(written, indent=2))
    publish_mode(art_tmp)
