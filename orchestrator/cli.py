"""`orchestrate`: a thin shell over the Python API (plan, compile, sweep, verify, size).

Each command parses its arguments (orchestrator/cli_parser.py: the options as data), calls the
API (orchestrator/api.py) and prints what it returns: progress lines, reports, one-line errors.
Exit codes: 0 ok, 1 internal error, 2 user error (one clear line), 3 gate failed,
4 verification failed, 5 a requested check could not run (e.g. no FVP).
"""

from __future__ import annotations

import atexit
import json
import os
import sys
from pathlib import Path

from orchestrator import api, termination
from orchestrator.artifacts.files import (atomic_write_bytes, check_output_file, check_outputs,
                                          same_path)
from orchestrator.artifacts.manifest import artifacts_dir_for
from orchestrator.artifacts.profile import read_profile
from orchestrator.cli_parser import build_parser
from orchestrator.cli_progress import SweepProgress, progress_of
from orchestrator.errors import (GateFailure, NotRun, OrchestrateError, UserError,
                                 VerificationFailure, as_orchestrate_error)
from orchestrator.logs import quiet_upstream
from orchestrator.reports.html import render_sweep_html
from orchestrator.request import Request, load_policy_arg, memory_policy
from orchestrator.results import method_report
from orchestrator.sources.specs import model_spec
from orchestrator.target import resolve_target
from platforms.memory_placement import arena_bound_bytes
from platforms.platform import PlatformError, load_platform

__all__ = ["build_parser", "main"]


def _request(args, npu: str | None = None, model: str | None = None,
             runner_ops: set[str] | None = None) -> Request:
    """The Request the target options describe (`npu`/`model` override, for a sweep's jobs)."""
    return Request(model or args.model, platform=args.platform, npu=npu or args.npu,
                   cpu=args.cpu, io=args.io, calibration=args.calibration,
                   calibration_method=args.calibration_method,
                   precision=_given_precision(args), cpu_hz=args.cpu_hz,
                   npu_hz=args.npu_hz, policy=args.policy,
                   placement=getattr(args, "placement", None),
                   memory_policy=args.memory_policy,
                   runner_ops=frozenset(runner_ops) if runner_ops is not None else None,
                   calibration_costs=args.calibration_costs)


def _given_precision(args) -> str | None:
    """--precision as Request takes it: `auto` is the search's, not a module map."""
    given = getattr(args, "precision", None)
    if given is None or given.strip().lower() != "auto":
        return given
    if args.command not in ("plan", "compile"):
        raise UserError(f"--precision auto searches one program under a budget: use it with "
                        f"`orchestrate plan` or `compile` (--dataset, --min-snr or "
                        f"--max-accuracy-drop), not `{args.command}`; give modules instead "
                        "(--precision MODULE=a16w8,...)")
    return None


def _plan(args, runner_ops=None):
    """Compile and plan as the options say (policy, placement, progress); the Plan. With
    --precision auto, the search's table goes to stdout (compile) or stderr (plan)."""
    plan, found = _planned(args, runner_ops)
    if found is not None:
        print(found.render_text(), file=sys.stdout if args.command == "compile" else sys.stderr)
    return plan


def _planned(args, runner_ops=None):
    """(the Plan, the PrecisionSearch that chose it under --precision auto, else None)."""
    progress = progress_of(args)
    auto = (getattr(args, "precision", None) or "").strip().lower() == "auto"
    if not auto and any(getattr(args, name, None) is not None
                        for name in ("dataset", "min_snr", "max_accuracy_drop")):
        raise UserError("--dataset, --min-snr and --max-accuracy-drop are --precision auto's "
                        "validation set and budget; add --precision auto (or measure a "
                        "compiled program with `orchestrate verify PTE --dataset`)")
    found = None
    try:
        if auto:
            labels = None if args.labels.lower() == "none" else args.labels
            found = api.precision_auto(_request(args, runner_ops=runner_ops), args.dataset,
                                       labels, args.min_snr, args.max_accuracy_drop,
                                       progress=progress)
            plan = found.plan
        else:
            plan = api.plan(_request(args, runner_ops=runner_ops), progress=progress)
    finally:
        progress.finish()
    calibration = plan.compiled.calibration
    if calibration.warning and args.command == "compile":
        print(f"warning: {calibration.warning}", file=sys.stderr)
    return plan, found


