"""The local check judges each value by the rounding its own op adds, not by what it inherits.

A reference graph of the kind `mixed` has on Ethos-U55: a multiply by 0.1 (on the NPU, where
fixed-point rescaling may round one step away from the float reference), a sort, and a
requantize to a 1.73x finer scale, which turns an inherited one-step difference into two.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchao.quantization.pt2e  # noqa: F401 - registers quantized_decomposed

S_IN, S_MID = 0.02, 0.01
S_OUT = S_MID / 1.73
Q = torch.ops.quantized_decomposed


def _q(x, scale):
    return Q.quantize_per_tensor.default(x, scale, 0, -128, 127, torch.int8)


def _dq(x, scale):
    return Q.dequantize_per_tensor.default(x, scale, 0, -128, 127, torch.int8)


class _Reference(nn.Module):
    def forward(self, x):
        a = _q(x, S_IN)
        b = _q(_dq(a, S_IN) * 0.1 * 20, S_MID)  # 2 * x, quantized at S_MID
        c = _q(torch.sort(_dq(b, S_MID), dim=-1).values, S_OUT)
        d = _q(torch.flatten(_dq(c, S_OUT), 1), S_OUT)  # same-scale requantize: exact
        return d


@pytest.fixture(scope="module")
def reference():
    sample = (torch.linspace(-0.6, 0.6, 32).reshape(1, 32),)
    module, values = _exported_and_recorded(_Reference(), sample)
    return module, sample, values


class _Recorder(torch.fx.Interpreter):
    def __init__(self, module):
        super().__init__(module)
        self.values = {}

    def run_node(self, node):
        result = super().run_node(node)
        self.values[node.name] = result
        return result


def _exported_and_recorded(model: nn.Module, sample) -> tuple[torch.fx.GraphModule, dict]:
    """The exported reference module, and every node's value on `sample` by node name."""
    module = torch.export.export(model, sample, strict=True).module(check_guards=False)
    with torch.no_grad():
        recorder = _Recorder(module)
        recorder.run(*sample)
    return module, recorder.values


def _program(values, mid_error: int, out_error: int):
    """The values a program writes: the middle one off by `mid_error` steps on every other
    element (legitimate rounding of another arithmetic), the output computed from it."""
    a = values["quantize_per_tensor"]
    b = values["quantize_per_tensor_1"].clone()
    b[..., ::2] = (b[..., ::2].to(torch.int32) + mid_error).clamp(-128, 127).to(torch.int8)
    c = _q(torch.sort(_dq(b, S_MID), dim=-1).values, S_OUT)
    c = (c.to(torch.int32) + out_error).clamp(-128, 127).to(torch.int8)
    return [(0, "quantize", 10, a), (1, "npu", 11, b), (2, "sort+quantize", 12, c),
            (3, "flatten", 13, c.reshape(1, 32))]


def _check(reference, written):
    from orchestrator.verification.local_check import ForcedReference, check_locally

    module, sample, _ = reference
    return check_locally(ForcedReference(module, sample), written, {}, steps_per_stage=1)


def test_inherited_rounding_amplified_by_a_finer_scale_is_not_charged_to_the_requantize(reference):
    _, _, values = reference
    written = _program(values, mid_error=1, out_error=0)
    end_to_end = (written[2][3].to(torch.int32) - values["quantize_per_tensor_2"].to(torch.int32))
    assert int(end_to_end.abs().max()) == 2  # what an end-to-end 1-step check would fail
    checks = _check(reference, written)
    assert [c.reference_node for c in checks] == ["quantize_per_tensor", "quantize_per_tensor_1",
                                                  "quantize_per_tensor_2", "quantize_per_tensor_3"]
    assert [c.max_steps for c in checks] == [0, 1, 0, 0]
    assert all(c.passed for c in checks)


