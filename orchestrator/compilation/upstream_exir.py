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
- `to_edge`'s NormalizeTransposePass, SymToTensorPass, ScalarToTensorPass and
  RemoveMixedTypeOperators, whose `call` is
  wrapped while a program is lowered so that a graph with nothing they rewrite is not re-traced
  (`idle_edge_passes_skipped`).
- torch's fake kernel of `executorch_call_delegate` (`registered_hop_fake_fns`), replaced while
  a compile runs by one that reads a partition's outputs from its graph
  (`delegate_outputs_from_metadata`).
- torch's serializer's `canonicalize`, called by `torch.export.save` as a check whose result it
  drops, skipped while our `.pt2` bytes are written (`canonical_form_check_skipped`).
- `LegalizePortableDimOrderPass._target_ops`: the portable ops before which `to_executorch`
  inserts a copy to the contiguous dim order when their first input is not contiguous
  (`emitter_contiguous_ops`); the plan gives each such copy its row.

`tests/test_upstream_adapters.py` checks these names and signatures without compiling.
"""

from __future__ import annotations

import contextlib
import functools
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


@contextlib.contextmanager
def upstream_shortcuts() -> Iterator[None]:
    """What every compile stage runs inside: the same programs as upstream's flow, without the
    work that changes nothing (`provenance_shared`, `delegate_outputs_from_metadata`,
    `idle_edge_passes_skipped`)."""
    with provenance_shared(), delegate_outputs_from_metadata(), idle_edge_passes_skipped():
        yield


@contextlib.contextmanager
def idle_edge_passes_skipped(record: list | None = None) -> Iterator[None]:
    """Inside: four of `to_edge`'s passes return a graph that holds nothing they rewrite as it
    is, instead of re-tracing it.

    Each is an ExportPass, which re-traces the whole graph under fake tensors whatever it finds:
    on a 25-step GRU's 2,143 nodes, NormalizeTransposePass 0.8 s, SymToTensorPass 0.7 s,
    ScalarToTensorPass 1.0 s and RemoveMixedTypeOperators 1.0 s. What each rewrites, from its
    `call_operator`:
    - NormalizeTransposePass: `aten.t.default` (to `t_copy`);
    - SymToTensorPass: a SymInt, SymFloat or SymBool passed where the schema takes a tensor;
    - ScalarToTensorPass: a Python bool, int or float passed where the schema takes a tensor;
    - RemoveMixedTypeOperators: an add, mul, sub, div or minimum whose arguments promote to
      another dtype than one of them has (a cast is inserted).
    A graph (or control-flow subgraph) with none of these is skipped; any one and the pass runs
    as upstream wrote it. `record` gets (pass, "skipped" or "ran") per call. Process-global
    while inside, like `provenance_shared`."""
    check_version()
    from executorch.exir.passes.normalize_transpose_pass import (  # lazy: heavy (executorch)
        NormalizeTransposePass)
    from executorch.exir.passes.scalar_to_tensor_pass import (  # lazy: heavy (executorch)
        ScalarToTensorPass)
    from executorch.exir.passes.sym_to_tensor_pass import (  # lazy: heavy (executorch)
        SymToTensorPass)

    from executorch.exir.passes.remove_mixed_type_operators import (  # lazy: heavy (executorch)
        RemoveMixedTypeOperators)

    idle_when = {NormalizeTransposePass: _no_plain_transpose,
                 SymToTensorPass: _no_symbol_for_tensor, ScalarToTensorPass: _no_scalar_for_tensor,
                 RemoveMixedTypeOperators: _no_mixed_types}
    own = {cls: cls.__dict__.get("call") for cls in idle_when}

    def skipping(cls, upstream_call):
        def call(self, graph_module):
            from torch.fx.passes.infra.pass_base import PassResult  # lazy: heavy (torch)

            idle = idle_when[cls](graph_module)
            if record is not None:
                record.append((cls.__name__, "skipped" if idle else "ran"))
            return PassResult(graph_module, False) if idle else upstream_call(self, graph_module)
        return call

    for cls in idle_when:
        cls.call = skipping(cls, cls.call)
    try:
        yield
    finally:
        for cls, call in own.items():
            if call is None:
                del cls.call
            else:
                cls.call = call


def _graphs(graph_module):
    import torch  # lazy: heavy (torch)

    return [m.graph for m in graph_module.modules() if isinstance(m, torch.fx.GraphModule)]


def _no_plain_transpose(graph_module) -> bool:
    import torch  # lazy: heavy (torch)

    return not any(node.target is torch.ops.aten.t.default
                   for graph in _graphs(graph_module) for node in graph.nodes)


def _tensor_arguments(graph_module):
    """(argument value, node) for every argument an operator's schema types as a tensor."""
    import torch  # lazy: heavy (torch)

    for graph in _graphs(graph_module):
        for node in graph.nodes:
            schema = getattr(node.target, "_schema", None)
            if node.op != "call_function" or schema is None:
                continue
            for i, argument in enumerate(schema.arguments):
                if not isinstance(argument.type, torch.TensorType):
                    continue
                if argument.name in node.kwargs:
                    yield node.kwargs[argument.name], node
                elif not argument.kwarg_only and i < len(node.args):
                    yield node.args[i], node