def _print_cost_placement(plan, stream) -> None:
    if plan.cost_placement is None:
        return
    print("cost placement (--placement cost; every figure an estimate, sources in brackets):",
          file=stream)
    for line in plan.cost_placement.report_lines():
        print(f"  {line}", file=stream)


def _inputs(args) -> list[tuple[str, Path]]:
    """The files and folders a command reads, which no output may overwrite."""
    found = []
    model = getattr(args, "model", None)
    if model:
        file_part, sep, attribute = model.rpartition(":")
        found.append(("the model file", Path(file_part if sep and file_part.endswith(".py")
                                             else model)))
    found += [(what, Path(value)) for what, value in (
        ("the calibration data", getattr(args, "calibration", None)),
        ("the --runner-ops file", getattr(args, "runner_ops", None)),
        ("the --calibration-costs file", getattr(args, "calibration_costs", None)),
        ("the platform YAML", getattr(args, "platform", None))) if value]
    return [(what, path) for what, path in found if path.exists()]


def _check_outputs(args, report: str | None = None, pte: str | None = None,
                   pte_option: str = "-o", bundle: bool = False) -> None:
    """Fail before compiling, not after, when an output cannot be written or would overwrite an
    input, another output or something this tool did not write."""
    outputs: list[tuple[str, Path]] = []
    if report:
        check_output_file(Path(report), "-o")
        outputs.append(("-o", Path(report)))
    if pte:
        check_outputs(Path(pte), pte_option)
        outputs += [(pte_option, Path(pte)), (pte_option, artifacts_dir_for(Path(pte)))]
        if bundle:
            bpte = Path(pte).with_suffix(".bpte")
            check_output_file(bpte, "--bundle")
            outputs.append(("--bundle", bpte))
    inputs = _inputs(args)
    for position, (option, output) in enumerate(outputs):
        for what, path in inputs:
            if same_path(output, path):
                raise UserError(f"{option} '{output}' is {what}; writing there would overwrite "
                                f"it; choose another {option}")
            if _inside(path, output):
                raise UserError(f"{option} '{output}' would replace a folder holding {what} "
                                f"('{path}'); choose another {option}")
        for other_option, other in outputs[position + 1:]:
            if same_path(output, other) or _inside(other, output) or _inside(output, other):
                raise UserError(f"{option} '{output}' and {other_option} '{other}' would "
                                f"overwrite each other; give them different paths")


def _inside(path: Path, folder: Path) -> bool:
    """Whether `path` lies inside `folder` (both resolved; neither need exist)."""
    return Path(os.path.abspath(folder)) in Path(os.path.abspath(path)).parents


