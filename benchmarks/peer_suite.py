"""The peer suite: ExecuTorch's own backend test cases (benchmarks/peer_cases.py) through the CLI.

For each case and target this runs exactly what a user runs, as subprocesses:

    python -m orchestrator.cli compile benchmarks/peer_cases.py:<factory> <target options> \\
        -o <out>/<case>-<target>.pte --quiet
    python -m orchestrator.cli verify <out>/<case>-<target>.pte --format json

and records the compile outcome (compiled; refused, exit 2, with its one-line reason; internal
error, exit 1; a timeout or another exit), each verify method's outcome and detail from the JSON
(`methods[].name/.outcome/.detail`, the overall `outcome`), the exit codes, wall seconds, and
the MACs per engine from the compile's `<case>-<target>.artifacts/plan.json` (`summary.macs`:
NPU, CMSIS-NN, portable), so a CPU-only target's CMSIS-NN share costs no second compile.

Targets (every case runs on the first two; cases marked `slice` on all six):

    u55-128   --platform corstone300 --npu ethos-u55-128
    cpu-m55   --platform corstone300 --npu none
    u65-256   --platform corstone300 --npu ethos-u65-256
    u85-256   --platform corstone320 --npu ethos-u85-256
    cpu-m33   --platform corstone300 --npu none --cpu cortex-m33
    cpu-m4    --platform corstone300 --npu none --cpu cortex-m4

Run it from the project's venv (the CLI runs under the same Python):

    python benchmarks/peer_suite.py                      # all 263 cases: 678 runs
    python benchmarks/peer_suite.py --slice              # the slice: 38 cases x 6 targets
    python benchmarks/peer_suite.py --cases 'conv2d*,resnet8' --targets u55-128,cpu-m55
    python benchmarks/peer_suite.py --list               # what would run, and what is cached
    python benchmarks/peer_suite.py --report             # the report from the cache, no runs

How long (measured on this project's 2-core machine, host runtime and QEMU runner already built
and cached; the first verify of a fresh cache builds them, several minutes): a small op case
takes 11-12 s to compile and 10-15 s to verify per target, so the slice (228 runs) is about
1.5-2 hours and the whole suite (678 runs) about 5 hours plus the large models (MobileNetV2,
both Wav2Letters, YOLO11n, DeiT), which take minutes each; `--timeout` (900 s) bounds each
command. Keep `--jobs 1` on 2 cores: each compile and verify uses them both. Results are
appended to a JSON-lines cache (`--results`, default benchmarks/.peer-results/results.jsonl,
git-ignored) as each run ends, keyed by case, target, the SHA-256 of the case's source (its
factory and every top-level definition it uses in peer_cases.py) and the git HEAD of this
checkout: a rerun resumes where it stopped and skips finished runs (`--fresh` runs them again;
uncommitted changes to the tool do not invalidate the cache). The .pte files and artifacts
folders are kept beside the cache (`--out-dir`).

This script imports neither the project nor torch: it reads peer_cases.py with `ast` and calls
the CLI.
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASES_FILE = Path(__file__).with_name("peer_cases.py")
DEFAULT_RESULTS = Path(__file__).with_name(".peer-results") / "results.jsonl"

TARGETS = {
    "u55-128": ("--platform", "corstone300", "--npu", "ethos-u55-128"),
    "cpu-m55": ("--platform", "corstone300", "--npu", "none"),
    "u65-256": ("--platform", "corstone300", "--npu", "ethos-u65-256"),
    "u85-256": ("--platform", "corstone320", "--npu", "ethos-u85-256"),
    "cpu-m33": ("--platform", "corstone300", "--npu", "none", "--cpu", "cortex-m33"),
    "cpu-m4": ("--platform", "corstone300", "--npu", "none", "--cpu", "cortex-m4"),
}
EVERY_CASE_TARGETS = ("u55-128", "cpu-m55")
CPU_ONLY_TARGETS = ("cpu-m55", "cpu-m33", "cpu-m4")
# verify's method names (orchestrator/verification/methods.py) as table columns.
METHOD_ABBREVIATIONS = {"twin": "twin", "host runtime": "rt", "QEMU Cortex-M55": "qemu",
                        "Corstone FVP": "fvp"}
OUTCOME_ABBREVIATIONS = {"passed": "pass", "failed": "FAIL", "not-run": "not-run",
                         "partial": "partial", "inconclusive": "inconcl"}
DETAIL_CHARS = 1000  # kept per method in the cache; the report prints 200

_running: set[subprocess.Popen] = set()  # the CLI processes under way, for an interruption
_interrupted = threading.Event()


@dataclass(frozen=True)
class CaseInfo:
    name: str
    factory: str
    upstream: str
    description: str
    slice: bool
    source_sha256: str


@dataclass(frozen=True)
class CliRun:
    exit_code: int | None  # None: timed out
    stdout: str
    stderr: str
    seconds: float


# ---- reading peer_cases.py without importing it --------------------------------------------

def read_cases(path: Path = CASES_FILE) -> list[CaseInfo]:
    """Every `@case(...)` factory of peer_cases.py, with the hash of the source it runs."""
    source = path.read_text()
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    top = _top_level_definitions(tree)
    cases = []
    for node in tree.body:
        if not (isinstance(node, ast.FunctionDef) and node.name.startswith("case_")):
            continue
        decorator = next((d for d in node.decorator_list if isinstance(d, ast.Call)
                          and isinstance(d.func, ast.Name) and d.func.id == "case"), None)
        if decorator is None:
            continue
        upstream = _constant(decorator.args[0], top)
        in_slice = next((_constant(k.value, top) for k in decorator.keywords if k.arg == "slice"),
                        False)
        description = " ".join((ast.get_docstring(node) or "").split())
        cases.append(CaseInfo(node.name.removeprefix("case_"), node.name, upstream, description,
                              bool(in_slice), _source_sha256(node, top, lines)))
    return cases


def _top_level_definitions(tree: ast.Module) -> dict[str, ast.AST]:
    top: dict[str, ast.AST] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            top[node.name] = node
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    top[target.id] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            top[node.target.id] = node
    return top


def _constant(node: ast.AST, top: dict[str, ast.AST]):
    if isinstance(node, ast.Name) and isinstance(top.get(node.id), (ast.Assign, ast.AnnAssign)):
        node = top[node.id].value
    return ast.literal_eval(node)


def _source_sha256(function: ast.FunctionDef, top: dict[str, ast.AST], lines: list[str]) -> str:
    """SHA-256 of the factory's source (decorators included) and of every top-level definition
    it uses, directly or through another: a change to a shared module class reruns its cases."""
    seen, pending = {function.name}, [function]
    while pending:
        for child in ast.walk(pending.pop()):
            if isinstance(child, ast.Name) and child.id in top and child.id not in seen:
                seen.add(child.id)
                pending.append(top[child.id])
    digest = hashlib.sha256(_segment(function, lines).encode())
    for name in sorted(seen - {function.name}):
        digest.update(f"\n# {name}\n{_segment(top[name], lines)}".encode())
    return digest.hexdigest()


def _segment(node: ast.AST, lines: list[str]) -> str:
    start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    return "".join(lines[start - 1:node.end_lineno])


# ---- running the CLI -----------------------------------------------------------------------

def run_cli(argv: list[str], timeout_s: float) -> CliRun:
    """`python -m orchestrator.cli ARGV` in its own process group, so that a timeout also ends
    what it started (QEMU, a runner build)."""
    start = time.monotonic()
    process = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", *argv], cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    _running.add(process)
    try:
        stdout, stderr = process.communicate(timeout=timeout_s)
        exit_code: int | None = process.returncode
    except subprocess.TimeoutExpired:
        stdout, stderr = _stop(process)
        exit_code = None
    except BaseException:
        _stop(process)
        raise
    finally:
        _running.discard(process)
    return CliRun(exit_code, stdout, stderr, round(time.monotonic() - start, 1))


def _stop(process: subprocess.Popen) -> tuple[str, str]:
    for sig, grace_s in ((signal.SIGTERM, 30), (signal.SIGKILL, 30)):
        _kill_group(process, sig)
        try:
            return process.communicate(timeout=grace_s)
        except subprocess.TimeoutExpired:
            continue
    return "", ""


def _kill_group(process: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(process.pid, sig)
    except ProcessLookupError:
        pass


def _raise_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def _error_line(run: CliRun) -> str:
    """The CLI's one-line error (`orchestrate: ...`), else the last line it wrote."""
    lines = [line.strip() for line in run.stderr.splitlines() if line.strip()]
    marked = [line for line in lines if line.startswith("orchestrate:")]
    if marked:
        return marked[-1].removeprefix("orchestrate:").strip()
    return lines[-1] if lines else ""