def test_a_defect_is_named_at_the_op_that_makes_it(reference):
    _, _, values = reference
    checks = _check(reference, _program(values, mid_error=1, out_error=3))
    # The first failure is the op that made the error; the flatten after it carries the same
    # bytes (a failed value is not forced into the reference, see the next test for why).
    assert [c.passed for c in checks] == [True, True, False, False]
    assert checks[2].max_steps == 3 and checks[2].allowed_steps == 1


def test_a_same_scale_requantize_adds_no_rounding_stage(reference):
    checks = _check(reference, _program(reference[2], mid_error=0, out_error=0))
    assert [c.rounding_stages for c in checks] == [1, 1, 1, 1]
    from orchestrator.verification.local_check import ForcedReference

    module, sample, _ = reference
    unforced = ForcedReference(module, sample)
    last = next(n for n in unforced.nodes if n.name == "quantize_per_tensor_3")
    assert unforced.rounding_stages(last) == 3  # a, b, c: the flatten requantize adds none


def test_a_value_with_no_reference_node_is_reported_unmatched(reference):
    checks = _check(reference, [(0, "odd", 5, torch.zeros(1, 7, dtype=torch.int8))])
    assert checks[0].passed is None and checks[0].reference_node is None


def test_a_kernel_intermediate_with_no_reference_node_is_unmatched_not_failed(reference):
    """A value the reference never computes (e.g. the `minimum` of a Cortex-M hardswish) shares a
    shape with the next quantize node; it must not fail, nor be forced into the reference."""
    _, _, values = reference
    written = _program(values, mid_error=0, out_error=0)
    intermediate = (1, "cortex_m::minimum", 20, written[1][3].clamp(max=3))
    checks = _check(reference, [written[0], intermediate, *written[1:]])
    assert checks[1].passed is None and checks[1].reference_node is None
    assert all(c.passed for i, c in enumerate(checks) if i != 1)


def test_a_hardswish_minimum_is_checked_as_its_source_clamped_at_one_bound(reference):
    """With its source known, the same intermediate is checked: equal to the source below one
    bound and that bound above it. A value that is not such a clamp stays unmatched."""
    _, _, values = reference
    written = _program(values, mid_error=0, out_error=0)
    source_value = written[0][2]
    clamped = written[0][3].clamp(max=3)
    intermediate = (1, "cortex_m::minimum.out", 20, clamped, (source_value,))
    checks = _check(reference, [written[0], intermediate, *written[1:]])
    assert checks[1].passed is True and checks[1].reference_node == f"clamped from EValue {source_value}"
    wrong = clamped.clone().flatten()
    first = int(written[0][3].flatten()[0])
    wrong[0] = first + 1 if first < 127 else 126  # one element off both the source and the bound
    bad = (1, "cortex_m::minimum.out", 20, wrong.reshape(clamped.shape), (source_value,))
    checks = _check(reference, [written[0], bad, *written[1:]])
    assert checks[1].passed is None


def test_block_and_clamp_relations():
    from orchestrator.verification.local_check import _is_block_of, _is_clamp_of

    whole = torch.arange(24, dtype=torch.int8).reshape(1, 2, 12)
    assert _is_block_of(whole[:, :, 4:8], whole)  # a split chunk
    assert _is_block_of(whole[:, 1], whole)  # a select
    assert not _is_block_of(whole[:, :, 4:8].flip(-1), whole)  # reversed: not a block
    assert not _is_block_of(torch.zeros(1, 2, 4, dtype=torch.int8) + 100, whole)
    x = torch.tensor([-5, 0, 3, 9, 12], dtype=torch.int8)
    assert _is_clamp_of(x.clamp(max=4), x, upper=True)
    assert _is_clamp_of(x.clamp(min=1), x, upper=False)
    assert not _is_clamp_of(x.clamp(max=4), x, upper=False)
    assert not _is_clamp_of(torch.tensor([-5, 0, 3, 4, 5], dtype=torch.int8), x, upper=True)


def test_a_kernel_writing_the_evalue_it_reads_is_not_checked_against_its_own_output(reference):
    """A transpose over a size-1 dim can write into the EValue it reads; "moved from" itself
    would be a check that cannot fail. With nothing earlier in that EValue it stays unmatched."""
    checks = _check(reference, [(0, "cortex_m::transpose.out", 5,
                                 torch.zeros(1, 7, dtype=torch.int8), (5,))])
    assert checks[0].passed is None and checks[0].reference_node is None


