"""An ExportedProgram's `.pt2` bytes, made once per program object.

A compile writes the same two programs (float and quantized) twice: into the cache entry
(orchestrator/artifacts/cache.py) and into the artifacts folder verify reads
(orchestrator/artifacts/outputs.py). `torch.export.save` serializes the whole graph each time: a
25-step GRU's quantized program of 1,841 nodes takes ~1.5 s a copy. `pt2_bytes` serializes a
program once and hands the same bytes to both writers; a program read from the cache is
remembered with the very bytes it was read from (`remember`), so a cache hit's artifacts are
the entry's own files, not a re-serialization of what was loaded.

Programs are never changed after the quantize stage (every later stage makes new ones), so the
bytes stay those of the program; tests/test_cache.py checks a cache entry's files and the
artifacts' are the same bytes.
"""

from __future__ import annotations

import io
import weakref

import torch

from orchestrator.compilation import upstream_exir

_bytes: "weakref.WeakKeyDictionary[torch.export.ExportedProgram, bytes]" = \
    weakref.WeakKeyDictionary()


def pt2_bytes(program: torch.export.ExportedProgram) -> bytes:
    """`torch.export.save(program)`'s bytes, serialized on the first call for this program."""
    data = _bytes.get(program)
    if data is None:
        buffer = io.BytesIO()
        with upstream_exir.canonical_form_check_skipped():
            torch.export.save(program, buffer)
        data = _bytes[program] = buffer.getvalue()
    return data


def remember(program: torch.export.ExportedProgram, data: bytes) -> None:
    """`data` is what `program` was loaded from: later writes reuse it."""
    _bytes[program] = data
