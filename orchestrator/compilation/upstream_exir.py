"""Adapter: every touch of ExecuTorch's exir private names, in one place, with a version guard.

- `EdgeProgramManager._config_methods`: the constant methods (`input0_scale`, ...) that
  QuantizeInputs/QuantizeOutputs record; there is no public getter.
- `executorch.exir._serialize._program.deserialize_pte_binary` and `serialize_pte_binary`: a
  `.pte` read back into its PTEFile (the Program with its constants) and written again after
  its Program was rewritten (orchestrator/compilation/share_values.py), with the emitter's
  defaults (no delegate segments, 128-byte segment alignment, default constant alignment);
  orchestrator/compilation/share_tables.py writes the PTEFile itself instead when asked.
- A new EdgeProgramManager around the CPU-routed program (public constructor), instead of
  writing `EdgeProgramManager._edge_programs`, so the manager the lower stage returned stays as
  it was.
- `torch.fx.traceback.NodeSource` (torch's node provenance, `node.meta["from_node"]`), copied
  by reference while a compile runs (`provenance_shared`).
- `torch.export.ExportedProgram.run_decompositions`, wrapped while a program is lowered to the
  NPU so that a call with nothing to decompose is not a retrace (`idle_decompositions_skipped`),
  by `executorch.exir.graph_module.contains_any_call_fn_target_op`, upstream's own test.

`tests/test_upstream_adapters.py` checks these names and signatures without compiling.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Iterator

from partitioners.upstream_version import require

SUPPORTED_EXECUTORCH = ("1.5.1",)
SUPPORTED_TORCH = ("2.13.0", "2.13.0+cpu")


def check_version() -> str:
    return require("executorch", SUPPORTED_EXECUTORCH, "orchestrator/compilation/upstream_exir.py")


def config_methods(edge_manager) -> dict:
    """The program's constant methods, e.g. {"input0_scale": 0.03, ...}."""
    check_version()
    return dict(edge_manager._config_methods or {})


def with_forward(edge_manager, program):
    """A new EdgeProgramManager whose "forward" is `program`, keeping the constant methods."""
    check_version()
    from executorch.exir import (  # lazy: heavy (torch, executorch)
        EdgeCompileConfig, EdgeProgramManager)

    return EdgeProgramManager(
        {"forward": program}, constant_methods=config_methods(edge_manager) or None,
        # The Cortex-M and quantized graphs do not pass edge IR validation (mixed dtypes,
        # cortex_m ops); upstream's own Arm flow turns it off too.
        compile_config=EdgeCompileConfig(_check_ir_validity=False))


@contextlib.contextmanager
def provenance_shared() -> Iterator[None]:
    """Inside: a deep copy of a node's provenance (`NodeSource`) is the same object.

    Every node an ExportPass rewrites gets a NodeSource whose `from_node` is a deep copy of its
    predecessor's, which holds the chain of every pass before it: over the ~150 passes of the
    Arm backend's TOSA pipeline the copies grow with the graph times the passes (a 25-step GRU,
    one U55 partition: 110,507 NodeSource copies, 25.6M deepcopy calls, 40% of `lower` under a
    profiler; DS-CNN: 10% of it). Torch never changes a NodeSource after making it (each pass
    builds new ones and new `from_node` lists), so sharing one is the same value: the same
    names for the graph signature (`history[-1].name`) and the same greatest ancestors for
    ExecuTorch's debug handles. Not thread-safe across compiles with other settings: the swap
    is process-global, like the Vela wrapper's (partitioners/upstream_ethos_u.py)."""
    require("torch", SUPPORTED_TORCH, "orchestrator/compilation/upstream_exir.py")
    from torch.fx.traceback import NodeSource  # lazy: heavy (torch)

    had = "__deepcopy__" in NodeSource.__dict__
    previous = NodeSource.__dict__.get("__deepcopy__")
    NodeSource.__deepcopy__ = _same_node_source
    try:
        yield
    finally:
        if had:
            NodeSource.__deepcopy__ = previous
        else:
            del NodeSource.__deepcopy__


def _same_node_source(node_source, memo):
    return node_source


