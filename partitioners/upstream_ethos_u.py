"""Adapter: every touch of the Ethos-U backend's private names, in one place, with a version guard.

ExecuTorch keeps what a placement report needs out of its public API:
- `TOSAPartitioner._tag_module(module, containing_program, reporter, tag_iterator=None)` is the
  only place the partitioner's `WhyNoPartitionReporter` is visible; upstream calls it again on
  every control-flow submodule (`torch.cond` branches) with the 4th argument;
- `WhyNoPartitionReporter._rejected_nodes` (node -> message) holds the rejections;
- `executorch.backends.arm.ethosu.backend.vela_compile` is called once per partition; wrapping it
  is how each call gets an output folder of its own. The swap is process-global, so a lock keeps
  two compiles in one process from interleaving their recordings.
- `_tag_module` returns its partition tags as a `set`, and `TOSAPartitioner.partition` hands
  them on in that set's order (`partition_tags = {tag: ... for tag in tags}`), which is string
  hash order: the partitions are then fused, and a multi-output partition's outputs ordered,
  differently from one Python process to the next (PYTHONHASHSEED). Measured on a model with a
  two-output partition: two hash seeds gave two `.pte` files (7,232 B and 7,184 B, arenas 5,904 B
  and 6,336 B). `capture_reporters` hands the tags on in tag-number order instead.
- `FuseQuantizedActivationPass._is_fuseable_quantized_activation(node)` decides which ReLUs fold
  into the convolution before them; `live_activations_kept` narrows it (an upstream defect, see
  there) while the same lock is held.
- `executorch.backends.arm.tosa.partitioner._validate_partition(nodes)` is upstream's check that
  a set of nodes can be cut out as one partition; `partition_extractable` asks it of each piece
  of a partition cut at a recurrence's steps (partitioners/repeated_steps.py).
- `EthosUBackend.preprocess` (wrapped by `preprocess_failures_recorded`) may be answered with
  the result of an equal partition compiled before it, by a digest of the partition's program.
- `executorch.backends.arm._passes.insert_table_ops.TableOps` lists the operators the backend
  lowers to TOSA TABLE lookups (`int16_table_lookups` counts those a program runs on 16-bit
  activations).

- `executorch.backends.arm._passes.arm_pass_manager.register_pass_insertions_after` is the
  Arm backend's hook for a pass of one's own in its TOSA pipeline; `conv_pads_folded` inserts
  partitioners/conv_padding.py's pass after `RewritePadPass` with it, and that pass reads the
  TOSA dialect's PAD, CONV2D, DEPTHWISE_CONV2D and CONST_SHAPE nodes.
- `executorch.backends.arm.operators.op_tosa_rescale.RescaleVisitor._build_rescale` writes every
  TOSA RESCALE with `rounding_mode=SINGLE_ROUND`; `tflite_rounding` has it write DOUBLE_ROUND
  for a program whose quantization came from a TFLite file (see there).

`tests/test_upstream_adapters.py` checks each of these names and signatures without compiling,
so an ExecuTorch upgrade that moves them fails there, not as a wrong report.
"""

from __future__ import annotations

import contextlib
import inspect
import re
import threading
from typing import Callable, Iterator

from partitioners.upstream_version import UpstreamVersionError, require  # noqa: F401

SUPPORTED_EXECUTORCH = ("1.5.1",)
_VELA_LOCK = threading.Lock()


def check_version() -> str:
    return require("executorch", SUPPORTED_EXECUTORCH, "partitioners/upstream_ethos_u.py")


class NumberedTags(set):
    """A set of partition tags (`tag0`, `tag1`, ...) that iterates in tag-number order, not in
    string-hash order; set operations on it behave as on any set."""

    def __iter__(self):
        return iter(sorted(set.__iter__(self), key=_tag_number))


def _tag_number(tag: str) -> tuple[tuple[int, ...], str]:
    """tag3 -> (3,); a partition cut in pieces, tag3_0, tag3_1 ... -> (3, 0), (3, 1)."""
    return (tuple(int(d) for d in re.findall(r"\d+", tag)) or (-1,), tag)


