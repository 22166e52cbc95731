"""The plain upstream flow for one model and target, the yardstick of compile_speed.py.

Written from ExecuTorch's own test harness (backends/test/harness/stages: Quantize exports,
prepares, calibrates and converts; Export; ToEdgeTransformAndLower with the EthosUPartitioner;
backends/cortex_m/test/tester.py: RunPasses with CortexMPassManager for the core; ToExecutorch;
Serialize) with the two settings this machine's torch needs (channels-last model and inputs,
`module(check_guards=False)`, ../shared/UPSTREAM-FACTS.md). No orchestrator import: this is
what a user of ExecuTorch alone runs. It prints one JSON line of phase seconds, measured from
the interpreter's start:

    python benchmarks/upstream_flow.py ds-cnn --npu ethos-u55-128 -o /tmp/u.pte
    python benchmarks/upstream_flow.py benchmarks/compile_speed_models.py:gru_kws25 --npu none
"""

from __future__ import annotations

import time

_T0 = time.perf_counter()

import argparse  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

import torch  # noqa: E402
from executorch.backends.arm.ethosu import EthosUCompileSpec, EthosUPartitioner  # noqa: E402
from executorch.backends.arm.quantizer import (EthosUQuantizer,  # noqa: E402
                                               get_symmetric_quantization_config)
from executorch.backends.cortex_m.edge_compile_config import (  # noqa: E402
    cortex_m_edge_compile_config)
from executorch.backends.cortex_m.passes.cortex_m_pass_manager import (  # noqa: E402
    CortexMPassManager)
from executorch.backends.cortex_m.quantizer.quantizer import CortexMQuantizer  # noqa: E402
from executorch.backends.cortex_m.target_config import CortexMTargetConfig  # noqa: E402
from executorch.exir import (EdgeCompileConfig, ExecutorchBackendConfig,  # noqa: E402
                             to_edge_transform_and_lower)
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e  # noqa: E402

VELA = {"ethos-u55": ("Ethos_U55_High_End_Embedded", "Shared_Sram"),
        "ethos-u65": ("Ethos_U65_High_End", "Dedicated_Sram_384KB"),
        "ethos-u85": ("Ethos_U85_SYS_DRAM_Mid", "Sram_Only")}


def _model(spec: str):
    if ":" in spec:
        path, factory = spec.rsplit(":", 1)
        loaded = importlib.util.spec_from_file_location("bench_model", path)
        module = importlib.util.module_from_spec(loaded)
        sys.modules[loaded.name] = module  # torch.export looks the model's module up by name
        loaded.loader.exec_module(module)
        return getattr(module, factory)()
    sys.path.insert(0, str(ROOT))
    from examples.zoo import ZOO  # the same factories `orchestrate` compiles

    return ZOO[spec].factory()


def _channels_last(x):
    return x.to(memory_format=torch.channels_last) if x.dim() == 4 else x


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--npu", default="ethos-u55-128", help="'none' for CPU only")
    parser.add_argument("--cpu", default="cortex-m55")
    parser.add_argument("--samples", type=int, default=8, help="calibration samples")
    parser.add_argument("-o", "--output", required=True)
    args = parser.parse_args()
    seconds = {"import": time.perf_counter() - _T0}

    def phase(name, start):
        seconds[name] = time.perf_counter() - start
        return time.perf_counter()

    t = time.perf_counter()
    model, inputs = _model(args.model)
    model = model.eval().to(memory_format=torch.channels_last)
    inputs = tuple(_channels_last(x) for x in inputs)
    generator = torch.Generator().manual_seed(0)
    samples = [tuple(_channels_last(torch.randn(x.shape, generator=generator)) for x in inputs)
               for _ in range(args.samples)]
    t = phase("load", t)

    captured = torch.export.export(model, inputs, strict=True)
    t = phase("export", t)

    if args.npu != "none":
        system_config, memory_mode = VELA[args.npu.rsplit("-", 1)[0]]
        spec = EthosUCompileSpec(args.npu, system_config=system_config, memory_mode=memory_mode)
        quantizer = EthosUQuantizer(spec)
        quantizer.set_global(get_symmetric_quantization_config(is_per_channel=True))
    else:
        quantizer = CortexMQuantizer()
    prepared = prepare_pt2e(captured.module(check_guards=False), quantizer)
    with torch.no_grad():
        for sample in samples:
            prepared(*sample)
    quantized = torch.export.export(convert_pt2e(prepared), inputs, strict=True)
    t = phase("quantize", t)

    if args.npu != "none":
        edge = to_edge_transform_and_lower(
            quantized, partitioner=[EthosUPartitioner(spec)],
            compile_config=EdgeCompileConfig(_check_ir_validity=False))
    else:
        edge = to_edge_transform_and_lower(quantized,
                                           compile_config=cortex_m_edge_compile_config())
    t = phase("lower", t)

    config = CortexMTargetConfig.from_target_string(args.cpu)
    edge._edge_programs["forward"] = CortexMPassManager(edge.exported_program(),
                                                        target_config=config).transform()
    t = phase("route_cpu", t)

    program = edge.to_executorch(ExecutorchBackendConfig(extract_delegate_segments=False))
    Path(args.output).write_bytes(program.buffer)
    t = phase("serialize", t)
    seconds["total"] = time.perf_counter() - _T0
    print(json.dumps({"phases": seconds, "pte_bytes": Path(args.output).stat().st_size}))


if __name__ == "__main__":
    main()
