"""orchestrate: one ExecuTorch .pte for a Cortex-M + Ethos-U microcontroller, every op placed.

The Python API (orchestrator/api.py) has a function for every `orchestrate` command; the CLI
parses, calls one and prints what it returns:

    plan(model, **target)          where every op runs and why, with costs and memory: a Plan
    compile(model, output)         the .pte and its artifacts folder: a CompileResult
    write_program(plan, output)    a planned program written as compile writes it
    check_gates(plan, ...)         plan's CI gates: raises GateFailure (exit 3)
    verify(pte)                    the host twin alone, op by op: a VerifyReport
    verify_all(pte, method)        every method (twin, host runtime, QEMU, FVP; --profile): a Verification
    evaluate(pte, dataset)         accuracy on a labelled set by every method (verify --dataset)
    layer_errors(pte)              quantization error per layer, worst first (--per-layer-error)
    sweep(requests)                one model planned for many targets: a row each
    size(pte)                      where every byte of a .pte goes: a SizeReport
    firmware_project(pte, output)  a firmware project (built, run on QEMU): a FirmwareProject
    firmware_size(folder)          flash and RAM of a built firmware per component: a FirmwareSize
    compare(tflite, **target)      ours against the incumbent (vela + TFLM) on QEMU: a Comparison
    measure(program, profile)      a measured profile beside the plan: a MeasuredPlan
    calibrate(profiles, cpu)       the CPU cost model fitted to profiles: a Calibrated
    source_trees()                 the third-party source trees native builds use: Sources
    fetch_sources(mirrors)         clone the pinned source trees into the cache
    doctor()                       what this machine can verify and build: a MachineReport
    known()                        zoo models, platforms and CPUs (`orchestrate list`): Known
    reasons()                      every placement reason a plan can give, as Markdown
    cache(clear=False)             the cache folders and their sizes: CacheFolders

Errors are orchestrator.errors.OrchestrateError subclasses, each with the CLI's exit code.
"""

import importlib.util as _importlib_util
import os as _os
import sys as _sys
from pathlib import Path as _Path

# The packages installed beside this one (the project's top-level layout). Another
# distribution's package of the same name earlier on the path would be imported in its place:
# say which, once, before any of them is imported.
_SIBLINGS = ("kernels", "platforms", "partitioners", "cost_models", "npu_driver", "examples")


def _shadowing_package() -> str | None:
    home = _Path(__file__).resolve().parent.parent
    for name in _SIBLINGS:
        spec = _importlib_util.find_spec(name)
        places = ([_Path(spec.origin).parent] if spec is not None and spec.origin else
                  [_Path(p) for p in (spec.submodule_search_locations or ())] if spec else [])
        if not any(place.resolve().parent == home for place in places):
            found = ", ".join(str(place) for place in places) or "nowhere"
            return (f"orchestrate's package '{name}' is not the one Python imports ({found}, "
                    f"not beside {home / 'orchestrator'}): another distribution or folder "
                    f"named '{name}' comes first on the path; install orchestrate in a virtual "
                    "environment of its own or remove that folder from PYTHONPATH")
    return None


_shadowed = _shadowing_package()
if _shadowed is not None:
    if _Path(_sys.argv[0]).name == "orchestrate":  # the command: one line, exit 2
        print(f"orchestrate: error: {_shadowed}", file=_sys.stderr)
        raise SystemExit(2)
    raise ImportError(_shadowed)

from kernels.cache_root import cache_root as _cache_root  # noqa: E402 - after the check above
from orchestrator import numerics as _numerics

# Before anything imports torch: the float kernels it picks decide calibration results.
_numerics.pin()
# torch makes its compile-cache folder (torchinductor_<user>) in the temporary folder as it
# loads; under orchestrate's cache root instead, a compile leaves nothing in $TMPDIR, and one
# stopped by a signal neither (the user's own TORCHINDUCTOR_CACHE_DIR is kept).
_os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(_cache_root() / "torchinductor"))

from orchestrator.api import (  # noqa: E402,A004
    CompileResult, cache, calibrate, check_gates, compare, compile, doctor, evaluate,
    fetch_sources, firmware_project, firmware_size, known, layer_errors, measure, plan, reasons,
    size, source_trees, sweep, verify, verify_all, write_program)

__all__ = ["CompileResult", "cache", "calibrate", "check_gates", "compare", "compile", "doctor",
           "evaluate", "fetch_sources", "firmware_project", "firmware_size", "known",
           "layer_errors", "measure", "plan", "reasons", "size", "source_trees", "sweep", "verify",
           "verify_all", "write_program"]