def cmd_plan(args) -> int:
    args.format = _plan_format(args.format, args.output)
    if args.measured:
        return _plan_measured(args)
    if args.firmware and args.model.endswith(".pte"):
        return _plan_firmware_of_pte(args)
    if args.model.endswith(".pte"):
        raise UserError(f"'{args.model}' is a compiled program: its plan is in its artifacts "
                        "folder (plan.json, report.html); give the model to plan it again, or "
                        "--measured FILE.etdp to see a profile beside its plan")
    _check_outputs(args, report=args.output, pte=args.pte, pte_option="--pte")
    _request_first(args)
    from orchestrator.reports.coverage import (  # lazy: heavy (torch, executorch, vela)
        render_json, render_markdown)
    from orchestrator.reports.summary import read_runner_ops  # lazy: heavy (torch)

    _policy_first(args)
    runner_ops = read_runner_ops(args.runner_ops) if args.runner_ops else None
    if args.firmware:
        if args.format not in ("table", "json"):
            raise UserError(f"--firmware shows a table or JSON, not {args.format}; use --format "
                            "table or json")
        api.firmware_size(args.firmware)  # an unreadable build is refused before compiling
    plan, found = _planned(args, runner_ops)
    compiled = plan.compiled
    firmware = (api.firmware_size(args.firmware, pte_bytes=compiled.pte_bytes)
                if args.firmware else None)
    if args.format == "html":
        text = plan.to_html()
    elif args.format == "model-explorer":
        from orchestrator.reports.explorer import render_node_data  # lazy: heavy (torch)

        text = render_node_data(plan)
    elif args.format == "table":
        text = plan.to_text(all_rows=args.all_rows)
        if firmware is not None:
            text += "\n" + "\n".join(firmware.plan_lines())
        if found is not None:  # which modules went int16, and why, before the plan
            text = found.render_text() + "\n\n" + text
    else:
        render = {"json": render_json, "markdown": render_markdown}[args.format]
        text = render(compiled, plan.rows, plan.summary)
        if firmware is not None or (found is not None and args.format == "json"):
            as_json = json.loads(text)
            if firmware is not None:
                as_json["summary"]["firmware"] = firmware.plan_json()
            if found is not None:
                as_json["precision_search"] = found.to_json()
            text = json.dumps(as_json, indent=2)
    if found is not None and args.format not in ("table", "json"):
        print(found.render_text(), file=sys.stderr)
    if args.output:
        atomic_write_bytes(Path(args.output),
                           (text + ("\n" if not text.endswith("\n") else "")).encode())
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        print(text)
    _print_cost_placement(plan, sys.stdout if not args.output and args.format == "table"
                          else sys.stderr)
    if args.pte:  # the same refusals as `compile` (it wrote such programs)
        api.write_program(plan, args.pte)
    api.check_gates(plan, args.fail_under_npu_coverage, args.max_partitions, args.require_fit,
                    runner_ops is not None, args.require_runnable)
    return 0


def _plan_firmware_of_pte(args) -> int:
    """`plan PROGRAM.pte --firmware DIR`: the build's figures, checked against that program."""
    pte = Path(args.model)
    if not pte.is_file():
        raise UserError(f"'{args.model}' not found; give a .pte written by `orchestrate compile`")
    firmware = api.firmware_size(args.firmware, pte_bytes=pte.read_bytes())
    print(json.dumps({"firmware": firmware.plan_json()}, indent=2) if args.format == "json"
          else "\n".join(firmware.plan_lines()))
    return 0


# Options that describe a compile: with a compiled .pte and --measured, its plan is the one
# compile wrote, so they would change nothing (name: the value that means "not given").
_COMPILE_OPTIONS = {"npu": None, "cpu": None, "calibration": None,
                    "calibration_method": "histogram", "precision": None, "cpu_hz": None,
                    "npu_hz": None, "policy": None, "placement": None, "pte": None,
                    "runner_ops": None, "fail_under_npu_coverage": None, "max_partitions": None,
                    "require_fit": False, "require_runnable": False, "io": "float",
                    "memory_policy": "auto", "platform": "corstone300", "all_rows": False}


def _plan_measured(args) -> int:
    """`plan MODEL_OR_PTE --measured FILE.etdp`: the profile beside the plan, as a table or
    plan.json with `measured` blocks."""
    if args.format not in ("table", "json"):
        raise UserError(f"--measured shows a table or JSON, not {args.format}; use --format "
                        "table or json (or an -o ending in .json)")
    _check_outputs(args, report=args.output)
    if args.output and same_path(Path(args.output), Path(args.measured)):
        raise UserError(f"-o '{args.output}' is the --measured profile; writing there would "
                        "overwrite it; choose another -o")
    if args.model.endswith(".pte"):
        given = [f"--{name.replace('_', '-')}" for name, unset in _COMPILE_OPTIONS.items()
                 if getattr(args, name) != unset]
        if given:
            raise UserError(f"{', '.join(given)} {'describe' if len(given) > 1 else 'describes'}"
                            " a compile; with a compiled .pte the plan is the one `compile` "
                            "wrote: drop them, or give the model")
        measured = api.measure(args.model, args.measured,
                               calibration_costs=args.calibration_costs)
    else:
        read_profile(args.measured)  # an unreadable profile is refused before compiling
        _policy_first(args)
        measured = api.measure(_plan(args), args.measured)
    if args.format == "json":
        text = json.dumps(measured.to_json(), indent=2)
    else:
        text = measured.to_text()
    if args.output:
        atomic_write_bytes(Path(args.output), (text + "\n").encode())
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        print(text)
    return 0


