"""`orchestrate sweep`: one model planned for several NPU configurations, side by side."""

from __future__ import annotations

import json

from orchestrator.cli import main


def test_sweep_compares_npu_sizes_with_velas_cycles(capsys):
    code = main(["sweep", "mixed", "--npus", "ethos-u55-32,ethos-u55-128,none", "--format", "json"])
    assert code == 0
    rows = {r["npu"]: r for r in json.loads(capsys.readouterr().out)}
    assert set(rows) == {"ethos-u55-32", "ethos-u55-128", "none"}
    small, large, cpu = rows["ethos-u55-32"], rows["ethos-u55-128"], rows["none"]
    # Same placement, four times the MACs: Vela schedules the partitions in fewer cycles.
    assert small["npu_mac_coverage_pct"] == large["npu_mac_coverage_pct"] > 50.0
    assert small["npu_partitions"] == large["npu_partitions"] > 0
    assert large["npu_cycles"] < small["npu_cycles"]
    assert cpu["npu_partitions"] == 0 and cpu["npu_cycles"] == 0
    assert "vela" in large["latency_source"] and "vela" not in cpu["latency_source"]


def test_sweep_rejects_an_npu_the_platform_lacks(capsys):
    assert main(["sweep", "ds-cnn", "--npus", "ethos-u85-256"]) == 2
    assert "ethos-u85-256" in capsys.readouterr().err


def test_a_parallel_sweep_of_several_models_equals_the_serial_one():
    from orchestrator.request import Request
    from orchestrator.sweeps.local import sweep_jobs

    jobs = [Request(model, npu=npu)
            for model, npu in (("mixed", "ethos-u55-64"), ("deep-autoencoder", "none"))]
    parallel = sweep_jobs(jobs, workers=2)
    serial = sweep_jobs(jobs, workers=1)
    assert parallel == serial
    assert [(r.model, r.npu) for r in parallel] == [("mixed", "ethos-u55-64"),
                                                    ("deep-autoencoder", "none")]


def test_sweep_takes_more_models_and_refuses_a_bad_one_before_compiling(capsys):
    assert main(["sweep", "ds-cnn", "--models", "no-such-model", "--npus", "none"]) == 2
    assert "unknown model 'no-such-model'" in capsys.readouterr().err
