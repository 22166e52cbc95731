"""A small module quantized by the Ethos-U quantizer, as the edge program the CPU route takes:
what an op moved off the NPU looks like to the Cortex-M passes (tests/test_weight_zp.py,
tests/test_fused_activation.py)."""

from __future__ import annotations

import torch


def ethos_u55_spec():
    """The Ethos-U55-128 compile spec these tests quantize and lower for (Shared_Sram)."""
    from executorch.backends.arm.ethosu import EthosUCompileSpec

    return EthosUCompileSpec("ethos-u55-128", system_config="Ethos_U55_High_End_Embedded",
                             memory_mode="Shared_Sram")


def ethos_u_quantized(module: torch.nn.Module, sample):
    """`module` (eval mode) quantized per channel by the Ethos-U quantizer for ethos-u55-128:
    (the quantized reference module, its exported program). `sample(generator)` makes one input
    tuple; the example input and four calibration samples come from one generator seeded 1."""
    from executorch.backends.arm.quantizer import (EthosUQuantizer,
                                                   get_symmetric_quantization_config)
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    generator = torch.Generator().manual_seed(1)
    example = sample(generator)
    quantizer = EthosUQuantizer(ethos_u55_spec())
    quantizer.set_global(get_symmetric_quantization_config(is_per_channel=True))
    prepared = prepare_pt2e(torch.export.export(module, example, strict=True)
                            .module(check_guards=False), quantizer)
    for _ in range(4):
        prepared(*sample(generator))
    reference = convert_pt2e(prepared)
    return reference, torch.export.export(reference, example, strict=True)


def ethos_u_quantized_edge(module: torch.nn.Module, features: int):
    """`module` (eval mode, one [1, features] input, uniform in [-1, 1)) quantized by
    `ethos_u_quantized`, lowered to edge with the Cortex-M compile config (no partitioner: every
    op is left for the CPU)."""
    from executorch.backends.cortex_m.edge_compile_config import cortex_m_edge_compile_config
    from executorch.exir import to_edge_transform_and_lower

    _, program = ethos_u_quantized(
        module, lambda generator: (torch.rand(1, features, generator=generator) * 2 - 1,))
    return to_edge_transform_and_lower(program, compile_config=cortex_m_edge_compile_config())


def root_cause(error: BaseException) -> BaseException:
    """The innermost exception of a chain (upstream wraps a pass's failure in its own)."""
    while error.__cause__ or error.__context__:
        error = error.__cause__ or error.__context__
    return error
