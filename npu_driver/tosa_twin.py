"""Host execution of one Ethos-U partition through the TOSA reference model.

Vela compiles a partition's TOSA graph into the command stream the NPU runs; the TOSA reference
model (tosa-tools' `tosa_reference_model`) executes that same graph bit-exactly as the TOSA
specification defines it. The graph's IO names, shapes and element types come from the TOSA
flatbuffer itself (the `tosa` package tosa-tools ships is the generated flatbuffer reader), and
they are checked against the sizes the delegate payload declares, so the bytes the device copies
in and out have one meaning on both sides.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import tempfile
from dataclasses import dataclass

import numpy as np

from npu_driver.payload import EthosUPayload

# tosa/DType.py enum values -> numpy element type of the reference model's IO arrays.
_TOSA_NUMPY_TYPES = {1: np.bool_, 3: np.int8, 4: np.int16, 5: np.int32, 7: np.float32,
                     8: np.float16, 17: np.int64}
_TOSA_TYPE_NAMES = {0: "UNKNOWN", 1: "BOOL", 2: "INT4", 3: "INT8", 4: "INT16", 5: "INT32",
                    6: "INT48", 7: "FP32", 8: "FP16", 9: "BF16", 17: "INT64"}


class TosaTwinError(RuntimeError):
    """A TOSA graph the twin cannot run, or one that disagrees with its delegate payload."""


@dataclass(frozen=True)
class TosaTensorSpec:
    """One graph input or output: its name, shape and numpy element type."""

    name: str
    shape: tuple[int, ...]
    numpy_type: str  # numpy dtype name, e.g. "int8"

    @property
    def elements(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.elements * np.dtype(self.numpy_type).itemsize


@dataclass(frozen=True)
class TosaGraphIO:
    inputs: tuple[TosaTensorSpec, ...]
    outputs: tuple[TosaTensorSpec, ...]


def main_block(tosa_bytes: bytes):
    from tosa.TosaGraph import TosaGraph  # lazy: heavy (tosa)

    graph = TosaGraph.GetRootAs(tosa_bytes, 0)
    if graph.RegionsLength() == 0:
        raise TosaTwinError("TOSA graph has no regions")
    regions = [graph.Regions(i) for i in range(graph.RegionsLength())]
    region = next((r for r in regions if r.Name() == b"main"), regions[0])
    if region.BlocksLength() == 0:
        raise TosaTwinError("TOSA graph's main region has no blocks")
    return region.Blocks(0)


def graph_io(tosa_bytes: bytes) -> TosaGraphIO:
    """The main block's inputs and outputs, in the order the reference model assigns them; a
    damaged flatbuffer is a TosaTwinError naming what could not be read."""
    try:
        return _graph_io(tosa_bytes)
    except TosaTwinError:
        raise
    except Exception as error:  # noqa: BLE001 - the generated reader raises anything on bad bytes
        raise TosaTwinError(f"the TOSA graph is not a valid TOSA flatbuffer "
                            f"({type(error).__name__}: {error})") from None


def _graph_io(tosa_bytes: bytes) -> TosaGraphIO:
    block = main_block(tosa_bytes)
    tensors = {}
    for index in range(block.TensorsLength()):
        tensor = block.Tensors(index)
        tensors[tensor.Name()] = tensor

    def spec(name: bytes) -> TosaTensorSpec:
        tensor = tensors.get(name)
        if tensor is None:
            raise TosaTwinError(f"TOSA IO tensor {name.decode()} is not declared in the block")
        type_id = int(tensor.Type())
        if type_id not in _TOSA_NUMPY_TYPES:
            raise TosaTwinError(f"TOSA IO tensor {name.decode()} has element type "
                                f"{_TOSA_TYPE_NAMES.get(type_id, type_id)}, which the twin "
                                "cannot hand over byte for byte")
        shape = tuple(int(d) for d in tensor.ShapeAsNumpy()) if tensor.ShapeLength() else ()
        return TosaTensorSpec(name.decode(), shape, np.dtype(_TOSA_NUMPY_TYPES[type_id]).name)

    return TosaGraphIO(tuple(spec(block.Inputs(i)) for i in range(block.InputsLength())),
                       tuple(spec(block.Outputs(i)) for i in range(block.OutputsLength())))


def _numel(shape) -> int:
    count = 1
    for size in shape:
        count *= int(size)
    return count


def check_against_payload(io: TosaGraphIO, payload: EthosUPayload, partition: str) -> None:
    """Refuse when the payload's IO differs from the TOSA graph's IO in what the device checks.

    EthosUBackend.cpp checks each IO's element size and element count and copies its bytes; it
    never compares shapes. Vela may flatten an IO (a [1, 3, 50] input becomes [1, 1, 1, 1, 1,
    150]): the same bytes in the same row-major order, so only sizes and counts must agree.
    """
    for kind, tosa_side, vela_side in (("input", io.inputs, payload.inputs),
                                       ("output", io.outputs, payload.outputs)):
        if len(tosa_side) != len(vela_side):
            raise TosaTwinError(f"{partition}: TOSA graph has {len(tosa_side)} {kind}(s), the "
                                f"delegate payload declares {len(vela_side)}")
        for index, (tensor, vela) in enumerate(zip(tosa_side, vela_side)):
            if tensor.nbytes != vela.nbytes or _numel(tensor.shape) != _numel(vela.shape6d):
                raise TosaTwinError(
                    f"{partition}: {kind} {index} is {tensor.name} {list(tensor.shape)} "
                    f"{tensor.numpy_type} ({tensor.nbytes} B) in the TOSA graph but "
                    f"{list(vela.shape6d)} x {vela.elem_size} B ({vela.nbytes} B) in the "
                    "delegate payload")


@contextlib.contextmanager
def _captured_native_output():
    """Collect what the reference model's C++ prints (spec-version warnings) instead of the console."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = (os.dup(1), os.dup(2))
    with tempfile.TemporaryFile(mode="w+b") as sink:
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
        captured: list[str] = []
        try:
            yield captured
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
            sink.seek(0)
            captured.append(sink.read().decode("utf-8", errors="replace"))


