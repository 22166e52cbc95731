import configparser
from pathlib import Path

import pytest
import yaml

from orchestrator.errors import UserError
from platforms import (
    CPU_TIERS,
    MEMORY_USES,
    PlatformError,
    cpu_tier,
    list_platforms,
    load_platform,
    normalize_cpu,
)
from platforms.platform import vela_ini_path

SHIPPED = ("corstone300", "corstone320")


@pytest.fixture(scope="module", params=SHIPPED)
def platform(request):
    return load_platform(request.param)


def _shipped_document(name: str) -> dict:
    return yaml.safe_load((Path(__file__).parents[1] / "platforms" / name / "platform.yaml").read_text())


def _write(tmp_path: Path, document: dict, file_name: str = "my_soc.yaml") -> Path:
    path = tmp_path / file_name
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def test_shipped_platforms_are_listed_and_load_by_name_and_alias():
    assert set(SHIPPED) <= set(list_platforms())  # the boards: tests/test_boards.py
    for name in SHIPPED:
        by_name = load_platform(name)
        assert by_name.name == name
        assert load_platform(name.replace("corstone", "corstone-")) == by_name
        assert load_platform(name.upper()) == by_name


def test_platforms_are_immutable_and_can_key_a_cache(platform):
    assert {platform: "seen"}[load_platform(platform.name)] == "seen"
    with pytest.raises(AttributeError):
        platform.cpu_hz = 1
    with pytest.raises(TypeError):
        platform.vela["u99"] = platform.vela[platform.npu_family(platform.npu_default)]


def test_corstone300_offers_u55_and_u65_with_m55():
    corstone300 = load_platform("corstone300")
    assert corstone300.cpu_default == "cortex-m55"
    assert corstone300.npu_default == "ethos-u55-128"
    assert corstone300.npu_options == (
        "ethos-u55-32", "ethos-u55-64", "ethos-u55-128", "ethos-u55-256", "ethos-u65-256", "ethos-u65-512",
    )


def test_corstone320_offers_u85_with_m85():
    corstone320 = load_platform("corstone320")
    assert corstone320.cpu_default == "cortex-m85"
    assert corstone320.npu_default == "ethos-u85-256"
    assert corstone320.npu_options == (
        "ethos-u85-128", "ethos-u85-256", "ethos-u85-512", "ethos-u85-1024", "ethos-u85-2048",
    )


def test_npu_default_is_one_of_the_options(platform):
    assert platform.npu_default in platform.npu_options
    assert platform.validate_npu(platform.npu_default) == platform.npu_default


def test_npu_macs_and_family_come_from_the_name(platform):
    for npu in platform.npu_options:
        assert platform.npu_macs(npu) == int(npu.rsplit("-", 1)[1])
        assert platform.npu_family(npu) == npu.split("-")[1]
    assert platform.npu_macs(platform.npu_default.upper()) == int(platform.npu_default.rsplit("-", 1)[1])


def test_vela_sections_exist_in_the_installed_vela_ini(platform):
    ini = configparser.ConfigParser()
    ini.read(vela_ini_path(platform.vela_config_ini, platform.source_file))
    assert ini.sections(), "Vela's bundled vela.ini was not found"
    for npu in platform.npu_options:
        system_config, memory_mode = platform.vela_config(npu)
        assert ini.has_section(f"System_Config.{system_config}")
        assert ini.has_section(f"Memory_Mode.{memory_mode}")


def test_vela_config_matches_ethosu_compile_spec_defaults(platform):
    from executorch.backends.arm.ethosu.compile_spec import EthosUCompileSpec

    for npu in platform.npu_options:
        upstream = EthosUCompileSpec._default_system_config_and_memory_mode(npu, None, None)
        assert tuple(platform.vela_config(npu)) == upstream


