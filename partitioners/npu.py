"""NPU partitioning: ExecuTorch's EthosUPartitioner, with its rejection reasons and Vela's artifacts kept.

Upstream does the deciding (`EthosUPartitioner` and its operator-support checks) and the compiling
(`vela_compile`). This module adds what a report needs and upstream throws away:

- the partitioner's `WhyNoPartitionReporter` is local to `TOSAPartitioner.partition`; we capture
  it through `_tag_module`, which receives it as an argument (partitioners/upstream_ethos_u.py);
- `vela_compile` writes every partition's TOSA and Vela CSVs to one folder, each call overwriting
  the previous; we wrap it so each call gets a folder of its own, and we keep the exact TOSA bytes
  Vela compiled so the twin can later run that very graph (matched by content hash).
"""

from __future__ import annotations

import contextlib
import hashlib
import multiprocessing
import shutil
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch

from partitioners import upstream_ethos_u
from partitioners.fused_activation_split import grouped_convolutions_split
from partitioners.policy import ForceCpuCheck
from partitioners.records import Workaround
from partitioners.repeated_steps import StepSplit, partition_digest, split_by_steps


@dataclass(frozen=True)
class NpuRejection:
    """Why the Ethos-U partitioner left a node on the CPU, as the check that decided said it."""

    node: str
    message: str
    context: str  # the node's own values the message refers to (stride, padding, kernel, dtypes)
    policy_rule: str = ""  # "force_cpu.<rule> in <file>" when a placement policy decided
    device_refusal: str = ""  # what the device runtime said when it refused it on the NPU


@dataclass(frozen=True)
class VelaRun:
    """One call of Vela: the TOSA graph it compiled and the delegate payload it produced."""

    call_index: int
    tosa_bytes: bytes
    payload_bytes: bytes
    out_dir: Path  # holds out.tosa and output/{out_per-layer.csv, out_summary_*.csv, out_vela.npz}

    @property
    def tosa_sha256(self) -> str:
        return hashlib.sha256(self.tosa_bytes).hexdigest()

    @property
    def payload_sha256(self) -> str:
        return hashlib.sha256(self.payload_bytes).hexdigest()


@dataclass(frozen=True)
class DelegatePartition:
    """An Ethos-U delegate of the final program, matched to the Vela call that produced it."""

    index: int
    delegate_name: str  # lowered_module_<k> in the edge program
    payload_sha256: str
    tosa_sha256: str
    tosa_bytes: bytes
    vela_dir: Path


def partition_span(indices: list[int]) -> str:
    """NPU partitions by number: p3, p2-p6 for consecutive ones, else each named (p2, p5)."""
    if len(indices) > 1 and indices == list(range(indices[0], indices[-1] + 1)):
        return f"p{indices[0]}-p{indices[-1]}"
    return ", ".join(f"p{i}" for i in indices)


def npu_delegates(final_program, vela_runs) -> list[DelegatePartition]:
    """Ethos-U delegates in program order, each with the Vela run whose payload it carries."""
    by_payload = {run.payload_sha256: run for run in vela_runs}
    partitions = []
    for index, (name, lowered) in enumerate(_lowered_modules(final_program)):
        digest = hashlib.sha256(lowered.processed_bytes).hexdigest()
        run = by_payload.get(digest)
        if run is None:
            raise RuntimeError(f"delegate {name} has no matching Vela run (payload {digest[:12]})")
        partitions.append(DelegatePartition(index, name, digest, run.tosa_sha256, run.tosa_bytes,
                                            run.out_dir))
    return partitions


def _lowered_modules(program):
    graph_module = program.graph_module
    for node in graph_module.graph.nodes:
        if node.op == "call_function" and "executorch_call_delegate" in str(node.target):
            name = node.args[0].target
            yield name, getattr(graph_module, name)


# How a placement reason says that a pool's windows leave input rows unread (_rows_left_out).
UNREAD_ROWS_NOTE = "which the Arm backend lowers as negative padding"


