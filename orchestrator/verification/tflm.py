"""TFLM as a verification method: a program compiled from a full-integer `.tflite` is run on the
same int8 inputs as the file in TensorFlow Lite Micro's own interpreter (the `tflite-micro`
package: TFLM's reference kernels built for the host), and every output is compared byte for
byte.

The file judged is the one the program was compiled from: its SHA-256 is in the manifest, and a
file changed since is not run. TFLM is native code, so it runs in a child process
(`python -m orchestrator.verification.tflm`): a crash there is a verdict, not the end of verify.
The program's side is the twin executing the `.pte` (the same computation the host runtime and
QEMU check byte for byte against it); with `--per-op`, each TFLite operator's output in the
program's quantized reference is compared with TFLM's tensor and the first that differs is named.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import numpy as np

TFLM = "TFLM reference"
SEED = 1


def tflm_version() -> str | None:
    try:
        return metadata.version("tflite-micro")
    except metadata.PackageNotFoundError:
        return None


def exercised_text() -> str:
    return f"TFLM reference kernels (tflite-micro {tflm_version()}), on the host"


class TflmCannotRun(Exception):
    pass


def model_file(manifest) -> Path:
    """The `.tflite` a program was compiled from, checked against the manifest's SHA-256."""
    model = manifest.data.get("model") or {}
    source = str(model.get("source", ""))
    if not source.startswith("tflite:"):
        raise TflmCannotRun("the program was not compiled from a .tflite file")
    path = Path(source[7:])
    if not path.is_file():
        raise TflmCannotRun(f"{path} (the .tflite it was compiled from) is not there")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != model.get("file_sha256"):
        raise TflmCannotRun(f"{path} changed since the program was compiled from it (SHA-256 "
                            "differs); compile again")
    return path


def litert_version() -> str | None:
    try:
        return metadata.version("ai-edge-litert")
    except metadata.PackageNotFoundError:
        return None


def run_tflm(path: Path, samples: list[list[np.ndarray]], preserve: bool = False,
             timeout_s: int = 600, engine: str = "tflm",
             ) -> tuple[list[list[np.ndarray]], dict[int, list[np.ndarray]]]:
    """TFLM's outputs for each sample (and, with `preserve`, every tensor's value per sample,
    by TFLite tensor index), computed in a child process; engine "litert": the TFLite
    interpreter's reference kernels (LiteRT) instead, for a float file TFLM cannot run (a
    hybrid file: int8 weights, float activations)."""
    if engine == "tflm" and tflm_version() is None:
        raise TflmCannotRun("the tflite-micro package is not installed (pip install tflite-micro)")
    if engine == "litert" and litert_version() is None:
        raise TflmCannotRun("the ai-edge-litert package is not installed")
    with tempfile.TemporaryDirectory(prefix="orchestrate-tflm-") as folder:
        given, taken = Path(folder) / "in.npz", Path(folder) / "out.npz"
        np.savez(given, **{f"s{i}_{j}": x for i, sample in enumerate(samples)
                           for j, x in enumerate(sample)})
        done = subprocess.run([sys.executable, "-m", "orchestrator.verification.tflm", str(path),
                               str(given), str(taken), str(len(samples)), "1" if preserve else "0",
                               engine],
                              capture_output=True, text=True, timeout=timeout_s)
        if done.returncode != 0 or not taken.is_file():
            last = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
            raise TflmCannotRun(f"TFLM could not run {path.name}: {last[:300]}")
        with np.load(taken, allow_pickle=False) as found:
            outputs = [[found[k] for k in sorted((k for k in found.files
                                                  if k.startswith(f"o{i}_")),
                                                 key=lambda k: int(k.split("_")[1]))]
                       for i in range(len(samples))]
            tensors: dict[int, list[np.ndarray]] = {}
            for key in found.files:
                if key.startswith("t"):
                    sample, index = key[1:].split("_")
                    tensors.setdefault(int(index), [None] * len(samples))[int(sample)] = found[key]
    return outputs, tensors


def _litert_worker(path: str, given: str, taken: str, count: int) -> None:
    from ai_edge_litert.interpreter import (  # lazy: optional (child process only)
        Interpreter, OpResolverType)

    interpreter = Interpreter(model_path=path,
                              experimental_op_resolver_type=OpResolverType.BUILTIN_REF)
    interpreter.allocate_tensors()
    inputs_of, outputs_of = interpreter.get_input_details(), interpreter.get_output_details()
    results = {}
    with np.load(given, allow_pickle=False) as inputs:
        for i in range(count):
            for j, detail in enumerate(inputs_of):
                interpreter.set_tensor(detail["index"], inputs[f"s{i}_{j}"])
            interpreter.invoke()
            for k, detail in enumerate(outputs_of):
                results[f"o{i}_{k}"] = np.array(interpreter.get_tensor(detail["index"]))
    np.savez(taken, **results)


