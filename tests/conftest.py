"""Shared, session-scoped compiles: each (model, target) is compiled once for the whole run."""

from __future__ import annotations

import warnings

import pytest

import orchestrator  # noqa: F401 - pins host numerics before torch is imported

warnings.filterwarnings("ignore")


class CompileCache:
    def __init__(self, tmp_factory):
        self._cache = {}
        self._tmp = tmp_factory

    def get(self, model: str, platform: str = "corstone300", npu: str | None = None,
            cpu: str | None = None, io: str = "float", write: bool = False):
        """(Compiled, pte_path or None); `npu='none'` for CPU-only.

        Keyed by the resolved target, so `npu=None` and the platform's default NPU, or `cpu=None`
        and the platform's default core, share one compile."""
        from examples import zoo
        from orchestrator.artifacts.outputs import write_outputs
        from orchestrator.compilation.pipeline import compile_model
        from orchestrator.sources.loader import load_calibration, load_model
        from orchestrator.target import resolve_target

        target = resolve_target(platform, npu=npu, cpu=cpu, io=io)
        zoo_entry = zoo.lookup(model)
        key = (zoo_entry.name if zoo_entry else model, str(target.platform.source_file or platform),
               target.npu, target.cpu, target.io)
        if key not in self._cache:
            loaded = load_model(model)
            compiled = compile_model(loaded, load_calibration(None, loaded.example_inputs), target)
            self._cache[key] = [compiled, None]
        entry = self._cache[key]
        if write and entry[1] is None:
            stem = f"{key[0]}_{target.npu or 'cpu'}_{target.cpu}_{io}".replace("/", "_")[-80:]
            out = self._tmp.mktemp("pte") / f"{stem}.pte"
            write_outputs(entry[0], out)
            entry[1] = out
        return entry[0], entry[1]


@pytest.fixture(scope="session", autouse=True)
def _session_cache(tmp_path_factory):
    """A fresh capture/quantization cache per test session (orchestrator/artifacts/cache.py): shared by
    the session's compiles (and by every pytest-xdist worker of the session: their base temp
    folders are siblings), never by a user's own cache or an earlier run. Entries are written
    to a temporary folder and renamed, so workers racing on one key leave one whole entry."""
    import os

    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    cache = base / "orchestrate-cache"
    cache.mkdir(parents=True, exist_ok=True)
    os.environ["ORCHESTRATE_CACHE"] = str(cache)


@pytest.fixture(scope="session")
def compiles(tmp_path_factory) -> CompileCache:
    return CompileCache(tmp_path_factory)


@pytest.fixture(scope="session")
def ds_cnn_cpu(compiles):
    """DS-CNN compiled CPU-only for the Cortex-M55, written: its .pte path."""
    return compiles.get("ds-cnn", "corstone300", "none", "cortex-m55", write=True)[1]


@pytest.fixture(scope="session")
def ds_cnn_profile(ds_cnn_cpu, tmp_path_factory):
    """(the .etdp of ds_cnn_cpu, what `verify --qemu --profile` printed): one QEMU profile per
    session (tests/test_profile.py, tests/test_calibrate.py)."""
    import io
    from contextlib import redirect_stderr, redirect_stdout

    from orchestrator.cli import main
    from tests.device_tools import qemu_or_missing

    qemu_or_missing()
    etdp = tmp_path_factory.mktemp("profile") / "ds_cnn.etdp"
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(["verify", str(ds_cnn_cpu), "--qemu", "--profile", "--profile-out", str(etdp)])
    assert code == 0, out.getvalue() + err.getvalue()
    return etdp, out.getvalue()


# Run order and worker groups. pytest-xdist runs with `--dist loadfile --no-loadscope-reorder`
# (a file per worker, in the order below rather than by test count), and
# the scheduler below makes one unit of the files in SHARED_COMPILES, so they run on one worker
# and its session `compiles` fixture compiles each (model, target) they have in common once
# (ds-cnn and mixed on U55-128, U85 and the M55, ds-cnn on the M33, the deep autoencoder, the
# person detector on the example SoC: about a minute of compiles both workers would otherwise
# do). The no-compile unit files run first (a
# broken catalogue, adapter or platform file fails within seconds), then the units that take
# longest (worker seconds from `--durations=0`), so the workers end together rather than one
# idling while the other runs a long file that happened to sort last.
SHARED_COMPILES = ("test_compile.py", "test_plan.py", "test_verify_zoo.py", "test_twin.py",
                   "test_memory_placement.py", "test_host_runtime.py", "test_bad_inputs.py",
                   "test_size.py", "test_plan_readable.py",
                   "test_golden.py", "test_arena_bound.py")
# Files whose tests share nothing but the on-disk caches: every test is a unit of its own.
PER_TEST_UNITS = ("test_qemu_families.py", "test_peer_symptoms.py")
_UNIT_FIRST = ("test_architecture.py", "test_upstream_adapters.py", "test_platforms.py",
               "test_cost_cpu.py", "test_local_check.py")
_LONGEST_FIRST = (*SHARED_COMPILES, "test_qemu_families.py", "test_firmware.py", "test_wheel.py", "test_sweep.py", "test_device_code.py", "test_program_state.py",
                  "test_user_models.py",
                  "test_qemu.py", "test_qemu_tiers.py", "test_files_are_data.py",
                  "test_sweep_ray.py", "test_policy.py")


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(_UNIT_FIRST + _LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable within a file


def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile`, with the SHARED_COMPILES files as one unit. (xdist's own
    `--dist loadgroup` does not group under pytest 9: it renames `Item._nodeid`, which pytest 9
    no longer reads.)"""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedCompilesScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            file = nodeid.split("::", 1)[0]
            name = file.rsplit("/", 1)[-1]
            if name in PER_TEST_UNITS:  # each test compiles its own program: spread them
                return nodeid
            return "shared-compiles" if name in SHARED_COMPILES else file

    return SharedCompilesScheduling(config, log)
