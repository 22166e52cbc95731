"""Contract tests of the upstream adapters: the private names they touch exist with the shapes
they assume. Fast (no compile); an ExecuTorch upgrade that moves a name fails here first."""

from __future__ import annotations

from importlib import metadata

import pytest


def test_ethos_u_adapter_contract():
    from partitioners import upstream_ethos_u

    contract = upstream_ethos_u.contract()
    # Upstream passes the 4th argument when it recurses into control-flow submodules.
    assert contract["_tag_module"] == ["self", "module", "containing_program", "reporter",
                                       "tag_iterator"]
    assert contract["_rejected_nodes"] is True  # node -> message
    # partition_extractable: upstream's check that a set of nodes cuts out without a cycle
    assert contract["_validate_partition"] == ["nodes"]
    assert contract["vela_compile"][:2] == ["tosa_flatbuffer", "args"]
    assert {"intermediate_path", "block_placements"} <= set(contract["vela_compile"])
    # a staticmethod called once per partition by exir's to_backend
    assert contract["EthosUBackend.preprocess"] == ["edge_program", "compile_specs"]
    # a staticmethod of one node, called by the pass and by the partitioner's support check
    assert contract["_is_fuseable_quantized_activation"] == ["node"]
    assert contract["_is_fuseable_input"] == ["node"]
    # int16_table_lookups: the backend's lists of operators it lowers to TABLE
    assert contract["TableOps"] == ["special_table_ops", "unary_table_ops"]
    assert contract["register_pass_insertions_after"] == ["target_pass_type", "passes"]
    assert contract["tosa.PAD/CONV2D/DEPTHWISE_CONV2D"] is True
    assert contract["RewritePadPass"] == "RewritePadPass"


def test_exir_adapter_contract():
    from orchestrator.compilation import upstream_exir

    contract = upstream_exir.contract()
    assert contract["EdgeProgramManager.__init__"][:4] == ["self", "edge_programs",
                                                           "constant_methods", "compile_config"]
    assert contract["_config_methods"] is True
    # share_values' program is written with the emitter's own serializer when share_tables is off
    assert contract["serialize_pte_binary"][:2] == ["pte_file", "extract_delegate_segments"]
    # provenance_shared: what it makes cheap is still there to make cheap
    assert contract["NodeSource deep-copies from_node"] is True
    # idle_decompositions_skipped: the method it wraps and upstream's test it skips by
    assert contract["run_decompositions"][:3] == ["self", "decomp_table",
                                                  "decompose_custom_triton_ops"]
    assert contract["contains_any_call_fn_target_op"] == ["graph_module", "ops"]
    # delegate_outputs_from_metadata: the fake kernel it swaps is where it looks
    assert contract["registered_hop_fake_fns[executorch_call_delegate]"] is True
    # canonical_form_check_skipped: the serializer still calls the check it skips
    assert contract["serialize calls canonicalize"] is True


def test_tag_module_wrapper_forwards_the_tag_iterator():
    from partitioners import upstream_ethos_u

    calls = []

    class Partitioner:
        def _tag_module(self, module, containing_program, reporter, tag_iterator=None):
            calls.append(tag_iterator)
            return {"tag"}

    partitioner = Partitioner()
    reporters = upstream_ethos_u.capture_reporters(partitioner)
    assert partitioner._tag_module("m", "p", "r1") == {"tag"}
    assert partitioner._tag_module("m", "p", "r2", "iterator") == {"tag"}
    assert reporters == ["r1", "r2"] and calls == [None, "iterator"]


def test_the_tag_module_wrapper_hands_the_tags_on_in_tag_number_order():
    from partitioners import upstream_ethos_u

    class Partitioner:
        def _tag_module(self, module, containing_program, reporter, tag_iterator=None):
            return {"tag10", "tag2", "tag1", "tag0"}

    partitioner = Partitioner()
    upstream_ethos_u.capture_reporters(partitioner)
    tags = partitioner._tag_module("m", "p", "r")
    assert list(tags) == ["tag0", "tag1", "tag2", "tag10"]
    assert tags & {"tag2", "tag7"} == {"tag2"} and tags == {"tag0", "tag1", "tag2", "tag10"}


