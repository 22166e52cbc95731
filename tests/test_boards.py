"""The boards people ship on (issue 29): Alif Ensemble E8 (RTSS-HP), Raspberry Pi Pico 2 and
Renesas EK-RA8D1 are shipped platforms whose figures each cite a public source, and
`orchestrate plan ds-cnn --platform BOARD` plans on each: the board's core and clock, a memory
fit, the .pte in non-volatile memory and the arena in the board's RAM. One plan per board."""

import contextlib
import io
import json
from pathlib import Path

import pytest
import yaml

from orchestrator.cli import main
from orchestrator.errors import UserError
from orchestrator.target import resolve_target
from platforms import PlatformError, list_platforms, load_platform

PLATFORMS_DIR = Path(__file__).parents[1] / "platforms"

# board -> (core, clock, the NPU a plan uses by default: None for a CPU-only board)
BOARDS = {
    "alife8": ("cortex-m55", 400_000_000, "ethos-u55-256"),
    "pico2": ("cortex-m33", 150_000_000, None),
    "ekra8d1": ("cortex-m85", 480_000_000, None),
}


def _document(board: str) -> dict:
    return yaml.safe_load((PLATFORMS_DIR / board / "platform.yaml").read_text())


@pytest.fixture(scope="module", params=sorted(BOARDS))
def planned(request):
    """(board, exit code, plan JSON) of `orchestrate plan ds-cnn --platform BOARD --format json`."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["plan", "ds-cnn", "--platform", request.param, "--format", "json"])
    return request.param, code, out.getvalue()


def test_boards_are_shipped_and_load_by_their_spellings():
    assert set(BOARDS) <= set(list_platforms())
    for board, spellings in {"alife8": ("alif_e8", "alif-e8", "Alif-E8"), "pico2": ("pico-2",),
                             "ekra8d1": ("ek_ra8d1", "ek-ra8d1", "EK-RA8D1")}.items():
        platform = load_platform(board)
        assert platform.name == board
        assert (PLATFORMS_DIR / board / "__init__.py").is_file()
        for spelling in spellings:
            assert load_platform(spelling) == platform


def test_cores_clocks_and_npus_are_the_boards():
    for board, (cpu, cpu_hz, npu) in BOARDS.items():
        platform = load_platform(board)
        assert (platform.cpu_default, platform.cpu_hz, platform.npu_default) == (cpu, cpu_hz, npu)
    assert load_platform("alife8").npu_options == ("ethos-u55-256", "ethos-u85-256")
    for cpu_only in ("pico2", "ekra8d1"):
        assert load_platform(cpu_only).npu_options == ()


def test_every_figure_names_a_url():
    for board in BOARDS:
        document = _document(board)
        assert "https://" in document["cpu"]["source"], board
        if "npu" in document:
            assert "https://" in document["npu"]["source"], board
        for memory in document["memories"]:
            assert "https://" in memory["source"], (board, memory["name"])
            if "cpu_read" in memory:
                assert "https://" in memory["cpu_read"]["source"], (board, memory["name"])
        for entry in document.get("reserved", []):
            assert "https://" in entry["source"], (board, entry["region"])


def test_each_board_has_non_volatile_memory_for_the_pte_and_ram_for_the_arena():
    for board in BOARDS:
        platform = load_platform(board)
        assert any(r.kind == "flash" and r.may_hold("weights") for r in platform.memories), board
        assert any(r.kind in ("tcm", "sram") and r.may_hold("arena") for r in platform.memories)
        for region in platform.regions_holding("npu_scratch"):
            assert region.npu_accessible, (board, region.name)
        assert not any(r.npu_accessible for r in platform.memories if r.kind == "tcm"), board


def test_cpu_only_boards_plan_cpu_only_and_refuse_an_npu():
    for board in ("pico2", "ekra8d1"):
        assert resolve_target(board).npu is None
        assert resolve_target(board, npu="none").npu is None
        with pytest.raises(UserError, match="no NPU"):
            resolve_target(board, npu="ethos-u55-128")


def test_a_board_without_an_fvp_says_so():
    for board in BOARDS:
        platform = load_platform(board)
        assert platform.fvp == {} and platform.fvp_load_region is None
        with pytest.raises(PlatformError, match="no FVP models"):
            platform.fvp_spec(platform.npu_default or "ethos-u55-256")


def test_plan_ds_cnn_fits_each_board(planned):
    board, code, out = planned
    assert code == 0, out[-2000:]
    plan = json.loads(out)
    platform = load_platform(board)
    cpu, cpu_hz, npu = BOARDS[board]
    target = plan["platform"]
    assert (target["platform"], target["cpu"], target["cpu_hz"], target["npu"]) == (
        board, cpu, cpu_hz, npu)

    memory = plan["summary"]["memory"]
    assert memory["fits"] is True
    assert all(item["fits"] for item in memory["items"])
    regions = {r.name: r for r in platform.memories}
    image = next(item for item in memory["items"] if item["item"].startswith(".pte"))
    assert regions[image["region"]].kind == "flash"  # non-volatile: flash or MRAM
    placement = plan["summary"]["memory_placement"]
    assert placement["image_region"] == image["region"]
    assert placement["arenas"]
    for arena in placement["arenas"]:
        assert regions[arena["region"]].kind in ("tcm", "sram"), arena
    if npu:
        # The NPU reads its weights in place from the .pte and its scratch from RAM.
        assert regions[image["region"]].npu_accessible
        assert plan["summary"]["npu_mac_coverage_pct"] > 0
        scratch = [item for item in memory["items"] if item["item"].startswith("npu scratch")]
        assert all(regions[item["region"]].npu_accessible for item in scratch)
    else:
        assert plan["summary"]["npu_mac_coverage_pct"] == 0
