"""The user-model families (examples/user_models.py, models the zoo lacks) as hybrid Ethos-U55-128
programs on QEMU: `orchestrate compile` then `orchestrate verify --qemu`, every BundleIO case
byte-exact on the Cortex-M55 runner with the real EthosUBackend and Ethos-U core driver, each NPU
invocation executed by the functional model over semihosting and checked against the
partition's TOSA graph. A family compile refuses must be refused in one line naming why, and
only the ones listed here.

Each family is its own scheduling unit (tests/conftest.py), so the two workers share them; the
firmware objects are cached on disk, so a family costs its compile, a link and the run. Under
CI=true a missing toolchain, QEMU or source tree fails these tests (tests/device_tools.py).
"""

from __future__ import annotations

import pytest

from examples.user_models import USER_MODELS, model_spec
from orchestrator.cli import main
from tests.device_tools import npu_line, qemu_or_missing, verify_qemu_passes

# What compile refuses on the U55-128, and the words its one line must hold.
REFUSED: dict[str, str] = {}
# Families whose every NPU partition the device check moved to the CPU: the attention block's
# Vela stream writes its int32 matmul temporary past the scratch it sized, so the functional
# model refuses it, and its ops run on the CPU (tests/test_npu_verify.py shows the refusal).
MOVED_OFF_THE_NPU = ("attention_block",)
# index_ops' int64 `full`, whose NPU output EthosUBackend refuses, is moved to the CPU by the
# device check (tests/test_live_activation.py checks that program on every method).


# Kept out of the default suite for its time budget (they run with the opt-in user_models
# marker, `python -m pytest -m user_models`, and in benchmarks/qemu_hybrid.py): the two
# recurrent families take 3-4 minutes each, nearly all of it in upstream's
# to_edge_transform_and_lower over the unrolled steps (measured: 149 of 196 s for gru_kws), and
# the four slowest of the rest (55-92 s each) repeat what the suite already runs on QEMU: the
# MobileNet blocks and SqueezeNet are the zoo's depthwise/pointwise/concat CNNs again, ds_tcn the
# dilated Conv1d stack conv1d_audio covers.
SLOW = ("gru_kws", "lstm_classifier", "mobilenet_v2_small", "mobilenet_v3_small_block",
        "squeezenet_small", "ds_tcn",
        # compiled for the U55 and run on QEMU, twin and host runtime by
        # tests/test_live_activation.py (its int64 constant moved off the NPU, its ReLU's clamp)
        "index_ops",
        # compiled twice by tests/test_reproducible.py (two processes, one program)
        "gated_flip_two_outputs",
        # the four slowest of the rest (17-52 s each), each covered elsewhere on the device:
        # attention_block's refusal by tests/test_npu_verify.py, a CRNN on every device method by
        # tests/test_device_code.py, a ShuffleNet's channel shuffle by tests/test_user_models.py,
        # LayerNorm by tests/test_keyword_transformer.py
        "attention_block", "crnn", "shufflenet_small", "layernorm_mlp")


@pytest.mark.parametrize("family", [
    pytest.param(name, marks=pytest.mark.user_models) if name in SLOW else name
    for name in USER_MODELS])
def test_family_on_the_ethos_u55_passes_verify_qemu_or_is_refused_in_one_line(
        family, tmp_path, capsys):
    qemu_or_missing()
    pte = tmp_path / f"{family}.pte"
    code = main(["compile", model_spec(family), "--npu", "ethos-u55-128", "-o", str(pte),
                 "--quiet"])
    err = capsys.readouterr().err
    if family in REFUSED:
        lines = [line for line in err.splitlines() if line.startswith("orchestrate:")]
        assert code not in (0, 1) and len(lines) == 1, err
        assert REFUSED[family] in lines[0], err
        assert not pte.exists()
        return
    assert code == 0, err
    out = verify_qemu_passes(pte, capsys)
    if family in MOVED_OFF_THE_NPU:
        assert not any(line.startswith("npu: ") for line in out.splitlines()), out
        return
    npu = npu_line(out)
    invocations = int(npu.removeprefix("npu: ").split(" ")[0])
    assert invocations >= 4, npu  # every case ran at least one NPU partition
    assert "NPU commands executed by the functional model" in npu, npu