_FORMAT_OF_SUFFIX = {".json": "json", ".md": "markdown", ".markdown": "markdown",
                     ".html": "html", ".htm": "html"}


def _plan_format(given: str | None, output: str | None) -> str:
    return _report_format(given, output, ("table", "json", "markdown", "html", "model-explorer"))


def _report_format(given: str | None, output: str | None, offered: tuple[str, ...]) -> str:
    """The report format: --format, else the one -o's extension names, else the table. A
    --format that contradicts the extension (`-o plan.html --format json`), or an extension
    naming a format the command does not write, is refused."""
    implied = _FORMAT_OF_SUFFIX.get(Path(output).suffix.lower()) if output else None
    if implied and implied not in offered and not given:
        raise UserError(f"-o {output} names a {implied} file, which this command does not "
                        f"write; use {', '.join(offered)} (--format, or a matching extension)")
    if given and implied and given != implied and not (given == "model-explorer"
                                                      and implied == "json"):
        raise UserError(f"-o {output} names a {implied} file but --format is {given}; drop "
                        f"--format or use a matching extension")
    return given or implied or "table"


def _request_first(args, models: list[str] | None = None) -> None:
    """The model spec(s) and the target, checked before anything heavy is imported: a typo in
    a name, a path or --platform/--npu/--cpu is answered at once (orchestrator/sources/specs.py,
    orchestrator/target.py read no torch)."""
    for model in models or [args.model]:
        model_spec(model)
    npus = [args.npu] if not getattr(args, "npus", None) else \
        [npu.strip() for npu in args.npus.split(",") if npu.strip()]
    for npu in npus:
        resolve_target(args.platform, npu=npu, cpu=args.cpu, io=args.io)


def _policy_first(args) -> None:
    """A bad policy file is refused before anything compiles."""
    if getattr(args, "policy", None):
        load_policy_arg(args.policy)


def cmd_compile(args) -> int:
    _check_outputs(args, pte=args.output, bundle=args.bundle)
    _request_first(args)
    _policy_first(args)
    plan = _plan(args)
    if args.require_fit:  # refused before anything is written
        api.check_gates(plan, None, None, True)
    written = api.write_program(plan, args.output, bundle=args.bundle)
    compiled, art = plan.compiled, written.artifacts
    s = plan.summary
    bound = arena_bound_bytes(compiled.arenas)
    arena = ("(planned)" if bound is None else
             f"(planned; lower bound {bound:,} B from lifetimes)")
    print(f"wrote {args.output}: {len(compiled.pte_bytes):,} B, arena {compiled.arena_bytes:,} B "
          f"{arena}; NPU partitions {s.npu_partitions}, NPU MAC coverage "
          f"{s.npu_mac_coverage_pct:.1f}%; artifacts in {art}")
    for line in io_quantization_lines(compiled.io_quant):
        print(line)
    view = compiled.program_view
    if view.state_values:  # a streaming model's buffers (docs/streaming.md)
        print(f"state: {view.state_bytes:,} B in {len(view.state_values)} buffer(s) carried from "
              "one run to the next, from their initial values in the .pte (plan.json "
              "summary.memory.state)")
    _print_cost_placement(plan, sys.stdout)
    for fault in s.device_faults:
        print(f"warning: the device runtime cannot run this program: {fault}", file=sys.stderr)
    if not s.fits:  # the plan's memory verdict (coverage.py), said where a compile is read
        too_big = "; ".join(f"{m.item} {m.bytes:,} B -> " + (
            f"{m.region} has {m.region_bytes:,} B free" if m.region else "no region may hold it")
            for m in s.memory if not m.fits)
        print(f"warning: the program does not fit {compiled.target.platform.name}'s memories "
              f"({too_big}); it will not load on the device (`compile --require-fit` makes "
              "this an error, exit 3; `orchestrate plan` shows the memory map)", file=sys.stderr)
    if args.bundle:
        bpte = Path(args.output).with_suffix(".bpte")
        print(f"wrote {bpte} (BundleIO: test inputs with the host twin's expected outputs)")
    return 0