def test_every_memory_cites_a_source_and_npu_uses_need_npu_access(platform):
    assert {r.name for r in platform.memories} >= {"sram", "ddr"}
    for region in platform.memories:
        assert region.size_bytes > 0
        assert region.source.strip()
        assert region.holds <= set(MEMORY_USES)
    for region in platform.regions_holding("npu_scratch"):
        assert region.npu_accessible, region.name
    tcms = [r for r in platform.memories if r.kind == "tcm"]
    assert tcms and not any(r.npu_accessible for r in tcms)


def test_sram_sizes_are_the_ones_the_executorch_runner_links_against():
    assert load_platform("corstone300").memory("sram").size_bytes == 2 * 1024 * 1024
    assert load_platform("corstone320").memory("sram").size_bytes == 4 * 1024 * 1024


def test_fvp_load_address_lies_in_an_npu_readable_weights_region(platform):
    region = platform.memory(platform.fvp_load_region)
    assert region.base_address <= platform.fvp_load_address < region.base_address + region.size_bytes
    assert region.npu_accessible
    assert region.may_hold("weights")


def test_clocks_are_positive_and_can_be_overridden(platform):
    assert platform.cpu_hz > 0 and platform.npu_hz > 0
    faster = platform.with_clocks(cpu_hz=400_000_000)
    assert faster.cpu_hz == 400_000_000
    assert faster.npu_hz == platform.npu_hz
    assert faster.cpu_hz_source == "overridden by the user"
    with pytest.raises(PlatformError, match="npu_hz"):
        platform.with_clocks(npu_hz=0)


def test_user_yaml_by_path_loads(tmp_path):
    document = _shipped_document("corstone300")
    document["name"] = "my_soc"
    document["npu"]["options"] = ["ethos-u55-64"]
    document["npu"]["default"] = "ethos-u55-64"
    del document["vela"]["u65"]
    del document["fvp"]["models"]["u65"]
    soc = load_platform(str(_write(tmp_path, document)))
    assert soc.name == "my_soc"
    assert soc.npu_options == ("ethos-u55-64",)
    assert soc.vela_config("ethos-u55-64").memory_mode == "Shared_Sram"
    assert soc.source_file == tmp_path / "my_soc.yaml"


def test_user_yaml_may_bring_its_own_vela_ini(tmp_path):
    (tmp_path / "my_vela.ini").write_text(
        "[System_Config.My_SoC]\ncore_clock=400e6\naxi0_port=Sram\naxi1_port=OffChipFlash\n"
        "[Memory_Mode.My_Mode]\nconst_mem_area=Axi1\narena_mem_area=Axi0\ncache_mem_area=Axi0\n"
    )
    document = _shipped_document("corstone320")
    document["vela_config_ini"] = "my_vela.ini"
    document["vela"]["u85"] = {"system_config": "My_SoC", "memory_mode": "My_Mode"}
    soc = load_platform(_write(tmp_path, document))
    assert soc.vela_config("ethos-u85-512") == ("My_SoC", "My_Mode")
    assert vela_ini_path(soc.vela_config_ini, soc.source_file) == tmp_path / "my_vela.ini"


def test_bad_npu_name_lists_the_allowed_ones():
    corstone300 = load_platform("corstone300")
    with pytest.raises(PlatformError) as raised:
        corstone300.validate_npu("ethos-u85-256")
    message = str(raised.value)
    assert "\n" not in message
    assert "'ethos-u85-256'" in message
    for option in corstone300.npu_options:
        assert option in message


def test_platform_error_is_a_value_error_and_a_user_error():
    assert issubclass(PlatformError, ValueError)
    from orchestrator.errors import as_orchestrate_error

    reported = as_orchestrate_error(PlatformError("x"))
    assert isinstance(reported, UserError) and reported.exit_code == 2


def test_unknown_platform_name_lists_the_known_ones():
    with pytest.raises(PlatformError, match="corstone300, corstone320"):
        load_platform("corstone999")