def _compile_outcome(run: CliRun) -> str:
    if run.exit_code is None:
        return "timeout"
    return {0: "compiled", 1: "internal-error", 2: "refused"}.get(run.exit_code,
                                                                  f"exit {run.exit_code}")


def run_case(case: CaseInfo, target: str, out_dir: Path, timeout_s: float, git_head: str) -> dict:
    pte = out_dir / f"{case.name}-{target}.pte"
    compile_run = run_cli(["compile", f"{CASES_FILE.relative_to(ROOT)}:{case.factory}",
                           *TARGETS[target], "-o", str(pte), "--quiet"], timeout_s)
    outcome = _compile_outcome(compile_run)
    record = {"case": case.name, "target": target, "source_sha256": case.source_sha256,
              "git_head": git_head, "upstream": case.upstream,
              "finished": time.strftime("%Y-%m-%dT%H:%M:%S"),
              "compile": {"outcome": outcome, "exit": compile_run.exit_code,
                          "seconds": compile_run.seconds,
                          "reason": None if outcome == "compiled" else _error_line(compile_run),
                          "warnings": [line.strip()[:300]
                                       for line in compile_run.stderr.splitlines()
                                       if line.startswith("warning:")][:5]},
              "plan": None, "verify": None}
    if outcome != "compiled":
        return record
    record["plan"] = _plan_summary(pte.with_suffix(".artifacts") / "plan.json")
    record["verify"] = _verify(pte, timeout_s)
    return record


