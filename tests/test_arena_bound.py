"""Activation arenas at their lower bound: each planned buffer is laid out by the smaller of
upstream's greedy and the lifetime planner (platforms/arena_planning.py: plan_buffers,
platforms/offset_planning.py), and sits within 5% (plus one alignment unit) of the peak of the
bytes live at one instruction."""

from __future__ import annotations

import random

import pytest

from examples.zoo import zoo_names
from platforms.offset_planning import Block, best_offsets, check_layout, live_bytes_bound

ALIGNMENT_BYTES = 16  # ExecuTorch MemoryPlanningPass's default alignment, which we keep

# MobileNet-v1-0.25 CPU-only with int8 I/O, the buffer's tensors around its peak (aligned bytes,
# first and last instruction): upstream's greedy stacks the two 18,432 B activations and the
# 36,864 B one into 73,728 B where 55,296 B are live at once.
MOBILENET_PEAK = [(27648, 0, 113), (128, 111, 113), (18432, 112, 116), (4464, 114, 116),
                  (18432, 115, 119), (36864, 118, 122), (4464, 120, 122), (9216, 121, 125)]


def test_the_bound_is_the_peak_of_bytes_alive_at_one_instruction():
    # Lifetimes are inclusive: a block ending at 3 and one starting at 3 are alive together.
    assert live_bytes_bound([Block(100, 0, 3), Block(50, 3, 5), Block(70, 4, 9)]) == 150
    assert live_bytes_bound([Block(100, 0, 2), Block(50, 3, 5)]) == 100
    assert live_bytes_bound([Block(0, 0, 9)]) == 0 and live_bytes_bound([]) == 0


def test_the_lifetime_planner_packs_mobilenets_peak_to_its_bound():
    blocks = [Block(*b) for b in MOBILENET_PEAK]
    layout = best_offsets(blocks)
    check_layout(blocks, layout.offsets)
    assert live_bytes_bound(blocks) == 55_296 and layout.bytes == 55_296
    assert all(offset % ALIGNMENT_BYTES == 0 for offset in layout.offsets)


def test_a_layout_never_overlaps_two_live_blocks_and_never_beats_the_bound():
    rng = random.Random(49)
    for _ in range(200):
        blocks = []
        for _ in range(rng.randint(1, 30)):
            first = rng.randint(0, 40)
            blocks.append(Block(16 * rng.randint(0, 64), first, first + rng.randint(0, 8)))
        layout = best_offsets(blocks)
        check_layout(blocks, layout.offsets)
        assert layout.bytes >= live_bytes_bound(blocks)
        assert layout.bytes == max((o + b.bytes for o, b in zip(layout.offsets, blocks)),
                                   default=0)


def test_check_layout_names_two_live_blocks_that_share_bytes():
    with pytest.raises(AssertionError, match="blocks 0 and 1"):
        check_layout([Block(32, 0, 2), Block(32, 2, 4)], [0, 16])
    check_layout([Block(32, 0, 2), Block(32, 3, 4)], [0, 0])  # not alive together


def _specs(shapes):
    import torch
    from executorch.exir.tensor import TensorSpec

    specs = []
    for size, first, last in shapes:
        spec = TensorSpec.from_tensor(torch.zeros(size, dtype=torch.int8))
        spec.lifetime = [first, last]
        specs.append(spec)
    return specs


def test_plan_buffers_beats_greedy_on_executorch_specs_and_keeps_aliases_inside_their_base():
    """On ExecuTorch's own TensorSpecs: the greedy figure, the bound and our offsets; a spec
    backed by another's storage sits at its base's offset plus its storage_base_offset, and
    specs sharing bytes share a mem_obj_id (what ExecuTorch's Verifier checks)."""
    import torch

    from platforms.arena_planning import plan_buffers

    specs = _specs(MOBILENET_PEAK)
    alias = _specs([(4096, 119, 120)])[0]
    alias.storage_base, alias.storage_base_offset = specs[5], 1024
    graph_module = torch.fx.GraphModule(torch.nn.Module(), torch.fx.Graph())
    result, plans = plan_buffers(ALIGNMENT_BYTES, specs + [alias], graph_module, None)
    assert plans[1].greedy_bytes == 73_728 and plans[1].bound_bytes == 55_296
    assert plans[1].bytes == result.bufsizes[1] == 55_296
    assert plans[1].planner.startswith("orchestrate lifetime planner")
    placed = result.spec_dict
    assert placed[alias].mem_offset == placed[specs[5]].mem_offset + 1024
    assert placed[alias].mem_obj_id == placed[specs[5]].mem_obj_id
    for i, a in enumerate(specs):
        for b in specs[i + 1:]:
            bytes_overlap = (placed[a].mem_offset < placed[b].mem_offset + b.allocated_memory
                             and placed[b].mem_offset < placed[a].mem_offset + a.allocated_memory)
            alive = not (a.lifetime[1] < b.lifetime[0] or b.lifetime[1] < a.lifetime[0])
            assert not (bytes_overlap and alive)
            if bytes_overlap:
                assert placed[a].mem_obj_id == placed[b].mem_obj_id