def io_quantization_lines(io_quant: dict) -> list[str]:
    """The integer program I/O's widths, scales and zero points, as the application needs
    them."""
    lines = []
    for kind in ("input", "output"):
        # an output that is no quantized value (topk indices) has none: the indices skip it
        for index in sorted(int(key[len(kind):-len("_scale")]) for key in io_quant
                            if key.startswith(kind) and key.endswith("_scale")):
            scale = io_quant[f"{kind}{index}_scale"]
            zero = io_quant.get(f"{kind}{index}_zp", 0)
            low = io_quant.get(f"{kind}{index}_quant_min", -128)
            high = io_quant.get(f"{kind}{index}_quant_max", 127)
            # an a16w8 module computing the model output returns int16 (--precision)
            width = "int16" if high > 127 else "int8"
            formula = (f"q = clamp(round(x / scale) + zero_point, {low}, {high})"
                       if kind == "input" else "x = (q - zero_point) * scale")
            lines.append(f"{kind} {index}: {width}, scale {scale:.9g}, zero point {zero} ({formula})")
    if lines:
        lines.append("(also in the .pte as config methods input0_scale, input0_zp, ... and in "
                     "the artifacts' manifest.json io_quantization)")
    return lines


def _sweep_models(args) -> list[str]:
    models = [args.model]
    if args.models:
        if args.models.startswith("@"):
            listing = Path(args.models[1:])
            if not listing.is_file():
                raise UserError(f"--models file '{listing}' not found; give @FILE with one model "
                                "per line")
            extra = [line.strip() for line in listing.read_text().splitlines()
                     if line.strip() and not line.startswith("#")]
        else:
            extra = [m.strip() for m in args.models.split(",")]
        if not all(extra):
            raise UserError(f"--models '{args.models}' has an empty name; separate models with "
                            "single commas")
        models += [m for m in extra if m not in models]
    return models


def cmd_sweep(args) -> int:
    from orchestrator.sweeps.local import render_text, to_json  # lazy: heavy (tabulate)

    args.format = _report_format(args.format, args.output, ("table", "json", "html"))
    _check_outputs(args, report=args.output)
    _request_first(args, _sweep_models(args))
    _policy_first(args)
    try:
        platform = load_platform(args.platform)
    except PlatformError as error:
        raise UserError(str(error)) from None
    memory_policy(args.memory_policy, platform)  # named before any worker starts
    chosen = args.npus or args.npu
    # A board without an NPU sweeps its CPU alone.
    npus = ([npu.strip() for npu in chosen.split(",")] if chosen
            else list(platform.npu_options) or ["none"])
    if not all(npus):
        raise UserError(f"--npus '{chosen}' has an empty name; separate NPU names with single "
                        "commas, e.g. ethos-u55-128,none")
    models = _sweep_models(args)
    jobs = [_request(args, npu=npu, model=model) for model in models for npu in npus]
    warning = None if args.calibration else (
        "warning: calibration: no --calibration given; generated samples calibrate the "
        "quantizer, so accuracy figures are not representative")
    progress = SweepProgress(len(jobs), not args.quiet, warning)
    rows = api.sweep(jobs, args.jobs, progress, executor=args.executor)
    progress.finish()
    if args.format == "html":
        text = render_sweep_html(to_json(rows), f"orchestrate sweep: {', '.join(models)} on "
                                 f"{args.platform}")
    else:
        text = json.dumps(to_json(rows), indent=2) if args.format == "json" else render_text(rows)
    if args.output:
        atomic_write_bytes(Path(args.output), (text + "\n").encode())
        print(f"wrote {args.output} ({args.format})", file=sys.stderr)
    else:
        print(text)
    return 0