def _plan_summary(plan_json: Path) -> dict | None:
    try:
        summary = json.loads(plan_json.read_text())["summary"]
    except (OSError, ValueError, KeyError) as error:
        return {"error": f"{plan_json.name}: {error}"}
    return {"macs": summary.get("macs", {}), "npu_partitions": summary.get("npu_partitions"),
            "npu_mac_coverage_pct": summary.get("npu_mac_coverage_pct")}


def _verify(pte: Path, timeout_s: float) -> dict:
    run = run_cli(["verify", str(pte), "--format", "json"], timeout_s)
    result = {"exit": run.exit_code, "seconds": run.seconds, "outcome": None, "verdict": None,
              "methods": [], "error": None}
    report = _json_object(run.stdout)
    if report is None:
        result["outcome"] = "timeout" if run.exit_code is None else "no-report"
        result["error"] = _error_line(run)[:DETAIL_CHARS]
        return result
    result["outcome"], result["verdict"] = report.get("outcome"), report.get("verdict")
    result["methods"] = [{"name": m.get("name"), "outcome": m.get("outcome"),
                          "detail": (m.get("detail") or "")[:DETAIL_CHARS]}
                         for m in report.get("methods", [])]
    return result


def _json_object(text: str) -> dict | None:
    start = text.find("{")
    if start < 0:
        return None
    try:
        value = json.loads(text[start:])
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


# ---- the cache -----------------------------------------------------------------------------

def cache_key(record_or_case: dict | CaseInfo, target: str | None = None,
              git_head: str | None = None) -> tuple[str, str, str, str]:
    if isinstance(record_or_case, CaseInfo):
        return record_or_case.name, target, record_or_case.source_sha256, git_head
    r = record_or_case
    return r["case"], r["target"], r["source_sha256"], r["git_head"]