def test_a_value_with_size_1_dims_added_is_checked_against_the_node_without_them(reference):
    """A linear computed as a 1x1 convolution writes [N, M, 1, 1] where the reference has
    [N, M]: with no reference node of its own shape, it is checked against the one whose shape
    is the same once size-1 dims are dropped (and a wrong value fails there)."""
    _, _, values = reference
    written = _program(values, mid_error=0, out_error=0)
    as_conv = (1, "cortex_m::quantized_conv2d.out", 11, written[1][3].reshape(1, 32, 1, 1))
    checks = _check(reference, [written[0], as_conv, *written[2:]])
    assert checks[1].reference_node == "quantize_per_tensor_1" and checks[1].max_steps == 0
    assert all(c.passed for c in checks)
    wrong = as_conv[3].to(torch.int32)
    wrong[0, 0] += 5
    bad = (1, "cortex_m::quantized_conv2d.out", 11, wrong.clamp(-128, 127).to(torch.int8))
    assert _check(reference, [written[0], bad])[1].passed is False


def test_movement_relations_are_exact_not_the_same_multiset():
    """A permute, view or layout copy is checked as exactly its input moved: a transpose that
    read channels-last bytes as row-major (the CRNN's front end) holds the same elements in
    another order, and the old sorted-elements check passed it."""
    from orchestrator.verification.local_check import _relation

    x = torch.arange(2 * 3 * 4, dtype=torch.int8).reshape(1, 2, 3, 4)
    _, permuted = _relation("transpose")
    assert permuted(x.permute(0, 3, 1, 2), x)
    row_major_misread = x.permute(0, 2, 3, 1).contiguous().reshape(1, 2, 3, 4).permute(0, 3, 1, 2)
    assert not permuted(row_major_misread, x)
    assert sorted(row_major_misread.flatten().tolist()) == sorted(x.flatten().tolist())
    _, viewed = _relation("view_copy")
    assert viewed(x.reshape(6, 4), x) and not viewed(x.permute(0, 1, 3, 2).reshape(6, 4), x)
    _, copied = _relation("_clone_dim_order")
    assert copied(x.clone(), x) and not copied(x.flip(-1), x)
    # an expand repeats its input along size-1 dims (an attention's per-head key and value,
    # which the twin had failed against another layer's node at 183 steps)
    _, expanded = _relation("expand_copy")
    row = x[:, :1]
    assert expanded(row.expand(1, 2, 3, 4).contiguous(), row)
    assert not expanded(x, row) and not expanded(x.reshape(1, 1, 6, 4), x)


def test_a_movement_that_is_not_its_input_moved_fails_even_without_a_reference_node(reference):
    """With no reference node of its shape, a permute whose output is not its input permuted is
    a failure naming its source, not an unmatched value (PARTIAL) or a pass."""
    source = torch.arange(-12, 12, dtype=torch.int8).reshape(1, 2, 3, 4)
    first = (0, "cortex_m::quantize_per_tensor.out", 3, source)
    good = (1, "cortex_m::transpose.out", 4, source.permute(0, 3, 1, 2), (3,))
    bad = (1, "cortex_m::transpose.out", 4, source.flatten().reshape(1, 4, 2, 3), (3,))
    assert _check(reference, [first, good])[1].passed is True
    failed = _check(reference, [first, bad])[1]
    assert failed.passed is False and failed.reference_node == "not a move of EValue 3"


class _DelegateOutputs(nn.Module):
    """index_ops' shape of trouble: a partition hands over a constant (zeros_like) the reference
    computes late, and its outputs in another order than the reference's."""

    def forward(self, x):
        a = _q(x, S_IN)
        y = _q(torch.relu(_dq(a, S_IN)), S_MID)
        z = _q(_dq(y, S_MID) - 0.3, S_MID)
        over = _dq(z, S_MID) > 0.1
        zeros = _q(torch.zeros_like(_dq(z, S_MID)), S_MID)
        w = _q(_dq(z, S_MID) * 0.5, S_MID)
        positive = _dq(z, S_MID) > 0.0
        return over, zeros, w, positive