def partition_extractable(nodes: set) -> bool:
    """Upstream's own check that a set of nodes can be one partition: no path leaves it and
    comes back (executorch.backends.arm.tosa.partitioner._validate_partition)."""
    check_version()
    from executorch.backends.arm.tosa.partitioner import _validate_partition  # lazy: heavy (executorch)

    return _validate_partition(nodes)


def capture_reporters(partitioner, tagged: dict | None = None, retag=None) -> list:
    """Make `partitioner` hand over every WhyNoPartitionReporter it fills while tagging, and
    return its tags in tag-number order (see the module docstring); `tagged` (when given)
    receives each tag's node names, in the order the backend compiles the partitions.
    `retag(module, program, tags) -> tags` (when given) may re-cut the partitions upstream
    formed, before upstream tags their constants."""
    check_version()
    reporters: list = []
    upstream_tag_module = partitioner._tag_module

    def tag_module(module, containing_program, reporter, *args, **kwargs):
        reporters.append(reporter)
        tags = NumberedTags(
            upstream_tag_module(module, containing_program, reporter, *args, **kwargs))
        if retag is not None:
            tags = NumberedTags(retag(module, containing_program, tags))
        if tagged is not None:
            for tag in tags:
                tagged[tag] = tuple(n.name for n in module.graph.nodes
                                    if n.meta.get("delegation_tag") == tag)
        return tags

    partitioner._tag_module = tag_module
    return reporters


def rejected_nodes(reporter) -> dict:
    """node -> the message of the operator-support check that rejected it."""
    return dict(reporter._rejected_nodes)


@contextlib.contextmanager
def vela_compile_wrapped(make_wrapper: Callable[[Callable], Callable]) -> Iterator[None]:
    """Replace the backend's `vela_compile` by `make_wrapper(upstream_vela_compile)` meanwhile."""
    check_version()
    import executorch.backends.arm.ethosu.backend as ethosu_backend  # lazy: heavy (executorch, vela)

    with _VELA_LOCK:
        upstream = ethosu_backend.vela_compile
        ethosu_backend.vela_compile = make_wrapper(upstream)
        try:
            yield
        finally:
            ethosu_backend.vela_compile = upstream


@contextlib.contextmanager
def preprocess_failures_recorded(failed: list[int], digest=None,
                                 reused: list[tuple[int, int]] | None = None) -> Iterator[None]:
    """Count the Ethos-U backend's `preprocess` calls (one per partition, in tag order: TOSA
    lowering, then Vela) and append to `failed` the index of a call that raised, wherever in
    the backend it raised.

    With `digest(edge_program, compile_specs) -> str` (partitioners/repeated_steps.py), a
    partition equal to one already compiled gets that one's result without a second TOSA
    lowering and Vela call; `reused` receives (call index, index of the call it reused).

    Called inside `vela_compile_wrapped` (whose lock makes the process-global swap safe)."""
    check_version()
    from executorch.backends.arm.ethosu.backend import EthosUBackend  # lazy: heavy (executorch, vela)

    upstream = EthosUBackend.__dict__["preprocess"]
    calls = [0]
    compiled: dict[str, tuple[int, object]] = {}

    def counted(edge_program, compile_specs):
        index = calls[0]
        calls[0] += 1
        key = digest(edge_program, compile_specs) if digest is not None else None
        if key in compiled:
            first, result = compiled[key]
            if reused is not None:
                reused.append((index, first))
            return result
        try:
            result = upstream.__func__(edge_program, compile_specs)
        except Exception:
            failed.append(index)
            raise
        if key is not None:
            compiled[key] = (index, result)
        return result

    EthosUBackend.preprocess = staticmethod(counted)
    try:
        yield
    finally:
        EthosUBackend.preprocess = upstream