def cmd_verify(args) -> int:
    method = "fvp" if args.fvp else "qemu" if args.qemu else args.runtime
    if args.per_layer_error:
        return _verify_layer_errors(args)
    if args.html or args.model_explorer:
        raise UserError("--html and --model-explorer colour the plan by the per-layer error: "
                        "add --per-layer-error")
    if args.dataset is not None:
        return _verify_dataset(args, method)
    if args.min_accuracy is not None or args.max_accuracy_drop is not None:
        raise UserError("--min-accuracy and --max-accuracy-drop judge a labelled set: add "
                        "--dataset FILE")
    progress = progress_of(args)
    if args.frames is not None and args.samples is not None:
        raise UserError("--frames N runs N frames in order on every method; give it or "
                        "--samples, not both")
    verification = api.verify_all(
        args.pte, method, samples=args.frames or args.samples or 16, qemu_samples=args.frames,
        calibration=args.calibration,
        per_op=args.per_op, max_steps=args.max_steps, npu_model=args.npu_model,
        platform=args.platform, timeout_s=args.timeout, executorch_src=args.executorch_src,
        cmsis_nn_src=args.cmsis_nn_src, runner_elf=args.runner_elf, atol=args.atol,
        profile=args.profile, profile_out=args.profile_out,
        on_result=lambda result: (progress.finish(),
                                  _print_report(args, method_report(result), result.text)),
        progress=progress)
    progress.finish()
    if verification.combined is not None:
        _print_report(args, verification.combined.to_json(), verification.combined.render_text())
    error = verification.error(require_device=args.require_device)
    if error is not None:
        raise error
    if verification.profile is not None:
        print("\n".join(verification.profile.lines))
    return 0


def _verify_layer_errors(args) -> int:
    """`verify --per-layer-error [--html FILE] [--model-explorer FILE]`."""
    written = [(option, Path(value)) for option, value in (
        ("--html", args.html), ("--model-explorer", args.model_explorer)) if value]
    for option, path in written:  # refused before anything is measured
        check_output_file(path, option)
        for what, given in (("the program", args.pte), ("--dataset", args.dataset),
                            ("--calibration", args.calibration)):
            if given and same_path(path, Path(given)):
                raise UserError(f"{option} '{path}' is {what}; writing there would overwrite "
                                f"it; choose another {option}")
    if len(written) == 2 and same_path(written[0][1], written[1][1]):
        raise UserError("--html and --model-explorer name one file; give them different paths")
    report = api.layer_errors(args.pte, args.samples, args.calibration, args.dataset)
    _print_report(args, report.to_json(), report.render_text())
    for option, path in written:
        text = (api.layer_error_html(args.pte, report) if option == "--html" else
                json.dumps(api.layer_error_overlay(args.pte, report), indent=2) + "\n")
        atomic_write_bytes(path, text.encode())
        print(f"wrote {path}", file=sys.stderr)
    return 0


def _verify_dataset(args, method: str) -> int:
    if args.calibration or args.profile or args.fvp:
        raise UserError("--dataset measures accuracy on its own samples: drop --calibration, "
                        "--profile and --fvp")
    report = api.evaluate(
        args.pte, args.dataset, None if args.labels.lower() == "none" else args.labels,
        args.samples, method, args.qemu_samples, args.min_accuracy, args.max_accuracy_drop,
        args.executorch_src, args.cmsis_nn_src, args.platform, args.timeout, args.npu_model)
    _print_report(args, report.to_json(), report.render_text())
    error = report.error()
    if error is not None:
        raise error
    return 0


def _print_report(args, as_json: dict, as_text: str) -> None:
    if args.format == "json":
        print(json.dumps(as_json, indent=2))
    else:
        print(as_text)


def cmd_size(args) -> int:
    from orchestrator.artifacts.size import render_json, render_text  # lazy: heavy (torch)

    if args.firmware:
        measured = api.firmware_size(args.firmware, run=args.run)
        print(measured.to_json() if args.format == "json" else measured.to_text())
        return 0
    if args.pte is None:
        raise UserError("give a .pte file, or --firmware DIR for a firmware project")
    report = api.size(args.pte)
    print(render_json(report) if args.format == "json" else render_text(report))
    return 0


