"""A corpus of hostile and damaged inputs, each a small folder and the command to run on it.

    python tests/hostile_corpus.py PROGRAM.pte OUT_DIR   # writes OUT_DIR/<case>/ and cases.json

`PROGRAM.pte` is a hybrid program `orchestrate compile` wrote (with its artifacts folder); every
case copies what it needs into its own folder, damages it, and names the command, the exit codes
allowed and what the one line must say. A case that could run code plants a `MARKER` file path
in what it writes: the file appearing is a failure. tests/test_hostile_corpus.py runs them all.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import shutil
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from tests.tampering import copy_program, flip_used_weight_byte

MARKER = "ran-hostile-code"  # a file of this name appearing means the tool ran the input


@dataclass(frozen=True)
class Case:
    name: str
    argv: list[str]  # orchestrate arguments; "{case}" is the case folder
    codes: list[int]  # the exit codes allowed
    needle: str  # what the one stderr line must contain ("" for any)


def _copy_program(pte: Path, folder: Path) -> Path:
    return copy_program(pte, folder, "model")


def _manifest(folder: Path) -> tuple[Path, dict]:
    path = folder / "model.artifacts" / "manifest.json"
    return path, json.loads(path.read_text())


def _rehash(folder: Path, manifest: dict) -> None:
    """Recompute every hash the manifest records, as a careful tamperer would."""
    pte = folder / "model.pte"
    manifest["pte"]["sha256"] = hashlib.sha256(pte.read_bytes()).hexdigest()
    art = folder / "model.artifacts"
    for relative in list(manifest["files"]):
        if (art / relative).is_file():
            manifest["files"][relative] = hashlib.sha256((art / relative).read_bytes()).hexdigest()
    for entry in manifest["partitions"]:
        if (art / entry["tosa"]).is_file():
            entry["tosa_sha256"] = hashlib.sha256((art / entry["tosa"]).read_bytes()).hexdigest()


def _laughs(levels: int = 9, width: int = 10) -> str:
    text = "l0: &l0 [" + ", ".join(["lol"] * width) + "]\n"
    for level in range(1, levels):
        text += f"l{level}: &l{level} [" + ", ".join([f"*l{level - 1}"] * width) + "]\n"
    return text


class _Plant:
    """Unpickling this writes the marker: a calibration file that runs code if loaded unsafely."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def _evil_platform(folder: Path) -> Path:
    """A copy of the Corstone-300 platform whose FVP and QEMU would plant the marker."""
    import platforms

    source = Path(platforms.__file__).parent / "corstone300"
    evil = folder / "evil-platform"
    shutil.copytree(source, evil)
    script = evil / "FVP_Corstone_SSE-300_Ethos-U55"
    script.write_text(f"#!/bin/sh\ntouch {folder / MARKER}\necho PASS\n")
    script.chmod(0o755)
    return evil / "platform.yaml"


