"""Where buffers live changes what the CPU pays to read them (issue: flash and memory).

The deep autoencoder is weight-bound (270 KB of fully-connected weights, 264k MACs): read in
place from QSPI flash its estimate is dominated by streaming the weights; copied to DTCM at boot
(the auto policy: DTCM has room) it is not. The plan names the region, the gain and its source.
"""

from __future__ import annotations

import json

import pytest

from orchestrator.planning.planner import make_plan
from platforms.memory_placement import WEIGHTS_ITEM, MemoryPolicy, load_memory_policy
from platforms.platform import PlatformError


@pytest.fixture(scope="module")
def autoencoder_m55(compiles):
    compiled, _ = compiles.get("deep-autoencoder", "corstone300", "none", "cortex-m55")
    return compiled


def _fc(plan):
    return next(r for r in plan.rows if r.name == "aten_linear_default")


def test_a_weight_bound_estimate_follows_the_region_its_weights_are_read_from(
        autoencoder_m55, tmp_path):
    in_place = make_plan(autoencoder_m55, memory_policy=load_memory_policy("in-place"))
    policy = tmp_path / "memory.yaml"
    policy.write_text("weights: sram\n")
    sram = make_plan(autoencoder_m55, memory_policy=load_memory_policy(str(policy)))
    auto = make_plan(autoencoder_m55)
    fc = {name: _fc(p).cost for name, p in (("flash", in_place), ("sram", sram), ("dtcm", auto))}
    # 81,920 int8 weights + 512 B bias: flash at the calibrated 1/1.54 cycles/B, SRAM at the
    # vela.ini-derived 1.125 cycles/B, DTCM (zero-wait) at 0.
    assert fc["dtcm"].cycles < fc["flash"].cycles < fc["sram"].cycles
    assert fc["sram"].cycles - fc["dtcm"].cycles == pytest.approx(82_432 * 1.125, abs=2)
    assert fc["flash"].source == "model:mve" and fc["sram"].source == "model:mve+model:memory"
    assert in_place.summary.placement.weights_region == "qspi_flash"
    assert sram.summary.placement.weights_region == "sram"
    assert auto.summary.latency_seconds < in_place.summary.latency_seconds \
        < sram.summary.latency_seconds


def test_auto_puts_the_weights_into_dtcm_when_it_has_room_and_names_the_gain(autoencoder_m55):
    plan = make_plan(autoencoder_m55)
    placement = plan.summary.placement
    assert (placement.image_region, placement.weights_region) == ("qspi_flash", "dtcm")
    item = next(m for m in plan.summary.memory if m.item == WEIGHTS_ITEM)
    assert item.region == "dtcm" and item.fits and item.bytes >= 270_000
    in_place = make_plan(autoencoder_m55, memory_policy=load_memory_policy("in-place"))
    saved = round((in_place.summary.latency_seconds - plan.summary.latency_seconds)
                  * plan.compiled.target.cpu_hz)
    assert placement.gain_cycles == pytest.approx(saved, abs=len(plan.rows))
    assert placement.hottest[0][0] in ("aten_linear_default", "aten_linear_default_9")
    text = plan.to_text()
    assert f"weights copied qspi_flash -> dtcm at boot: estimated -{placement.gain_cycles:,}" in text
    assert "(cost model; region read figures from the platform YAML)" in text
    data = plan.to_json()["summary"]
    assert data["memory_placement"]["weights_region"] == "dtcm"
    assert WEIGHTS_ITEM in [m["item"] for m in data["memory"]["items"]]
    json.dumps(data)


def test_weights_stay_in_place_when_no_faster_region_has_room(autoencoder_m55):
    import dataclasses

    platform = autoencoder_m55.target.platform
    small = dataclasses.replace(platform, memories=tuple(
        dataclasses.replace(m, size_bytes=64 * 1024) if m.kind in ("tcm", "sram") else m
        for m in platform.memories))
    compiled = dataclasses.replace(autoencoder_m55, target=dataclasses.replace(
        autoencoder_m55.target, platform=small))
    plan = make_plan(compiled)
    assert plan.summary.placement.weights_region == "qspi_flash"
    assert not plan.summary.placement.weights_copied
    assert WEIGHTS_ITEM not in [m.item for m in plan.summary.memory]


@pytest.mark.parametrize("text,needle", [
    ("weights: nowhere\n", "region 'nowhere' is not a memory of corstone300"),
    ("weights: itcm\n", "itcm may not hold weights"),
    ("speed: fast\n", "unknown key 'speed'"),
    ("arena: [dtcm, nowhere]\n", "arena region 'nowhere' is not a memory of corstone300"),
    ("arena: [dtcm, dtcm]\n", "arena must list distinct region names"),
    ("keep_free: {dtcm: lots}\n", "keep_free must map region names to byte counts"),
    ("keep_free: {nowhere: 10}\n", "keep_free region 'nowhere' is not a memory"),
])
def test_a_bad_memory_policy_is_one_line_naming_it(autoencoder_m55, tmp_path, text, needle):
    path = tmp_path / "m.yaml"
    path.write_text(text)
    with pytest.raises(PlatformError, match=needle):
        policy = load_memory_policy(str(path))
        from platforms.memory_placement import place_program

        place_program(autoencoder_m55.target.platform, 1000, (), 100, None, policy)