def test_upstream_hands_the_partition_tags_on_in_set_order():
    """What the wrapper above corrects: TOSAPartitioner.partition builds its partition_tags by
    iterating the set _tag_module returns, and a set of strings iterates in hash order, which
    PYTHONHASHSEED changes from one process to the next."""
    import inspect
    import os
    import subprocess
    import sys

    from executorch.backends.arm.tosa.partitioner import TOSAPartitioner

    assert "tags: set[str] = set()" in inspect.getsource(TOSAPartitioner._tag_module)
    assert "{tag: self.delegation_spec for tag in tags}" in inspect.getsource(
        TOSAPartitioner.partition)
    orders = {subprocess.run(
        [sys.executable, "-c", "print(list({f'tag{i}' for i in range(6)}))"],
        env={**os.environ, "PYTHONHASHSEED": str(seed)}, capture_output=True, text=True,
        check=True).stdout for seed in range(6)}
    assert len(orders) > 1, orders


def test_vela_compile_is_restored_after_the_wrapper():
    import executorch.backends.arm.ethosu.backend as ethosu_backend

    from partitioners import upstream_ethos_u

    original = ethosu_backend.vela_compile
    with upstream_ethos_u.vela_compile_wrapped(lambda upstream: "wrapped"):
        assert ethosu_backend.vela_compile == "wrapped"
    assert ethosu_backend.vela_compile is original


def test_backend_preprocess_is_restored_and_failures_counted():
    from executorch.backends.arm.ethosu.backend import EthosUBackend

    from partitioners import upstream_ethos_u

    original = EthosUBackend.__dict__["preprocess"]
    failed: list[int] = []
    with upstream_ethos_u.vela_compile_wrapped(lambda upstream: upstream), \
            upstream_ethos_u.preprocess_failures_recorded(failed):
        assert EthosUBackend.__dict__["preprocess"] is not original
        with pytest.raises(Exception):
            EthosUBackend.preprocess(None, [])  # no program: the backend raises
    assert failed == [0]
    assert EthosUBackend.__dict__["preprocess"] is original


@pytest.mark.parametrize("module_name", ["partitioners.upstream_ethos_u", "partitioners.upstream_cortex_m",
                                         "orchestrator.compilation.upstream_exir", "kernels.upstream_runtime"])
def test_version_guard_names_the_supported_versions(module_name, monkeypatch):
    import importlib

    adapter = importlib.import_module(module_name)
    assert adapter.check_version() == metadata.version("executorch")
    monkeypatch.setattr(adapter, "SUPPORTED_EXECUTORCH", ("0.0.1",))
    from kernels.upstream_version import UpstreamVersionError

    with pytest.raises(UpstreamVersionError, match=r"checked against 0\.0\.1"):
        adapter.check_version()


def test_one_version_guard_for_every_adapter():
    """partitioners/upstream_version.py re-exports the kernels guard: one function, one error
    class, whichever package an adapter imports it from."""
    from kernels import upstream_version as kernels_guard
    from partitioners import upstream_version as partitioners_guard

    assert partitioners_guard.require is kernels_guard.require
    assert partitioners_guard.UpstreamVersionError is kernels_guard.UpstreamVersionError


def test_cortex_m_adapter_contract():
    from partitioners import upstream_cortex_m

    contract = upstream_cortex_m.contract()
    assert contract["_DIALECT_SUBSTITUTIONS"] is True
    assert contract["substitution signature"] == ["node", "dialect_pass"]
    assert {"convolution", "linear", "add", "avg_pool2d"} <= upstream_cortex_m.substituted_op_names()
    # single_channel_convolutions_as_conv2d rewrites what this test of upstream decides
    assert contract["depthwise test"] is True


