"""State that lives in the program: buffers a model updates in place, frame after frame.

A streaming model keeps state between calls in registered buffers it writes in place (a ring
buffer of past frames shifted with `self.state.copy_(...)`, a GRU's hidden state, a running
mean). ExecuTorch keeps such a buffer as a *mutable buffer*: memory planned for the whole
program, read at the start of `execute` and written back at its end, so the next `execute`
of the same Method reads what the last one wrote. Two upstream defaults would make a wrong
program of it, silently:

- PT2E's `convert_pt2e` folds every `quantize` whose input is a module attribute into an int8
  constant (`fold_quantize`, meant for weights). A state buffer is an attribute too: its read
  became a constant holding the initial state, and every frame read that constant again
  (the state never carried). `converted` folds the weights as upstream folds them and keeps
  the state's quantize a runtime op.
- ExecuTorch's emitter serializes a mutated buffer's shape and dtype only ("a meaningless
  initial state"), so the device starts from whatever its arena held. `initialized` marks each
  state placeholder (`et_init_buffer`, upstream's own switch, as `InitializedMutableBufferPass`
  sets it) so its initial value is in the program's mutable data segment and the runtime copies
  it in at `load_method`: a reload is a reset.

Calibration runs the samples as consecutive frames, so the state's observer sees the values it
carries; the buffers get their initial values back before the conversion (`States`). The
state's scale is one for every frame (static quantization). A state read by one quantize and
written back from the dequantize of the same parameters is kept int8 (`int8_states`: no
quantize or dequantize per frame); any other stays float, quantized where it is read. A state
is written back in its buffer's dim order (`written_in_buffer_order`).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch.export.graph_signature import InputKind, OutputKind, OutputSpec, TensorArgument
from torchao.quantization.pt2e.constant_fold import constant_fold
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e

from partitioners.legalize import layout_copy

_VIEW_OPS = ("slice", "select", "view", "_unsafe_view", "narrow", "squeeze", "unsqueeze",
             "expand", "permute", "transpose", "t", "as_strided", "diagonal", "unfold")


def _quantize_ops() -> tuple:
    """The ops `convert_pt2e(fold_quantize=True)` folds (torchao 0.18 `_QUANT_OPS`)."""
    return (torch.ops.quantized_decomposed.quantize_per_tensor.default,
            torch.ops.quantized_decomposed.quantize_per_tensor.tensor,
            torch.ops.quantized_decomposed.quantize_per_channel.default,
            torch.ops.torchao.quantize_affine)


def mutated_buffers(program: torch.export.ExportedProgram) -> tuple[str, ...]:
    """The names (module FQNs) of the buffers `program` writes, in its signature's order (the
    order of the program's state values): those its signature lists as mutated (a functional
    graph) and those an in-place op writes, directly or through a view (torch.export's
    training IR keeps `copy_` in the graph)."""
    buffers = {spec.arg.name: spec.target for spec in program.graph_signature.input_specs
               if spec.kind == InputKind.BUFFER}
    names = {spec.target for spec in program.graph_signature.output_specs
             if spec.kind == OutputKind.BUFFER_MUTATION}
    for node in program.graph.nodes:
        schema = getattr(node.target, "_schema", None)
        if node.op != "call_function" or schema is None:
            continue
        for argument, value in zip(schema.arguments, node.args):
            if argument.alias_info is None or not argument.alias_info.is_write:
                continue
            base = _view_base(value)
            if base is not None and base.name in buffers:
                names.add(buffers[base.name])
    return tuple(name for name in buffers.values() if name in names)


def _view_base(value):
    """The node a chain of view ops starts from (the buffer a `self.state[:, :2] = x` writes)."""
    while isinstance(value, torch.fx.Node) and value.op == "call_function" and \
            getattr(value.target, "__name__", "").split(".")[0] in _VIEW_OPS and value.args:
        value = value.args[0]
    return value if isinstance(value, torch.fx.Node) else None


class States:
    """The state buffers of a captured program's unlifted `module` (the tensors PT2E's
    prepared module reads and writes under other names) and their initial values, taken before
    anything runs it: `prepare_pt2e`'s own trace already writes them (and leaves them with an
    autograd history, which `copy.deepcopy` of the program refuses)."""

    def __init__(self, program: torch.export.ExportedProgram, module: torch.nn.Module) -> None:
        self.module = module
        self.names = mutated_buffers(program)
        self.initial = {name: module.get_buffer(name).detach().clone() for name in self.names}

    def __bool__(self) -> bool:
        return bool(self.names)

    def tensor(self, name: str) -> torch.Tensor:
        return self.module.get_buffer(name)

    @contextlib.contextmanager
    def calibrating(self) -> Iterator[None]:
        """Meanwhile the states carry from sample to sample (calibration steps the model frame
        by frame); afterwards each holds its initial value again, in place, as a plain tensor
        (no autograd history)."""
        try:
            yield
        finally:
            with torch.no_grad():
                for name, value in self.initial.items():
                    tensor = self.tensor(name)
                    tensor.detach_()
                    tensor.requires_grad_(False)
                    tensor.copy_(value)


def converted(prepared: torch.fx.GraphModule, states: States) -> torch.fx.GraphModule:
    """`convert_pt2e(prepared)` for a model with `states` (whose tensors `prepared` reads and
    writes under the names PT2E gave them, `_tensor_constant0`, one attribute per use):

    - the weights are folded as `fold_quantize=True` folds them, but a quantize that reads a
      state buffer stays an op: it runs on every frame, on what the last frame wrote;
    - every use of one state tensor goes through one buffer attribute, named after the module's
      buffer (dots as underscores): two attributes of one mutated tensor make torch.export's
      functionalization fail (AssertionError "expected compiled_fn to be GraphModule").

    Without state: `convert_pt2e(prepared)`, upstream's conversion as it is."""
    if not states:
        return convert_pt2e(prepared)
    model = convert_pt2e(prepared, fold_quantize=False)
    tensors = {states.tensor(name).untyped_storage().data_ptr(): (name, states.tensor(name))
               for name in states.names}
    reads: dict[str, str] = {}  # get_attr node name -> its state's new attribute
    for node in model.graph.nodes:
        if node.op != "get_attr":
            continue
        value = _attribute(model, str(node.target))
        found = tensors.get(value.untyped_storage().data_ptr()) \
            if isinstance(value, torch.Tensor) else None
        if found is not None:
            reads[node.name] = found[0].replace(".", "_")

    after_state: set[torch.fx.Node] = set()  # every node computed from a state (graph order)
    for node in model.graph.nodes:
        if node.name in reads or any(i in after_state for i in node.all_input_nodes):
            after_state.add(node)
    quantizes = _quantize_ops()
    constant_fold(model, lambda node: node.op == "call_function" and node.target in quantizes
                  and node not in after_state)
    for name, tensor in tensors.values():
        model.register_buffer(name.replace(".", "_"), tensor)
    aliases = set()
    for node in model.graph.nodes:
        if node.name in reads:
            aliases.add(str(node.target))
            node.target = reads[node.name]
    for name, value in list(model.named_buffers()):  # other names of a state tensor go
        if name not in reads.values() and \
                value.untyped_storage().data_ptr() in tensors:
            aliases.add(name)
    for alias in aliases - set(reads.values()):
        owner_path, _, leaf = alias.rpartition(".")
        owner = model.get_submodule(owner_path) if owner_path else model
        if hasattr(owner, leaf):
            delattr(owner, leaf)
    # A state written from float weights (a GRU's hidden state on the CPU) would come out of
    # the re-export requiring grad, and ExecuTorch's passes refuse the write-back `copy_` into
    # it ("a leaf Variable that requires grad is being used in an in-place operation").
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    model.recompile()
    return model