def test_a_partitions_outputs_in_any_order_and_its_constants_are_each_matched_to_their_node():
    from orchestrator.verification.local_check import ForcedReference, check_locally

    sample = (torch.linspace(-0.6, 0.6, 32).reshape(1, 32),)
    module, v = _exported_and_recorded(_DelegateOutputs(), sample)
    names = sorted(n for n in v if n.startswith(("quantize_per_tensor", "gt")))
    a, y, z, zeros, w = (v[n] for n in names if n.startswith("quantize"))
    over, positive = v["gt"], v["gt_1"]
    assert bool((over != positive).any())  # a wrong match between the two would fail
    written = [(0, "quantize", 10, a),
               (1, "npu", 11, zeros), (1, "npu", 12, z), (1, "npu", 13, y),  # constant first
               (2, "gt", 14, over), (3, "mul", 15, w), (4, "gt", 16, positive)]
    checks = check_locally(ForcedReference(module, sample), written, {}, steps_per_stage=1)
    assert [(c.value, c.reference_node, c.passed) for c in checks] == [
        (10, "quantize_per_tensor", True), (11, "quantize_per_tensor_3", True),
        (12, "quantize_per_tensor_2", True), (13, "quantize_per_tensor_1", True),
        (14, "gt", True), (15, "quantize_per_tensor_4", True), (16, "gt_1", True)]


class _TwoBranches(nn.Module):
    def forward(self, x):
        a = _q(x, S_IN)
        p = _q(_dq(a, S_IN) * 0.3, S_MID)  # branch 1, listed first by the reference
        r = _q(_dq(a, S_IN) * 0.25, S_MID)  # branch 2: the same shape and scale
        return _q(_dq(p, S_MID) + _dq(r, S_MID), S_MID)


def test_a_branch_the_program_runs_before_the_one_the_reference_lists_first_is_matched():
    """An NPU partition can hand two branches' values over in the other order than the
    reference lists them (an outside model's one AvgPool2d called on a 7x7 and an 8x8 input:
    the program pooled the 8x8 one first). The second branch's value then has only later nodes
    to go by, and failed against the sum (207 steps) where the node before was its own."""
    from orchestrator.verification.local_check import ForcedReference, check_locally

    sample = (torch.linspace(-0.6, 0.6, 8).reshape(1, 8),)
    module, values = _exported_and_recorded(_TwoBranches(), sample)
    written = [(0, "quantize", 10, values["quantize_per_tensor"]),
               (1, "branch 2", 11, values["quantize_per_tensor_2"]),
               (2, "branch 1", 12, values["quantize_per_tensor_1"]),
               (3, "add", 13, values["quantize_per_tensor_3"])]
    checks = check_locally(ForcedReference(module, sample), written, {}, steps_per_stage=1)
    assert [c.reference_node for c in checks] == [
        "quantize_per_tensor", "quantize_per_tensor_2", "quantize_per_tensor_1",
        "quantize_per_tensor_3"]
    assert all(c.passed for c in checks), checks


S_POOL = 0.0236
S_DOUBLED = 0.02  # 2 x S_POOL / 0.02 = 2.36: one pool step is 2.36 output steps after the x2


class _PoolTimesConstant(nn.Module):
    """Arm's form of AvgPool2d(2, 2, divisor_override=2) as the quantized reference has it: the
    pool, its own quantize, then a multiply by the constant kernel_size / divisor (quantized as a
    weight), and the output's quantize."""

    def __init__(self, factor: float, out_scale: float):
        super().__init__()
        # already int8, as a frozen weight is: round(factor / 0.0079) - 128
        self.register_buffer("factor", torch.tensor([round(factor / 0.0079) - 128],
                                                    dtype=torch.int8))
        self.out_scale = out_scale

    def forward(self, x):
        pooled = _q(torch.nn.functional.avg_pool2d(_dq(_q(x, S_POOL), S_POOL), 2), S_POOL)
        factor = Q.dequantize_per_tensor.default(self.factor, 0.0079, -128, -128, 127,
                                                 torch.int8)
        return _q(_dq(pooled, S_POOL) * factor, self.out_scale)