def cmd_firmware(args) -> int:
    def written(project) -> None:
        print(project.summary())
        if project.elf is None:
            print(f"build it: cmake -S {project.folder} -B {project.folder}/build && cmake "
                  f"--build {project.folder}/build")
        else:
            print(f"built {project.elf}; `orchestrate size --firmware {project.folder}` shows "
                  "its flash and RAM")

    project = api.firmware_project(args.pte, args.output, profile=args.profile, platform=args.platform,
                           third_party=args.third_party, build=not args.no_build,
                           method_pool_bytes=args.method_pool_bytes,
                           lto=False if args.no_lto else None, npu_device=args.npu_device,
                           run=args.run, on_written=written, frames=args.frames,
                           inputs=args.inputs)
    if project.run_passed is not None:
        print("\n".join(project.run_lines))
        if not project.run_passed:
            raise VerificationFailure("the firmware's outputs on QEMU differ from the host twin's")
    return 0


def cmd_compare(args) -> int:
    output = Path(args.output) if args.output else None
    if output is not None:
        if output.suffix not in (".json", ".html"):
            raise UserError(f"-o '{output}' must end in .json or .html")
        check_output_file(output, "-o")
    if args.npus and args.npu:
        raise UserError("--npu and --npus both name the target: give one")
    npus = [n.strip() for n in args.npus.split(",") if n.strip()] if args.npus else [args.npu]
    if not npus:
        raise UserError("--npus names no NPU; give e.g. ethos-u55-128,none")
    progress = None if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True))
    comparisons = [api.compare(args.model, platform=args.platform, npu=npu, cpu=args.cpu,
                               samples=args.samples, per_op=args.per_op, firmware=args.firmware,
                               work_dir=Path(args.work) / npu if args.work and args.npus
                               else args.work, progress=progress) for npu in npus]
    data = [c.to_json() for c in comparisons] if args.npus else comparisons[0].to_json()
    if output is not None:
        atomic_write_bytes(output, (json.dumps(data, indent=2) + "\n" if output.suffix == ".json"
                                    else "".join(c.html() for c in comparisons)).encode())
    if args.format == "json":
        print(json.dumps(data, indent=2))
    elif args.npus:
        from orchestrator.comparison.compare import comparison_table  # lazy: heavy (torch)

        print(comparison_table(comparisons, colour=sys.stdout.isatty()))
    else:
        print(comparisons[0].text(colour=sys.stdout.isatty()))
    return 0


def cmd_calibrate(args) -> int:
    result = api.calibrate(args.profiles, args.cpu, args.output, validate=args.validate,
                           bound=args.bound / 100)
    print(result.to_text())
    print(f"wrote {args.output}: use it with `orchestrate plan MODEL --calibration-costs "
          f"{args.output}` or a platform YAML's cpu: calibration_costs")
    return 0


def cmd_reasons(args) -> int:
    print(api.reasons(), end="")
    return 0


def cmd_cache(args) -> int:
    for folder in api.cache(clear=args.clear):
        for entry in folder.entries:
            print(f"  {entry.name:<16} {entry.size_bytes:>14,} B")
        print(f"cache {folder.root}: {folder.total_bytes:,} B"
              + (" (cleared)" if folder.cleared else ""))
    return 0


def cmd_sources(args) -> int:
    if args.action == "fetch":
        mirrors = {}
        for entry in args.mirrors:
            name, sep, url = entry.partition("=")
            if not sep or not name or not url:
                raise UserError(f"--from '{entry}' is not NAME=URL, e.g. "
                                "--from executorch=/srv/mirrors/executorch.git")
            mirrors[name] = url
        names = [n.strip() for n in args.only.split(",")] if args.only else None
        api.fetch_sources(mirrors, names=names, log=print)
        return 0
    found = api.source_trees()
    for tree in found.trees:
        commit = f", fetched at {tree.fetched_commit[:12]}" if tree.fetched_commit else ""
        print(f"  {tree.name:<20} {'present' if tree.present else 'missing':<8} {tree.folder} "
              f"({tree.origin}{commit}); pinned {tree.pinned_commit[:12]}")
    if found.missing:
        print(f"{found.missing} tree(s) missing: {found.hint}")
    return 0


def cmd_doctor(args) -> int:
    report = api.doctor()
    print(json.dumps(report.to_json(), indent=2) if args.format == "json" else report.to_text())
    return report.exit_code