def _rows_left_out(node: torch.fx.Node) -> str:
    """For a floor-mode average pool whose windows miss the input's last rows or columns (DS-CNN: a
    (24, 5) window over 25x5): the input's size and what no window reads. The Arm backend
    lowers those to a negative TOSA padding, which its U55 check counts as padding."""
    args = node.args
    source = args[0].meta.get("val") if isinstance(args[0], torch.fx.Node) else None
    if "avg_pool2d" not in str(node.target) or not isinstance(source, torch.Tensor) \
            or source.dim() != 4:
        return ""  # (max_pool2d's fifth argument is its dilation, not ceil_mode)
    kernel = tuple(args[1])
    stride = tuple(args[2]) if len(args) > 2 and args[2] else kernel
    padding = tuple(args[3]) if len(args) > 3 else (0, 0)
    ceil_mode = bool(args[4]) if len(args) > 4 else False
    if ceil_mode or len(kernel) != 2 or len(stride) != 2 or len(padding) != 2:
        return ""
    sizes = tuple(int(d) for d in source.shape[2:])
    missed = [(n + 2 * p - k) % s for n, k, s, p in zip(sizes, kernel, stride, padding)]
    if not any(missed):
        return ""
    what = " and ".join(f"the last {m} {axis}s" if m > 1 else f"the last {axis}"
                        for m, axis in zip(missed, ("row", "column")) if m)
    return f"input {sizes[0]}x{sizes[1]}: no window reads {what}, {UNREAD_ROWS_NOTE}"


def node_context(node: torch.fx.Node) -> str:
    """The values of a node a placement reason is about: conv/pool geometry and tensor dtypes."""
    parts = []
    name = str(getattr(node.target, "__name__", node.target))
    args = node.args
    if "convolution" in name and len(args) >= 7:
        weight = args[1].meta.get("val") if isinstance(args[1], torch.fx.Node) else None
        if weight is not None:
            parts.append(f"kernel {tuple(weight.shape[2:])}")
        parts.append(f"stride {tuple(args[3])}, padding {tuple(args[4])}, dilation {tuple(args[5])}")
        if len(args) > 8 and args[8] != 1:
            parts.append(f"groups {args[8]}")
    elif "pool" in name and len(args) >= 2:
        parts.append(f"kernel {tuple(args[1])}")
        if len(args) > 2 and args[2]:
            parts.append(f"stride {tuple(args[2])}")
        if len(args) > 3 and any(args[3]):
            parts.append(f"padding {tuple(args[3])}")
        left_out = _rows_left_out(node)
        if left_out:
            parts.append(left_out)
    dtypes = []
    for arg in node.all_input_nodes:
        val = _stored(arg).meta.get("val")
        if isinstance(val, torch.Tensor):
            dtypes.append(str(val.dtype).replace("torch.", ""))
    users = list(node.users)
    quantized = users and all(_is_qdq(user, "quantize") for user in users)
    out = (users[0] if quantized else node).meta.get("val")
    if isinstance(out, torch.Tensor) and not parts:
        parts.append(f"{'/'.join(dtypes) or '-'} -> {str(out.dtype).replace('torch.', '')}")
    return "; ".join(parts)


def _is_qdq(node, kind: str) -> bool:
    """`node` is a quantize (kind "quantize") or dequantize (kind "dequantize") op."""
    target = str(getattr(node, "target", ""))
    return f".{kind}_per_" in f".{target.split('.', 1)[-1]}" if "." in target else False


def _stored(value: torch.fx.Node) -> torch.fx.Node:
    """The value as the program stores it: a float input a dequantize makes is int8 before it
    (the quantized graph computes in float between dequantize and quantize; the device does
    not)."""
    if _is_qdq(value, "dequantize") and value.all_input_nodes:
        return value.all_input_nodes[0]
    return value


class VelaRefusal(Exception):
    """The backend could not compile a partition the Ethos-U partitioner formed: Vela (an op
    its checks accepted and Vela cannot run: a 1-channel convolution of stride (12, 2) on the
    U55 is a DepthwiseConv2D that "could not run on NPU"), or, with `by_vela` False, the Arm
    backend's TOSA lowering before Vela (a Linear + BatchNorm1d whose folded weight stays a
    float constant the int8 TOSA profile refuses). The partition's nodes and upstream's words."""

    def __init__(self, partition: int, nodes: tuple[str, ...], message: str,
                 by_vela: bool = True):
        who = "Vela could not compile" if by_vela else "the Arm backend could not lower"
        super().__init__(f"{who} NPU partition {partition}: {message}")
        self.partition, self.nodes, self.message = partition, nodes, message
        self.by_vela = by_vela