def run_tosa(tosa_bytes: bytes, io: TosaGraphIO, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Run the graph; `inputs` are in `io.inputs` order and already shaped and typed to match."""
    import tosa_reference_model  # lazy: heavy (tosa reference model)

    for tensor, array in zip(io.inputs, inputs):
        if tuple(array.shape) != tensor.shape or array.dtype.name != tensor.numpy_type:
            raise TosaTwinError(f"input {tensor.name} must be {list(tensor.shape)} "
                                f"{tensor.numpy_type}, got {list(array.shape)} {array.dtype}")
    # verbosity="ERROR" aborts the process inside the reference model; "LOW" is the quietest
    # setting that returns control. Variable tensors come from numpy, not the flatbuffer.
    error = None
    with _captured_native_output() as log:
        try:
            outputs, status = tosa_reference_model.run(
                tosa_bytes, inputs, verbosity="LOW", initialize_variable_tensor_from_numpy=True)
        except ValueError as exc:
            error = exc
    detail = log[0].strip().splitlines()[-1] if log and log[0].strip() else ""
    if error is not None:
        raise TosaTwinError(f"TOSA reference model refused the graph: {error} {detail}".strip())
    if status != tosa_reference_model.GraphStatus.TOSA_VALID:
        raise TosaTwinError(f"TOSA reference model finished with {status.name} {detail}".strip())
    result = []
    for tensor, array in zip(io.outputs, outputs):
        array = np.ascontiguousarray(array)
        if array.dtype.name != tensor.numpy_type:
            if array.dtype.itemsize != np.dtype(tensor.numpy_type).itemsize:
                raise TosaTwinError(f"output {tensor.name} came back as {array.dtype}, the graph "
                                    f"declares {tensor.numpy_type}")
            array = array.view(tensor.numpy_type)
        result.append(array.reshape(tensor.shape))
    return result
