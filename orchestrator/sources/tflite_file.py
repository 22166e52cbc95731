"""A `.tflite` file read as data: its tensors (shapes, types, quantization, constant bytes) and its
operators (TFLite builtin name, tensor indices, options), checked before anything uses them.

The flatbuffer is read through the accessor classes Vela ships for its own TFLite front end
(`ethosu.vela.tflite`, generated from TFLite's schema) and Vela's table of each builtin's options
(`ethosu.vela.tflite_mapping.builtin_operator_map`): this module is the one place that touches
them (`contract()` says whether they are still there). Nothing in the file is executed: a
flatbuffer holds offsets, and every offset, index and size is checked here, so a truncated file,
a wrong identifier, a buffer index out of range or a huge shape is one `UserError` line naming the
problem.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from ethosu.vela.tflite.BuiltinOperator import BuiltinOperator
from ethosu.vela.tflite.Model import Model
from ethosu.vela.tflite_mapping import builtin_operator_map

from orchestrator.errors import UserError

# A tensor larger than this is not a microcontroller model (and would make numpy allocate it).
MAX_TENSOR_ELEMENTS = 1 << 26
MAX_DIMENSION = 1 << 20
_IDENTIFIER = b"TFL3"

# TFLite TensorType -> numpy dtype (schema.fbs); types a Cortex-M model does not use are refused.
_TENSOR_TYPES = {0: np.float32, 1: np.float16, 2: np.int32, 3: np.uint8, 4: np.int64,
                 6: np.bool_, 7: np.int16, 9: np.int8}


@dataclass(frozen=True)
class TfliteTensor:
    index: int
    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    data: np.ndarray | None  # the constant's values (read-only), None for an activation
    scales: tuple[float, ...] = ()  # empty: not quantized
    zero_points: tuple[int, ...] = ()
    quantized_dimension: int = 0

    @property
    def quantized(self) -> bool:
        return bool(self.scales)

    def describe(self) -> str:
        return f"tensor {self.index} '{self.name}'"


@dataclass(frozen=True)
class TfliteOperator:
    index: int
    opcode: str  # the TFLite builtin name, e.g. CONV_2D
    inputs: tuple[int, ...]  # tensor indices; -1 is an optional input left out
    outputs: tuple[int, ...]
    options: dict = field(default_factory=dict, compare=False)

    def describe(self) -> str:
        return f"{self.opcode} (operator {self.index})"


@dataclass(frozen=True)
class TfliteGraph:
    path: Path
    tensors: tuple[TfliteTensor, ...]
    operators: tuple[TfliteOperator, ...]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    version: int
    description: str

    @property
    def full_integer(self) -> bool:
        """Every graph input and output is an int8/int16 quantized tensor: the file carries its
        own quantization and takes integer data, as TFLM runs it."""
        ends = [self.tensors[i] for i in self.inputs + self.outputs]
        return all(t.quantized and t.dtype in (np.int8, np.int16) for t in ends)

    @property
    def hybrid(self) -> bool:
        """A float file whose weights are int8 (dynamic-range quantization): the TFLite
        interpreter quantizes the activations at run time, so it computes neither the float
        network nor an int8 program's values."""
        return not self.full_integer and any(
            self.tensors[i].dtype == np.float32 and any(
                self.tensors[w].data is not None and self.tensors[w].dtype == np.int8
                for w in op.inputs[1:] if w >= 0)
            for op in self.operators for i in op.inputs[:1] if i >= 0)


def _refuse(path: Path, problem: str) -> UserError:
    return UserError(f"{path}: {problem}; give a .tflite file written by the TensorFlow Lite "
                     "converter (or re-export it)")


def read_tflite(path: Path) -> TfliteGraph:
    """The graph of a `.tflite` file, every index, offset and size checked."""
    data = path.read_bytes()
    if len(data) < 8 or data[4:8] != _IDENTIFIER:
        raise _refuse(path, "not a TFLite flatbuffer (no 'TFL3' identifier at byte 4)")
    try:
        return _parse(path, data)
    except UserError:
        raise
    except (IndexError, struct.error, ValueError, TypeError, AttributeError, KeyError,
            OverflowError, UnicodeDecodeError, MemoryError) as exc:
        raise _refuse(path, f"truncated or corrupt flatbuffer ({type(exc).__name__} while "
                            "reading it)") from exc