@contextlib.contextmanager
def vela_runs_recorded(work_dir: Path, failed: list[int] | None = None
                       ) -> Iterator[list[VelaRun]]:
    """Give every Vela call its own folder under `work_dir` and record its input and output;
    `failed` (when given) receives the index of a call Vela raised in."""
    runs: list[VelaRun] = []

    def wrapper(upstream_vela_compile):
        def recording_vela_compile(tosa_flatbuffer, args, verbose=False, intermediate_path=None,
                                   block_placements=None):
            out_dir = work_dir / f"vela_call{len(runs)}"
            if out_dir.exists():
                shutil.rmtree(out_dir)
            out_dir.mkdir(parents=True)
            # `--verbose-performance` makes Vela write the per-layer CSV the cost model reads.
            flags = list(args)
            if "--verbose-performance" not in flags:
                flags.append("--verbose-performance")
            try:
                result = run_isolated(upstream_vela_compile, tosa_flatbuffer, flags,
                                      verbose=False, intermediate_path=str(out_dir),
                                      block_placements=block_placements)
            except Exception:
                if failed is not None:
                    failed.append(len(runs))
                raise
            runs.append(VelaRun(len(runs), bytes(tosa_flatbuffer), bytes(result.processed_bytes),
                                out_dir))
            return result

        return recording_vela_compile

    with upstream_ethos_u.vela_compile_wrapped(wrapper):
        yield runs


class VelaCrashed(RuntimeError):
    """Vela's native compiler ended the process it ran in (a signal, e.g. SIGSEGV in
    `process_regor`): in its own process, that is a failure of one partition's compile, which
    the planner handles as any Vela refusal (the partition's ops go to the CPU)."""


def run_isolated(function, *args, **kwargs):
    """`function(*args, **kwargs)` in a forked child process, its result (or its exception)
    sent back; stdout discarded (Vela prints its tables there). A child that dies, as
    Vela 5.1's native compiler did on MobileViT-XXS for the U55 (SIGSEGV after about four
    minutes), raises VelaCrashed here instead of taking the compile down. In a daemonic
    process, which may not start children, the call runs in this process."""
    if multiprocessing.current_process().daemon:
        with contextlib.redirect_stdout(_Discard()):
            return function(*args, **kwargs)
    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)

    def child() -> None:
        try:
            with contextlib.redirect_stdout(_Discard()):
                outcome = ("result", function(*args, **kwargs))
        except BaseException as error:  # noqa: BLE001 - every failure goes back
            outcome = ("error", error)
        try:
            send.send(outcome)
        except Exception:  # noqa: BLE001 - an unpicklable exception goes back as its words
            what = outcome[1] if outcome[0] == "error" else "the result could not be sent back"
            send.send(("error", RuntimeError(str(what))))
        send.close()

    process = context.Process(target=child, name="orchestrate-vela")
    process.start()
    send.close()
    try:
        kind, value = receive.recv()
    except EOFError:  # the child ended without a word
        kind, value = None, None
    finally:
        receive.close()
        process.join()
    if kind == "result":
        return value
    if kind == "error":
        raise value  # the child's exception, its type and words (its traceback stays there)
    code = process.exitcode
    how = (f"signal {signal.Signals(-code).name}" if code is not None and code < 0
           else f"exit code {code}")
    raise VelaCrashed(f"Vela's compiler crashed ({how}) in the process it ran in")


class _Discard:
    """Vela prints its performance tables to stdout; the report shows them, the console need not."""

    def write(self, _text: str) -> int:
        return 0

    def flush(self) -> None:
        pass


def rejections_from(reporters: list) -> dict[str, NpuRejection]:
    """Operator rejections keyed by node name (placeholders, outputs and constants dropped)."""
    rejections: dict[str, NpuRejection] = {}
    for reporter in reporters:
        for node, message in upstream_ethos_u.rejected_nodes(reporter).items():
            if node.op != "call_function" or node.name in rejections:
                continue
            rejections[node.name] = NpuRejection(node.name, str(message), node_context(node))
    return rejections


def vela_workarounds(program, npu: str | None
                     ) -> tuple[tuple[str, ...], tuple[Workaround, ...]]:
    """Vela flags an Ethos-U target needs for this program, and their plan reports.

    On the Ethos-U85, Vela 5.1 puts the LUT load of every lookup in a chained operation group
    before the group (regor's InsertLUTDMACommands) and hands the one LUT slot out again
    (AllocateLutSlot): two 16-bit tables, each 2 KiB and filling the LUT memory, in one group
    overwrite each other before the first is used. Executed by the Ethos-U85 model, an A16W8
    LSTM applies tanh where its TOSA graph applies sigmoid from the second step on
    (tests/test_u85_lut_reload.py); compiled with `--disable-chaining` it equals the TOSA graph.
    So a U85 program with two or more lookups on 16-bit activations is compiled unchained."""
    if not (npu or "").startswith("ethos-u85"):
        return (), ()
    lookups = upstream_ethos_u.int16_table_lookups(program)
    if lookups < 2:
        return (), ()
    return ("--disable-chaining",), (Workaround(
        "(program)", "Vela 5.1 for the Ethos-U85 (regor's InsertLUTDMACommands and "
        "AllocateLutSlot: two 2 KiB int16 tables of one chained group load into the one LUT "
        "slot before the group runs)",
        f"compiled with --disable-chaining: {lookups} lookups run on 16-bit activations (tables "
        "that fill the LUT memory), so no chained group may need two of them; the plan's Vela "
        "estimate is of the unchained program"),)


