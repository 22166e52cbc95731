"""Shared tables: a `.pte` whose equal flatbuffer tables, vectors and strings are written once.

ExecuTorch's serializer packs the schema Program object by object, so every tensor carries its
own `sizes` and `dim_order` vectors and its own allocation table, every equal tensor its own
table, every operator its own "out" string. A flatbuffer names a child by offset, and nothing
stops two parents naming the same child: the runtime (and its verifier) read each reference
where it points. Measured on DS-CNN, CPU-only Cortex-M55 (after share_values.py): 66 tensors
carry 13 distinct `sizes`, 5 distinct `dim_order`s, 3 distinct allocations and are 49 distinct
tables; the flatbuffer goes from 7,760 B to 5,784 B.

`write_pte` writes the Program with every logically equal table, vector and string emitted once
(each is keyed by its schema type and its content, children by the offset they were written
at), then lays the `.pte` out as ExecuTorch's runtime reads it (its schema/extended_header.h
and program.cpp): the flatbuffer with the extended header after its file identifier, then the
constant segment. The constants keep the tensor alignment upstream uses (16 B: ExecuTorch's
tensors, CMSIS-NN's MVE loads); the segment starts at the next multiple of that alignment
rather than of upstream's 128 B, which the runtime does not ask for (program.cpp checks only
the program data's own alignment; the QEMU runner and the firmware place the image at 64 B,
and a copy of the segment at 16 B).

`pte_layout` says where the bytes of that `.pte` go, by schema type (vtables and alignment
padding included), header and segment padding: the figures add up to the file.

The schema is data here (`_TABLES`, in program.fbs field order; a union takes two slots, its
type and its value); tests/test_share_values.py checks it against the program.fbs the installed
ExecuTorch serializes with, and that ExecuTorch's own reader gives back the Program its own
serializer would have written.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import struct

import flatbuffers

from executorch.exir import schema

FILE_IDENTIFIER = b"ET12"
TENSOR_ALIGNMENT = 16  # bytes: each constant, and the segment they live in
DELEGATE_ALIGNMENT = 16  # bytes: an inline delegate payload (program.fbs force_align)

# table -> ((field, type), ...) in program.fbs order. A type is a scalar of _SCALARS, "string",
# a table, a union of _UNIONS, or "[element]" (a vector); a "[ubyte]" whose bytes the schema
# force-aligns is named "[ubyte tensor]" or "[ubyte delegate]".
_TABLES = {
    "Program": (("version", "uint"), ("execution_plan", "[ExecutionPlan]"),
                ("constant_buffer", "[Buffer]"),
                ("backend_delegate_data", "[BackendDelegateInlineData]"),
                ("segments", "[DataSegment]"), ("constant_segment", "SubsegmentOffsets"),
                ("mutable_data_segments", "[SubsegmentOffsets]"), ("named_data", "[NamedData]")),
    "ExecutionPlan": (("name", "string"), ("container_meta_type", "ContainerMetadata"),
                      ("values", "[EValue]"), ("inputs", "[int]"), ("outputs", "[int]"),
                      ("chains", "[Chain]"), ("operators", "[Operator]"),
                      ("delegates", "[BackendDelegate]"), ("non_const_buffer_sizes", "[int64]"),
                      ("non_const_buffer_device", "[NonConstBufferDevice]")),
    "ContainerMetadata": (("encoded_inp_str", "string"), ("encoded_out_str", "string")),
    "Null": (),
    "AllocationDetails": (("memory_id", "uint"), ("memory_offset_low", "uint"),
                          ("memory_offset_high", "uint")),
    "ExtraTensorInfo": (("mutable_data_segments_idx", "uint64"),
                        ("fully_qualified_name", "string"), ("location", "byte"),
                        ("device_type", "byte"), ("device_index", "byte")),
    "Tensor": (("scalar_type", "byte"), ("storage_offset", "int"), ("sizes", "[int]"),
               ("dim_order", "[ubyte]"), ("requires_grad", "bool"), ("data_buffer_idx", "uint"),
               ("allocation_info", "AllocationDetails"), ("layout", "byte"),
               ("shape_dynamism", "byte"), ("extra_tensor_info", "ExtraTensorInfo")),
    "Int": (("int_val", "long"),),
    "Bool": (("bool_val", "bool"),),
    "Double": (("double_val", "double"),),
    "String": (("string_val", "string"),),
    "IntList": (("items", "[long]"),),
    "DoubleList": (("items", "[double]"),),
    "BoolList": (("items", "[bool]"),),
    "TensorList": (("items", "[int]"),),
    "OptionalTensorList": (("items", "[int]"),),
    "EValue": (("val", "KernelTypes"),),
    "Operator": (("name", "string"), ("overload", "string")),
    "KernelCall": (("op_index", "int"), ("args", "[int]")),
    "DelegateCall": (("delegate_index", "int"), ("args", "[int]")),
    "MoveCall": (("move_from", "int"), ("move_to", "int")),
    "JumpFalseCall": (("cond_value_index", "int"), ("destination_instruction", "int")),
    "FreeCall": (("value_index", "int"),),
    "Instruction": (("instr_args", "InstructionArguments"),),
    "Frame": (("filename", "string"), ("lineno", "int"), ("name", "string"),
              ("context", "string")),
    "FrameList": (("items", "[Frame]"),),
    "BackendDelegateDataReference": (("location", "byte"), ("index", "uint")),
    "CompileSpec": (("key", "string"), ("value", "[ubyte]")),
    "BackendDelegate": (("id", "string"), ("processed", "BackendDelegateDataReference"),
                        ("compile_specs", "[CompileSpec]")),
    "Chain": (("inputs", "[int]"), ("outputs", "[int]"), ("instructions", "[Instruction]"),
              ("stacktrace", "[FrameList]")),
    "NonConstBufferDevice": (("buffer_idx", "int"), ("device_type", "byte"),
                             ("device_index", "byte")),
    "Buffer": (("storage", "[ubyte tensor]"),),
    "BackendDelegateInlineData": (("data", "[ubyte delegate]"),),
    "DataSegment": (("offset", "uint64"), ("size", "uint64")),
    "SubsegmentOffsets": (("segment_index", "uint"), ("offsets", "[uint64]")),
    "NamedData": (("key", "string"), ("segment_index", "uint32")),
}
# union -> member tables in program.fbs order (a member's type tag is its position + 1)
_UNIONS = {
    "KernelTypes": ("Null", "Int", "Bool", "Double", "Tensor", "String", "IntList",
                    "DoubleList", "BoolList", "TensorList", "OptionalTensorList"),
    "InstructionArguments": ("KernelCall", "DelegateCall", "MoveCall", "JumpFalseCall",
                             "FreeCall"),
}
# flatbuffers scalar type -> (struct format, flatbuffers.Builder's Prepend...Slot name)
_SCALARS = {
    "bool": ("<?", "Bool"), "byte": ("<b", "Int8"), "ubyte": ("<B", "Uint8"),
    "int": ("<i", "Int32"), "uint": ("<I", "Uint32"), "uint32": ("<I", "Uint32"),
    "long": ("<q", "Int64"), "int64": ("<q", "Int64"), "uint64": ("<Q", "Uint64"),
    "double": ("<d", "Float64"),
}
# The extended header (schema/extended_header.h): magic, its length, then three uint64s.
_HEADER_MAGIC = b"eh00"
_HEADER_BYTES = 32


def _aligned(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment


def _scalar(kind: str, value) -> bytes | None:
    """The little-endian bytes of a scalar field, None when it is absent or its default: every
    default in program.fbs is zero, and flatbuffers.Builder leaves out a field that compares
    equal to it (-0.0 too, as it does in upstream's serializer)."""
    if isinstance(value, enum.Enum):
        value = value.value
    if kind == "double" and isinstance(value, str):  # schema.Double keeps inf as "inf"
        value = float(value)
    if value is None or value == 0:
        return None
    return struct.pack(_SCALARS[kind][0], value)


class _SharedBuilder:
    """A flatbuffers.Builder that writes each logically equal object once: `_written` maps an
    object's key (its schema type and content; a child by the offset it was written at) to
    where it was written."""

    def __init__(self, tensor_alignment: int, delegate_alignment: int):
        self.builder = flatbuffers.Builder(4096)
        self._written: dict = {}
        # schema type ("Tensor", "[int]", "string") -> bytes its objects took, their vtables
        # and alignment padding included
        self.bytes_by_kind: collections.Counter = collections.Counter()
        self._byte_alignment = {"tensor": tensor_alignment, "delegate": delegate_alignment}

    def _once(self, key, write) -> int:
        if key not in self._written:
            # children are written before `write` is called: the bytes it adds are its own
            start = self.builder.Offset()
            self._written[key] = write()
            kind = key[0] if key[0] == "string" else \
                f"[{key[1]}]" if key[0] == "vector" else key[1]
            self.bytes_by_kind[kind] += self.builder.Offset() - start
        return self._written[key]

    def string(self, text: str) -> int:
        return self._once(("string", text), lambda: self.builder.CreateString(text))

    def _raw_vector(self, element_bytes: int, data: bytes, alignment: int) -> int:
        builder = self.builder
        builder.StartVector(element_bytes, len(data) // element_bytes, alignment)
        # the bytes in one copy (flatbuffers' own CreateByteVector does the same, 4-aligned)
        builder.head = builder.Head() - len(data)
        builder.Bytes[builder.Head():builder.Head() + len(data)] = data
        return builder.EndVector()

    def vector(self, kind: str, items) -> int:
        element = kind[1:-1]
        if element in _TABLES:
            offsets = tuple(self.table(element, item) for item in items)

            def write() -> int:
                self.builder.StartVector(4, len(offsets), 4)
                for offset in reversed(offsets):
                    self.builder.PrependUOffsetTRelative(offset)
                return self.builder.EndVector()

            return self._once(("vector", element, offsets), write)
        scalar, _, aligned_as = element.partition(" ")
        fmt = _SCALARS[scalar][0]
        if isinstance(items, (bytes, bytearray, memoryview)):
            data = bytes(items)
        else:
            data = b"".join(struct.pack(fmt, float(x) if scalar == "double" else x)
                            for x in items)
        size = struct.calcsize(fmt)
        alignment = max(size, self._byte_alignment.get(aligned_as, 1))
        return self._once(("vector", element, data),
                          lambda: self._raw_vector(size, data, alignment))

    def table(self, name: str, obj) -> int:
        fields = []  # (slot, scalar type or None for an offset, packed bytes or offset)
        slot = 0
        for field, kind in _TABLES[name]:
            value = getattr(obj, field, None)
            if kind in _UNIONS:
                if value is not None:
                    member = type(value).__name__
                    fields.append((slot, "ubyte", bytes([_UNIONS[kind].index(member) + 1])))
                    fields.append((slot + 1, None, self.table(member, value)))
                slot += 2
                continue
            if value is None:
                pass
            elif kind in _SCALARS:
                packed = _scalar(kind, value)
                if packed is not None:
                    fields.append((slot, kind, packed))
            elif kind == "string":
                fields.append((slot, None, self.string(value)))
            elif kind.startswith("["):
                fields.append((slot, None, self.vector(kind, value)))
            else:
                fields.append((slot, None, self.table(kind, value)))
            slot += 1

        def write() -> int:
            builder = self.builder
            builder.StartObject(slot)
            # widest first, as flatc's generated builders add them: the least padding
            for field_slot, kind, value in sorted(
                    fields, key=lambda f: -(len(f[2]) if f[1] else 4)):
                if kind is None:
                    builder.PrependUOffsetTRelativeSlot(field_slot, value, 0)
                else:
                    number = struct.unpack(_SCALARS[kind][0], value)[0]
                    getattr(builder, f"Prepend{_SCALARS[kind][1]}Slot")(field_slot, number, 0)
            return builder.EndObject()

        return self._once(("table", name, tuple(fields)), write)


def _flatbuffer(program, tensor_alignment: int, delegate_alignment: int) -> _SharedBuilder:
    shared = _SharedBuilder(tensor_alignment, delegate_alignment)
    root = shared.table("Program", program)
    start = shared.builder.Offset()
    shared.builder.Finish(root, file_identifier=FILE_IDENTIFIER)
    shared.bytes_by_kind["root offset and identifier"] += shared.builder.Offset() - start
    return shared


def write_pte(pte_file, *, tensor_alignment: int = TENSOR_ALIGNMENT,
              segment_alignment: int = TENSOR_ALIGNMENT) -> bytes:
    """The `.pte` of `pte_file` (ExecuTorch's PTEFile, as deserialize_pte_binary reads it: the
    constants in `program.constant_buffer`): the flatbuffer with shared objects, then the
    constants in one segment, each at a multiple of `tensor_alignment`. A program with a
    mutable data segment (state: orchestrator/compilation/program_state.py) is written by
    upstream's serializer, which lays out that segment."""
    if pte_file.mutable_data and not pte_file.named_data:
        from orchestrator.compilation import upstream_exir  # lazy: heavy (executorch)

        return upstream_exir.write_pte(pte_file)
    return _write(pte_file, tensor_alignment, segment_alignment)[0]


def pte_layout(pte_file, *, tensor_alignment: int = TENSOR_ALIGNMENT,
               segment_alignment: int = TENSOR_ALIGNMENT) -> dict[str, int]:
    """Where the bytes of the `.pte` `write_pte` writes go: each flatbuffer schema type
    ("Tensor", "[int]" for int vectors, "string"; its vtables and alignment padding included),
    the extended header, the padding before the constant segment and between constants, and
    the constants. The figures add up to the file's size."""
    return _write(pte_file, tensor_alignment, segment_alignment)[1]


def _write(pte_file, tensor_alignment: int, segment_alignment: int) -> tuple[bytes, dict]:
    if pte_file.mutable_data or pte_file.named_data:
        raise ValueError("share_tables writes a program's constant segment only; this one has "
                         "mutable or named data segments (compile with share_tables off)")
    if segment_alignment % tensor_alignment:
        raise ValueError(f"segment alignment {segment_alignment} B is not a multiple of the "
                         f"tensor alignment {tensor_alignment} B")
    program = pte_file.program
    # A program whose constants were all in delegates comes back from deserialize_pte_binary
    # with its empty segment still listed (a file without segment data has no header to restore
    # it from); it is written as it is. Any other listed segment's bytes are not here.
    if any(segment.size for segment in program.segments) or \
            (program.segments and program.constant_buffer):
        raise ValueError("share_tables writes the constants of `constant_buffer` as the one "
                         "segment; this program lists segments whose data it does not carry")
    segment = bytearray()
    offsets = []
    for buffer in program.constant_buffer:
        segment += bytes(_aligned(len(segment), tensor_alignment) - len(segment))
        offsets.append(len(segment))
        segment += bytes(buffer.storage)
    if offsets:
        # as upstream's serializer: the constants leave the flatbuffer even when only the
        # placeholder buffer 0 (no bytes) is there
        program = dataclasses.replace(
            program, constant_buffer=[],
            segments=[schema.DataSegment(0, len(segment))],
            constant_segment=schema.SubsegmentOffsets(0, offsets))
    shared = _flatbuffer(program, tensor_alignment, DELEGATE_ALIGNMENT)
    data, alignment = bytes(shared.builder.Output()), shared.builder.minalign
    layout = dict(shared.bytes_by_kind.most_common())
    if not segment:
        return data, layout
    header_bytes = _aligned(_HEADER_BYTES, alignment)
    program_size = header_bytes + len(data)
    segment_base = _aligned(program_size, segment_alignment)
    header = (_HEADER_MAGIC + struct.pack("<IQQQ", _HEADER_BYTES, program_size, segment_base,
                                          len(segment))).ljust(header_bytes, b"\0")
    constant_bytes = sum(len(buffer.storage) for buffer in pte_file.program.constant_buffer)
    layout.update({"extended header": header_bytes,
                   "padding before the constant segment": segment_base - program_size,
                   "padding between constants": len(segment) - constant_bytes,
                   "constants": constant_bytes})
    # The header goes after the root offset and the identifier; the root moves with it (a
    # multiple of every alignment inside, so the objects behind it stay aligned).
    root = struct.unpack_from("<I", data)[0] + header_bytes
    out = struct.pack("<I", root) + data[4:8] + header + data[8:]
    return out + bytes(segment_base - len(out)) + bytes(segment), layout