def test_memory_policy_cli_refuses_a_missing_file(capsys):
    from orchestrator.cli import main

    assert main(["plan", "mixed", "--memory-policy", "missing.yaml"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--memory-policy 'missing.yaml'" in err[0]


def test_sweep_configurations_are_planned_under_the_memory_policy():
    """`sweep --memory-policy` reaches every job: the weight-bound model's row is slower with
    its weights read in place from flash than copied to DTCM."""
    from orchestrator.request import Request
    from orchestrator.sweeps.local import run_job

    def row(memory_policy):
        return run_job(Request("deep-autoencoder", npu="none", memory_policy=memory_policy))

    assert row("in-place").latency_seconds > row("auto").latency_seconds


@pytest.mark.parametrize("verb", ["plan", "sweep"])
def test_a_memory_policy_naming_an_unknown_region_is_refused_before_compiling(
        tmp_path, capsys, monkeypatch, verb):
    from orchestrator.compilation import pipeline
    from orchestrator.cli import main

    def no_compile(*args, **kwargs):
        raise AssertionError("compiled before the policy was checked")

    monkeypatch.setattr(pipeline, "compile_model", no_compile)
    path = tmp_path / "m.yaml"
    path.write_text("weights: nowhere\n")
    assert main([verb, "mixed", "--npu", "none", "--memory-policy", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "region 'nowhere' is not a memory of corstone300" in err[0]


def test_auto_does_not_copy_weights_the_cost_model_sees_no_gain_in(compiles, tmp_path):
    """CMSIS-NN convs read their weights within the calibrated MAC rate (no streaming term),
    so for a conv-only model a copy to DTCM buys nothing by the model: auto leaves the weights
    in place instead of claiming a gain of 0; a policy naming DTCM still puts them there."""
    model = tmp_path / "convs.py"
    model.write_text(
        "import torch\nfrom torch import nn\n"
        "def factory():\n"
        "    torch.manual_seed(0)\n"
        "    m = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3))\n"
        "    return m.eval(), (torch.randn(1, 3, 16, 16),)\n")
    compiled, _ = compiles.get(f"{model}:factory", "corstone300", "none", "cortex-m55")
    plan = make_plan(compiled)
    assert plan.summary.placement.weights_region == "qspi_flash"
    assert WEIGHTS_ITEM not in [m.item for m in plan.summary.memory]
    assert "weights copied" not in plan.to_text()
    forced = make_plan(compiled, memory_policy=MemoryPolicy(weights="dtcm", source="test"))
    assert forced.summary.placement.weights_region == "dtcm"
    assert forced.summary.latency_seconds == plan.summary.latency_seconds


def test_the_split_keeps_the_most_accessed_tensors_in_the_fast_slot():
    """The eviction order: fewest accesses first, the largest of equals first; the fast slot keeps
    all it can within its budget (here a buffer's size is the sum of its tensors)."""
    from platforms.arena_planning import Tensor, split
    from platforms.memory_placement import ArenaSlot

    tensors = [Tensor("a", 100, 2), Tensor("b", 400, 2), Tensor("c", 300, 5), Tensor("d", 50, 3)]
    sizes = {t.key: t.bytes for t in tensors}

    def size_of(keys):
        return sum(sizes[k] for k in keys)

    slots = (ArenaSlot("dtcm", 450), ArenaSlot("bram", None))
    assert split(tensors, slots, size_of) == [0, 1, 0, 0]  # b (2 accesses, largest) goes
    assert split(tensors, (ArenaSlot("dtcm", 360), ArenaSlot("bram", None)), size_of) == \
        [1, 1, 0, 0]
    assert split(tensors, (ArenaSlot("dtcm", 10_000), ArenaSlot("bram", None)), size_of) == \
        [0, 0, 0, 0]
    assert split(tensors, (ArenaSlot("dtcm", 0), ArenaSlot("bram", None)), size_of) == \
        [1, 1, 1, 1]


@pytest.fixture(scope="module")
def ds_cnn_arenas(compiles, tmp_path_factory):
    """DS-CNN CPU-only three ways: one arena in DTCM (auto, it fits), split because the
    application keeps most of DTCM, and one arena in BRAM; the CPU weights read in place from
    flash in all three, so only the activations differ."""
    import orchestrator
    from orchestrator.request import Request

    folder = tmp_path_factory.mktemp("policies")
    (folder / "split.yaml").write_text("keep_free: {dtcm: 440000}\nweights: in-place\n")
    (folder / "bram.yaml").write_text("arena: bram\nweights: in-place\n")
    compiled, _ = compiles.get("ds-cnn", "corstone300", "none", "cortex-m55")
    plans = {"dtcm": make_plan(compiled, memory_policy=load_memory_policy("in-place"))}
    for name in ("split", "bram"):
        plans[name] = orchestrator.plan(Request("ds-cnn", npu="none", cpu="cortex-m55",
                                                memory_policy=str(folder / f"{name}.yaml")))
    return plans


def test_activations_that_do_not_fit_dtcm_are_split_over_two_planned_buffers(ds_cnn_arenas):
    dtcm, split, bram = (ds_cnn_arenas[k] for k in ("dtcm", "split", "bram"))
    assert [(a.mem_id, a.region) for a in dtcm.compiled.arenas] == [(1, "dtcm")]
    assert [(a.mem_id, a.region) for a in split.compiled.arenas] == [(1, "dtcm"), (2, "bram")]
    assert [(a.mem_id, a.region) for a in bram.compiled.arenas] == [(1, "bram")]
    first = split.compiled.arenas[0]
    assert first.bytes <= first.budget == 524_288 - 73_728 - 440_000
    # What ExecuTorch serialized: one planned buffer per arena, the sizes the plan shows.
    buffers = list(split.compiled.executorch_program.execution_plan[0].non_const_buffer_sizes)
    assert buffers == [0] + [a.bytes for a in split.compiled.arenas]
    # Every planned tensor is in one of them.
    assert set(split.compiled.arena_of.values()) == {1, 2}
    items = {m.item: m for m in split.summary.memory}
    assert items["executorch arena 1 of 2 (%d tensors)" % first.tensors].region == "dtcm"
    assert "activations split over 2 arenas" in split.to_text()
    data = split.to_json()["summary"]["memory_placement"]["arenas"]
    assert [(a["region"], a["cycles_per_byte"]) for a in data] == [("dtcm", 0), ("bram", 1.125)]


def test_each_ops_activation_reads_are_costed_at_its_arenas_speed(ds_cnn_arenas):
    """All in zero-wait DTCM < split < all in BRAM (1.125 cycles/B), op by op and in total."""
    dtcm, split, bram = (ds_cnn_arenas[k] for k in ("dtcm", "split", "bram"))
    assert dtcm.summary.latency_seconds < split.summary.latency_seconds \
        < bram.summary.latency_seconds
    cost = {name: {r.name: r.cost.cycles for r in plan.rows if r.placement == "cmsis-nn"
                   and r.kind == "op"} for name, plan in ds_cnn_arenas.items()}
    assert cost["dtcm"].keys() == cost["split"].keys() == cost["bram"].keys()
    for op in cost["dtcm"]:
        assert cost["dtcm"][op] <= cost["split"][op] <= cost["bram"][op]
    # An op reading one arena and writing the other costs strictly between the two.
    assert any(cost["dtcm"][op] < cost["split"][op] < cost["bram"][op] for op in cost["dtcm"])


def test_a_split_plan_is_reproducible(ds_cnn_arenas, tmp_path):
    """The split plans buffers many times over: the same program and policy give the same
    .pte bytes (no dependence on hash order of the planner's tensor objects)."""
    import orchestrator
    from orchestrator.request import Request

    split = ds_cnn_arenas["split"]
    compiled = split.compiled
    policy = tmp_path / "split.yaml"
    policy.write_text("keep_free: {dtcm: 440000}\nweights: in-place\n")
    again = orchestrator.plan(Request("ds-cnn", npu="none", cpu="cortex-m55",
                                      memory_policy=str(policy)))
    assert again.compiled.pte_bytes == compiled.pte_bytes
    assert again.compiled.arenas == compiled.arenas


@pytest.mark.parametrize("pte_bytes, fits", [(300_000, True), (3_000_000, False)])
def test_a_sram_only_programs_image_goes_to_sram_or_does_not_fit(pte_bytes, fits):
    """Vela's Sram_Only estimates read the NPU weights at SRAM speed, in place from the .pte:
    the plan put the image in QSPI flash regardless, so its figures and its fit disagreed. Now
    the image of a program with NPU partitions compiled for Sram_Only goes to an SRAM region
    (Corstone-300: bram, then sram) or does not fit; without Sram_Only it stays in flash."""
    from platforms.memory_placement import Arena, place_program
    from platforms.platform import load_platform

    platform = load_platform("corstone300")
    arenas = (Arena(1, "dtcm", 4_096, 3),)
    kinds = {r.name: r.kind for r in platform.memories}
    sram_only = place_program(platform, pte_bytes, arenas, 0, (0, 768), MemoryPolicy(),
                              npu_weights_in_sram=True)
    image = sram_only.items[0]
    assert image.fits is fits and kinds[image.region] == "sram"
    assert "Sram_Only" in image.item
    shared = place_program(platform, pte_bytes, arenas, 0, (0, 768), MemoryPolicy())
    assert kinds[shared.items[0].region] == "flash" and shared.items[0].fits