def test_cortex_m_substitutions_are_restored_after_wrapping():
    from partitioners import upstream_cortex_m

    before = upstream_cortex_m.substitutions()
    with upstream_cortex_m.substitutions_wrapped(lambda f: "wrapped"):
        assert set(upstream_cortex_m.substitutions().values()) == {"wrapped"}
    assert upstream_cortex_m.substitutions() == before


def test_cortex_m_reason_capture_contract():
    """What the reason capture reads from upstream's source: every `return None` of a
    substitution sits under an `if` the capture can find, and the max-pool checker sets the flag
    the max-pool substitution reads under a condition of its own."""
    from partitioners import upstream_cortex_m

    contract = upstream_cortex_m.contract()
    assert contract["plain functions"] is True  # the profiler matches their code objects
    guards = contract["return None guards"]
    assert [where for returns in guards.values() for where, condition in returns
            if not condition] == []
    assert [c for _, c in guards["_get_avg_pool2d_replacement"]] == [
        "not _has_qparams(node)", "divisor_override is not None"]
    assert ('input_qparams is None or cortex_m_meta.get("skip_quantized_max_pool2d", False)'
            in [c for _, c in guards["_get_max_pool2d_replacement"]])
    assert contract["flag setters"] == {"skip_quantized_max_pool2d": {
        "check": "CortexMMaxPool2DCheck", "check_pattern": ["pattern"],
        "sets it under": "dilation != (1, 1) or ceil_mode",
        "read by": ["_get_max_pool2d_replacement"]}}


