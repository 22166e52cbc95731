"""Capture + quantization are cached by content: a hit gives the same .pte bytes."""

from __future__ import annotations

import pytest


@pytest.fixture()
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ORCHESTRATE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _compile(model, npu, calibration=None):
    from orchestrator.compilation.pipeline import compile_model
    from orchestrator.sources.loader import load_calibration, load_model
    from orchestrator.target import resolve_target

    loaded = load_model(model)
    samples = load_calibration(None, loaded.example_inputs, seed=calibration or 0)
    return compile_model(loaded, samples, resolve_target("corstone300", npu=npu))


def test_a_cache_hit_gives_the_same_program_bytes(private_cache):
    cold = _compile("mixed", "ethos-u55-128")
    warm = _compile("mixed", "ethos-u55-128")
    assert not cold.cache_hit and warm.cache_hit
    assert warm.pte_bytes == cold.pte_bytes
    assert len(list((private_cache / "quantized").iterdir())) == 1


def test_the_key_follows_what_quantization_reads(private_cache):
    from orchestrator.artifacts.cache import quantized_key
    from orchestrator.sources.loader import load_calibration, load_model
    from orchestrator.target import resolve_target

    model = load_model("ds-cnn")
    samples = load_calibration(None, model.example_inputs)
    other = load_calibration(None, model.example_inputs, seed=1)

    def key(npu, calibration=samples, channels_last=True):
        return quantized_key(model, calibration, resolve_target("corstone300", npu=npu),
                             channels_last)

    # One quantization serves every U55 size (the quantizer reads the TOSA spec, not the MACs).
    assert key("ethos-u55-64") == key("ethos-u55-128") == key("ethos-u55-256")
    assert key("ethos-u55-128") != key("none")
    assert key("ethos-u55-128") != key("ethos-u55-128", calibration=other)
    assert key("ethos-u55-128") != key("ethos-u55-128", channels_last=False)
    # compile(legalize=False) quantizes without the pre-quantization rewrites: its own entry
    assert key("none") != quantized_key(model, samples, resolve_target("corstone300", npu="none"),
                                        True, rewrites=False)
    model.module.state_dict()[next(iter(model.module.state_dict()))].add_(1.0)
    assert key("ethos-u55-128") != quantized_key(load_model("ds-cnn"), samples,
                                                 resolve_target("corstone300", npu="ethos-u55-128"),
                                                 True)


def test_the_cache_can_be_switched_off(monkeypatch):
    from orchestrator.artifacts.cache import cache_dir

    monkeypatch.setenv("ORCHESTRATE_CACHE", "off")
    assert cache_dir() is None


def test_a_change_to_the_projects_own_rewrites_re_keys_the_cache(private_cache, tmp_path,
                                                                 monkeypatch):
    """An entry made before a change to the pre-quantization rewrites (partitioners/
    quantizable.py, ...) is never served after it: before, the key held only the model, the
    quantizer and the package versions, and a new rewrite met stale quantized programs."""
    from orchestrator.artifacts import cache
    from orchestrator.sources.loader import load_calibration, load_model
    from orchestrator.target import resolve_target

    assert "partitioners/quantizable.py" in cache.REWRITE_SOURCES
    model = load_model("mixed")
    samples = load_calibration(None, model.example_inputs)
    target = resolve_target("corstone300", npu="none")
    for source in cache.REWRITE_SOURCES:
        (tmp_path / source).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / source).write_bytes((cache._ROOT / source).read_bytes())
    monkeypatch.setattr(cache, "_ROOT", tmp_path)
    before = cache.quantized_key(model, samples, target, True)
    with open(tmp_path / "partitioners/quantizable.py", "a") as rewrites:
        rewrites.write("\n# a new rewrite\n")
    assert cache.quantized_key(model, samples, target, True) != before


def test_the_key_follows_a_modules_constructor_settings(private_cache):
    """Two models of one class whose settings differ only in a constructor argument that is in
    neither the source nor a tensor (a transposed convolution's padding: the same weight
    shapes) are two entries; they shared one, and the second compiled as the first."""
    import torch

    from orchestrator.artifacts.cache import quantized_key
    from orchestrator.sources.loader import LoadedModel, load_calibration
    from orchestrator.target import resolve_target

    def model(padding: int) -> LoadedModel:
        torch.manual_seed(0)
        module = torch.nn.Sequential(torch.nn.ConvTranspose2d(4, 2, 4, stride=2,
                                                              padding=padding)).eval()
        return LoadedModel("tconv", module, (torch.randn(1, 4, 4, 4),), "zoo:tconv", "unknown")

    target = resolve_target("corstone300", npu="none")
    padded, unpadded = model(1), model(0)
    samples = load_calibration(None, padded.example_inputs)
    assert quantized_key(padded, samples, target, True) != \
        quantized_key(unpadded, samples, target, True)


def test_artifacts_and_cache_entry_hold_one_serialization_of_each_program(private_cache,
                                                                          tmp_path):
    import io

    import torch

    from orchestrator.artifacts.manifest import artifacts_dir_for
    from orchestrator.artifacts.outputs import write_outputs

    cold = _compile("mixed", "ethos-u55-128")
    write_outputs(cold, tmp_path / "cold.pte", extra_files={})
    warm = _compile("mixed", "ethos-u55-128")
    write_outputs(warm, tmp_path / "warm.pte", extra_files={})
    (entry,) = (private_cache / "quantized").iterdir()
    for name, program in (("float.pt2", cold.captured.program),
                          ("quantized.pt2", cold.quantized.program)):
        stored = (entry / name).read_bytes()
        # what torch.export.save writes for the program, written once and reused: the cache
        # entry, the cold compile's artifacts and the warm (cache-hit) compile's artifacts
        fresh = io.BytesIO()
        torch.export.save(program, fresh)
        assert stored == fresh.getvalue()
        assert (artifacts_dir_for(tmp_path / "cold.pte") / name).read_bytes() == stored
        assert (artifacts_dir_for(tmp_path / "warm.pte") / name).read_bytes() == stored
