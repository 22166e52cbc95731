"""The wheel is the product: a plain `pip install` of it carries every file a command reads, and
the device commands work from it, outside the checkout.

An editable install reads the checkout, so the rest of the suite cannot see a file the wheel
forgot (13 C and header files once: the runner's `npu/` folder and the firmware templates, then in `platforms/firmware/`).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.device_tools import qemu_or_missing

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("orchestrator", "partitioners", "cost_models", "kernels", "npu_driver", "platforms",
            "examples")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel `pip wheel .` builds from a copy of the checkout's tracked files (as a fresh
    clone has them: setuptools reuses a `build/` folder left in the checkout, which can hold
    files the declared package data no longer reaches), with the build backend installed here."""
    source = tmp_path_factory.mktemp("source")
    for name in _tracked(["pyproject.toml", "README.md", "docs", *PACKAGES]):
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, source / name)
    out = tmp_path_factory.mktemp("wheel")
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                           "--no-build-isolation", "-w", str(out), str(source)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    (built,) = out.glob("orchestrate-*.whl")
    return built


def _tracked(paths: list[str]) -> list[str]:
    """The files `git ls-files` lists under `paths` that exist in the work tree."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not run: the file list comes from `git ls-files` of a checkout")
    listed = subprocess.run(["git", "ls-files", *paths], cwd=REPO, capture_output=True,
                            text=True, check=True).stdout.split()
    return [name for name in listed if (REPO / name).is_file()]


def _tracked_package_files() -> list[str]:
    return [name for name in _tracked(list(PACKAGES)) if "/tests/" not in name]


def test_wheel_holds_every_file_git_knows_under_the_packages(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = [name for name in _tracked_package_files() if name not in names]
    assert not missing, f"the wheel lacks {len(missing)} file(s): {missing}"
    # The README and every page of docs/ ship, with the README's relative links intact.
    data = "orchestrate-0.1.0.data/data/share/doc/orchestrate/"
    documents = [name for name in _tracked(["README.md", "docs"]) if name.endswith(".md")]
    assert len(documents) > 5 and not [name for name in documents if data + name not in names], \
        sorted(name for name in names if name.startswith(data))
    # Nothing the build left behind rides along.
    stray = [name for name in names if "__pycache__" in name or name.endswith(".pyc")]
    assert not stray, stray


def _user_venv(wheel: Path, where: Path) -> Path:
    """A fresh venv at `where` with the wheel installed as a user installs it. Its dependencies
    (torch, ExecuTorch, Vela: gigabytes) are this interpreter's site-packages, reached through a
    path entry, which Python adds without running the `.pth` files in it: the editable install
    of the checkout stays invisible."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    site = Path(subprocess.run([str(where / "bin" / "python"), "-c",
                                "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "orchestrate-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(where / "bin" / "python"),
                    "install", "-q", "--no-deps", str(wheel)], check=True, capture_output=True)
    return where / "bin" / "orchestrate"


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """`argv` as a user runs it: no PYTHONPATH, the third-party sources named by
    $ORCHESTRATE_THIRD_PARTY (an installed package has no checkout to find them beside)."""
    from kernels.native.sources import THIRD_PARTY_ENV, third_party_root

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    env[THIRD_PARTY_ENV] = str(third_party_root()[0])
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, env=env, timeout=1800)


def test_installed_wheel_runs_a_hybrid_program_on_qemu_and_its_firmware(wheel, tmp_path):
    """From a venv outside the checkout with only the wheel installed: compile a U55-128
    program, `verify --qemu` it (the runner with its NPU bridge is built from the wheel's C
    sources) and `firmware --npu-device qemu-bridge --run` it (the release firmware's sources
    are the wheel's `orchestrator/firmware/templates/`)."""
    qemu_or_missing()
    orchestrate = _user_venv(wheel, tmp_path / "venv")
    work = tmp_path / "work"
    work.mkdir()
    located = _run([str(orchestrate.parent / "python"), "-c",
                    "import platforms, orchestrator; print(platforms.__file__)"], work)
    assert located.stdout.startswith(str(tmp_path / "venv")), located.stdout + located.stderr
    # --help names where the documentation is, and it is there: the wheel's copy
    helped = _run([str(orchestrate), "--help"], work)
    readme = Path(re.search(r"Documentation: (\S+README\.md)", " ".join(helped.stdout.split()))[1])
    assert readme.is_relative_to(tmp_path / "venv") and readme.is_file(), helped.stdout
    assert (readme.parent / "docs" / "plan.md").is_file() and "docs/plan.md" in readme.read_text()

    compiled = _run([str(orchestrate), "compile", "ds-cnn", "--platform", "corstone300",
                     "--npu", "ethos-u55-128", "-o", "ds.pte", "--quiet"], work)
    assert compiled.returncode == 0, compiled.stderr
    verified = _run([str(orchestrate), "verify", "ds.pte", "--qemu"], work)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    cases = [line for line in verified.stdout.splitlines() if line.strip().startswith("case ")]
    assert cases and all(": PASS," in line for line in cases), verified.stdout
    assert any(line.startswith("npu: ") for line in verified.stdout.splitlines()), verified.stdout

    firmware = _run([str(orchestrate), "firmware", "ds.pte", "-o", "fw", "--npu-device",
                     "qemu-bridge", "--run"], work)
    assert firmware.returncode == 0, firmware.stdout + firmware.stderr
    assert "byte-identical to the host twin's" in firmware.stdout, firmware.stdout