def _partition_output_check(factor: float, out_scale: float, error: int):
    """The local check of one NPU partition's only output (the pool's own value never leaves
    the partition), `error` steps off the reference on one element."""
    from orchestrator.verification.local_check import ForcedReference, check_locally

    sample = (torch.linspace(-1.0, 1.0, 64).reshape(1, 1, 8, 8),)
    module = torch.export.export(_PoolTimesConstant(factor, out_scale), sample,
                                 strict=True).module(check_guards=False)
    with torch.no_grad():
        expected = module(*sample)
    written = expected.clone()
    written[0, 0, 1, 1] = (written[0, 0, 1, 1].to(torch.int32) + error).clamp(-128, 127).to(
        torch.int8)
    # the input's quantize runs on the CPU before the partition: its value is the program's
    quantized_input = _q(sample[0], S_POOL)
    checks = check_locally(ForcedReference(module, sample),
                           [(0, "quantize", 6, quantized_input), (1, "npu", 7, written)],
                           {7: (out_scale, 0)}, steps_per_stage=1)
    assert checks[0].passed and checks[0].max_steps == 0
    return checks[1]


def test_a_multiply_after_an_unseen_rounding_stage_multiplies_its_allowance():
    """The pool's one step reaches the output as 2 x 0.0236 / 0.02 = 2.36 steps, plus the
    output's own step: 3 steps pass (counting the two stages alone allowed 2, and failed Arm's
    divisor_override lowering on one element), 4 do not."""
    three = _partition_output_check(2.0, S_DOUBLED, error=3)
    assert three.rounding_stages == 2
    assert three.allowed_steps == pytest.approx(1 + 1 * 2.0 * S_POOL / S_DOUBLED, rel=0.01)
    assert three.passed and three.max_steps == 3
    four = _partition_output_check(2.0, S_DOUBLED, error=4)
    assert four.reference_node == three.reference_node
    assert four.max_steps == 4 and not four.passed


def test_a_multiply_with_a_gain_below_one_keeps_one_step_per_stage():
    """x 0.5 into a coarser scale: the pool's step arrives as 0.5 x 0.0236 / 0.03 = 0.39 output
    steps, so the allowance stays one step per stage (2), and 3 steps fail."""
    check = _partition_output_check(0.5, 0.03, error=3)
    assert check.allowed_steps == 2 and check.rounding_stages == 2
    assert not check.passed


class _Chain(nn.Module):
    """A recurrence's shape: each step a multiply of the last and a requantize, with a side
    branch joining two steps later."""

    def forward(self, x):
        value = _q(x, S_IN)
        history = [value]
        for step in range(12):
            scale = S_IN * (1.0 + 0.05 * step)
            mixed = _dq(value, S_IN if step == 0 else S_IN * (1.0 + 0.05 * (step - 1))) * 1.1
            if step >= 2:
                mixed = mixed + _dq(history[-2], S_IN * (1.0 + 0.05 * (step - 3))
                                    if step >= 3 else S_IN) * 0.5
            value = _q(mixed, scale)
            history.append(value)
        return value