def load_cache(path: Path) -> dict[tuple[str, str, str, str], dict]:
    cached = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
                cached[cache_key(record)] = record  # the latest run of a key wins
            except (ValueError, KeyError, TypeError):
                continue  # a line cut short by an interrupted write
    return cached


def git_head() -> str:
    done = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                          text=True)
    return done.stdout.strip() if done.returncode == 0 else "unknown"


# ---- selection and the run -----------------------------------------------------------------

def select(cases: list[CaseInfo], patterns: str | None, slice_only: bool,
           targets: list[str]) -> list[tuple[CaseInfo, str]]:
    chosen = [c for c in cases if not slice_only or c.slice]
    if patterns:
        wanted = [p.strip() for p in patterns.split(",") if p.strip()]
        unknown = [p for p in wanted
                   if not any(fnmatch.fnmatchcase(c.name, p) or fnmatch.fnmatchcase(c.factory, p)
                              for c in cases)]
        if unknown:
            sys.exit(f"peer_suite: no case matches {', '.join(unknown)} (see --list)")
        chosen = [c for c in chosen if any(fnmatch.fnmatchcase(c.name, p)
                                           or fnmatch.fnmatchcase(c.factory, p) for p in wanted)]
    return [(c, t) for c in chosen for t in targets if c.slice or t in EVERY_CASE_TARGETS]