@contextlib.contextmanager
def live_activations_kept(kept: list[tuple[str, int, int]],
                          clamps: list[str] | None = None) -> Iterator[None]:
    """Keep the ReLUs (and hardtanh(0, max)) after a convolution or linear out of upstream's
    fusion: each stays a quantized clamp, which Vela fuses into the layer as its activation.

    Upstream defect (ExecuTorch 1.5.1, Arm backend): FuseQuantizedActivationPass removes a ReLU
    after a convolution or linear and instead raises the following quantize's qmin to its zero
    point. RewriteConvPass then builds the convolution's output RESCALE from that quantize's
    scale and zero point only; a TOSA RESCALE saturates to the int8 range, so the raised qmin is
    never applied. Where the zero point is qmin (a ReLU output quantized on its own, range from
    0) nothing is lost. Where it is above (the ReLU's output shares a quantization range that
    goes below zero, e.g. with a tensor it is concatenated with), the NPU passes the negative
    values through. A kept activation stays a quantized clamp, the path upstream takes for an
    activation it does not fuse (RewriteConvPass's `_get_effective_output_qparams`). `kept`
    gets (node name, zero point, qmin) of each of those.

    The others (zero point at qmin) after a 2-D convolution are kept too, and `clamps` (when
    given) gets their names. They change no value (the clamp is the int8 range, which the
    layer's output stage applies anyway), and where Vela fuses the clamp into the convolution
    the command stream is the same byte for byte (where a transpose sits between, Vela fuses it
    there instead: one activation register more or less). But Vela 5.1 estimates an
    Ethos-U55/U65 layer with no
    fused activation at the LUT's output cost, 1 cycle per element on the U55-128 against 0.5
    with a ReLU (regor `EthosU55Performance::EstimateAOCyclesPerElement` starts its activation
    index at 0, the Sigmoid/Tanh/LUT entry). A TFLite file's fused RELU reaches Vela as an
    activation, so without the clamp the same layer costs up to twice the incumbent's estimate
    (MobileNetV1-0.25's first pointwise convolution: 37,984 cycles against 19,392).

    Called inside `vela_compile_wrapped` (whose lock makes the process-global swap safe)."""
    check_version()
    from executorch.backends.arm._passes.fuse_quantized_activation_pass import (  # lazy: heavy (executorch)
        FuseQuantizedActivationPass)
    from executorch.backends.arm._passes.quant_args import QuantArgs  # lazy: heavy (executorch)

    if not _VELA_LOCK.locked():
        raise RuntimeError("live_activations_kept must run inside vela_compile_wrapped")
    upstream = FuseQuantizedActivationPass.__dict__["_is_fuseable_quantized_activation"]

    def fuseable(node) -> bool:
        if not upstream.__func__(node):
            return False
        if not FuseQuantizedActivationPass._is_fuseable_input(node.args[0]):
            return True  # the pass leaves it alone anyway (an add's ReLU): nothing to keep
        quant = next(iter(node.users))
        args = QuantArgs.from_operator(quant.target, quant.args)
        if isinstance(args.zp, int) and args.zp > args.qmin:
            kept.append((node.name, args.zp, args.qmin))
            return False
        producer = node.args[0]
        value = producer.meta.get("val")
        if clamps is None or "convolution" not in str(producer.target) or \
                getattr(value, "dim", lambda: 0)() != 4:
            # Only a 2-D convolution's: after a linear, or a 1-D convolution (which the
            # backend wraps in views), RewriteConvPass then finds no output quantization and
            # the partition is refused (examples/user_models.py conv1d_audio, sensor_mlp)
            return True
        clamps.append(node.name)
        return False

    upstream_call = FuseQuantizedActivationPass.call

    def call(self, graph_module):
        # Only the pass is narrowed: the partitioner's support check asks the same question
        # ("is this conv's output quantized through its activation?"), and the answer stays yes.
        FuseQuantizedActivationPass._is_fuseable_quantized_activation = staticmethod(fuseable)
        try:
            return upstream_call(self, graph_module)
        finally:
            FuseQuantizedActivationPass._is_fuseable_quantized_activation = upstream

    FuseQuantizedActivationPass.call = call
    try:
        yield
    finally:
        FuseQuantizedActivationPass.call = upstream_call


_PAD_FOLD: list = []  # the one FoldPadIntoConvolution registered with the Arm pass manager


