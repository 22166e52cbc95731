"""What the Ethos-U85 model shows about Vela 5.1's U85 lookup tables in a chained operation group:
an unrolled two-step LSTM cell quantized A16W8 (16-bit activations, as `--precision
MODULE=a16w8` gives an LSTM) runs its sigmoid and tanh as 2 KiB int16 tables, each filling the
U85's LUT memory. regor's InsertLUTDMACommands puts the LUT DMA of every lookup fused into a
chained group before the group's first operation, and AllocateLutSlot hands the one 2 KiB slot
out again, so in the second step the tanh table is loaded over the sigmoid table the group's
first lookup (the forget gate) still needs. Executed as the registers say, the stream applies
tanh once where the TOSA graph applies sigmoid, and the second step's output differs."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from torch import nn

from npu_driver.ethos_u import run_partition
from npu_driver.tosa_twin import main_block, run_tosa

NPU = "ethos-u85-256"
STEP_BYTES = 16 * 2  # one step's hidden state: 16 int16 values


class _TwoStepLstm(nn.Module):
    def __init__(self):
        super().__init__()
        self.ih = nn.Linear(8, 64)
        self.hh = nn.Linear(16, 64, bias=False)

    def forward(self, x):
        h, c, outs = torch.zeros(1, 16), torch.zeros(1, 16), []
        for step in range(2):
            i, f, g, o = (self.ih(x[:, step]) + self.hh(h)).chunk(4, -1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
            outs.append(h)
        return torch.stack(outs, 1)


def _two_step_lstm():
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(7)
        return _TwoStepLstm().eval(), (torch.rand(1, 2, 8) * 2 - 1,)


@pytest.fixture(scope="module")
def lowered():
    from npu_driver.payload import parse_payload
    from npu_driver.tosa_twin import graph_io
    from tests.npu_edge_models import lower_a16w8

    (tosa, payload), = lower_a16w8(_two_step_lstm, NPU)
    return tosa, parse_payload(payload), graph_io(tosa)


def _graph_tables(tosa: bytes):
    """The TOSA graph's TABLE constants by function (their 513 int16 values) and how many
    TABLE operations apply each."""
    from tosa.Op import Op

    block = main_block(tosa)
    tensors = {block.Tensors(i).Name(): block.Tensors(i) for i in range(block.TensorsLength())}
    uses, values = Counter(), {}
    for index in range(block.OperatorsLength()):
        op = block.Operators(index)
        if op.Op() == Op.TABLE:
            name = op.Inputs(1)
            kind = "sigmoid" if b"sigmoid" in name else "tanh"
            uses[kind] += 1
            values[kind] = np.frombuffer(tensors[name].DataAsNumpy().tobytes(), "<i2")
    return uses, values


def test_the_stream_applies_tanh_where_the_graph_applies_sigmoid(lowered):
    tosa, payload, io = lowered
    uses, values = _graph_tables(tosa)
    rng = np.random.default_rng(3)
    arrays = [rng.integers(-32768, 32768, size=spec.shape).astype(spec.numpy_type)
              for spec in io.inputs]
    got, counters = run_partition(payload, arrays, NPU, trace=True)
    loaded, applied = None, Counter()
    for access in counters.trace:
        if access.what == "DMA source":  # a 2 KiB table: 512 (base, slope) int16 pairs
            bases = np.frombuffer(payload.weight_bytes[access.lowest:access.highest + 1],
                                  "<i2")[0::2]
            loaded = next(kind for kind, table in values.items()
                          if np.array_equal(bases, table[:512]))
        elif access.what == "LUT":
            applied[loaded] += 1
    assert uses == {"sigmoid": 6, "tanh": 4}
    assert applied == {"sigmoid": 5, "tanh": 5}
    expected = run_tosa(tosa, io, arrays)[0].tobytes()
    assert got[0][:STEP_BYTES] == expected[:STEP_BYTES]
    assert got[0][STEP_BYTES:] != expected[STEP_BYTES:]