def lower_to_npu(quantized_program, compile_spec, work_dir: Path, policy=None,
                 cut_steps: bool = False, tflite_rounding: bool = False):
    """to_edge + EthosUPartitioner + Vela. Returns (edge manager, rejections, Vela runs, the
    Workarounds of upstream defects corrected while lowering).

    A placement policy's forced nodes are refused by an extra operator-support check
    (partitioners/policy.py), recorded as rejections naming the rule. With `cut_steps` (the
    quantization tied a recurrence's steps, orchestrator/compilation/recurrent_steps.py, which
    compares their weights by content), a partition holding the steps is cut into one partition
    per step; without it no partition is cut (the partitioner sees weights as fake tensors, and
    layers with their own weights and equal fixed-range quantizations would look alike)."""
    from executorch.backends.arm.ethosu import EthosUPartitioner  # lazy: heavy (executorch, vela)
    from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower  # lazy: heavy (executorch, vela)


    force = ForceCpuCheck(policy) if policy is not None and policy.forces_cpu() else None
    partitioner = EthosUPartitioner(compile_spec, additional_checks=[force] if force else None)
    tagged: dict[str, tuple[str, ...]] = {}
    splits: list[StepSplit] = []
    reporters = upstream_ethos_u.capture_reporters(partitioner, tagged,
                                                   _cut_at_steps(splits) if cut_steps else None)
    kept: list[tuple[str, int, int]] = []
    clamps: list[str] = []  # ReLUs kept as the layer's activation (Vela's estimate)
    folded: list[tuple[str, tuple[int, ...]]] = []  # PADs folded into a convolution
    failed: list[int] = []  # Vela calls that raised
    refused: list[int] = []  # backend preprocess calls (partitions) that raised
    reused: list[tuple[int, int]] = []  # partitions whose equal was compiled before them
    grouped = grouped_convolutions_split(quantized_program)
    try:
        with vela_runs_recorded(work_dir, failed) as runs, \
                upstream_ethos_u.preprocess_failures_recorded(refused, partition_digest,
                                                              reused), \
                upstream_ethos_u.live_activations_kept(
                    kept, clamps if _estimates_a_lut_without_activation(compile_spec) else None), \
                upstream_ethos_u.conv_pads_folded(folded), \
                upstream_ethos_u.tflite_rounding(tflite_rounding):
            edge = to_edge_transform_and_lower(
                quantized_program,
                partitioner=[partitioner],
                # The quantized graphs do not pass edge IR validation (mixed dtypes); upstream's
                # own Arm flow turns it off too.
                compile_config=EdgeCompileConfig(_check_ir_validity=False),
            )
    except Exception as error:
        # The backend compiles the partitions in tag order, one preprocess (TOSA lowering,
        # then one Vela call) each.
        # A tag upstream emptied again (its nodes left to other checks) forms no partition.
        partitions = [nodes for nodes in tagged.values() if nodes]
        index = refused[0] if refused else failed[0] if failed else None
        if index is None or index >= len(partitions):
            raise
        cause = error
        while cause.__cause__ is not None or cause.__context__ is not None:
            cause = cause.__cause__ or cause.__context__
        message = " ".join(str(cause).split())[:300]
        raise VelaRefusal(index, partitions[index], message, by_vela=bool(failed)) from error
    rejections = rejections_from(reporters)
    for name, rule in (force.forced if force else {}).items():
        previous = rejections.get(name)
        rejections[name] = NpuRejection(name, previous.message if previous else "",
                                        previous.context if previous else "", rule)
    for name, why in (force.device_refused if force else {}).items():
        previous = rejections.get(name)
        rejections[name] = NpuRejection(name, previous.message if previous else "",
                                        previous.context if previous else "",
                                        device_refusal=why)
    return edge, rejections, list(runs), (*(_kept_activation(*k) for k in dict.fromkeys(kept)),
                                          *(_steps_compiled_once(split, len(reused))
                                            for split in splits),
                                          *((_clamps_kept(len(clamps)),) if clamps else ()),
                                          *((_pads_folded(folded),) if folded else ()),
                                          *((TFLITE_ROUNDING,) if tflite_rounding else ()),
                                          *((grouped.workaround(),) if grouped else ()))