def test_missing_platform_file_is_named(tmp_path):
    missing = tmp_path / "nowhere.yaml"
    with pytest.raises(PlatformError, match="nowhere.yaml: platform file not found"):
        load_platform(str(missing))


@pytest.mark.parametrize(
    ("edit", "key"),
    [
        (lambda d: d["cpu"].pop("cpu_hz"), "cpu.cpu_hz: missing"),
        (lambda d: d["npu"].update(npu_hz="1e9"), "npu.npu_hz: expected an integer"),
        (lambda d: d["memories"][0].update(size_bytes="big"), "memories[0].size_bytes: expected an integer"),
        (lambda d: d["memories"][1].update(npu_accessible="yes"), "memories[1].npu_accessible: expected true/false"),
        (lambda d: d["memories"][2].update(kind="rom"), "memories[2].kind"),
        (lambda d: d["memories"][3].update(holds=["stack"]), "memories[3].holds[0]"),
        (lambda d: d["npu"].update(default="ethos-u55-1024"), "npu.default"),
        (lambda d: d["npu"]["options"].append("ethos-u55-512"), "npu.options[6]"),
        (lambda d: d["vela"]["u55"].update(system_config="Ethos_U55_Imaginary"), "vela.u55.system_config"),
        (lambda d: d["vela"].pop("u65"), "vela.u65: missing"),
        (lambda d: d["fvp"].update(load_region="sdcard"), "fvp.load_region"),
        (lambda d: d["fvp"].update(load_address=0x40000000), "fvp.load_address"),
        (lambda d: d["fvp"]["models"]["u55"]["args"].append("--cpulimit {cpu_s}"), "fvp.models.u55.args[8]"),
        (lambda d: d["cpu"].update(default="cortex-a53"), "cpu.default"),
    ],
)
def test_bad_yaml_names_file_and_key(tmp_path, edit, key):
    document = _shipped_document("corstone300")
    edit(document)
    path = _write(tmp_path, document)
    with pytest.raises(PlatformError) as raised:
        load_platform(str(path))
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: ")
    assert key in message


def test_yaml_syntax_error_names_the_line(tmp_path):
    path = tmp_path / "broken.yml"
    path.write_text("name: broken\ncpu: [unclosed\n")
    with pytest.raises(PlatformError, match=r"broken\.yml: line \d+: not valid YAML"):
        load_platform(str(path))


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("cortex-m0", "cortex-m0"),
        ("cortex-m0+", "cortex-m0plus"),
        ("Cortex-M0plus", "cortex-m0plus"),
        ("cortex-m35P", "cortex-m35p"),
        (" CORTEX-M85 ", "cortex-m85"),
    ],
)
def test_normalize_cpu_returns_the_upstream_target_string(given, expected):
    assert normalize_cpu(given) == expected


def test_unknown_cpu_is_rejected_with_the_allowed_list():
    with pytest.raises(PlatformError) as raised:
        cpu_tier("cortex-m99")
    assert "'cortex-m99'" in str(raised.value)
    assert "cortex-m0plus" in str(raised.value) and "cortex-m85" in str(raised.value)


def test_cpu_tiers_match_executorch_supported_backends():
    from executorch.backends.cortex_m.library import cmsis_nn
    from executorch.backends.cortex_m.target_config import (
        _SUPPORTED_BACKENDS,
        CortexM,
        CortexMTargetConfig,
    )

    # The supersession documented next to _SUPPORTED_BACKENDS: SCALAR < DSP < MVE.
    capability = [cmsis_nn.Backend.SCALAR, cmsis_nn.Backend.DSP, cmsis_nn.Backend.MVE]
    upstream_targets = set()
    for core in CortexM:
        config = CortexMTargetConfig(cpu=core)
        upstream_targets.add(config.target_string)
        best = max(_SUPPORTED_BACKENDS[core], key=capability.index)
        assert cpu_tier(config.target_string) == best.name.lower(), core
        assert config.backend == best, core
    assert set(CPU_TIERS) == upstream_targets