def cmd_list(args) -> int:
    data = api.known().to_json()
    if args.format == "json":
        print(json.dumps(data, indent=2))
        return 0
    lines = ["zoo models (orchestrate plan NAME):"]
    lines += [f"  {m['name']:<18} {m['description']}" for m in data["models"]]
    lines.append("platforms (--platform NAME, or a YAML of your own):")
    for p in data["platforms"]:
        npus = (f"NPUs {', '.join(p['npus'])} (default {p['npu_default']}, "
                f"{p['npu_hz'] / 1e6:g} MHz); --npu none for CPU only" if p["npus"] else "no NPU")
        lines.append(f"  {p['name']:<18} CPU {p['cpu']} at {p['cpu_hz'] / 1e6:g} MHz; {npus}")
    lines.append("CPUs (--cpu NAME): " + ", ".join(f"{c['name']} ({c['tier']})"
                                                  for c in data["cpus"]))
    print("\n".join(lines))
    return 0


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if argv is None:  # the command line, not a test calling main()
        termination.install(args.command)
    if not args.verbose:
        quiet_upstream()
    else:
        os.environ["ORCHESTRATE_DEBUG"] = "1"
    handler = {"plan": cmd_plan, "compile": cmd_compile, "sweep": cmd_sweep,
               "verify": cmd_verify, "size": cmd_size, "firmware": cmd_firmware, "reasons": cmd_reasons,
               "compare": cmd_compare,
               "calibrate": cmd_calibrate, "list": cmd_list, "cache": cmd_cache,
               "sources": cmd_sources, "doctor": cmd_doctor}[args.command]
    try:
        try:
            return handler(args)
        except Exception as error:
            translated = as_orchestrate_error(error)
            if translated is None or translated is error:
                raise
            raise translated from error
    except SystemExit as request:
        # argparse has finished by now, so only a user's model code can ask to exit; exiting
        # with its status would report success (or failure) for work never done.
        print(f"orchestrate: error: the model's code called exit({request.code!r}) while "
              f"`{args.command}` ran, so nothing was written; remove the exit() call (guard "
              "script code with `if __name__ == \"__main__\":`)", file=sys.stderr)
        return UserError.exit_code
    except NotRun as error:
        print(f"orchestrate: {error}", file=sys.stderr)
        return error.exit_code
    except OrchestrateError as error:
        if isinstance(error, UserError):
            prefix = "error: "
        elif isinstance(error, (GateFailure, VerificationFailure)):
            prefix = ""  # the message starts with "gate failed" / the verdict
        else:
            prefix = "internal error: "
        print(f"orchestrate: {prefix}{error}", file=sys.stderr)
        if type(error) is OrchestrateError and os.environ.get("ORCHESTRATE_DEBUG"):
            raise
        return error.exit_code
    except KeyboardInterrupt:
        print(f"orchestrate: interrupted; `{args.command}` stopped, its temporary files removed "
              "and earlier outputs left as they were", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`orchestrate size x | head -1`): nothing more to say.
        _silence_stdout()
        return 0
    except Exception as error:  # noqa: BLE001 - a bug of ours or upstream's: one line, exit 1
        if os.environ.get("ORCHESTRATE_DEBUG"):
            raise
        message = " ".join(str(error).split())[:300]
        print(f"orchestrate: internal error: {type(error).__name__}: {message} (set "
              "ORCHESTRATE_DEBUG=1 for the traceback)", file=sys.stderr)
        return OrchestrateError.exit_code


def entry() -> None:
    """The `orchestrate` command: `main`, then the exit handlers (temporary folders removed,
    caches closed), then the process ends without tearing the interpreter down: with torch and
    ExecuTorch loaded, that teardown (module and extension finalizers, which hold nothing this
    run still owes the disk) took 4.4 s of wall after a compile had finished
    (docs/benchmarks.md)."""
    code = main()
    if sys.getprofile() is not None or sys.gettrace() is not None:
        sys.exit(code)  # a profiler or debugger writes its results after this returns
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # the reader went away: nothing more to say
            pass
    os._exit(int(code or 0))


if __name__ == "__main__":
    entry()
