"""The device-fault entries of the reason catalogue: what the device runtime or one of its
kernels would fail on, in the words a user reads.

They are written here, beside the checks that find them (kernels/device_ops.py,
kernels/layout_checks.py, kernels/reference.py; the twin's EthosUBackend I/O checks in
orchestrator/verification/twin.py build theirs with kernels/reference.py's `device_fault`), because kernels/
sits below partitioners/ (tests/test_architecture.py) and the twin's kernels word their faults
with them.
partitioners/reasons.py registers every entry in the one catalogue, so the plan, the twin and
partitioners/REASONS.md read the same text; a `KernelFault` is built from `fault_text` only,
and a twin `DeviceFault` from a catalogue text (tests/test_architecture.py checks both).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FaultEntry:
    key: str
    decided_by: str  # the check that finds the fault
    template: str  # the user-facing text; {fields} are the op's values


DEVICE_FAULTS: tuple[FaultEntry, ...] = (
    FaultEntry("missing-kernel", "device kernel libraries (plan: kernels/device_ops.py; twin: "
               "the host portable library)",
               "no kernel for {op} in the libraries the device runner links (portable, "
               "quantized, Cortex-M): the program fails to load (Missing operator) unless the "
               "firmware adds one"),
    FaultEntry("dim-order-family", "portable kernel dim-order check (tensors_have_same_dim_order)",
               "{op} needs all tensors contiguous or all channels-last; got {orders}: the kernel "
               "returns InvalidArgument on the device"),
    FaultEntry("layout-nhwc-read", "CMSIS-NN layout rule (kernels/layout_checks.py)",
               "{op} reads its input as NHWC, but {tensor} has dim_order {order}: the kernel "
               "computes on reinterpreted bytes"),
    FaultEntry("layout-raw-lockstep", "CMSIS-NN layout rule (kernels/layout_checks.py)",
               "{op} walks {tensor} (dim_order {order}) in lockstep with its output (dim_order "
               "{out_order}): the elements it pairs are not the ones the model pairs"),
    FaultEntry("layout-view", "portable view_copy (kernels/layout_checks.py)",
               "{op} copies the bytes of {tensor} (dim_order {order}) as if contiguous: the view "
               "holds the elements in another order"),
    FaultEntry("layout-raw-walk", "portable kernel layout rule (kernels/layout_checks.py)",
               "{op} walks the raw bytes of {tensor} (dim_order {order}) by its sizes: it moves "
               "the wrong elements"),
    FaultEntry("default-dim-order", "portable kernel dim-order check (tensor_is_default_dim_order)",
               "{op} needs a default dim_order input, got {order}: the kernel returns "
               "InvalidArgument on the device"),
    FaultEntry("contiguous-strides", "portable kernel stride walk (op_topk.cpp)",
               "{op} walks its tensors with contiguous strides (getLeadingDims, strides()[dim]); "
               "dim_order {order} makes it read and write the wrong elements on the device"),
    FaultEntry("transpose-rank", "Cortex-M transpose rank check (op_transpose.cpp, "
               "kMaxSupportedDims)",
               "{op} supports tensor rank 1 to {max_rank}, got rank {rank}: the kernel returns "
               "InvalidArgument on the device (transpose_out: expected tensor rank in "
               "[1, {max_rank}], got {rank})"),
    FaultEntry("mve-conv-1xn-padding", "CMSIS-NN arm_convolve_1_x_n_s8, MVE path "
               "(ARM_MATH_MVEI)",
               "{op} is a 1xN convolution (input height 1, {channels} channels, stride {stride}) "
               "that arm_convolve_wrapper_s8 hands to arm_convolve_1_x_n_s8, whose MVE path "
               "requires twice the padding plus {asym} to equal the {total} column(s) of "
               "padding the output uses; with padding {padding} it returns "
               "ARM_CMSIS_NN_FAILURE (-3) on the {tier} tier (the host's C path accepts it)"),
    FaultEntry("dsp-avgpool-scratch", "CMSIS-NN arm_avgpool_s8, DSP path (ARM_MATH_DSP)",
               "{op} hands arm_avgpool_s8 an empty scratch; its DSP path needs {needed} bytes "
               "({channels} channels x 4) and returns ARM_CMSIS_NN_ARG_ERROR (-1) without them "
               "on the {tier} tier (the host's C path needs none and accepts it)"),
    # EthosUBackend's delegate I/O copies (EthosUBackend.cpp), checked by the twin
    # (orchestrator/verification/twin.py): the backend logs the error and returns InvalidProgram.
    FaultEntry("npu-input-type", "EthosUBackend input copy (EthosUBackend.cpp)",
               "input {slot} is {dtype} but Vela expects {elem_size}-byte elements: "
               "EthosUBackend returns InvalidProgram"),
    FaultEntry("npu-output-chunks", "EthosUBackend output copy (copy_with_layout_adjustment)",
               "output {slot} has {tensor_bytes} bytes, not divisible by the Vela chunk count "
               "{chunk_count}: EthosUBackend returns InvalidProgram"),
    FaultEntry("npu-output-chunk-bytes", "EthosUBackend output copy (copy_with_layout_adjustment)",
               "output {slot} chunks are {chunk} bytes, not a multiple of Vela's {vela_chunk}-byte "
               "chunks: EthosUBackend returns InvalidProgram"),
    FaultEntry("npu-output-expansion", "EthosUBackend output copy (copy_with_layout_adjustment)",
               "output {slot} needs expansion factor {factor} with element size {elem_size}; only "
               "packed int4 to int8 (factor 2, 1-byte elements) is supported: EthosUBackend "
               "returns InvalidProgram"),
)

_BY_KEY = {entry.key: entry for entry in DEVICE_FAULTS}


def fault_text(key: str, **fields) -> str:
    """The text of device-fault entry `key`, its template filled with `fields`."""
    return _BY_KEY[key].template.format(**fields)
