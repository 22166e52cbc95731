import stat
import subprocess
from pathlib import Path

import pytest

from platforms import PlatformError, load_platform
from platforms import fvp
from platforms.fvp import (
    FvpNotFound,
    find_fvp,
    find_runner_elf,
    fvp_command,
    parse_runner_log,
    run_bpte,
    run_fvp,
)

RUNNER = "I [executorch:arm_executor_runner.cpp:{line} {func}()] "
PERF = "I [executorch:arm_perf_monitor.cpp:{line} StopMeasurements()] "

# A Corstone-300 / Ethos-U55 run of a bundled program, in the format of ExecuTorch's
# examples/arm/executor_runner/arm_executor_runner.cpp and arm_perf_monitor.cpp.
PASS_LOG_U55 = "\r\n".join(
    [
        "telnetterminal0: Listening for serial connection on port 5000",
        RUNNER.format(line=1240, func="main") + "PTE @ 0x38000000 [----BP08]",
        RUNNER.format(line=512, func="runner_init") + "PTE Model data loaded. Size: 3136 bytes.",
        RUNNER.format(line=524, func="runner_init") + "Model buffer loaded, has 1 methods",
        RUNNER.format(line=531, func="runner_init") + "Running method forward",
        RUNNER.format(line=587, func="runner_init") + "Setting up planned buffer with mem_id=1, size 64.",
        RUNNER.format(line=760, func="runner_init") + "Input testset[0] from bundled bpte",
        RUNNER.format(line=1121, func="run_model") + "Starting running 1 inferences...",
        PERF.format(line=151) + "NPU Inferences : 1",
        PERF.format(line=152) + "NPU delegations: 1 (1.00 per inference)",
        PERF.format(line=157) + "Profiler report, CPU cycles per operator:",
        PERF.format(line=161) + "ethos-u : cycle_cnt : 2510 cycles (2510.00 per inference)",
        PERF.format(line=170) + "Operator(s) total: 2510 CPU cycles (2510.00 per inference)",
        PERF.format(line=177) + "Inference runtime: 7614 CPU cycles total (7614.00 per inference)",
        PERF.format(line=184) + "NOTE: CPU cycle values and ratio calculations require FPGA and identical CPU/NPU frequency",
        PERF.format(line=194) + "Inference CPU ratio: 78.64 %",
        PERF.format(line=198) + "Inference NPU ratio: 21.36 %",
        PERF.format(line=208) + "cpu_wait_for_npu_cntr : 1626 CPU cycles (1626.00 per inference)",
        PERF.format(line=213) + "Ethos-U PMU report:",
        PERF.format(line=218) + "ethosu_pmu_cycle_cntr :  1342 (1342.00 per inference)",
        PERF.format(line=226) + "ethosu_pmu_cntr0 : 18 (18.00 per inference)",
        PERF.format(line=226) + "ethosu_pmu_cntr1 : 8 (8.00 per inference)",
        PERF.format(line=226) + "ethosu_pmu_cntr2 : 12 (12.00 per inference)",
        PERF.format(line=226) + "ethosu_pmu_cntr3 : 1005 (1005.00 per inference)",
        PERF.format(line=236) + "Ethos-U PMU Events:[ETHOSU_PMU_AXI0_RD_DATA_BEAT_RECEIVED, "
        "ETHOSU_PMU_AXI1_RD_DATA_BEAT_RECEIVED, ETHOSU_PMU_AXI0_WR_DATA_BEAT_WRITTEN, ETHOSU_PMU_NPU_IDLE]",
        RUNNER.format(line=1141, func="run_model") + "1 inferences finished",
        RUNNER.format(line=1030, func="verify_result") + "=== Error stats for testset 0 ===",
        RUNNER.format(line=1031, func="verify_result") + " mean_absolute_error: 0.000000",
        RUNNER.format(line=1042, func="verify_result") + "Model output match expected BundleIO bpte ref data.",
        RUNNER.format(line=1043, func="verify_result") + "TEST: BundleIO index[0] Test_result: PASS",
        RUNNER.format(line=1143, func="run_model") + "Model run: 1",
        RUNNER.format(line=880, func="log_mem_status")
        + "model_pte_program_size:     3136 bytes. (pte size unknown when not baked into elf)",
        RUNNER.format(line=907, func="log_mem_status") + "method_allocator_used:     1364 / 62914560  free: 62913196 ( used: 0 % ) ",
        RUNNER.format(line=915, func="log_mem_status") + "method_allocator_planned:  64 bytes",
        RUNNER.format(line=950, func="log_mem_status") + "temp_allocator:            2097152",
        RUNNER.format(line=1262, func="main") + "Program complete, exiting.",
        RUNNER.format(line=1266, func="main") + "\x04",
        "",
        "Info: /OSCI/SystemC: Simulation stopped by user.",
    ]
)