def _arena_bound(path: str) -> int:
    """An arena TFLM cannot run out of: every tensor of the file at once, plus 64 KiB for its
    own bookkeeping. The package's default (ten times the file's size) is too small for a small
    file with large feature maps (a 2.4 KB file averaging a 272x272x8 map)."""
    from orchestrator.sources.tflite_file import read_tflite  # lazy: heavy (ethosu.vela; child process only)

    graph = read_tflite(Path(path))
    total = sum(int(np.prod(t.shape or (1,))) * np.dtype(t.dtype).itemsize
                for t in graph.tensors)
    return total + 64 * 1024


def _worker(path: str, given: str, taken: str, count: int, preserve: bool) -> None:
    from tflite_micro.python.tflite_micro import runtime  # lazy: optional (child process only)

    config = runtime.InterpreterConfig.kPreserveAllTensors if preserve else \
        runtime.InterpreterConfig.kAllocationRecording
    interpreter = runtime.Interpreter.from_file(path, arena_size=_arena_bound(path),
                                                intrepreter_config=config)
    results = {}
    with np.load(given, allow_pickle=False) as inputs:
        for i in range(count):
            j = 0
            while f"s{i}_{j}" in inputs.files:
                interpreter.set_input(inputs[f"s{i}_{j}"], j)
                j += 1
            interpreter.invoke()
            k = 0
            while True:
                try:
                    results[f"o{i}_{k}"] = np.array(interpreter.get_output(k))
                except (IndexError, RuntimeError, ValueError):
                    break
                k += 1
                if k >= 64:
                    break
            if preserve:
                index = 0
                while True:
                    try:
                        value = interpreter.GetTensor(index, 0)
                    except Exception:  # noqa: BLE001 - past the last tensor
                        break
                    if value is not None and getattr(value, "size", 0):
                        results[f"t{i}_{index}"] = np.array(value)
                    index += 1
    np.savez(taken, **results)


def float_file_outputs(manifest, samples) -> tuple[Path, list[np.ndarray], bool] | None:
    """Output 0 of the float `.tflite` a program was compiled from, computed by the TFLite
    interpreter's reference kernels (LiteRT: TFLM refuses a hybrid file) on `samples` (tuples
    of the module's float tensors, NCHW), in the module's layout, and whether the file is hybrid
    (TfliteGraph.hybrid); None when the program did not come from a float `.tflite`."""
    from orchestrator.sources.tflite_file import read_tflite  # lazy: heavy (Vela)

    try:
        path = model_file(manifest)
    except TflmCannotRun:
        return None
    graph = read_tflite(path)
    if graph.full_integer:
        return None
    given = [[np.ascontiguousarray(x.numpy().transpose(0, 2, 3, 1) if x.dim() == 4
                                   else x.numpy(), dtype=np.float32) for x in sample]
             for sample in samples]
    outputs, _ = run_tflm(path, given, engine="litert")
    return path, [o[0].transpose(0, 3, 1, 2) if o[0].ndim == 4 else o[0] for o in outputs], \
        graph.hybrid


@dataclass(frozen=True)
class TflmComparison:
    samples: int
    values: int
    differing: int
    max_steps: int
    first: str | None  # "sample 3, output 0, element 7: ours 12, TFLM 11"
    first_operator: str | None  # with --per-op: the first TFLite operator whose output differs

    @property
    def passed(self) -> bool:
        return self.differing == 0

    def detail(self) -> str:
        head = (f"{'equal to' if self.passed else 'differs from'} TFLM on {self.samples} random "
                f"int8 inputs: {self.differing} of {self.values:,} output values differ")
        if not self.passed:
            head += f" (at most {self.max_steps} steps; first: {self.first})"
            if self.first_operator:
                head += f"; first operator that differs: {self.first_operator}"
        return head