def generate(pte: Path, out: Path) -> list[Case]:
    """Write every case's folder under `out`; return the cases."""
    cases: list[Case] = []
    out.mkdir(parents=True, exist_ok=True)

    def folder_of(name: str) -> Path:
        path = out / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    # Loaders: YAML bombs, bad encodings, a calibration pickle that runs code.
    bomb = folder_of("yaml-aliases-platform") / "bomb.yaml"
    bomb.write_text(_laughs())
    cases.append(Case("yaml-aliases-platform", ["plan", "ds-cnn", "--platform", str(bomb)],
                      [2], "aliases"))
    bomb = folder_of("yaml-aliases-policy") / "bomb.yaml"
    bomb.write_text(_laughs())
    cases.append(Case("yaml-aliases-policy", ["plan", "ds-cnn", "--policy", str(bomb)], [2],
                      "aliases"))
    latin = folder_of("yaml-not-utf8") / "soc.yaml"
    latin.write_bytes("name: caf\xe9\n".encode("latin-1"))
    cases.append(Case("yaml-not-utf8", ["plan", "ds-cnn", "--platform", str(latin)], [2],
                      "not UTF-8"))
    calibration = folder_of("calibration-pickle-runs-code") / "samples.pt"
    calibration.write_bytes(pickle.dumps(_Plant(str(calibration.parent / MARKER))))
    cases.append(Case("calibration-pickle-runs-code",
                      ["plan", "ds-cnn", "--npu", "none", "--calibration", str(calibration)],
                      [2], "samples.pt"))
    pt2 = folder_of("pt2-truncated") / "model.pt2"
    pt2.write_bytes(b"PK\x03\x04" + b"\0" * 64)
    cases.append(Case("pt2-truncated", ["plan", str(pt2)], [2], "model.pt2"))

    # The program and its artifacts folder.
    folder = folder_of("pte-byte-flipped")
    program = _copy_program(pte, folder)
    data = bytearray(program.read_bytes())
    data[len(data) // 2] ^= 0x01
    program.write_bytes(bytes(data))
    for extra, name in (([], "pte-byte-flipped"), (["--qemu"], "pte-byte-flipped-qemu"),
                        (["--runtime", "executorch"], "pte-byte-flipped-runtime")):
        cases.append(Case(name, ["verify", str(program), *extra], [2],
                          "does not match its artifacts"))
    folder = folder_of("manifest-names-a-platform-file")
    _copy_program(pte, folder)
    path, manifest = _manifest(folder)
    evil = _evil_platform(folder)
    manifest["target"]["platform"] = str(evil)
    manifest["target"]["platform_file"] = str(evil)
    path.write_text(json.dumps(manifest))
    for extra, name in ((["--fvp"], "manifest-names-a-platform-file"),
                        (["--qemu"], "manifest-names-a-platform-file-qemu")):
        cases.append(Case(name, ["verify", str(folder / "model.pte"), *extra], [2],
                          "not an installed platform"))
    folder = folder_of("manifest-path-escapes")
    _copy_program(pte, folder)
    path, manifest = _manifest(folder)
    manifest["files"]["../../outside.txt"] = "0" * 64
    path.write_text(json.dumps(manifest))
    cases.append(Case("manifest-path-escapes", ["verify", str(folder / "model.pte")], [2],
                      "outside its artifacts folder"))
    folder = folder_of("manifest-not-json")
    _copy_program(pte, folder)
    (folder / "model.artifacts" / "manifest.json").write_bytes(b"{\"pte\": [1, 2,")
    cases.append(Case("manifest-not-json", ["verify", str(folder / "model.pte")], [2],
                      "manifest.json"))

    # NPU bytes: a payload weight byte changed with every hash recomputed, and TOSA graphs with
    # random bytes flipped (hashes recomputed): the twin must fail or refuse, never crash.
    folder = folder_of("npu-weight-byte")
    program = _copy_program(pte, folder)
    path, manifest = _manifest(folder)
    flip_used_weight_byte(program)
    cases.append(Case("npu-weight-byte", ["verify", str(program), "--runtime", "twin"], [4],
                      "EthosUBackend lowered_module_"))
    for seed in range(3):
        name = f"tosa-fuzz-{seed}"
        folder = folder_of(name)
        program = _copy_program(pte, folder)
        path, manifest = _manifest(folder)
        tosa = folder / "model.artifacts" / manifest["partitions"][0]["tosa"]
        data = bytearray(tosa.read_bytes())
        for k in range(4):  # four bytes, spread over the flatbuffer
            position = (seed * 7919 + k * 104729) % len(data)
            data[position] ^= 0xFF
        tosa.write_bytes(bytes(data))
        _rehash(folder, manifest)
        path.write_text(json.dumps(manifest))
        cases.append(Case(name, ["verify", str(program), "--runtime", "twin", "--samples", "2"],
                          [2, 4], ""))
    (out / "cases.json").write_text(json.dumps([asdict(c) for c in cases], indent=1))
    return cases


if __name__ == "__main__":
    written = generate(Path(sys.argv[1]), Path(sys.argv[2]))
    print(f"{len(written)} cases in {sys.argv[2]}")