@contextlib.contextmanager
def idle_decompositions_skipped(record: list | None = None) -> Iterator[None]:
    """Inside: `run_decompositions(table)` on a program that an earlier `run_decompositions`
    inside made, whose graph calls no operator of `table`, returns that program as it is.

    `to_edge_transform_and_lower` functionalizes the program (`run_decompositions({})`) and then,
    for a partitioner that filters the operators it keeps (the Ethos-U partitioner does), runs
    two more `run_decompositions` with upstream's default table. Each is a full re-trace under
    fake tensors. Upstream skips the same call on its other path when the graph holds none of the
    table's targets (its comment: the first call has already functionalized the graph, so "it is
    safe to skip when none of those targets occur in the graph"). Here the second call still
    decomposes what CompositeImplicitAutograd operators the graph holds (aten.conv2d ->
    aten.convolution), but the third finds nothing left and is skipped (a 25-step GRU on the
    U55-128: 2,144 nodes in and out, 3.2 s; DS-CNN too). The test is upstream's own
    (`contains_any_call_fn_target_op`, which looks into control-flow subgraphs too); a graph
    with any target of the table, or any operator with a CompositeImplicitAutograd kernel, is
    decomposed as before. `record` gets one entry per call: "skipped" or "ran".
    Process-global while inside, like `provenance_shared`."""
    require("torch", SUPPORTED_TORCH, "orchestrator/compilation/upstream_exir.py")
    from executorch.exir.graph_module import (  # lazy: heavy (torch, executorch)
        contains_any_call_fn_target_op)
    from torch.export import ExportedProgram  # lazy: heavy (torch)

    original = ExportedProgram.__dict__["run_decompositions"]
    made: list = []  # programs a run_decompositions inside returned (kept alive: compared by id)

    def run_decompositions(program, decomp_table=None, *args, **kwargs):
        idle = (decomp_table is not None and not args and not kwargs
                and any(program is seen for seen in made)
                and not contains_any_call_fn_target_op(program.graph_module, decomp_table)
                and not _calls_composite_implicit(program.graph_module))
        if record is not None:
            record.append("skipped" if idle else "ran")
        if idle:
            return program
        result = original(program, decomp_table, *args, **kwargs)
        made.append(result)
        return result

    ExportedProgram.run_decompositions = run_decompositions
    try:
        yield
    finally:
        ExportedProgram.run_decompositions = original


def _calls_composite_implicit(graph_module) -> bool:
    """Whether the graph (or a control-flow subgraph) calls an operator with a
    CompositeImplicitAutograd kernel: a re-trace may decompose one whatever the table says
    (a quantized DS-CNN's `aten.conv2d`, absent from the table, comes back as
    `aten.convolution`), so a program holding one is never skipped."""
    import torch  # lazy: heavy (torch)

    stack = [graph_module]
    while stack:
        module = stack.pop()
        stack.extend(child for child in module.children()
                     if isinstance(child, torch.fx.GraphModule))
        for node in module.graph.nodes:
            op = getattr(node.target, "_op", node.target)
            if (node.op == "call_function" and isinstance(op, torch._ops.OpOverload)
                    and torch._C._dispatch_has_kernel_for_dispatch_key(
                        op.name(), "CompositeImplicitAutograd")):
                return True
    return False


def read_pte(pte_bytes: bytes):
    """The PTEFile of a `.pte`: its Program (constants back in `constant_buffer`, delegate
    payloads inline) and its mutable/named data segments."""
    check_version()
    from executorch.exir._serialize._program import (  # lazy: heavy (torch, executorch)
        deserialize_pte_binary)

    return deserialize_pte_binary(pte_bytes)


def write_pte(pte_file) -> bytes:
    """A PTEFile written by ExecuTorch's serializer as the emitter writes it."""
    check_version()
    from executorch.exir._serialize._program import (  # lazy: heavy (torch, executorch)
        serialize_pte_binary)

    return bytes(serialize_pte_binary(pte_file, extract_delegate_segments=False))


def contract() -> dict[str, object]:
    from executorch.exir import EdgeProgramManager  # lazy: heavy (torch, executorch)
    from executorch.exir._serialize import _program  # lazy: heavy (torch, executorch)
    from executorch.exir.graph_module import (  # lazy: heavy (torch, executorch)
        contains_any_call_fn_target_op)
    from torch.export import ExportedProgram  # lazy: heavy (torch)
    from torch.fx.traceback import NodeSource  # lazy: heavy (torch)

    return {
        "serialize_pte_binary": list(inspect.signature(_program.serialize_pte_binary).parameters),
        "EdgeProgramManager.__init__": list(inspect.signature(EdgeProgramManager.__init__).parameters),
        # set in __init__ as an attribute: it appears among the names the code stores
        "_config_methods": "_config_methods" in EdgeProgramManager.__init__.__code__.co_names,
        # provenance_shared: NodeSource deep-copies its predecessor's chain in __init__
        "NodeSource deep-copies from_node": "deepcopy" in inspect.getsource(NodeSource.__init__),
        "run_decompositions": list(inspect.signature(ExportedProgram.run_decompositions).parameters),
        "contains_any_call_fn_target_op": list(
            inspect.signature(contains_any_call_fn_target_op).parameters),
    }