def run_all(work: list[tuple[CaseInfo, str]], cached: dict, head: str, args) -> list[dict]:
    results_path, out_dir = Path(args.results), Path(args.out_dir)
    results_path.parent.mkdir(parents=True, exist_ok=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    todo = [(c, t) for c, t in work if args.fresh or cache_key(c, t, head) not in cached]
    print(f"peer suite: {len(work)} runs selected, {len(work) - len(todo)} cached, {len(todo)} to "
          f"run ({args.jobs} at a time); results: {results_path}; .pte files: {out_dir}",
          file=sys.stderr, flush=True)
    lock, done = threading.Lock(), []

    def one(item: tuple[CaseInfo, str]) -> None:
        case, target = item
        record = run_case(case, target, out_dir, args.timeout, head)
        if _interrupted.is_set():  # its commands were killed: not a result
            return
        with lock:
            with results_path.open("a") as stream:  # after every run: an interruption keeps it
                stream.write(json.dumps(record) + "\n")
            cached[cache_key(record)] = record
            done.append(record)
            print(f"[{len(done)}/{len(todo)}] {_progress_line(record)}", file=sys.stderr,
                  flush=True)

    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        if args.jobs == 1:  # in this thread, so that Ctrl-C reaches run_cli and stops its child
            for item in todo:
                one(item)
        else:
            with ThreadPoolExecutor(max_workers=args.jobs) as pool:
                try:
                    for future in as_completed([pool.submit(one, item) for item in todo]):
                        future.result()
                except KeyboardInterrupt:
                    _interrupted.set()
                    for process in list(_running):
                        _kill_group(process, signal.SIGTERM)
                    pool.shutdown(wait=True, cancel_futures=True)
                    raise
    except KeyboardInterrupt:
        _interrupted.set()
        print("peer suite: interrupted; the finished runs are in the cache", file=sys.stderr)
    return [cached[cache_key(c, t, head)] for c, t in work if cache_key(c, t, head) in cached]


# ---- the report ----------------------------------------------------------------------------

def _methods_cell(record: dict) -> str:
    verify = record.get("verify")
    if not verify:
        return ""
    if not verify["methods"]:
        return f"{verify['outcome']} (exit {verify['exit']})"
    methods = " ".join(f"{METHOD_ABBREVIATIONS.get(m['name'], m['name'])}:"
                       f"{OUTCOME_ABBREVIATIONS.get(m['outcome'], m['outcome'])}"
                       for m in verify["methods"])
    return f"{(verify['outcome'] or '?').upper():<12} {methods}"


def _compile_cell(record: dict) -> str:
    outcome = record["compile"]["outcome"]
    return {"internal-error": "INTERNAL", "timeout": "TIMEOUT"}.get(outcome, outcome)


def _progress_line(record: dict) -> str:
    line = (f"{record['case']} {record['target']}: {_compile_cell(record)} "
            f"{record['compile']['seconds']} s")
    if record["verify"]:
        line += f"; verify {_methods_cell(record)} {record['verify']['seconds']} s"
    elif record["compile"]["reason"]:
        line += f": {record['compile']['reason'][:150]}"
    return line


def table(records: list[dict]) -> str:
    lines = [f"{'case':<44} {'target':<8} {'compile':<10} {'s':>6}  {'verify':<55} {'s':>6}"]
    previous = None
    for r in records:
        name = r["case"] if r["case"] != previous else ""
        previous = r["case"]
        verify_s = f"{r['verify']['seconds']:6.1f}" if r["verify"] else ""
        lines.append(f"{name:<44} {r['target']:<8} {_compile_cell(r):<10} "
                     f"{r['compile']['seconds']:6.1f}  {_methods_cell(r):<55} {verify_s}")
    return "\n".join(lines)


def summarize(records: list[dict], targets: list[str]) -> dict[str, dict]:
    summary = {}
    for target in targets:
        rows = [r for r in records if r["target"] == target]
        compiles = defaultdict(int)
        methods: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        verdicts, macs = defaultdict(int), defaultdict(int)
        for r in rows:
            compiles[r["compile"]["outcome"]] += 1
            if r["verify"]:
                verdicts[r["verify"]["outcome"]] += 1
                for m in r["verify"]["methods"]:
                    methods[METHOD_ABBREVIATIONS.get(m["name"], m["name"])][m["outcome"]] += 1
            for engine, count in ((r.get("plan") or {}).get("macs") or {}).items():
                macs[engine] += count
        summary[target] = {"cases": len(rows), "compile": dict(compiles),
                           "verify": dict(verdicts),
                           "methods": {k: dict(v) for k, v in methods.items()},
                           "macs": dict(macs)}
    return summary


def _share(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "n/a"


def summary_lines(summary: dict[str, dict]) -> list[str]:
    lines = []
    for target, s in summary.items():
        c = s["compile"]
        others = sum(n for k, n in c.items()
                     if k not in ("compiled", "refused", "internal-error"))
        methods = "; ".join(
            f"{name} " + "/".join(f"{n} {OUTCOME_ABBREVIATIONS.get(o, o)}"
                                  for o, n in sorted(outcomes.items()))
            for name, outcomes in s["methods"].items())
        macs = s["macs"]
        if target in CPU_ONLY_TARGETS:
            cpu = macs.get("cmsis-nn", 0) + macs.get("portable", 0)
            share = (f"CMSIS-NN MAC share {_share(macs.get('cmsis-nn', 0), cpu)} "
                     f"({macs.get('cmsis-nn', 0):,} CMSIS-NN, "
                     f"{macs.get('portable', 0):,} portable)")
        else:
            share = (f"NPU MAC share {_share(macs.get('npu', 0), sum(macs.values()))}, CMSIS-NN "
                     f"{macs.get('cmsis-nn', 0):,}, portable {macs.get('portable', 0):,}")
        verdicts = ", ".join(f"{n} {o}" for o, n in sorted(s["verify"].items()))
        lines.append(f"{target}: {s['cases']} cases: {c.get('compiled', 0)} compiled, "
                     f"{c.get('refused', 0)} refused, {c.get('internal-error', 0)} internal "
                     f"errors, {others} timeouts/other exits | verify: {verdicts or 'none'} | "
                     f"{methods or 'no methods'} | {share}")
    return lines


def findings(records: list[dict]) -> dict[str, list[dict]]:
    """Refusal reasons, internal errors and other compile exits, and every verify method that
    did not pass, each distinct text once with the runs that gave it."""
    groups: dict[tuple[str, str], list[str]] = defaultdict(list)
    for r in records:
        where = f"{r['case']}@{r['target']}"
        outcome = r["compile"]["outcome"]
        if outcome == "refused":
            groups[("refused", r["compile"]["reason"] or "")].append(where)
        elif outcome != "compiled":
            groups[(f"compile {outcome}", (r["compile"]["reason"] or "")[:200])].append(where)
        verify = r["verify"] or {}
        if verify.get("error"):
            groups[(f"verify {verify['outcome']}", verify["error"][:200])].append(where)
        for m in verify.get("methods", []):
            if m["outcome"] != "passed":
                groups[(f"{m['name']} {m['outcome']}", m["detail"][:200])].append(where)
    result: dict[str, list[dict]] = defaultdict(list)
    for (kind, text), runs in sorted(groups.items(), key=lambda item: (item[0][0], -len(item[1]))):
        result[kind].append({"count": len(runs), "text": text, "runs": runs})
    return dict(result)


def findings_lines(found: dict[str, list[dict]]) -> list[str]:
    lines = []
    for kind in sorted(found, key=lambda k: (k != "refused", k)):
        lines.append(f"{kind}:")
        for item in found[kind]:
            runs = ", ".join(item["runs"][:6]) + (", ..." if len(item["runs"]) > 6 else "")
            lines.append(f"  {item['count']:>3}  {item['text']}\n       [{runs}]")
    return lines


# ---- the command line ----------------------------------------------------------------------

def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", help="names or fnmatch patterns, comma-separated "
                                        "(case or factory names: conv2d*, case_resnet8)")
    parser.add_argument("--targets", default=",".join(TARGETS),
                        help=f"comma-separated, of {', '.join(TARGETS)} (default: all; cases "
                             f"outside the slice run on {' and '.join(EVERY_CASE_TARGETS)} only)")
    parser.add_argument("--slice", action="store_true", help="the slice cases only")
    parser.add_argument("--results", default=str(DEFAULT_RESULTS), help="JSON-lines cache")
    parser.add_argument("--out-dir", help="where the .pte files go (default: beside --results)")
    parser.add_argument("--fresh", action="store_true", help="run cached runs again")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per command")
    parser.add_argument("--jobs", type=int, default=1,
                        help="runs at a time (default 1: each compile uses the machine's cores)")
    parser.add_argument("--format", choices=("table", "json"), default="table")
    parser.add_argument("--list", action="store_true", help="list the selected runs and exit")
    parser.add_argument("--report", action="store_true", help="report from the cache; run nothing")
    args = parser.parse_args()
    targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    unknown = [t for t in targets if t not in TARGETS]
    if unknown or args.jobs < 1:
        parser.error(f"unknown target(s) {', '.join(unknown)}; choose from {', '.join(TARGETS)}"
                     if unknown else "--jobs must be at least 1")
    args.out_dir = args.out_dir or str(Path(args.results).parent / "pte")

    cases = read_cases()
    work = select(cases, args.cases, args.slice, targets)
    head = git_head()
    cached = load_cache(Path(args.results))
    if args.list:
        for case, target in work:
            state = "cached" if cache_key(case, target, head) in cached else "to run"
            print(f"{case.name:<44} {target:<8} {state:<7} {'slice ' if case.slice else '      '}"
                  f"{case.description[:90]}")
        print(f"{len({c.name for c, _ in work})} cases, {len(work)} runs "
              f"({len(cases)} cases in peer_cases.py, {sum(c.slice for c in cases)} in the slice)")
        return 0
    if args.report:
        records = [cached[cache_key(c, t, head)] for c, t in work
                   if cache_key(c, t, head) in cached]
    else:
        records = run_all(work, cached, head, args)

    summary = summarize(records, [t for t in TARGETS if t in targets])
    found = findings(records)
    if args.format == "json":
        print(json.dumps({"git_head": head, "runs_selected": len(work), "records": records,
                          "summary": summary, "findings": found}, indent=2))
        return 130 if _interrupted.is_set() else 0
    print(table(records))
    print(f"\nsummary ({len(records)} of {len(work)} selected runs finished; git HEAD "
          f"{head[:12]}):")
    print("\n".join(summary_lines(summary)))
    if found:
        print("\n" + "\n".join(findings_lines(found)))
    return 130 if _interrupted.is_set() else 0


if __name__ == "__main__":
    sys.exit(main())
