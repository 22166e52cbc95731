"""Writing outputs so that a failed run leaves nothing half-written, with the user's usual modes.

`check_output_file` refuses, before any work, an output that could not be written or whose
writing would replace something that is not a file (a folder, a device node).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from contextlib import ExitStack
from pathlib import Path

from orchestrator.artifacts.manifest import artifacts_dir_for, is_manifest_folder
from orchestrator.errors import UserError
from orchestrator.termination import deferred, removed_on_stop

_TEMP_PREFIX = ".orchestrate-"
# Room for what is written inside an artifacts folder (partitions/p<k>/vela/<Vela's file names>).
_PATH_MARGIN_BYTES = 128


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def publish_mode(path: Path) -> None:
    """`mkstemp`/`mkdtemp` create 0600/0700 entries; give them the modes a plain write would."""
    base = 0o777 if Path(path).is_dir() else 0o666
    os.chmod(path, base & ~_umask())


def folder_of(path: Path) -> Path:
    """The folder a relative or absolute output path is written in."""
    return Path(path).parent if str(Path(path).parent) else Path(".")


def staged_write(path: Path, data: bytes) -> Path:
    """Write `data` to a new temporary sibling of `path` and return it; the caller renames it."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=_TEMP_PREFIX, suffix=path.suffix, dir=folder_of(path))
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        publish_mode(Path(tmp))
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return Path(tmp)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write to a temporary sibling, then rename over `path`; a full disk or a failed write is
    one UserError naming the file (nothing is left behind)."""
    with ExitStack() as stack:
        try:
            tmp = stack.enter_context(removed_on_stop(lambda: staged_write(path, data)))
        except OSError as error:
            raise write_failed(path, error) from None
        try:
            with deferred():
                os.replace(tmp, path)
        except OSError as error:
            tmp.unlink(missing_ok=True)
            raise write_failed(path, error) from None
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise


def write_failed(path: Path, error: OSError) -> UserError:
    """The one line for an output the file system would not take (ENOSPC, EDQUOT, EIO, ...)."""
    return UserError(f"cannot write {path}: {error.strerror or error}; nothing was written "
                     "(earlier outputs are as they were); free space or choose another path")


def check_output_file(path: Path, option: str, companions: Iterable[Path] = ()) -> None:
    """Refuse an output file that cannot be written: its folder is missing or read-only, the path
    is a folder or another non-file, or its name (or a companion's written beside it, such as
    the artifacts folder of a .pte) is longer than the file system allows."""
    path = Path(path)
    folder = folder_of(path)
    # Lengths first: stat() of an over-long name raises instead of answering.
    name_max = _limit(folder, "PC_NAME_MAX", 255)
    path_max = _limit(folder, "PC_PATH_MAX", 4096)
    for item in (path, *companions):
        name_bytes = len(os.fsencode(Path(item).name))
        if name_bytes > name_max:
            raise UserError(f"{option}: the name '{_short(Path(item).name)}' is {name_bytes} bytes, "
                            f"longer than the {name_max} bytes the file system allows; choose a "
                            f"shorter {option}")
        if len(os.fsencode(os.path.abspath(item))) + _PATH_MARGIN_BYTES > path_max:
            raise UserError(f"{option}: the path '{_short(str(item))}' leaves no room within the "
                            f"{path_max}-byte path limit; choose a shorter {option}")
    if path.is_dir():
        raise UserError(f"{option} '{path}' is a folder; give the path of a file to write")
    if path.exists() and not path.is_file():
        raise UserError(f"{option} '{path}' exists and is not a regular file; choose another "
                        f"{option}")
    if not folder.is_dir():
        raise UserError(f"output folder '{folder}' does not exist; create it or choose another "
                        f"{option}")
    # Permission bits do not say it all (root, read-only mounts, ACLs): try the real thing.
    try:
        fd, probe = tempfile.mkstemp(prefix=_TEMP_PREFIX, dir=folder)
    except OSError as error:
        raise UserError(f"cannot write in output folder '{folder}' ({error.strerror}); choose "
                        f"another {option}") from None
    os.close(fd)
    os.unlink(probe)


def same_path(a: Path, b: Path) -> bool:
    """Whether two paths name the same file or folder (also through links), existing or not."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.abspath(a) == os.path.abspath(b)


def _limit(folder: Path, name: str, default: int) -> int:
    try:
        return int(os.pathconf(folder, name))
    except (OSError, ValueError):
        return default


def _short(text: str) -> str:
    return text if len(text) <= 60 else f"{text[:28]}...{text[-28:]}"


def check_outputs(pte_path: Path, option: str = "-o") -> None:
    """Refuse, before compiling, a .pte path whose outputs cannot be written or would replace
    something this tool did not write."""
    pte_path = Path(pte_path)
    if pte_path.suffix != ".pte":
        raise UserError(f"{option} '{pte_path}' must end in .pte; pass e.g. {option} model.pte")
    folder = artifacts_dir_for(pte_path)
    check_output_file(pte_path, option, companions=[folder])
    require_ours(folder, option)


def require_ours(folder: Path, option: str) -> None:
    """Refuse to replace a path at `folder` unless it is an artifacts folder this tool wrote."""
    if (folder.exists() or folder.is_symlink()) and not is_manifest_folder(folder):
        kind = "link" if folder.is_symlink() else "folder" if folder.is_dir() else "file"
        raise UserError(f"'{folder}' exists and is a {kind} orchestrate did not write (no "
                        f"manifest.json in it), so it will not be replaced; move it away or "
                        f"choose another {option}")
