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
    assert contract["vela_compile"][:2] == ["tosa_flatbuffer", "args"]
    assert {"intermediate_path", "block_placements"} <= set(contract["vela_compile"])


def test_exir_adapter_contract():
    from orchestrator import upstream_exir

    contract = upstream_exir.contract()
    assert contract["EdgeProgramManager.__init__"][:4] == ["self", "edge_programs",
                                                           "constant_methods", "compile_config"]
    assert contract["_config_methods"] is True
    assert contract["deserialize_pte_binary"] == ["program_data"]
    assert contract["PTEFile.program"] is True


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


def test_vela_compile_is_restored_after_the_wrapper():
    import executorch.backends.arm.ethosu.backend as ethosu_backend

    from partitioners import upstream_ethos_u

    original = ethosu_backend.vela_compile
    with upstream_ethos_u.vela_compile_wrapped(lambda upstream: "wrapped"):
        assert ethosu_backend.vela_compile == "wrapped"
    assert ethosu_backend.vela_compile is original


@pytest.mark.parametrize("module_name", ["partitioners.upstream_ethos_u", "partitioners.upstream_cortex_m",
                                         "orchestrator.upstream_exir"])
def test_version_guard_names_the_supported_versions(module_name, monkeypatch):
    import importlib

    adapter = importlib.import_module(module_name)
    assert adapter.check_version() == metadata.version("executorch")
    monkeypatch.setattr(adapter, "SUPPORTED_EXECUTORCH", ("0.0.1",))
    from partitioners.upstream_version import UpstreamVersionError

    with pytest.raises(UpstreamVersionError, match=r"checked against 0\.0\.1"):
        adapter.check_version()


def test_cortex_m_adapter_contract():
    from partitioners import upstream_cortex_m

    contract = upstream_cortex_m.contract()
    assert contract["_DIALECT_SUBSTITUTIONS"] is True
    assert contract["substitution signature"] == ["node", "dialect_pass"]
    assert {"convolution", "linear", "add", "avg_pool2d"} <= upstream_cortex_m.substituted_op_names()


def test_cortex_m_substitutions_are_restored_after_wrapping():
    from partitioners import upstream_cortex_m

    before = upstream_cortex_m.substitutions()
    with upstream_cortex_m.substitutions_wrapped(lambda f: "wrapped"):
        assert set(upstream_cortex_m.substitutions().values()) == {"wrapped"}
    assert upstream_cortex_m.substitutions() == before