@contextlib.contextmanager
def conv_pads_folded(folded: list[tuple[str, tuple[int, ...]]]) -> Iterator[None]:
    """While active, the Arm backend's TOSA pipeline folds an explicit PAD into the convolution
    after it (partitioners/conv_padding.py, which says why); `folded` gets (convolution node,
    its new padding) of each.

    The pass is inserted after `RewritePadPass` through upstream's own hook
    (`arm_pass_manager.register_pass_insertions_after`), once per process; it folds only while
    a `conv_pads_folded` is active, so upstream's pipeline is unchanged outside it. Called
    inside `vela_compile_wrapped` (its lock)."""
    check_version()
    from executorch.backends.arm._passes.arm_pass_manager import (  # lazy: heavy (executorch)
        register_pass_insertions_after)
    from executorch.backends.arm._passes.rewrite_pad import RewritePadPass  # lazy: heavy (executorch)

    from partitioners.conv_padding import FoldPadIntoConvolution  # lazy: heavy (executorch)

    if not _VELA_LOCK.locked():
        raise RuntimeError("conv_pads_folded must run inside vela_compile_wrapped")
    if not _PAD_FOLD:
        _PAD_FOLD.append(_Switched(FoldPadIntoConvolution))
        register_pass_insertions_after(RewritePadPass, [_PAD_FOLD[0]])
    switched = _PAD_FOLD[0]
    switched.folded = folded
    try:
        yield
    finally:
        switched.folded = None


class _Switched:
    """A pass that runs `pass_type(self.folded)` while `folded` is set, and changes nothing
    otherwise (a pass registered with upstream stays registered for the process)."""

    def __init__(self, pass_type) -> None:
        self.pass_type = pass_type
        self.folded = None
        self.__name__ = pass_type.__name__

    def __call__(self, graph_module):
        from torch.fx.passes.infra.pass_base import PassResult  # lazy: heavy (torch)

        if self.folded is None:
            return PassResult(graph_module, False)
        return self.pass_type(self.folded)(graph_module)


@contextlib.contextmanager
def tflite_rounding(active: bool) -> Iterator[None]:
    """Every TOSA RESCALE the Arm backend writes rounds as TFLite does (TOSA's DOUBLE_ROUND)
    while active, instead of upstream's SINGLE_ROUND.

    A TFLite file's int8 arithmetic requantizes with gemmlowp's SaturatingRoundingDoublingHighMul
    and then RoundingDivideByPOT: two roundings, which TOSA states as DOUBLE_ROUND and Vela
    compiles to the NPU's TFLite rounding mode, as its own TFLite front end does. ExecuTorch 1.5.1
    writes SINGLE_ROUND for every RESCALE (`RescaleVisitor.define_node`), so a program keeping a
    file's scales computed up to 3 steps away from TFLM on the NPU (MLPerf Tiny's anomaly
    autoencoder on U55-128: 3,575 of 10,240 output values; with DOUBLE_ROUND: none).
    CMSIS-NN already rounds the TFLite way. Called inside `vela_compile_wrapped` (its lock)."""
    check_version()
    if not active:
        yield
        return
    from executorch.backends.arm.operators import op_tosa_rescale  # lazy: heavy (executorch)

    if not _VELA_LOCK.locked():
        raise RuntimeError("tflite_rounding must run inside vela_compile_wrapped")
    visitor = op_tosa_rescale.RescaleVisitor
    upstream = visitor.__dict__["_build_rescale"]
    double = op_tosa_rescale.ts.RoundingMode.DOUBLE_ROUND
    single = op_tosa_rescale.ts.RoundingMode.SINGLE_ROUND

    def build(self, *args, **kwargs):
        if kwargs.get("rounding_mode") == single:
            kwargs["rounding_mode"] = double
        return upstream(self, *args, **kwargs)

    visitor._build_rescale = build
    try:
        yield
    finally:
        visitor._build_rescale = upstream


