"""One safe loader for every YAML and JSON file the tool reads (platforms, policies, memory
policies, manifests, the firmware recipe): a file is data, so reading it can neither run code
nor take the machine's memory.

- YAML through PyYAML's SafeLoader (no tags that build objects), with aliases refused: a
  "billion laughs" file (nested aliases, 9 levels of 10) otherwise expands to gigabytes;
- bytes that are not UTF-8 are named with their offset, not an internal error;
- size (`max_bytes`), nesting depth and node count are bounded;
- the error says which file and what to do, and is a `DataFileError` that callers turn into
  their own (PlatformError, PolicyError, ...), so the CLI reports one line with exit 2.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

MAX_BYTES = 4 << 20
MAX_DEPTH = 32
MAX_NODES = 200_000


class DataFileError(ValueError):
    """A YAML or JSON file that cannot be read safely; the message names it."""


class _NoAliasLoader(yaml.SafeLoader):
    """SafeLoader that refuses aliases and bounds depth and node count while composing."""

    def __init__(self, stream, path: str):
        super().__init__(stream)
        self._path = path
        self._depth = 0
        self._nodes = 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise DataFileError(
                f"{self._path}: line {event.start_mark.line + 1}: YAML aliases (*{event.anchor}) "
                "are not accepted; write the value out")
        self._depth += 1
        self._nodes += 1
        if self._depth > MAX_DEPTH:
            raise DataFileError(f"{self._path}: nested deeper than {MAX_DEPTH} levels")
        if self._nodes > MAX_NODES:
            raise DataFileError(f"{self._path}: more than {MAX_NODES:,} values")
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def read_text(path: str | Path, max_bytes: int = MAX_BYTES) -> str:
    """The file's text: at most `max_bytes`, UTF-8."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise DataFileError(f"{path}: {size:,} bytes, more than the {max_bytes:,} a "
                                "configuration file may have")
        data = path.read_bytes()
    except OSError as error:
        raise DataFileError(f"{path}: cannot be read ({error.strerror or error})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise DataFileError(f"{path}: not UTF-8 text (byte {error.start}: "
                            f"{data[error.start:error.start + 1]!r}); save it as UTF-8") from None


def load_yaml(path: str | Path, max_bytes: int = MAX_BYTES):
    """The YAML document in `path` (safe types only, no aliases, bounded)."""
    text = read_text(path, max_bytes)
    loader = _NoAliasLoader(text, str(path))
    try:
        return loader.get_single_data()
    except DataFileError:
        raise
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(error, "problem", None) or " ".join(str(error).split())[:160]
        raise DataFileError(f"{path}: {where}not valid YAML ({problem})") from None
    finally:
        loader.dispose()


def _depth(value, limit: int, level: int = 0) -> None:
    if level > limit:
        raise DataFileError(f"nested deeper than {limit} levels")
    if isinstance(value, dict):
        for item in value.values():
            _depth(item, limit, level + 1)
    elif isinstance(value, list):
        for item in value:
            _depth(item, limit, level + 1)


def load_json(path: str | Path, max_bytes: int = MAX_BYTES):
    """The JSON document in `path` (bounded size and depth, UTF-8)."""
    text = read_text(path, max_bytes)
    try:
        value = json.loads(text)
        _depth(value, MAX_DEPTH)
    except json.JSONDecodeError as error:
        raise DataFileError(f"{path}: line {error.lineno}: not valid JSON ({error.msg})") from None
    except (DataFileError, RecursionError) as error:
        raise DataFileError(f"{path}: {error}") from None
    return value