@pytest.fixture(scope="module")
def pools_edge():
    """A factory of the smallest CPU-only edge program whose two pools CMSIS-NN declines:
    a ceil_mode max-pool (quantized, but flagged by the quantizer) and an avg-pool with a
    divisor_override (left unquantized by the quantizer)."""
    import torch
    from executorch.backends.cortex_m.edge_compile_config import cortex_m_edge_compile_config
    from executorch.backends.cortex_m.quantizer.quantizer import CortexMQuantizer
    from executorch.exir import to_edge_transform_and_lower
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    class Pools(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.max_pool = torch.nn.MaxPool2d(2, ceil_mode=True)
            self.avg_pool = torch.nn.AvgPool2d(2, divisor_override=3)

        def forward(self, x):
            return self.max_pool(x), self.avg_pool(x)

    x = (torch.randn(1, 2, 5, 5, generator=torch.Generator().manual_seed(0)),)
    prepared = prepare_pt2e(torch.export.export(Pools().eval(), x, strict=True)
                            .module(check_guards=False), CortexMQuantizer())
    prepared(*x)
    quantized = torch.export.export(convert_pt2e(prepared), x, strict=True)

    def edge():
        return to_edge_transform_and_lower(quantized, compile_config=cortex_m_edge_compile_config())

    return edge


def test_cortex_m_capture_names_the_condition_that_declined(pools_edge):
    from executorch.backends.cortex_m.passes.cortex_m_pass_manager import CortexMPassManager
    from executorch.backends.cortex_m.target_config import CortexMTargetConfig

    from partitioners import upstream_cortex_m

    before, outcomes = upstream_cortex_m.substitutions(), {}
    with upstream_cortex_m.substitutions_observed(
            lambda node, outcome: outcomes.setdefault(node.target.__name__, outcome)):
        CortexMPassManager(pools_edge().exported_program(),
                           target_config=CortexMTargetConfig.from_target_string("cortex-m55")
                           ).transform()
    max_pool = outcomes["aten.max_pool2d.default"]
    assert isinstance(max_pool, upstream_cortex_m.Declined)
    assert max_pool.held == ("cortex_m_meta.get('skip_quantized_max_pool2d', False)",)
    assert (max_pool.flag.check, max_pool.flag.held, max_pool.flag.values) == (
        "CortexMMaxPool2DCheck", ("ceil_mode",), "ceil_mode=True")
    avg_pool = outcomes["aten.avg_pool2d.default"]
    assert (avg_pool.held, avg_pool.flag) == (("not _has_qparams(node)",), None)
    assert avg_pool.where.startswith("aten_to_cortex_m_pass.py:")
    assert upstream_cortex_m.substitutions() == before


def test_cortex_m_declines_become_the_cmsis_condition_reason(pools_edge):
    from partitioners.cpu import route_to_cpu
    from partitioners.reasons import CATALOGUE, because

    _, decisions, _ = route_to_cpu(pools_edge(), "cortex-m55", legalize=False)
    by_op = {d.aten_op: d for d in decisions.values()}
    max_pool, avg_pool = by_op["aten.max_pool2d.default"], by_op["aten.avg_pool2d.default"]
    assert (max_pool.category, max_pool.message) == (
        "shape-limit", "shape/geometry outside what the CMSIS-NN kernel supports (`ceil_mode` "
        "(ceil_mode=True): the quantizer's CortexMMaxPool2DCheck marks the node "
        "`skip_quantized_max_pool2d`)")
    assert (avg_pool.category, avg_pool.message) == (
        "not-quantized", "not quantized: the node carries no input/output qparams, so no int8 "
        "kernel applies (`not _has_qparams(node)`)")
    reason = because("cmsis-condition", debug=max_pool.check, message=max_pool.message)
    assert (reason.key, reason.check, reason.message) == (
        "cmsis-condition", CATALOGUE["cmsis-condition"].decided_by, max_pool.message)
    assert " after pattern_checkers.py:" in reason.debug  # upstream lines: debug, not the text


def test_runtime_adapter_contract():
    from kernels import upstream_runtime

    contract = upstream_runtime.contract()
    assert contract["_get_operator_names"] == []
    assert contract["operator name form"] is True  # "aten::add.out"
    assert contract["_get_registered_backend_names"] == []
    assert contract["_load_for_executorch_from_buffer"][:4] == [
        "buffer", "data_map_buffer", "enable_etdump", "debug_buffer_size"]
    assert contract["deserialize_pte_binary"] == ["program_data"]
    assert contract["Runtime.load_program"][:3] == ["self", "data", "verification"]
    assert contract["PTEFile.program"] is True
    # the twin refuses a program with data segments it does not load (orchestrator/verification/twin.py)
    assert {"program", "mutable_data", "named_data"} <= set(contract["PTEFile fields"])
    assert contract["portable_lib re-exports _C"] is True


def test_runtime_adapter_lists_the_host_kernels():
    from kernels import upstream_runtime

    names = upstream_runtime.operator_names()
    assert {"aten::add.out", "aten::view_copy.out"} <= names
    # No portable kernel: the twin reports the device fault (tests/test_twin.py).
    assert "aten::sort.values" not in names
    assert isinstance(upstream_runtime.registered_backend_names(), frozenset)


def test_memory_planning_names_the_arena_split_uses():
    """platforms/arena_planning.py runs inside ExecuTorch's MemoryPlanningPass as its
    `memory_planning_algo`, calls `greedy` per buffer and sets `TensorSpec.mem_id` (which greedy
    honours); an upstream change to these names or parameters fails here, without a compile."""
    import inspect

    from executorch.exir.memory_planning import MemoryPlanningAlgorithmSuite, greedy
    from executorch.exir.passes import MemoryPlanningPass
    from executorch.exir.tensor import TensorSpec

    assert list(inspect.signature(greedy).parameters)[:5] == [
        "alignment", "specs", "graph_module", "graph_signature", "extra_padding"]
    assert "memory_planning_algo" in inspect.signature(MemoryPlanningPass.__init__).parameters
    assert list(inspect.signature(MemoryPlanningAlgorithmSuite.__call__).parameters)[1:6] == [
        "alignment", "specs", "graph_module", "graph_signature", "extra_padding"]
    import torch

    spec = TensorSpec.from_tensor(torch.zeros(64, dtype=torch.int8))
    # allocated_memory: the bytes rounded up to the planner's alignment (16 by default).
    assert spec.mem_id is None and spec.storage_base is None and spec.allocated_memory == 64
    assert "spec.mem_id is None" in inspect.getsource(greedy)  # a preset mem_id is kept


def test_the_reason_capture_runs_under_cprofile_and_leaves_it_profiling(pools_edge):
    """`python -m cProfile orchestrate ...`: the capture swaps the profile function for each
    substitution; it must hand cProfile's C profiler back (setprofile refuses its object)."""
    import cProfile
    import sys

    from partitioners.cpu import route_to_cpu

    profile = cProfile.Profile()
    profile.enable()
    try:
        _, decisions, _ = route_to_cpu(pools_edge(), "cortex-m55", legalize=False)
        still_profiling = sys.getprofile() is profile
    finally:
        profile.disable()
    assert still_profiling
    assert {d.aten_op for d in decisions.values()} >= {"aten.max_pool2d.default",
                                                       "aten.avg_pool2d.default"}


def _conv_relu_program():
    import torch
    from torch import nn

    module = nn.Sequential(nn.Conv2d(2, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(16, 3)).eval()
    return torch.export.export(module, (torch.rand(1, 2, 4, 4),), strict=False)


def _targets(program) -> list[str]:
    return sorted(str(n.target) for n in program.graph.nodes if n.op == "call_function")


def test_a_retrace_that_decomposes_nothing_is_skipped_and_one_that_would_is_not():
    """Upstream's to_edge_transform_and_lower re-traces a functional program with its default
    table when a filtering partitioner (Ethos-U) is given, even when nothing in the graph is in
    the table: the re-trace gives the same operators. Inside idle_decompositions_skipped such a
    call returns the program; a program holding a table target or a CompositeImplicitAutograd
    operator (aten.conv2d, aten.linear), or one not made by a run_decompositions inside, is
    decomposed as before."""
    from executorch.exir.program._program import _default_decomposition_table

    from orchestrator.compilation import upstream_exir

    exported = _conv_relu_program()
    # upstream's behaviour, outside: the second re-trace of the decomposed program changes nothing
    decomposed = exported.run_decompositions(_default_decomposition_table())
    again = decomposed.run_decompositions(_default_decomposition_table())
    assert again is not decomposed and _targets(again) == _targets(decomposed)
    assert "aten.convolution.default" in _targets(decomposed)

    record: list[str] = []
    with upstream_exir.idle_decompositions_skipped(record):
        functional = exported.run_decompositions({})
        # aten.conv2d and aten.linear are CompositeImplicitAutograd: a re-trace decomposes them
        assert {"aten.conv2d.default", "aten.linear.default"} <= set(_targets(functional))
        table_run = functional.run_decompositions(_default_decomposition_table())
        assert "aten.convolution.default" in _targets(table_run)
        idle = table_run.run_decompositions(_default_decomposition_table())
        # made outside the context: never skipped
        outside = decomposed.run_decompositions(_default_decomposition_table())
    assert record == ["ran", "ran", "skipped", "ran"]
    assert idle is table_run and _targets(outside) == _targets(decomposed)
    # restored on exit
    after = table_run.run_decompositions(_default_decomposition_table())
    assert after is not table_run and record == ["ran", "ran", "skipped", "ran"]


def test_a_table_target_in_the_graph_is_still_decomposed():
    import torch

    from orchestrator.compilation import upstream_exir

    record: list[str] = []
    with upstream_exir.idle_decompositions_skipped(record):
        functional = _conv_relu_program().run_decompositions({})
        relu = torch.ops.aten.relu.default
        table = {relu: lambda x: torch.clamp(x, min=0)}
        decomposed = functional.run_decompositions(table)
    assert record == ["ran", "ran"]
    assert "aten.relu.default" not in _targets(decomposed)
    assert "aten.clamp.default" in _targets(decomposed)


def _edge_targets(edge) -> list[str]:
    return [str(n.target) for n in edge.exported_program().graph.nodes]


def test_to_edges_passes_re_trace_a_graph_with_nothing_to_rewrite_and_ours_skip_it():
    """NormalizeTransposePass, SymToTensorPass and ScalarToTensorPass each re-trace the whole
    graph whatever it holds; inside idle_edge_passes_skipped a graph with nothing they rewrite
    is handed on as it is, and the edge program is the same; a graph with an `aten.t` still goes
    through NormalizeTransposePass (which makes it `t_copy`)."""
    import torch
    from executorch.exir import to_edge
    from executorch.exir.passes.normalize_transpose_pass import NormalizeTransposePass

    from orchestrator.compilation import upstream_exir

    class Plain(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x) + x

    class Transposed(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x).t()

    x = torch.randn(3, 4)
    upstream = to_edge(torch.export.export(Plain(), (x,)))
    record: list = []
    with upstream_exir.idle_edge_passes_skipped(record):
        ours = to_edge(torch.export.export(Plain(), (x,)))
        assert record == [("NormalizeTransposePass", "skipped"),
                          ("ScalarToTensorPass", "skipped"), ("SymToTensorPass", "skipped"),
                          ("RemoveMixedTypeOperators", "skipped")]
        transposed = torch.export.export(Transposed(), (x,)).graph_module
        result = NormalizeTransposePass()(transposed)
    assert record[-1] == ("NormalizeTransposePass", "ran")
    assert any("t_copy" in str(n.target) for n in result.graph_module.graph.nodes)
    assert _edge_targets(ours) == _edge_targets(upstream)
    # restored on exit: the class calls upstream's own `call` again
    assert "call" not in NormalizeTransposePass.__dict__


def test_a_python_scalar_where_the_schema_takes_a_tensor_still_goes_to_scalar_to_tensor():
    import torch

    from orchestrator.compilation.upstream_exir import _no_scalar_for_tensor

    class AddScalar(torch.nn.Module):
        def forward(self, x):
            return torch.ops.aten.add.Tensor(x, 2)

    graph_module = torch.export.export(AddScalar(), (torch.randn(2),)).graph_module
    assert not _no_scalar_for_tensor(graph_module)


def test_an_add_of_an_int_and_a_float_tensor_still_goes_to_remove_mixed_type_operators():
    import torch
    from executorch.exir import to_edge

    from orchestrator.compilation import upstream_exir
    from orchestrator.compilation.upstream_exir import _no_mixed_types

    class Mixed(torch.nn.Module):
        def forward(self, x, n):
            return torch.ops.aten.add.Tensor(x, n)

    program = torch.export.export(Mixed(), (torch.randn(3), torch.arange(3)))
    assert not _no_mixed_types(program.graph_module)
    record: list = []
    with upstream_exir.idle_edge_passes_skipped(record):
        edge = to_edge(program)
    assert ("RemoveMixedTypeOperators", "ran") in record
    # the cast it inserts (an aten._to_copy, which to_edge then writes as _to_dim_order_copy)
    assert any("_to_dim_order_copy" in t for t in _edge_targets(edge))


def test_a_delegates_fake_outputs_from_its_recorded_outputs_equal_upstreams(compiles):
    """torch's fake kernel of executorch_call_delegate runs the partition's whole graph; the
    outputs recorded on it are the same fake tensors (shape, stride, dtype)."""
    import torch
    from torch._higher_order_ops.executorch_call_delegate import executorch_call_delegate
    from torch._higher_order_ops.utils import registered_hop_fake_fns
    from torch._subclasses.fake_tensor import FakeTensorMode

    from orchestrator.compilation.upstream_exir import _recorded_outputs

    compiled, _ = compiles.get("ds-cnn", npu="ethos-u55-128")
    graph = compiled.final_program.graph_module
    calls = [n for n in graph.graph.nodes if n.target is executorch_call_delegate]
    assert calls
    upstream = registered_hop_fake_fns[executorch_call_delegate]
    for call in calls:
        lowered = getattr(graph, call.args[0].target)
        with FakeTensorMode(allow_non_fake_inputs=True) as mode:
            args = [mode.from_tensor(torch.zeros(a.meta["val"].shape, dtype=a.meta["val"].dtype))
                    for a in call.args[1:]]
            theirs = upstream(lowered, *args)
            ours = _recorded_outputs(lowered.original_module)()
        flat_theirs = theirs if isinstance(theirs, (list, tuple)) else [theirs]
        flat_ours = ours if isinstance(ours, (list, tuple)) else [ours]
        assert [(t.shape, t.stride(), t.dtype) for t in flat_ours] == \
            [(t.shape, t.stride(), t.dtype) for t in flat_theirs]


def test_torch_export_save_writes_the_same_bytes_without_its_canonical_form_check():
    import io

    import torch

    from orchestrator.compilation import upstream_exir

    program = _conv_relu_program()

    def saved() -> bytes:
        buffer = io.BytesIO()
        torch.export.save(program, buffer)
        return buffer.getvalue()

    import torch._export.serde.serialize as serialize
    checked = saved()
    with upstream_exir.canonical_form_check_skipped():
        assert serialize.canonicalize is upstream_exir._not_canonicalized
        unchecked = saved()
    assert unchecked == checked
    assert serialize.canonicalize is not upstream_exir._not_canonicalized


def test_a_partition_equal_to_one_compiled_before_takes_its_result_without_a_second_call():
    from executorch.backends.arm.ethosu.backend import EthosUBackend

    from partitioners import upstream_ethos_u

    calls: list = []
    original = EthosUBackend.__dict__["preprocess"]
    EthosUBackend.preprocess = staticmethod(lambda program, specs: calls.append(program) or
                                            f"compiled {program}")
    try:
        failed: list[int] = []
        reused: list[tuple[int, int]] = []
        with upstream_ethos_u.preprocess_failures_recorded(
                failed, lambda program, specs: program.split(":")[0], reused):
            results = [EthosUBackend.preprocess(p, []) for p in ("a:1", "b:2", "a:3", "a:4")]
    finally:
        EthosUBackend.preprocess = original
    assert calls == ["a:1", "b:2"]
    assert results == ["compiled a:1", "compiled b:2", "compiled a:1", "compiled a:1"]
    assert reused == [(2, 0), (3, 0)] and failed == []


def test_upstreams_extraction_check_refuses_a_partition_a_path_leaves_and_re_enters():
    import torch

    from partitioners.upstream_ethos_u import partition_extractable

    class Diamond(torch.nn.Module):
        def forward(self, x):
            a = torch.relu(x)
            b = torch.sigmoid(a)
            return torch.tanh(a) + b

    graph = torch.export.export(Diamond(), (torch.randn(2),)).graph
    nodes = {n.name: n for n in graph.nodes}
    assert partition_extractable({nodes["relu"], nodes["sigmoid"]})
    # relu -> sigmoid (outside) -> add (inside): extracting {relu, add} would need a cycle
    assert not partition_extractable({nodes["relu"], nodes["add"]})


def test_a_vela_crash_moves_its_partition_to_the_cpu_and_the_compile_goes_on(tmp_path,
                                                                            monkeypatch):
    """Vela 5.1's native compiler can end the process (SIGSEGV in `process_regor` on
    MobileViT-XXS for the U55). Each Vela call runs in a child process: a crash there is a
    failed compile of that partition, which the planner moves to the CPU, naming the signal."""
    import json
    import os
    import signal

    import executorch.backends.arm.ethosu.backend as ethosu_backend

    from orchestrator.cli import main

    upstream = ethosu_backend.vela_compile

    def crashing(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGSEGV)  # runs in the child: only it ends
        return upstream(*args, **kwargs)

    monkeypatch.setattr(ethosu_backend, "vela_compile", crashing)
    pte = tmp_path / "ae.pte"
    code = main(["compile", "deep-autoencoder", "--npu", "ethos-u55-128", "-o", str(pte),
                 "--quiet"])
    assert code == 0 and pte.is_file()
    plan = json.loads((tmp_path / "ae.artifacts" / "plan.json").read_text())
    text = json.dumps(plan)
    assert "Vela's compiler crashed (signal SIGSEGV)" in text
    assert plan["summary"]["npu_partitions"] == 0