def _check_offset(path: Path, data: bytes, offset: int, what: str) -> None:
    if not 0 <= offset < len(data):
        raise _refuse(path, f"{what} points at byte {offset}, outside the {len(data)}-byte file")


def _parse(path: Path, data: bytes) -> TfliteGraph:
    root = struct.unpack_from("<I", data, 0)[0]
    _check_offset(path, data, root, "the root table")
    model = Model.GetRootAsModel(data, 0)
    if model.SubgraphsLength() < 1:
        raise _refuse(path, "the file holds no subgraph")
    if model.SubgraphsLength() > 1:
        raise UserError(f"{path}: the file holds {model.SubgraphsLength()} subgraphs (control "
                        "flow such as WHILE or IF); only single-graph models can be rebuilt")
    subgraph = model.Subgraphs(0)
    n_buffers = model.BuffersLength()
    tensors = tuple(_tensor(path, data, model, subgraph.Tensors(i), i, n_buffers)
                    for i in range(subgraph.TensorsLength()))
    n_tensors = len(tensors)
    opcodes = [_opcode_name(model.OperatorCodes(i)) for i in range(model.OperatorCodesLength())]
    operators = []
    for index in range(subgraph.OperatorsLength()):
        op = subgraph.Operators(index)
        code = op.OpcodeIndex()
        if not 0 <= code < len(opcodes):
            raise _refuse(path, f"operator {index} names operator code {code} of {len(opcodes)}")
        name = opcodes[code]
        inputs = tuple(int(i) for i in op.InputsAsNumpy()) if op.InputsLength() else ()
        outputs = tuple(int(i) for i in op.OutputsAsNumpy()) if op.OutputsLength() else ()
        for role, indices in (("input", inputs), ("output", outputs)):
            for tensor in indices:
                if not (-1 <= tensor < n_tensors) or (role == "output" and tensor < 0):
                    raise _refuse(path, f"{name} (operator {index}) names {role} tensor {tensor} "
                                        f"of {n_tensors}")
        operators.append(TfliteOperator(index, name, inputs, outputs, _options(name, op)))
    graph_inputs = tuple(int(i) for i in subgraph.InputsAsNumpy()) if subgraph.InputsLength() else ()
    graph_outputs = tuple(int(i) for i in subgraph.OutputsAsNumpy()) if subgraph.OutputsLength() \
        else ()
    for role, indices in (("input", graph_inputs), ("output", graph_outputs)):
        if not indices:
            raise _refuse(path, f"the graph has no {role}")
        for tensor in indices:
            if not 0 <= tensor < n_tensors:
                raise _refuse(path, f"graph {role} names tensor {tensor} of {n_tensors}")
    description = model.Description()
    return TfliteGraph(path, tensors, tuple(operators), graph_inputs, graph_outputs,
                       model.Version(), description.decode("utf-8", "replace") if description else "")


def _opcode_name(code) -> str:
    names = {v: k for k, v in vars(BuiltinOperator).items() if not k.startswith("_")}
    # Codes above 127 live in BuiltinCode, the older ones in DeprecatedBuiltinCode (schema 3a).
    value = max(code.BuiltinCode(), code.DeprecatedBuiltinCode())
    if value == BuiltinOperator.CUSTOM:
        custom = code.CustomCode()
        return f"CUSTOM:{custom.decode('utf-8', 'replace') if custom else '?'}"
    return names.get(value, f"BUILTIN_{value}")


def _options(name: str, op) -> dict:
    """The operator's builtin options as {snake_case name: value} (Vela's table of them)."""
    code = getattr(BuiltinOperator, name, None)
    entry = builtin_operator_map.get(code) if code is not None else None
    if entry is None or entry[1] is None:
        return {}
    options = entry[1].deserialize(op)
    options.pop("attribute_read_error", None)
    # Vela's table maps padding and fused activations to its own enums: keep their names.
    return {key: (value.name if hasattr(value, "name") else value) for key, value in
            options.items()}