def _no_scalar_for_tensor(graph_module) -> bool:
    return not any(isinstance(value, (bool, int, float))
                   for value, _ in _tensor_arguments(graph_module))


def _no_mixed_types(graph_module) -> bool:
    """Every add, mul, sub, div and minimum (the operators RemoveMixedTypeOperators promotes)
    takes only tensors of one floating dtype as its positional arguments: their promoted dtype
    is that dtype, and the pass casts nothing. Anything else (an integer or bool tensor, two
    dtypes, a scalar) and the pass runs."""
    import torch  # lazy: heavy (torch)

    aten = torch.ops.aten
    promoted = {aten.add.Tensor, aten.mul.Tensor, aten.sub.Tensor, aten.div.Tensor,
                aten.div.Tensor_mode, aten.minimum.default}
    for graph in _graphs(graph_module):
        for node in graph.nodes:
            if node.op != "call_function" or node.target not in promoted or len(node.args) <= 1:
                continue
            values = [a.meta.get("val") if isinstance(a, torch.fx.Node) else a
                      for a in node.args]
            if not all(isinstance(v, torch.Tensor) and v.dtype.is_floating_point
                       for v in values) or len({v.dtype for v in values}) != 1:
                return False
    return True


def _no_symbol_for_tensor(graph_module) -> bool:
    import torch  # lazy: heavy (torch)

    symbols = (torch.SymInt, torch.SymFloat, torch.SymBool)
    return not any(isinstance(value, symbols) or (
        isinstance(value, torch.fx.Node) and isinstance(value.meta.get("val"), symbols))
        for value, _ in _tensor_arguments(graph_module))


@contextlib.contextmanager
def delegate_outputs_from_metadata() -> Iterator[None]:
    """Inside: a re-trace under fake tensors gives a delegate call its outputs from the shapes,
    strides and dtypes the delegated partition's graph records, instead of running that graph.

    torch's fake kernel for `executorch_call_delegate` (`call_delegate_fake_tensor_mode`) rebuilds
    the partition's module (`ExportedProgram.module()`) and runs every node of it under fake
    tensors, at every call in every pass that re-traces the program around the delegates (the
    Cortex-M passes, `to_executorch`): a 25-step GRU cut into 27 NPU partitions spent 4 s there
    (py-spy). The partition's outputs are fixed when it is lowered, and recorded on its graph's
    output node (`meta["val"]`), so the same fake tensors come from there. A partition whose
    output is one of its inputs, holds a symbolic size, mutates a buffer or lacks a recorded
    value is run as upstream runs it. Process-global while inside, like `provenance_shared`."""
    require("torch", SUPPORTED_TORCH, "orchestrator/compilation/upstream_exir.py")
    from torch._higher_order_ops.executorch_call_delegate import (  # lazy: heavy (torch)
        executorch_call_delegate)
    from torch._higher_order_ops.utils import registered_hop_fake_fns  # lazy: heavy (torch)

    upstream = registered_hop_fake_fns[executorch_call_delegate]

    def from_metadata(lowered_module, *args):
        outputs = _recorded_outputs(lowered_module.original_module)
        return upstream(lowered_module, *args) if outputs is None else outputs()

    registered_hop_fake_fns[executorch_call_delegate] = from_metadata
    try:
        yield
    finally:
        registered_hop_fake_fns[executorch_call_delegate] = upstream