FAIL_LOG = "\n".join(
    [
        RUNNER.format(line=1121, func="run_model") + "Starting running 1 inferences...",
        PERF.format(line=218) + "ethosu_pmu_cycle_cntr :  1342 (1342.00 per inference)",
        "E [executorch:arm_executor_runner.cpp:1046 verify_result()] Model output don't match expected "
        "BundleIO bpte ref data. rtol=0.010000 atol=0.010000",
        "E [executorch:arm_executor_runner.cpp:1050 verify_result()] TEST: BundleIO index[0] Test_result: FAIL",
        "E [executorch:arm_executor_runner.cpp:1052 verify_result()] Bundle verification failed with status 0x12",
        RUNNER.format(line=1143, func="run_model") + "Model run: 0",
        "F [executorch:arm_executor_runner.cpp:1260 main()] Problem running model",
    ]
)

# Ethos-U85 names seven counters (arm_perf_monitor.cpp).
U85_EVENTS = [
    "ETHOSU_PMU_SRAM_RD_DATA_BEAT_RECEIVED",
    "ETHOSU_PMU_SRAM_WR_DATA_BEAT_WRITTEN",
    "ETHOSU_PMU_EXT_RD_DATA_BEAT_RECEIVED",
    "ETHOSU_PMU_EXT_WR_DATA_BEAT_WRITTEN",
    "ETHOSU_PMU_NPU_IDLE",
    "ETHOSU_PMU_MAC_ACTIVE",
    "ETHOSU_PMU_WD_ACTIVE",
]
PMU_LOG_U85 = "\n".join(
    [PERF.format(line=218) + "ethosu_pmu_cycle_cntr :  90210 (90210.00 per inference)"]
    + [PERF.format(line=226) + f"ethosu_pmu_cntr{i} : {100 + i} ({100 + i}.00 per inference)" for i in range(7)]
    + [PERF.format(line=240) + "Ethos-U PMU Events:[" + ", ".join(U85_EVENTS) + "]"]
    + [PERF.format(line=241) + "ethosu_pmu_custom_cntr : 42 (42.00 per inference)"]
    + [RUNNER.format(line=1043, func="verify_result") + "TEST: BundleIO index[0] Test_result: PASS"]
    + [RUNNER.format(line=1262, func="main") + "Program complete, exiting."]
)


@pytest.fixture
def bpte(tmp_path):
    path = tmp_path / "model.bpte"
    path.write_bytes(b"\0\0\0\0BP08" + bytes(1024))
    return path