def test_bounds_after_each_forced_value_equal_a_fresh_count():
    """The rounding stages and allowed steps are worked out again only after a forced value
    (a 49-step GRU's check recounted the whole graph at every value: minutes a sample); what
    is kept must equal counting everything afresh with the same values forced."""
    from orchestrator.verification.local_check import ForcedReference

    sample = (torch.linspace(-0.5, 0.5, 16).reshape(1, 16),)
    module = torch.export.export(_Chain(), sample, strict=True).module(check_guards=False)
    quantizes = [n for n in module.graph.nodes if n.op == "call_function"
                 and "quantize_per_tensor" in str(n.target) and "dequantize" not in str(n.target)]
    assert len(quantizes) == 13
    kept = ForcedReference(module, sample)
    forced = []
    for index in (1, 4, 5, 9):
        for node in quantizes:  # everything counted before the next value is forced
            kept.rounding_stages(node), kept.allowed_steps(node, 1.0)
        node = quantizes[index]
        value = kept.value(node).to(torch.int32) + 1  # one step off: the program's own rounding
        value = value.clamp(-128, 127).to(torch.int8)
        kept.force(node, value)
        forced.append((node, value))
        fresh = ForcedReference(module, sample)
        for earlier, earlier_value in forced:
            fresh.force(earlier, earlier_value)
        for later in quantizes:
            assert kept.rounding_stages(later) == fresh.rounding_stages(later), later.name
            assert kept.allowed_steps(later, 1.0) == pytest.approx(
                fresh.allowed_steps(later, 1.0)), later.name
    # the count restarts at forced values: a step reading two of them is one stage from them,
    # one whose side branch reaches back past them counts that branch's stages
    assert kept.rounding_stages(quantizes[9]) == 0 and kept.rounding_stages(quantizes[6]) == 1
    assert kept.rounding_stages(quantizes[8]) == 3 and kept.rounding_stages(quantizes[10]) == 4


class _ProgramOnlyTranspose(nn.Module):
    """A value only the program forms (CMSIS-NN's batch matmul reads its right-hand operand
    transposed: a ViT's attention x v), and a node of its shape much later, past a multiply
    whose gain makes the later node's bound, counted from the values forced so far, cover the
    whole int8 range."""

    def forward(self, x):
        a = _q(x, 0.1)
        b = _q(_dq(a, 0.1) + 1.0, 0.1)
        m = _q(_dq(b, 0.1) * _dq(b, 0.1), 0.001)
        late = _q(torch.transpose(_dq(m, 0.001), 1, 2), 0.001)
        return _q(_dq(late, 0.001) * 0.5, 0.001)


def test_a_value_within_a_bound_that_covers_the_whole_range_is_not_forced_into_that_node():
    """torchvision's ViT with its encoder forced onto the CPU: the twin FAILED layer 2 at 166
    steps while the host runtime and QEMU agreed with it. Layer 1's transposed operand had been
    matched to layer 2's key, whose bound from the values forced so far was 1.8e4 steps (any
    int8 value is within it), and forced there. Such a value is checked as what it is (a move
    of its source) and forces nothing, so the later node is judged on the program's own."""
    from orchestrator.verification.local_check import ForcedReference, check_locally

    sample = (torch.linspace(-3, 3, 32).reshape(1, 4, 8),)
    module, v = _exported_and_recorded(_ProgramOnlyTranspose(), sample)
    a, b, m, late, out = (v[f"quantize_per_tensor{s}"] for s in ("", "_1", "_2", "_3", "_4"))
    assert not torch.equal(a.transpose(1, 2), late)  # a wrong match would be seen
    written = [(0, "cortex_m::quantize_per_tensor.out", 10, a),
               (1, "cortex_m::transpose.out", 11, a.transpose(1, 2).contiguous(), (10,)),
               (2, "cortex_m::quantized_add.out", 12, b, (10,)),
               (3, "cortex_m::quantized_mul.out", 13, m, (12,)),
               (4, "cortex_m::transpose.out", 14, late, (13,)),
               (5, "cortex_m::quantized_mul.out", 15, out, (14,))]
    checks = check_locally(ForcedReference(module, sample), written, {}, steps_per_stage=1)
    assert checks[1].reference_node == "moved from EValue 10", checks[1]
    assert [c.reference_node for c in checks[2:]] == [
        "quantize_per_tensor_1", "quantize_per_tensor_2", "quantize_per_tensor_3",
        "quantize_per_tensor_4"]
    assert all(c.passed for c in checks), checks