TFLITE_ROUNDING = Workaround(
    "(every NPU partition)", "executorch arm RescaleVisitor (SINGLE_ROUND for every RESCALE)",
    "RESCALE written with TOSA's DOUBLE_ROUND, TFLite's rounding, which Vela compiles to the "
    "NPU's TFLite rounding mode: the model file's quantization is computed as TFLM computes it")


def _cut_at_steps(splits: list[StepSplit]):
    """A retag for `capture_reporters`: every partition that holds the repeated steps of an
    unrolled recurrence cut into one partition per step and the rest around them
    (partitioners/repeated_steps.py); `splits` receives what was cut."""

    def retag(module, program, tags):
        cut_tags = set()
        for tag in tags:
            nodes = [n for n in module.graph.nodes if n.meta.get("delegation_tag") == tag]
            cut = split_by_steps(nodes, program, upstream_ethos_u.partition_extractable)
            if cut is None:
                cut_tags.add(tag)
                continue
            groups, split = cut
            for index, group in enumerate(groups):
                for node in group:
                    node.meta["delegation_tag"] = f"{tag}_{index}"
                cut_tags.add(f"{tag}_{index}")
            splits.append(split)
        return cut_tags

    return retag


def _steps_compiled_once(split: StepSplit, reused: int) -> Workaround:
    return Workaround(
        "(recurrence)", "the Arm backend's TOSA pipeline and Vela (once per partition)",
        f"an NPU partition of {split.partition_nodes} nodes holding {split.steps} equal steps "
        f"of {split.step_ops} operators was cut into {split.groups} partitions, one per step; "
        f"{reused} partition(s) of the program equal to one compiled before took its TOSA graph "
        "and command stream without lowering it again, and the .pte stores each distinct "
        "stream once. "
        "The device makes one NPU invocation per step")


def _estimates_a_lut_without_activation(compile_spec) -> bool:
    """Vela 5.1's Ethos-U55/U65 estimate (one architecture in regor) charges a layer with no
    fused activation the LUT's output cost; its Ethos-U85 estimate does not, and there the
    upstream form stays (partitioners/upstream_ethos_u.py: live_activations_kept)."""
    return str(getattr(compile_spec, "target", "")).startswith(("ethos-u55", "ethos-u65"))


def _clamps_kept(count: int) -> Workaround:
    return Workaround(
        "(every NPU partition)", "Vela 5.1's Ethos-U55/U65 estimate",
        f"{count} ReLU(s) after a convolution handed to Vela as the layer's fused "
        "clamp, as a TFLite file's fused RELU reaches it, not folded away by upstream: the "
        "same values, and Vela's estimate no longer charges those layers the LUT's output "
        "cost (partitioners/upstream_ethos_u.py: live_activations_kept)")


def _pads_folded(folded: list[tuple[str, tuple[int, ...]]]) -> Workaround:
    shown = ", ".join(f"{name} {list(padding)}" for name, padding in folded[:4])
    more = f" and {len(folded) - 4} more" if len(folded) > 4 else ""
    return Workaround(
        "(every NPU partition)", "Vela 5.1 TOSA front end (folds a PAD into a convolution only "
        "when its value is the int8 code 0)",
        f"{len(folded)} explicit PAD(s) folded into the convolution after them, as the "
        f"convolution's own padding (top, bottom, left, right): {shown}{more}; Vela compiled "
        "each PAD as NPU memory copies of the whole feature map (partitioners/conv_padding.py)")


def _kept_activation(node: str, zero_point: int, qmin: int) -> Workaround:
    return Workaround(
        node, "executorch arm FuseQuantizedActivationPass",
        f"kept as a clamp on the NPU, not folded into the convolution before it: its output's "
        f"zero point ({zero_point}) is above qmin ({qmin}), and upstream's fold would raise qmin "
        f"to it in a quantize whose qmin the convolution's RESCALE never applies, passing "
        f"negative values through (partitioners/upstream_ethos_u.py: live_activations_kept)")
