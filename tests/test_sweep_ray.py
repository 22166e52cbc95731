"""`sweep --executor ray[:ADDRESS]`: the rows of a local sweep, computed by tasks on a Ray cluster.

The cluster is real: a head started with `ray start --head --num-cpus 2` on this machine (its own
temp dir and port, stopped after the module by signalling only the processes it started), joined
by address, so the tests go through `ray:ADDRESS` as a user's sweep does.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.errors import UserError
from orchestrator.request import Request
from orchestrator.sweeps.local import run_job, sweep_jobs

# Two configurations with different quantizers (Ethos-U55's, CortexMQuantizer): one each for
# the cluster's two CPUs, and two cache entries. Cold on Ray then warm locally: about 30 s here.
NPUS = ("ethos-u55-128", "none")


def _jobs(model: str = "mixed", npus=NPUS) -> list[Request]:
    return [Request(model, npu=npu)
            for npu in npus]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ray_installed() -> None:
    try:
        import ray  # noqa: F401
    except ImportError:
        pytest.skip("not run: Ray not installed (pip install 'orchestrate[ray]')")


@pytest.fixture(scope="module")
def ray_address(ray_installed):
    """HOST:PORT of a two-CPU Ray head running on this machine for this module."""
    # Ray's unix sockets live under --temp-dir and must stay under 108 bytes: a short /tmp path.
    temp_dir = tempfile.mkdtemp(prefix="orch-ray-", dir="/tmp")
    port = _free_port()
    log = Path(temp_dir) / "ray-start.log"
    ray_cli = Path(sys.executable).with_name("ray")
    with log.open("wb") as out:
        # --block keeps `ray start` in the foreground as the parent of every Ray process it
        # starts; a session of its own lets teardown signal exactly those processes.
        head = subprocess.Popen(
            [str(ray_cli), "start", "--head", "--block", "--num-cpus", "2", "--port", str(port),
             "--temp-dir", temp_dir, "--include-dashboard", "false", "--disable-usage-stats"],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while "Ray runtime started" not in log.read_text(errors="replace"):
            if head.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"ray start --head did not start:\n{log.read_text()[-2000:]}")
            time.sleep(0.2)
        yield f"127.0.0.1:{port}"
    finally:
        import ray

        ray.shutdown()
        _stop(head)
        shutil.rmtree(temp_dir, ignore_errors=True)


def _stop(head: subprocess.Popen) -> None:
    """SIGTERM to the head's process group (gcs_server, raylet, workers), SIGKILL after 20 s."""
    for sig, wait_seconds in ((signal.SIGTERM, 20), (signal.SIGKILL, 5)):
        try:
            os.killpg(head.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_seconds
        head.poll()
        while time.monotonic() < deadline:
            try:
                os.killpg(head.pid, 0)
            except ProcessLookupError:
                head.poll()
                return
            head.poll()  # reap the group leader so an exited group reads as gone
            time.sleep(0.2)


def test_a_ray_sweep_gives_the_local_rows_and_fills_the_shared_cache(ray_address, tmp_path,
                                                                      monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("ORCHESTRATE_CACHE", str(cache))
    heard = []
    on_ray = sweep_jobs(_jobs(), progress=lambda label, event, s: heard.append((label, event)),
                        executor=f"ray:{ray_address}")
    # The Ray workers wrote this process's cache: one entry per quantizer.
    entries = [e for e in (cache / "quantized").iterdir() if not e.name.startswith(".")]
    assert len(entries) == 2
    local = sweep_jobs(_jobs(), workers=1)
    assert on_ray == local
    assert [(r.model, r.npu) for r in on_ray] == [("mixed", npu) for npu in NPUS]
    assert sorted(heard) == sorted((f"mixed on {npu}", "done") for npu in NPUS)


def test_a_ray_worker_computes_with_the_pinned_host_numerics(ray_address):
    import ray

    from orchestrator import numerics
    from orchestrator.sweeps.ray_executor import worker_env

    ray.init(address=ray_address, log_to_driver=False)
    try:
        state = ray.get(ray.remote(numerics.state)
                        .options(runtime_env={"env_vars": worker_env()}).remote())
    finally:
        ray.shutdown()
    assert state["pinned_before_torch_import"] and state["reproducible"]
    assert state["settings"] == numerics.SETTINGS
    assert state["aten_cpu_capability"] == "AVX2"


def test_a_bad_model_in_a_ray_worker_is_the_user_error_a_local_run_gives(ray_address):
    job = Request("no-such-model", npu="none")
    with pytest.raises(UserError) as local:
        run_job(job)
    with pytest.raises(UserError) as on_ray:
        sweep_jobs([job], executor=f"ray:{ray_address}")
    assert type(on_ray.value) is type(local.value)
    assert str(on_ray.value) == str(local.value)
    assert "unknown model 'no-such-model'" in str(on_ray.value)


def test_an_address_where_no_cluster_answers_is_one_line_exit_2(ray_installed, capsys):
    port = _free_port()  # nothing listens there
    code = main(["sweep", "mixed", "--npus", "none", "--executor", f"ray:127.0.0.1:{port}"])
    errors = [line for line in capsys.readouterr().err.splitlines()
              if line.startswith("orchestrate:")]
    assert code == 2
    assert len(errors) == 1
    assert errors[0].startswith(f"orchestrate: error: no Ray cluster answers at 127.0.0.1:{port}")


def test_an_unknown_executor_is_refused_naming_the_accepted_ones_before_compiling(capsys):
    code = main(["sweep", "mixed", "--npus", "none", "--executor", "dask"])
    assert code == 2
    # One line, and before the model was even loaded (no calibration warning).
    assert capsys.readouterr().err == (
        "orchestrate: error: --executor 'dask' is not one of local, ray or ray:ADDRESS "
        "(e.g. ray:auto, ray:10.0.0.1:6379)\n")


def test_a_ray_sweep_without_ray_installed_says_how_to_install_it(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    assert main(["sweep", "mixed", "--npus", "none", "--executor", "ray"]) == 2
    assert capsys.readouterr().err == (
        "orchestrate: error: sweep --executor ray needs Ray: pip install 'orchestrate[ray]'\n")
    with pytest.raises(UserError, match=r"pip install 'orchestrate\[ray\]'"):
        sweep_jobs(_jobs(), executor="ray:auto")