def _recorded_outputs(program):
    """A maker of fresh tensors shaped as `program`'s outputs (in the current mode), or None
    when its outputs cannot be told from its graph alone."""
    import torch  # lazy: heavy (torch)
    import torch.utils._pytree as pytree  # lazy: heavy (torch)

    signature = program.graph_signature
    out_spec = program.call_spec.out_spec
    if signature.buffers_to_mutate or signature.user_inputs_to_mutate or out_spec is None:
        return None
    output = next(reversed(program.graph_module.graph.nodes))
    flat = pytree.tree_leaves(output.args[0])
    values = [n.meta.get("val") if isinstance(n, torch.fx.Node) and n.op != "placeholder"
              else None for n in flat]
    if len(set(flat)) != len(flat) or not all(
            isinstance(v, torch.Tensor) and all(isinstance(d, int) for d in v.shape)
            for v in values):
        return None

    def outputs():
        return pytree.tree_unflatten(
            [torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device=v.device)
             for v in values], out_spec)

    return outputs


@contextlib.contextmanager
def canonical_form_check_skipped() -> Iterator[None]:
    """Inside: `torch.export.save` does not build the program's canonical form only to drop it.

    torch's serializer (`ExportedProgramSerializer.serialize`) calls `canonicalize` on the
    serialized program under the comment "Test canonical form is well defined" and discards the
    result; the bytes written are those of the program as serialized. On a 25-step GRU's
    quantized program (5.6 MB) the check took 1.2 of the save's 2.0 s. The bytes are the same
    without it (tests/test_upstream_adapters.py). Process-global while inside."""
    require("torch", SUPPORTED_TORCH, "orchestrator/compilation/upstream_exir.py")
    import torch._export.serde.serialize as serialize  # lazy: heavy (torch)

    upstream = serialize.canonicalize
    serialize.canonicalize = _not_canonicalized
    try:
        yield
    finally:
        serialize.canonicalize = upstream


def _not_canonicalized(program, *args, **kwargs):
    return program


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


@functools.cache
def emitter_contiguous_ops() -> frozenset[str]:
    """Names ("aten.mean.dim") of the ops whose non-contiguous first input `to_executorch`
    copies to the contiguous dim order first (ExecuTorch 1.5.1
    LegalizePortableDimOrderPass)."""
    from executorch.exir.passes.legalize_portable_dim_order_pass import (  # lazy: heavy (executorch)
        LegalizePortableDimOrderPass)

    return frozenset(str(getattr(op, "__name__", op))
                     for op in LegalizePortableDimOrderPass._target_ops)


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
        "registered_hop_fake_fns[executorch_call_delegate]": _delegate_fake_registered(),
        # canonical_form_check_skipped: the serializer calls canonicalize and drops its result
        "serialize calls canonicalize": "canonicalize(serialized_ep" in inspect.getsource(
            __import__("torch._export.serde.serialize", fromlist=["x"])
            .ExportedProgramSerializer.serialize),
    }


def _delegate_fake_registered() -> bool:
    from torch._higher_order_ops.executorch_call_delegate import (  # lazy: heavy (torch)
        executorch_call_delegate)
    from torch._higher_order_ops.utils import registered_hop_fake_fns  # lazy: heavy (torch)

    return executorch_call_delegate in registered_hop_fake_fns