def _attribute(module: torch.nn.Module, path: str):
    for part in path.split("."):
        module = getattr(module, part, None)
    return module


def initialized(edge_program) -> int:
    """Mark each mutated buffer's placeholder of `edge_program` (an ExportedProgram after
    to_edge) so the emitter writes its initial value; the count marked."""
    signature = edge_program.graph_signature
    mutated = set(signature.buffers_to_mutate.values())
    marked = 0
    for node in edge_program.graph.nodes:
        if node.op == "placeholder" and signature.inputs_to_buffers.get(node.name) in mutated:
            node.meta["et_init_buffer"] = True
            marked += 1
    return marked


def int8_states(edge_program) -> tuple[str, ...]:
    """Each state whose every read is one quantize and whose write-back is the dequantize of a
    value with the same parameters becomes an int8 buffer, in place (`edge_program` after
    to_edge, before the CPU passes): the buffer holds the quantized value (its initial value
    quantized as that quantize would), the reads take it as it is and the write-back stores the
    int8 value. No quantize and no dequantize per frame, a quarter of the bytes. A state read
    and written with different parameters (a running mean's multiply and add) stays float.
    Returns the buffers made int8."""
    signature = edge_program.graph_signature
    graph = edge_program.graph_module.graph
    output = graph.output_node()
    written_at = {spec.target: position for position, spec in enumerate(signature.output_specs)
                  if spec.kind == OutputKind.BUFFER_MUTATION}
    placeholders = {node.name: node for node in graph.nodes if node.op == "placeholder"}
    results = list(output.args[0])
    made = []
    for name, buffer in signature.inputs_to_buffers.items():
        if buffer not in written_at or name not in placeholders:
            continue
        placeholder = placeholders[name]
        reads = list(placeholder.users)
        written = results[written_at[buffer]]
        parameters = {tuple(read.args[1:]) for read in reads}
        if not reads or not all(_is(read, "quantize_per_tensor") for read in reads) or \
                len(parameters) != 1 or not _is(written, "dequantize_per_tensor") or \
                {tuple(written.args[1:])} != parameters:
            continue
        (scale, zero_point, low, high, dtype), = parameters
        for read in reads:
            read.replace_all_uses_with(placeholder)
            graph.erase_node(read)
        results[written_at[buffer]] = written.args[0]
        spec = signature.output_specs[written_at[buffer]]
        signature.output_specs[written_at[buffer]] = OutputSpec(
            spec.kind, TensorArgument(name=written.args[0].name), spec.target)
        initial = edge_program.state_dict[buffer]
        edge_program.state_dict[buffer] = torch.ops.quantized_decomposed.quantize_per_tensor(
            initial, scale, zero_point, low, high, dtype)
        placeholder.meta["val"] = placeholder.meta["val"].to(dtype)
        made.append(buffer)
    if made:
        output.args = (tuple(results),)
        for node in reversed(list(graph.nodes)):
            if _is(node, "dequantize_per_tensor") and not node.users:
                graph.erase_node(node)
        graph.lint()
        edge_program.graph_module.recompile()
    return tuple(made)