def int16_table_lookups(program) -> int:
    """How many operators of a quantized (ATen) program the Arm backend turns into TABLE lookups
    on 16-bit activations: those `TableOps` lists whose input a dequantize from int16 feeds (on
    the Ethos-U85, each a 2 KiB interpolating table that fills the LUT memory)."""
    check_version()
    import torch  # lazy: heavy (torch)
    from executorch.backends.arm._passes.insert_table_ops import (  # lazy: heavy (executorch)
        TableOps)

    tables = {getattr(op, "_op", op) for op in (*TableOps.unary_table_ops,
                                                 *TableOps.special_table_ops)}
    count = 0
    for node in program.graph.nodes:
        if node.op != "call_function" or node.target not in tables or not node.args:
            continue
        source = node.args[0]
        if isinstance(source, torch.fx.Node) and "dequantize" in str(source.target) and \
                torch.int16 in (*source.args, *source.kwargs.values()):
            count += 1
    return count


def contract() -> dict[str, object]:
    """The upstream names and signatures this adapter relies on (for the contract test)."""
    import executorch.backends.arm.ethosu.backend as ethosu_backend  # lazy: heavy (executorch, vela)
    from executorch.backends.arm.ethosu import EthosUPartitioner  # lazy: heavy (executorch, vela)
    from executorch.backends.arm._passes.fuse_quantized_activation_pass import (  # lazy: heavy (executorch)
        FuseQuantizedActivationPass)
    from executorch.backends.arm._passes.insert_table_ops import (  # lazy: heavy (executorch)
        TableOps)
    from executorch.backends.arm.operators import op_tosa_rescale  # lazy: heavy (executorch)
    from executorch.backends.arm.tosa.partitioner import _validate_partition  # lazy: heavy (executorch)
    from executorch.backends.arm._passes.arm_pass_manager import (  # lazy: heavy (executorch)
        register_pass_insertions_after)
    from executorch.backends.arm._passes.rewrite_pad import RewritePadPass  # lazy: heavy (executorch)
    from executorch.exir.backend.utils import WhyNoPartitionReporter  # lazy: heavy (executorch)
    from executorch.exir.dialects._ops import ops as exir_ops  # lazy: heavy (executorch)

    def static_parameters(name: str):
        found = FuseQuantizedActivationPass.__dict__.get(name)
        return list(inspect.signature(found.__func__).parameters) \
            if isinstance(found, staticmethod) else None

    return {
        "_is_fuseable_quantized_activation": static_parameters(
            "_is_fuseable_quantized_activation"),
        "_is_fuseable_input": static_parameters("_is_fuseable_input"),
        "_tag_module": list(inspect.signature(EthosUPartitioner._tag_module).parameters),
        "_validate_partition": list(inspect.signature(_validate_partition).parameters),
        "_rejected_nodes": isinstance(WhyNoPartitionReporter()._rejected_nodes, dict),
        "TableOps": sorted(name for name in ("unary_table_ops", "special_table_ops")
                           if isinstance(getattr(TableOps, name, None), (dict, set))),
        "vela_compile": list(inspect.signature(ethosu_backend.vela_compile).parameters),
        "RescaleVisitor._build_rescale": list(inspect.signature(
            op_tosa_rescale.RescaleVisitor._build_rescale).parameters),
        "RoundingMode.DOUBLE_ROUND": hasattr(op_tosa_rescale.ts.RoundingMode, "DOUBLE_ROUND"),
        "register_pass_insertions_after": list(inspect.signature(
            register_pass_insertions_after).parameters),
        "RewritePadPass": RewritePadPass.__name__,
        "tosa.PAD/CONV2D/DEPTHWISE_CONV2D": all(hasattr(exir_ops.backend.tosa, name) for name in (
            "PAD", "CONV2D", "DEPTHWISE_CONV2D", "CONST_SHAPE")),
        "EthosUBackend.preprocess": (
            list(inspect.signature(ethosu_backend.EthosUBackend.__dict__["preprocess"]
                                   .__func__).parameters)
            if isinstance(ethosu_backend.EthosUBackend.__dict__.get("preprocess"), staticmethod)
            else None),
    }
