"""orchestrator/compilation/fx_code_cache.py: each distinct FX source compiled once, with the
same programs and the same tracebacks as torch's own path."""

from __future__ import annotations

import builtins
import traceback

import pytest
import torch
import torch.fx.graph_module as graph_module
from executorch.exir import to_edge

from orchestrator.compilation import fx_code_cache


class _Small(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 4)

    def forward(self, x):
        return torch.relu(self.linear(x)) * 2


def _torch_path(monkeypatch) -> None:
    """torch's own `_exec_with_source` for this test (an earlier compile in this process may
    have installed the cache); monkeypatch puts back whatever was there."""
    assert fx_code_cache.TORCH_EXEC_WITH_SOURCE is not fx_code_cache._exec_with_source
    monkeypatch.setattr(graph_module, "_exec_with_source", fx_code_cache.TORCH_EXEC_WITH_SOURCE)


def _pte(module, inputs) -> bytes:
    program = torch.export.export(module, inputs, strict=False)
    return to_edge(program).to_executorch().buffer


def _compiles_during(fn) -> int:
    calls = []
    real = builtins.compile

    def counting(src, filename, *args, **kwargs):
        if str(filename).startswith("<eval_with_key>"):
            calls.append(filename)
        return real(src, filename, *args, **kwargs)

    builtins.compile = counting
    try:
        fn()
    finally:
        builtins.compile = real
    return len(calls)


def test_torch_alone_compiles_an_unchanged_graph_again_and_the_cache_does_not(monkeypatch):
    gm = torch.fx.symbolic_trace(_Small())
    _torch_path(monkeypatch)
    # Upstream: every recompile of the same graph compiles its source anew.
    assert _compiles_during(lambda: [gm.recompile() for _ in range(3)]) == 3
    assert fx_code_cache.install()
    before = fx_code_cache.counts()
    assert _compiles_during(lambda: [gm.recompile() for _ in range(3)]) <= 1
    after = fx_code_cache.counts()
    assert after["reused"] - before["reused"] >= 2


def test_same_program_bytes_and_values_with_the_cache(monkeypatch):
    torch.manual_seed(0)
    module, inputs = _Small().eval(), (torch.randn(2, 8),)
    _torch_path(monkeypatch)
    without = _pte(module, inputs)
    assert fx_code_cache.install()
    with_cache = _pte(module, inputs)
    assert with_cache == without
    gm = torch.fx.symbolic_trace(module)
    gm.recompile()
    gm.recompile()
    torch.testing.assert_close(gm(*inputs), module(*inputs), rtol=0, atol=0)


def test_a_reused_code_object_still_shows_its_source_line_in_a_traceback(monkeypatch):
    class Fails(torch.nn.Module):
        def forward(self, x):
            return torch.ops.aten.mm.default(x, x)  # [2, 3] @ [2, 3]: a shape error

    _torch_path(monkeypatch)
    assert fx_code_cache.install()
    gm = torch.fx.symbolic_trace(Fails())
    gm.recompile()
    gm.recompile()  # the second is served from the cache
    with pytest.raises(RuntimeError) as raised:
        gm(torch.ones(2, 3))
    text = "".join(traceback.format_exception(raised.value))
    assert "torch.ops.aten.mm.default(x, x)" in text


def test_install_leaves_torch_alone_when_the_function_it_wraps_changed(monkeypatch):
    def other(src, globals):  # noqa: A002
        raise AssertionError("not called")

    monkeypatch.setattr(graph_module, "_exec_with_source", other)
    assert fx_code_cache.install() is False
    assert graph_module._exec_with_source is other


def test_the_cache_keeps_the_last_sources_only(monkeypatch):
    """A long-lived process (a sweep, a precision search) holds a bounded number of code
    objects, not one per graph it ever compiled."""
    _torch_path(monkeypatch)
    assert fx_code_cache.install()
    before = fx_code_cache.counts()["compiled"]
    modules = []
    for scale in range(fx_code_cache._KEEP + 8):
        class Scaled(torch.nn.Module):
            def forward(self, x, k=scale):
                return x * k + k
        modules.append(torch.fx.symbolic_trace(Scaled()))
    assert fx_code_cache.counts()["compiled"] - before == fx_code_cache._KEEP + 8  # all distinct
    assert len(fx_code_cache._codes) == fx_code_cache._KEEP
    x = torch.ones(3)
    for scale, gm in enumerate(modules):  # the evicted ones still run: their code is bound
        torch.testing.assert_close(gm(x), x * scale + scale)