def _fake_fvp(directory: Path, name: str, script: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_corstone300_u55_128_command(bpte):
    corstone300 = load_platform("corstone300")
    argv = fvp_command(corstone300, "ethos-u55-128", "/opt/fvp/FVP_Corstone_SSE-300_Ethos-U55",
                       "/opt/runner/arm_executor_runner", bpte, 120)
    assert argv == [
        "/opt/fvp/FVP_Corstone_SSE-300_Ethos-U55",
        "-C", "ethosu.num_macs=128",
        "-C", "mps3_board.visualisation.disable-visualisation=1",
        "-C", "mps3_board.telnetterminal0.start_telnet=0",
        "-C", "mps3_board.uart0.out_file=-",
        "-C", "mps3_board.uart0.shutdown_on_eot=1",
        "-a", "/opt/runner/arm_executor_runner",
        "--data", f"{bpte}@0x38000000",
        "--timelimit", "120",
    ]


def test_corstone300_u65_256_command_uses_the_u65_fvp(bpte):
    corstone300 = load_platform("corstone300")
    argv = fvp_command(corstone300, "ethos-u65-256", "FVP_Corstone_SSE-300_Ethos-U65", "runner.elf", bpte, 60)
    assert argv[0] == "FVP_Corstone_SSE-300_Ethos-U65"
    assert argv[1:3] == ["-C", "ethosu.num_macs=256"]
    assert argv[argv.index("-a") + 1] == "runner.elf"
    assert argv[argv.index("--timelimit") + 1] == "60"
    assert argv[argv.index("--data") + 1] == f"{bpte}@0x38000000"


def test_corstone320_u85_256_command(bpte):
    corstone320 = load_platform("corstone320")
    argv = fvp_command(corstone320, "ethos-u85-256", "FVP_Corstone_SSE-320", "/r/arm_executor_runner", bpte, 300)
    assert argv == [
        "FVP_Corstone_SSE-320",
        "-C", "mps4_board.subsystem.ethosu.num_macs=256",
        "-C", "mps4_board.visualisation.disable-visualisation=1",
        "-C", "vis_hdlcd.disable_visualisation=1",
        "-C", "mps4_board.telnetterminal0.start_telnet=0",
        "-C", "mps4_board.uart0.out_file=-",
        "-C", "mps4_board.uart0.shutdown_on_eot=1",
        "-a", "/r/arm_executor_runner",
        "--data", f"{bpte}@0x38000000",
        "--timelimit", "300",
    ]


def test_paths_with_spaces_stay_one_argument(tmp_path):
    spaced = tmp_path / "my models" / "net.bpte"
    spaced.parent.mkdir()
    spaced.write_bytes(bytes(16))
    argv = fvp_command(load_platform("corstone320"), "ethos-u85-128", "FVP_Corstone_SSE-320",
                       "/my runner/arm_executor_runner", spaced, 10)
    assert "/my runner/arm_executor_runner" in argv
    assert f"{spaced}@0x38000000" in argv


def test_command_rejects_an_npu_the_platform_lacks(bpte):
    with pytest.raises(PlatformError, match="ethos-u85-256"):
        fvp_command(load_platform("corstone300"), "ethos-u85-256", "fvp", "elf", bpte, 10)


def test_bpte_larger_than_its_load_region_is_rejected(tmp_path):
    corstone300 = load_platform("corstone300")
    too_big = tmp_path / "big.bpte"
    with too_big.open("wb") as file:
        file.truncate(corstone300.memory("qspi_flash").size_bytes + 1)
    with pytest.raises(PlatformError, match="room for 8388608 bytes"):
        fvp_command(corstone300, "ethos-u55-128", "fvp", "elf", too_big, 10)


def test_pass_log_gives_a_pass_with_npu_and_cpu_cycles():
    result = parse_runner_log(PASS_LOG_U55)
    assert result.passed is True
    assert result.completed is True
    assert result.errors == ()
    assert result.fail_lines == ()
    assert [line.split("] ", 1)[1] for line in result.pass_lines] == [
        "Model output match expected BundleIO bpte ref data.",
        "TEST: BundleIO index[0] Test_result: PASS",
    ]
    assert result.cycles == 1342
    assert result.cpu_cycles == 7614
    assert result.summary() == "PASS, 1,342 NPU cycles"


def test_pass_log_pmu_counters_are_named_by_their_events():
    result = parse_runner_log(PASS_LOG_U55)
    assert result.pmu["ethosu_pmu_cycle_cntr"] == 1342
    assert result.pmu["cpu_wait_for_npu_cntr"] == 1626
    assert result.pmu["ethos-u:cycle_cnt"] == 2510
    assert dict(result.pmu_events) == {
        "ETHOSU_PMU_AXI0_RD_DATA_BEAT_RECEIVED": 18,
        "ETHOSU_PMU_AXI1_RD_DATA_BEAT_RECEIVED": 8,
        "ETHOSU_PMU_AXI0_WR_DATA_BEAT_WRITTEN": 12,
        "ETHOSU_PMU_NPU_IDLE": 1005,
    }
    assert "method_allocator_planned" not in result.pmu
    assert result.memory_bytes == {
        "model_pte_program_size": 3136,
        "method_allocator_used": 1364,
        "method_allocator_planned": 64,
        "temp_allocator": 2097152,
    }


def test_fail_log_gives_a_fail_with_the_lines_that_say_so():
    result = parse_runner_log(FAIL_LOG)
    assert result.passed is False
    assert result.pass_lines == ()
    assert len(result.fail_lines) == 3
    assert any("Test_result: FAIL" in line for line in result.fail_lines)
    assert any("Bundle verification failed" in line for line in result.fail_lines)
    assert result.errors == ("F [executorch:arm_executor_runner.cpp:1260 main()] Problem running model",)
    assert result.cycles == 1342
    assert result.summary().startswith("FAIL: ")


def test_u85_pmu_log_keeps_all_seven_events_and_unknown_counters():
    result = parse_runner_log(PMU_LOG_U85)
    assert result.passed is True
    assert result.cycles == 90210
    assert list(result.pmu_events) == U85_EVENTS
    assert result.pmu_events["ETHOSU_PMU_MAC_ACTIVE"] == 105
    assert result.pmu["ethosu_pmu_custom_cntr"] == 42


def test_plain_npu_and_cpu_cycle_lines_are_read():
    result = parse_runner_log("NPU cycles: 4321\nCPU cycles: 8765\nTest_result: PASS\n")
    assert (result.cycles, result.cpu_cycles, result.passed) == (4321, 8765, True)


def test_log_without_a_bundle_check_has_no_verdict():
    result = parse_runner_log(RUNNER.format(line=1262, func="main") + "Program complete, exiting.\n")
    assert result.passed is None
    assert result.completed is True
    assert result.summary().startswith("no verdict")


@pytest.mark.parametrize(
    "problem",
    [
        "Info: Simulation is stopping. Reason: CPU time has been exceeded.",
        "Hard fault. irq=-13, pc=0x10001234",
        "Error: FVP_Corstone_SSE-300_Ethos-U55: parameter 'ethosu.num_macs' out of range",
    ],
)
def test_simulation_problems_fail_even_after_a_pass(problem):
    result = parse_runner_log("Test_result: PASS\n" + problem + "\n")
    assert result.passed is False
    assert result.errors == (problem,)


def test_find_fvp_looks_in_orchestrate_fvp_dir_then_path(tmp_path, monkeypatch):
    corstone300 = load_platform("corstone300")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.delenv(fvp.FVP_DIR_ENV, raising=False)
    assert find_fvp(corstone300, "ethos-u55-128") is None

    on_path = _fake_fvp(tmp_path / "bin", "FVP_Corstone_SSE-300_Ethos-U55", "exit 0\n")
    assert find_fvp(corstone300, "ethos-u55-128", search_path=[tmp_path / "bin"]) == on_path
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    assert find_fvp(corstone300, "ethos-u55-128") == on_path
    assert find_fvp(corstone300, "ethos-u65-256") is None

    installed = _fake_fvp(tmp_path / "fvp" / "models" / "Linux64_GCC-9.3", "FVP_Corstone_SSE-300_Ethos-U55", "exit 0\n")
    monkeypatch.setenv(fvp.FVP_DIR_ENV, str(tmp_path / "fvp"))
    assert find_fvp(corstone300, "ethos-u55-128") == installed


def test_find_runner_elf_takes_the_option_then_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv(fvp.RUNNER_ELF_ENV, raising=False)
    assert find_runner_elf(None) is None
    elf = tmp_path / "arm_executor_runner"
    elf.write_bytes(b"\x7fELF")
    assert find_runner_elf(str(elf)) == elf
    monkeypatch.setenv(fvp.RUNNER_ELF_ENV, str(elf))
    assert find_runner_elf(None) == elf
    with pytest.raises(FileNotFoundError, match="missing.elf"):
        find_runner_elf(str(tmp_path / "missing.elf"))


def test_run_fvp_reads_the_log_of_the_process(tmp_path):
    log = tmp_path / "log.txt"
    log.write_text(PASS_LOG_U55)
    fake = _fake_fvp(tmp_path, "FVP_fake", f'cat "{log}"\n')
    result = run_fvp([str(fake), "-a", "elf"], timeout_s=30)
    assert result.passed is True
    assert result.cycles == 1342


def test_run_fvp_reports_a_nonzero_exit_as_an_error(tmp_path):
    fake = _fake_fvp(tmp_path, "FVP_fake", 'echo "Test_result: PASS"\nexit 3\n')
    result = run_fvp([str(fake)], timeout_s=30)
    assert result.passed is False
    assert result.errors == ("FVP exited with code 3",)


def test_run_fvp_kills_an_fvp_that_outlives_its_time_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(fvp, "_EXIT_GRACE_S", 0)
    fake = _fake_fvp(tmp_path, "FVP_fake", "echo started\nexec sleep 30\n")
    result = run_fvp([str(fake)], timeout_s=1)
    assert result.passed is False
    assert "killed" in result.errors[-1]


def test_missing_fvp_is_reported_as_not_run(tmp_path, bpte, monkeypatch):
    with pytest.raises(FvpNotFound) as raised:
        run_fvp([str(tmp_path / "FVP_Corstone_SSE-320")], timeout_s=10)
    assert str(raised.value).startswith("not run: no FVP found")
    from orchestrator.errors import as_orchestrate_error

    assert as_orchestrate_error(raised.value).exit_code == 5  # the CLI's "not run"

    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.delenv(fvp.FVP_DIR_ENV, raising=False)
    with pytest.raises(FvpNotFound, match="FVP_Corstone_SSE-320"):
        run_bpte(load_platform("corstone320"), "ethos-u85-256", bpte, runner_elf=None)


def _any_installed_fvp():
    for name in ("corstone300", "corstone320"):
        platform = load_platform(name)
        for npu in platform.npu_options:
            binary = find_fvp(platform, npu)
            if binary is not None:
                return platform, npu, binary
    return None


@pytest.mark.fvp
def test_installed_fvp_starts(bpte):
    found = _any_installed_fvp()
    if found is None:
        pytest.skip("not run: no FVP found")
    platform, npu, binary = found
    elf = find_runner_elf(None)
    if elf is None:
        # Without a runner we can only show the FVP starts and is the model we expect.
        completed = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=120)
        assert completed.returncode == 0, completed.stderr
        assert completed.stdout.strip()
        return
    result = run_fvp(fvp_command(platform, npu, binary, elf, bpte, 120), 120)
    # The fixture's .bpte is a header and zeros, no program: the runner must fail loudly.
    assert result.passed is False
    assert result.errors