def _tensor(path: Path, data: bytes, model, tensor, index: int, n_buffers: int) -> TfliteTensor:
    name_bytes = tensor.Name()
    name = name_bytes.decode("utf-8", "replace") if name_bytes else f"tensor_{index}"
    type_code = tensor.Type()
    if type_code not in _TENSOR_TYPES:
        raise UserError(f"{path}: tensor {index} '{name}' has TFLite type {type_code}, which "
                        "no Cortex-M kernel takes; convert the model to int8 or float32")
    dtype = np.dtype(_TENSOR_TYPES[type_code])
    shape = tuple(int(d) for d in tensor.ShapeAsNumpy()) if tensor.ShapeLength() else ()
    for dim in shape:
        if not 1 <= dim <= MAX_DIMENSION:
            raise _refuse(path, f"tensor {index} '{name}' has shape {list(shape)}, a dimension "
                                f"outside 1..{MAX_DIMENSION}")
    elements = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if elements > MAX_TENSOR_ELEMENTS:
        raise _refuse(path, f"tensor {index} '{name}' has shape {list(shape)} ({elements:,} "
                            f"elements, more than {MAX_TENSOR_ELEMENTS:,})")
    buffer_index = tensor.Buffer()
    if not 0 <= buffer_index < n_buffers:
        raise _refuse(path, f"tensor {index} '{name}' names buffer {buffer_index} of {n_buffers}")
    values = _buffer_values(path, data, model.Buffers(buffer_index), dtype, shape, elements,
                            f"tensor {index} '{name}'") if buffer_index else None
    scales: tuple[float, ...] = ()
    zero_points: tuple[int, ...] = ()
    axis = 0
    quantization = tensor.Quantization()
    if quantization is not None and quantization.ScaleLength():
        scales = tuple(float(s) for s in quantization.ScaleAsNumpy())
        zero_points = tuple(int(z) for z in quantization.ZeroPointAsNumpy()) \
            if quantization.ZeroPointLength() else (0,) * len(scales)
        axis = int(quantization.QuantizedDimension())
        if len(zero_points) != len(scales):
            raise _refuse(path, f"tensor {index} '{name}' has {len(scales)} scales and "
                                f"{len(zero_points)} zero points")
        if not all(np.isfinite(s) and s > 0 for s in scales):
            raise _refuse(path, f"tensor {index} '{name}' has a scale that is not a positive "
                                "finite number")
        if len(scales) > 1 and not (0 <= axis < len(shape) and shape[axis] == len(scales)):
            raise _refuse(path, f"tensor {index} '{name}' has {len(scales)} scales along "
                                f"dimension {axis} of shape {list(shape)}")
    return TfliteTensor(index, name, shape, dtype, values, scales, zero_points, axis)


def _buffer_values(path: Path, data: bytes, buffer, dtype: np.dtype, shape, elements: int,
                   what: str) -> np.ndarray | None:
    expected = elements * dtype.itemsize
    offset = buffer.Offset() if hasattr(buffer, "Offset") else 0
    if offset > 1:  # a model over 2 GB keeps its buffers after the flatbuffer
        size = buffer.Size()
        if offset + size > len(data):
            raise _refuse(path, f"{what}'s data runs past the end of the file")
        raw = data[offset:offset + size]
    elif buffer.DataLength():
        raw = buffer.DataAsNumpy().tobytes()  # numpy refuses a vector past the end of the file
    else:
        return None  # an empty buffer: an activation
    if len(raw) != expected:
        raise _refuse(path, f"{what} has {len(raw)} bytes of data where its shape "
                            f"{list(shape)} of {dtype.name} needs {expected}")
    values = np.frombuffer(raw, dtype=dtype.newbyteorder("<")).reshape(shape)
    values.setflags(write=False)
    return values


def contract() -> dict[str, object]:
    """What this module relies on in Vela's TFLite front end, each True when it holds."""
    return {
        "ethosu.vela.tflite.Model.GetRootAsModel": hasattr(Model, "GetRootAsModel"),
        "builtin_operator_map has CONV_2D options":
            builtin_operator_map[BuiltinOperator.CONV_2D][1] is not None,
        "options deserialize(op) exists":
            hasattr(builtin_operator_map[BuiltinOperator.CONV_2D][1], "deserialize"),
    }