def _is(node, name: str) -> bool:
    """A call of quantized_decomposed's `name` (aten or edge dialect)."""
    return isinstance(node, torch.fx.Node) and node.op == "call_function" and \
        f"quantized_decomposed.{name}.default" in str(node.target)


def written_in_buffer_order(edge_program) -> tuple[str, ...]:
    """Each state written back from a value laid out in another dim order than its buffer (a
    4-D ring buffer: the buffer channels-last, the cat's slice contiguous) gets a
    `_to_dim_order_copy` into the buffer's order first: the write-back `copy_` ExecuTorch
    inserts refuses two dim orders (`tensors_have_same_dim_order(in, src)`, error 0x12).
    Returns the buffers given one."""
    signature = edge_program.graph_signature
    graph = edge_program.graph_module.graph
    output = graph.output_node()
    results = list(output.args[0])
    placeholders = {node.name: node for node in graph.nodes if node.op == "placeholder"}
    by_buffer = {buffer: placeholders.get(name)
                 for name, buffer in signature.inputs_to_buffers.items()}
    made = []
    for position, spec in enumerate(signature.output_specs):
        if spec.kind != OutputKind.BUFFER_MUTATION or by_buffer.get(spec.target) is None:
            continue
        written, buffer = results[position], by_buffer[spec.target].meta.get("val")
        value = written.meta.get("val") if isinstance(written, torch.fx.Node) else None
        if not isinstance(value, torch.Tensor) or not isinstance(buffer, torch.Tensor):
            continue
        order = tuple(int(d) for d in buffer.dim_order())
        if tuple(int(d) for d in value.dim_order()) == order:
            continue
        copy = layout_copy(graph, graph.inserting_before(output), written, order,
                           f"{spec.target}:write-back", {})
        results[position] = copy
        signature.output_specs[position] = OutputSpec(
            spec.kind, TensorArgument(name=copy.name), spec.target)
        made.append(spec.target)
    if made:
        output.args = (tuple(results),)
        graph.lint()
        edge_program.graph_module.recompile()
    return tuple(made)


def for_the_device(edge_program) -> None:
    """The state's device form, in place, before the CPU passes: int8 where it can be
    (`int8_states`), each written back in its buffer's dim order (`written_in_buffer_order`)."""
    int8_states(edge_program)
    written_in_buffer_order(edge_program)