def compare(program, count: int, per_op: bool = False, npu_model: str = "auto") -> TflmComparison:
    """The program (twin) and TFLM on `count` random int8 inputs, output by output."""
    import torch  # lazy: heavy (torch)

    from orchestrator.sources.tflite_file import read_tflite  # lazy: heavy (Vela)
    from orchestrator.sources.tflite_module import int8_inputs  # lazy: heavy (torch)

    path = model_file(program.require_manifest())
    graph = read_tflite(path)
    if not graph.full_integer:
        raise TflmCannotRun(f"{path.name} is a float model; TFLM compares a full-integer file "
                            "(verify --dataset measures a float one)")
    samples = int8_inputs(graph, count, SEED)
    references, _ = run_tflm(path, samples)
    npu = program.npu_executor(npu_model)
    differing = values = worst = 0
    first = None
    for s, (sample, reference) in enumerate(zip(samples, references)):
        inputs = tuple(torch.from_numpy(x).permute(0, 3, 1, 2).contiguous() if x.ndim == 4
                       else torch.from_numpy(x) for x in sample)
        run = program.run(inputs, npu=npu)
        for o, (ours, theirs) in enumerate(zip(run.outputs, reference)):
            mine = ours.numpy()
            if mine.ndim == 4:
                mine = mine.transpose(0, 2, 3, 1)
            if mine.shape != theirs.shape:
                raise TflmCannotRun(f"output {o} is {list(mine.shape)} in the program and "
                                    f"{list(theirs.shape)} in TFLM")
            steps = np.abs(mine.astype(np.int64) - theirs.astype(np.int64)).reshape(-1)
            values += steps.size
            differing += int((steps > 0).sum())
            worst = max(worst, int(steps.max()))
            if first is None and steps.any():
                e = int(np.argmax(steps > 0))
                first = (f"sample {s}, output {o}, element {e}: ours "
                         f"{int(mine.reshape(-1)[e])}, TFLM {int(theirs.reshape(-1)[e])}")
    first_operator = _first_operator(program, graph, path, samples) \
        if per_op and differing else None
    return TflmComparison(count, values, differing, worst, first, first_operator)


def _first_operator(program, graph, path: Path, samples) -> str | None:
    """The first TFLite operator (file order) whose output in the program's quantized reference,
    quantized with the file's own scale, differs from TFLM's tensor on the first sample that
    differs."""
    import torch  # lazy: heavy (torch)

    from orchestrator.compilation.file_quantization import operator_of  # lazy: heavy (torch)

    _, reference = program.reference("quantized.pt2")
    _, tensors = run_tflm(path, samples[:4], preserve=True)
    gm = reference
    outputs_of: dict[int, torch.fx.Node] = {}
    for node in gm.graph.nodes:
        scope = operator_of(node) if node.op == "call_function" else None
        if scope is not None:
            outputs_of[scope] = node  # the last node of the operator's scope
    recorded: dict[str, torch.Tensor] = {}

    class _Recorder(torch.fx.Interpreter):
        def run_node(self, n):
            value = super().run_node(n)
            if isinstance(value, torch.Tensor):
                recorded[n.name] = value
            return value

    for s, sample in enumerate(samples[:4]):
        recorded.clear()
        inputs = []
        for index, x in zip(graph.inputs, sample):
            t = graph.tensors[index]
            value = torch.from_numpy((x.astype(np.float32) - t.zero_points[0]) * t.scales[0])
            inputs.append(value.permute(0, 3, 1, 2).contiguous(
                memory_format=torch.channels_last) if value.dim() == 4 else value)
        with torch.no_grad():
            _Recorder(gm).run(*inputs)
        for op in graph.operators:
            node = outputs_of.get(op.index)
            tensor = graph.tensors[op.outputs[0]]
            theirs = tensors.get(tensor.index, [None] * 4)[s]
            if node is None or theirs is None or not tensor.quantized or node.name not in \
                    recorded:
                continue
            value = recorded[node.name].detach().float()
            if value.dim() == 4:
                value = value.permute(0, 2, 3, 1)
            q = torch.clamp(torch.round(value / tensor.scales[0]) + tensor.zero_points[0],
                            -128, 127).to(torch.int64).numpy()
            if q.shape != theirs.shape:
                continue
            steps = np.abs(q - theirs.astype(np.int64))
            if steps.any():
                return (f"{op.opcode} (operator {op.index}, tensor {tensor.index} "
                        f"'{tensor.name[:60]}'): {int((steps > 0).sum())} value(s), at most "
                        f"{int(steps.max())} steps, on sample {s}")
    return None


if __name__ == "__main__":
    if sys.argv[6:] == ["litert"]:
        _litert_worker(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        _worker(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5] == "1")