def test_plan_buffers_keeps_greedy_where_it_is_already_at_the_bound_and_honours_submodules():
    """A tie keeps upstream's offsets; a control-flow parent's tensors start above the bytes its
    submodules were planned in (`input_mem_buffer_sizes`), which the bound counts too."""
    import torch

    from platforms.arena_planning import plan_buffers

    graph_module = torch.fx.GraphModule(torch.nn.Module(), torch.fx.Graph())
    _, plans = plan_buffers(ALIGNMENT_BYTES, _specs([(64, 0, 1), (64, 1, 2), (64, 2, 3)]),
                            graph_module, None)
    assert plans[1].bytes == plans[1].bound_bytes == 128
    assert plans[1].planner == "executorch greedy"
    graph_module.input_mem_buffer_sizes = [0, 256]
    result, plans = plan_buffers(ALIGNMENT_BYTES, _specs(MOBILENET_PEAK), graph_module, None)
    assert plans[1].bound_bytes == 256 + 55_296 and plans[1].bytes == 256 + 55_296
    assert min(r.mem_offset for r in result.spec_dict.values()) == 256


# Every zoo model CPU-only with int8 I/O (where greedy was furthest from the bound), and the
# programs the session compiles anyway (tests/test_golden.py), and the deep autoencoder on the
# U55, where greedy takes 3,840 B for a 3,200 B bound.
ZOO_CASES = [*((m, "corstone300", "none", "cortex-m55", "int8") for m in zoo_names()),
             *((m, p, n, c, "float") for m in ("ds-cnn", "mixed")
               for p, n, c in (("corstone300", "ethos-u55-128", None),
                               ("corstone300", "none", "cortex-m55"),
                               ("corstone320", "ethos-u85-256", None))),
             ("deep-autoencoder", "corstone300", "ethos-u55-128", None, "float")]


@pytest.mark.parametrize("model,platform,npu,cpu,io", ZOO_CASES,
                         ids=[f"{c[0]}-{c[2]}-{c[4]}" for c in ZOO_CASES])
def test_every_zoo_arena_is_within_5_percent_of_its_live_bytes_bound(
        compiles, model, platform, npu, cpu, io):
    compiled, _ = compiles.get(model, platform, npu, cpu, io=io)
    assert compiled.arenas
    for arena in compiled.arenas:
        assert arena.bound_bytes <= arena.bytes <= 1.05 * arena.bound_bytes + ALIGNMENT_BYTES, \
            arena
        assert arena.bytes <= arena.greedy_bytes, arena  # never worse than upstream
    assert sum(a.bytes for a in compiled.arenas) == compiled.arena_bytes  # the .pte's plan


def test_mobilenet_int8_arena_drops_from_greedys_73728_to_its_55296_bound(compiles):
    compiled, _ = compiles.get("mobilenet-v1-025", "corstone300", "none", "cortex-m55",
                               io="int8")
    (arena,) = compiled.arenas
    assert (arena.greedy_bytes, arena.bytes, arena.bound_bytes) == (73_728, 55_296, 55_296)
    assert compiled.arena_bytes == 55_296
    assert arena.to_json()["live_bytes_bound_source"].startswith("lower bound from lifetimes")


def test_mobilenet_int8_with_the_new_layout_passes_the_twin_and_the_host_runtime(compiles):
    """The real runtime reads and writes every activation at its planned offset: a layout that
    let two live tensors share bytes would differ from the twin (which keeps each value apart)."""
    from orchestrator.device_runs.combined import verify_all
    from tests.device_tools import host_runtime_or_missing

    host_runtime_or_missing().close()
    _, pte = compiles.get("mobilenet-v1-025", "corstone300", "none", "cortex-m55", io="int8",
                          write=True)
    verdict = verify_all(pte, samples=4, methods=("twin", "host runtime"))
    assert {r.name: r.outcome for r in verdict.results} == {
        "twin": "passed", "host runtime": "passed"}, verdict.verdict


def test_the_plan_reports_the_arena_beside_its_live_bytes_bound(compiles):
    """plan.json (summary and each arena), the text summary and the HTML memory section."""
    from orchestrator.planning.planner import make_plan

    compiled, _ = compiles.get("mobilenet-v1-025", "corstone300", "none", "cortex-m55",
                               io="int8")
    plan = make_plan(compiled)
    memory = plan.to_json()["summary"]["memory"]
    assert (memory["arena_bytes"], memory["arena_live_bytes_bound"]) == (55_296, 55_296)
    assert memory["arena_bytes_source"] == "planned"
    assert memory["arena_live_bytes_bound_source"].startswith("lower bound from lifetimes")
    (arena,) = plan.to_json()["summary"]["memory_placement"]["arenas"]
    assert (arena["bytes"], arena["live_bytes_bound"], arena["upstream_greedy_bytes"]) == (
        55_296, 55_296, 73_728)
    assert "arena 55,296 B (planned; 55,296 B lower bound from lifetimes" in \
        " ".join(plan.to_text().split())
    assert "55,296 B lower bound from lifetimes" in plan.to_html()
