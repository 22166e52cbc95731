"""How the tests damage a compiled program the way a careful tamperer would: a copy of the `.pte`
and its artifacts folder, a byte of a delegate payload changed, and every hash the manifest
records recomputed so that only the bytes' meaning can give the change away.

Used by tests/test_npu_verify.py (twin and host runtime), tests/test_qemu_npu.py (the device
side on QEMU) and tests/hostile_corpus.py.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np

from npu_driver.ethos_u import run_partition
from orchestrator.cli import main
from orchestrator.verification.twin import load_twin
from tests.device_tools import missing


def copy_program(pte: Path, folder: Path, name: str | None = None) -> Path:
    """`pte` and its artifacts folder copied into `folder` (as `name`.pte when given)."""
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / (f"{name}.pte" if name else pte.name)
    shutil.copy2(pte, target)
    shutil.copytree(pte.with_name(pte.stem + ".artifacts"),
                    target.with_name(target.stem + ".artifacts"))
    return target


def manifest_path(pte: Path) -> Path:
    return pte.with_name(pte.stem + ".artifacts") / "manifest.json"


def payload_bytes(twin, index: int = 0) -> bytes:
    """Delegate `index`'s payload as it lies in the program."""
    return twin.view.delegates[index].payload


def used_weight_offset(partition) -> int:
    """Offset, in the partition's weight data, of a byte its first operation's weights and
    scales come from (a traced run: the DMA that copies them from region 0 into the scratch),
    so changing it changes the computation."""
    arrays = [np.zeros(spec.shape, dtype=spec.numpy_type) for spec in partition.io.inputs]
    _, counters = run_partition(partition.payload, arrays, None, trace=True)
    read = next(a for a in counters.trace if a.what == "DMA source" and a.region == 0)
    return (read.lowest + read.highest) // 2


def replace_payload(pte: Path, old: bytes, new: bytes) -> None:
    """Put `new` where the delegate payload `old` lies in the .pte and recompute the manifest's
    hashes of the .pte and of that payload."""
    data = pte.read_bytes()
    assert data.count(old) == 1 and len(new) == len(old)
    data = data.replace(old, new)
    pte.write_bytes(data)
    path = manifest_path(pte)
    manifest = json.loads(path.read_text())
    manifest["pte"]["sha256"] = hashlib.sha256(data).hexdigest()
    for entry in manifest["partitions"]:
        if entry["payload_sha256"] == hashlib.sha256(old).hexdigest():
            entry["payload_sha256"] = hashlib.sha256(new).hexdigest()
    path.write_text(json.dumps(manifest))


def flip_weight_byte(pte: Path, position: int, mask: int = 0x01) -> None:
    """XOR (in place) byte `position` of the first partition's weight data with `mask`."""
    twin = load_twin(pte)
    payload = payload_bytes(twin)
    blob = bytearray(payload)
    blob[payload.index(twin.partitions[0].payload.weight_bytes) + position] ^= mask
    replace_payload(pte, payload, bytes(blob))


def flip_used_weight_byte(pte: Path) -> None:
    """Change (in place) a weight byte the first partition's first operation reads."""
    twin = load_twin(pte)
    payload = payload_bytes(twin)
    partition = twin.partitions[0]
    blob = bytearray(payload)
    blob[payload.index(partition.payload.weight_bytes) + used_weight_offset(partition)] ^= 0x40
    replace_payload(pte, payload, bytes(blob))


def verify_fails_on_every_method(pte: Path, capsys, partition: str, expected: str) -> None:
    """`orchestrate verify` on a tampered program exits 4, the twin naming `partition` and
    `expected`, and the host runtime and QEMU failing with `expected` too (under CI a method
    this machine cannot run fails the test: tests/device_tools.py)."""
    code = main(["verify", str(pte), "--samples", "1", "--format", "json"])
    report = json.loads(capsys.readouterr().out)
    methods = {m["name"]: m for m in report["methods"]}
    assert code == 4 and report["outcome"] == "failed"
    assert partition in methods["twin"]["detail"] and expected in methods["twin"]["detail"]
    for name in ("host runtime", "QEMU Cortex-M55"):
        if methods[name]["outcome"] == "not-run":
            missing(methods[name]["detail"])
        assert methods[name]["outcome"] == "failed", methods[name]
        assert expected in methods[name]["detail"], methods[name]["detail"]


def check_firmware_refuses_on_the_device(good: Path, tampered: Path, conv: int,
                                         folder: Path) -> None:
    """`orchestrate firmware --profile check` of `good` (qemu-bridge) runs to the twin's bytes
    on QEMU; with `tampered` (the same size: one word differs, its first convolution's OFM base
    past the scratch) in its place in the ELF, the core refuses the invocation in the host
    checker's words (templates/npu_stream_check.c) and the host never computes it."""
    from orchestrator.firmware import (firmware_run_lines, load_record, make_firmware,
                                       run_on_qemu)
    from orchestrator.firmware.spec import BUILD_DIR, ELF_NAME, RECORD_NAME
    from npu_driver.ethos_u import SCRATCH_REGION
    from tests.device_tools import qemu_or_missing

    qemu_or_missing()
    made = make_firmware(good, folder, profile="check", npu_device="qemu-bridge")
    assert "board/npu_stream_check.c" in (made.folder / "CMakeLists.txt").read_text()
    lines, passed = firmware_run_lines(made.folder, good)
    assert passed and "byte-identical to the host twin's" in lines[-1]

    # The tampered program in place of the embedded one, patched into the ELF where the .pte
    # lies instead of building again.
    elf = made.folder / BUILD_DIR / ELF_NAME
    image, good_pte, bad_pte = elf.read_bytes(), good.read_bytes(), tampered.read_bytes()
    assert len(bad_pte) == len(good_pte) and image.count(good_pte) == 1
    elf.write_bytes(image.replace(good_pte, bad_pte))
    record = load_record(made.folder)
    record["pte_sha256"] = hashlib.sha256(bad_pte).hexdigest()
    (made.folder / RECORD_NAME).write_text(json.dumps(record, indent=1) + "\n")
    refused = run_on_qemu(made.folder, pte_path=tampered)
    scratch = load_twin(tampered).partitions[0].payload.scratch_bytes
    assert refused.exit_code != 0
    assert (f"E [npu_check] NPU_OP_CONV at word {conv}: OFM reaches bytes "
            in refused.log), refused.log[-2000:]
    assert f"of region {SCRATCH_REGION}, which has {scratch} bytes" in refused.log
    assert "[npu_bridge]" not in refused.log  # the host's model was never asked
