"""The portable elementwise kernels' generic path, priced per operand (cost_models/cpu.py
`index_walk`, cpu_cost.yaml `index_walk`).

ExecuTorch's portable kernels walk every tensor by index when an input is broadcast, and `where`
(a bool condition beside its values) always does: on the Cortex-M55 in QEMU that is 115
instructions per operand and output element without a broadcast and about 245 with one, against
25 cycles per element the model charged every portable op. The plan priced
`nn.MultiheadAttention`'s `where` at 0.03x what it measured (37,652 cycles; 1,102,157
instructions). These tests hold the shapes that take the path, its price, and on QEMU the plan
beside the measurement."""

from __future__ import annotations

import pytest
import torch

from cost_models.cpu import load_cpu_cost_data, portable_cost
from cost_models.op_shapes import OpShape, index_walk
from tests.device_tools import qemu_or_missing


@pytest.mark.parametrize("op,inputs,output,expected", [
    ("aten.where.self", [(1, 4, 16, 1), (1, 4, 16, 16), (1, 4, 16, 16)], (1, 4, 16, 16), (4, True)),
    ("aten.where.self", [(1, 4, 16, 16)] * 3, (1, 4, 16, 16), (4, False)),
    ("aten.mul.Tensor", [(1, 4, 16, 8), (1,)], (1, 4, 16, 8), (3, True)),
    ("aten.add.Tensor", [(1, 8, 4, 4), (1, 8, 4, 4)], (1, 8, 4, 4), (0, False)),  # fast path
    ("aten.mul.Scalar", [(1, 8, 4, 4)], (1, 8, 4, 4), (0, False)),  # one tensor
    # the CPU route runs a comparison with a [1] constant as its Scalar overload
    ("aten.gt.Scalar", [(1, 16, 8, 8), (1,)], (1, 16, 8, 8), (0, False)),
    ("aten.permute_copy.default", [(1, 8, 4, 4)], (1, 4, 4, 8), (0, False)),  # not elementwise
])
def test_which_ops_walk_their_tensors(op, inputs, output, expected):
    assert index_walk(op, inputs, output) == expected


def test_a_row_is_priced_as_the_kernel_it_runs():
    from cost_models.op_shapes import walked_op

    assert walked_op("aten.gt.Tensor", "aten.gt.Scalar") == "aten.gt.Scalar"
    assert walked_op("aten.add.Tensor", "arm_elementwise_add_s8") == "aten.add.Tensor"
    assert walked_op("aten.where.self", None) == "aten.where.self"


def test_the_walk_is_priced_per_operand_and_more_with_a_broadcast():
    data = load_cpu_cost_data()
    element = data.portable["cortex-m55"].element_cycles

    def cycles(walked, broadcast, elements=1024):
        shape = OpShape(kind="copy", macs=0, input_bytes=elements, output_bytes=elements,
                        elements=elements, walked_operands=walked, broadcast=broadcast)
        return portable_cost(shape, "cortex-m55", 32_000_000).cycles

    fast, generic, broadcast = cycles(0, False), cycles(4, False), cycles(4, True)
    assert fast < generic < broadcast
    walk = data.index_walk
    assert generic - fast == pytest.approx(
        1024 * element * (4 * walk.generic_operand_elements - 1), abs=1)
    assert broadcast - fast == pytest.approx(
        1024 * element * (4 * walk.broadcast_operand_elements - 1), abs=1)
    assert cycles(3, True) < broadcast  # fewer operands, less walk


class Masked(torch.nn.Module):
    """`where` broadcasting its condition and `where` on same shapes (1,024 outputs each)."""

    def forward(self, x, y):
        return torch.where(y > 0, x, -x), torch.where(x > 0, x, -x)


def test_the_plan_prices_where_within_a_quarter_of_qemu(tmp_path, capsys):
    """CPU-only on the M55: each `where` row's model cycles and calibrated instruction estimate
    beside the instructions QEMU counted for its kernel call."""
    import json

    import orchestrator
    from orchestrator.cli import main

    qemu_or_missing()
    model = tmp_path / "masked.py"
    model.write_text(
        "import torch\n"
        "from tests.test_index_walk import Masked\n"
        "def build():\n"
        "    torch.manual_seed(0)\n"
        "    return Masked().eval(), (torch.rand(1, 4, 16, 16) * 2 - 1,\n"
        "                             torch.rand(1, 4, 16, 1) * 2 - 1)\n")
    pte = tmp_path / "m.pte"
    orchestrator.compile(f"{model}:build", pte, npu="none")
    assert main(["verify", str(pte), "--qemu", "--profile"]) == 0
    capsys.readouterr()
    assert main(["plan", str(pte), "--measured", str(pte.with_suffix(".etdp")),
                 "--format", "json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    rows = [op for op in plan["ops"] if op["op"] == "aten.where.self"]
    assert len(rows) == 2
    for row in rows:
        measured = row["measured"]["value"]
        assert 0.8 <= row["cost"]["cycles"] / measured <= 1.25, row
        assert 0.8 <= row["cost"]["instructions"] / measured <= 1.25, row
    broadcast, same = rows
    assert broadcast["measured"]["value"] > 1.8 * same["measured"]["value"]
