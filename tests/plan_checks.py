"""Properties every plan must have, shared by the readability test (DS-CNN on three targets), the
zoo matrix (`-m matrix`) and the user families (`-m user_models`)."""

from __future__ import annotations


def assert_summary_is_the_rows_added_up(plan) -> None:
    """Every count and sum of the summary is the one the table's rows give, hidden work is
    counted under the engine that runs it, and no "incl." part is larger than its whole."""
    s = plan.summary
    for engine in ("npu", "cmsis-nn", "portable"):
        ops = [r for r in plan.rows if r.kind == "op" and r.placement == engine]
        assert s.ops[engine] == len(ops), engine
        assert s.macs[engine] == sum(r.macs for r in ops), engine
        hidden = {}
        for r in plan.rows:
            if r.kind != "op" and r.placement == engine:
                hidden[r.kind] = hidden.get(r.kind, 0) + 1
        assert (s.hidden_by_engine or {}).get(engine, {}) == hidden, engine
    assert s.arena_bytes >= s.cmsis_scratch_bytes  # "its largest scratch buffer" is a part
    text = plan.to_text()
    if not plan.compiled.target.npu:
        assert "executorch + vela" not in text and "NPU scratch" not in text
    line = next(line for line in text.splitlines() if line.startswith("ops: "))
    assert f"NPU {s.ops['npu']}, CMSIS-NN {s.ops['cmsis-nn']}, portable {s.ops['portable']}" in line
