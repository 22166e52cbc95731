"""Model sources and calibration data: what a user can name, and what they hear when it is wrong."""

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from examples.zoo import ZOO, zoo_names
from orchestrator.errors import UserError
from orchestrator.sources.loader import Calibration, LoadedModel, load_calibration, load_model

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

# name -> (input shape, output shape, kind): the contract documented in examples/zoo.py.
ZOO_CONTRACT = {
    "ds-cnn": ((1, 1, 49, 10), (1, 12), "classifier"),
    "mobilenet-v1-025": ((1, 3, 96, 96), (1, 2), "classifier"),
    "resnet8": ((1, 3, 32, 32), (1, 10), "classifier"),
    "deep-autoencoder": ((1, 640), (1, 640), "autoencoder"),
    "person-detector": ((1, 3, 128, 128), (1, 80), "detector"),
    "mixed": ((1, 3, 32, 32), (1, 10), "classifier"),
}


def _user_error(call, *args) -> str:
    """Run `call`, require a UserError, and return its message after checking it is one line."""
    with pytest.raises(UserError) as info:
        call(*args)
    message = str(info.value)
    assert "\n" not in message
    assert info.value.exit_code == 2
    return message


def _conv_linear_macs(module: nn.Module, inputs: tuple[torch.Tensor, ...]) -> int:
    """Multiply-accumulates of every Conv2d and Linear for one forward pass."""
    macs = 0

    def count(layer, _inputs, output):
        nonlocal macs
        if isinstance(layer, nn.Conv2d):
            macs += output.numel() * layer.weight[0].numel()
        elif isinstance(layer, nn.Linear):
            macs += output.numel() * layer.in_features

    hooks = [m.register_forward_hook(count) for m in module.modules()]
    with torch.no_grad():
        module(*inputs)
    for hook in hooks:
        hook.remove()
    return macs


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_zoo_holds_exactly_the_documented_models():
    assert set(zoo_names()) == set(ZOO_CONTRACT)


@pytest.mark.parametrize("name", sorted(ZOO_CONTRACT))
def test_zoo_model_loads_with_documented_shapes_and_kind(name):
    input_shape, output_shape, kind = ZOO_CONTRACT[name]
    loaded = load_model(name)
    assert isinstance(loaded, LoadedModel)
    assert (loaded.name, loaded.source, loaded.kind) == (name, f"zoo:{name}", kind)
    assert [tuple(x.shape) for x in loaded.example_inputs] == [input_shape]
    assert not loaded.module.training
    with torch.no_grad():
        output = loaded.module(*loaded.example_inputs)
    assert tuple(output.shape) == output_shape
    assert torch.isfinite(output).all()


@pytest.mark.parametrize("name", sorted(ZOO_CONTRACT))
def test_zoo_model_exports_strictly_in_channels_last(name):
    loaded = load_model(name)
    module = loaded.module.to(memory_format=torch.channels_last)
    inputs = tuple(
        x.to(memory_format=torch.channels_last) if x.dim() == 4 else x for x in loaded.example_inputs
    )
    program = torch.export.export(module, inputs, strict=True)
    with torch.no_grad():
        torch.testing.assert_close(program.module()(*inputs), module(*inputs))


def test_underscore_alias_loads_the_hyphenated_zoo_model():
    loaded = load_model("ds_cnn")
    assert loaded.name == "ds-cnn"
    assert loaded.source == "zoo:ds-cnn"


def test_zoo_factory_is_deterministic_and_leaves_the_global_rng_alone():
    torch.manual_seed(1234)
    expected_next = torch.rand(3)
    torch.manual_seed(1234)
    first_module, first_inputs = ZOO["resnet8"].factory()
    assert torch.equal(torch.rand(3), expected_next)
    second_module, second_inputs = ZOO["resnet8"].factory()
    assert torch.equal(first_inputs[0], second_inputs[0])
    for a, b in zip(first_module.state_dict().values(), second_module.state_dict().values()):
        assert torch.equal(a, b)


def test_zoo_batchnorm_statistics_are_not_the_identity():
    module, _ = ZOO["mobilenet-v1-025"].factory()
    norms = [m for m in module.modules() if isinstance(m, nn.BatchNorm2d)]
    assert norms
    for bn in norms:
        assert not torch.equal(bn.running_mean, torch.zeros_like(bn.running_mean))
        assert not torch.equal(bn.running_var, torch.ones_like(bn.running_var))
        assert not torch.equal(bn.weight, torch.ones_like(bn.weight))


def test_person_detector_cost_is_moderate_for_a_microcontroller():
    loaded = load_model("person-detector")
    macs = _conv_linear_macs(loaded.module, loaded.example_inputs)
    assert 5_000_000 <= macs <= 15_000_000


def test_mixed_model_contains_the_ops_meant_to_leave_the_u55():
    loaded = load_model("mixed")
    program = torch.export.export(loaded.module, loaded.example_inputs, strict=True)
    targets = {node.target for node in program.graph.nodes if node.op == "call_function"}
    assert {torch.ops.aten.gt.Scalar, torch.ops.aten.where.self, torch.ops.aten.sort.default} <= targets
    # The U55 accepts a stride above 3 only on an unpadded conv, so padding is part of the point.
    large_stride = [
        m for m in loaded.module.modules() if isinstance(m, nn.Conv2d) and max(m.stride) > 3
    ]
    assert len(large_stride) == 1 and max(large_stride[0].padding) > 0


def test_factory_spec_loads_module_and_inputs(tmp_path):
    path = _write(
        tmp_path,
        "net.py",
        "import torch\n"
        "def build():\n"
        "    return torch.nn.Linear(4, 2).train(), (torch.ones(1, 4),)\n",
    )
    loaded = load_model(f"{path}:build")
    assert loaded.name == "net"
    assert loaded.source == f"file:{path.resolve()}:build"
    assert loaded.kind == "unknown"
    assert not loaded.module.training
    assert tuple(loaded.module(*loaded.example_inputs).shape) == (1, 2)


def test_factory_file_may_import_its_sibling_modules(tmp_path):
    _write(tmp_path, "my_layers.py", "import torch\nLayer = torch.nn.Identity\n")
    path = _write(
        tmp_path,
        "net.py",
        "import torch, my_layers\n"
        "def factory():\n"
        "    return my_layers.Layer(), (torch.ones(1, 3),)\n",
    )
    assert load_model(f"{path}:factory").name == "net"


def test_example_factory_file_loads():
    loaded = load_model(f"{EXAMPLES / 'my_model.py'}:factory")
    assert tuple(loaded.module(*loaded.example_inputs).shape) == (1, 12)


def test_model_under_test_convention_loads():
    loaded = load_model(str(EXAMPLES / "aot_style_model.py"))
    assert loaded.source == f"file:{(EXAMPLES / 'aot_style_model.py').resolve()}"
    assert len(loaded.example_inputs) == 2
    assert tuple(loaded.module(*loaded.example_inputs).shape) == (1, 4)


def test_pt2_round_trip_loads_a_runnable_module(tmp_path):
    module = nn.Sequential(nn.Linear(4, 3), nn.ReLU()).eval()
    example = (torch.randn(2, 4),)
    path = tmp_path / "tiny.pt2"
    torch.export.save(torch.export.export(module, example), path)
    loaded = load_model(str(path))
    assert (loaded.name, loaded.source, loaded.kind) == ("tiny", f"pt2:{path.resolve()}", "unknown")
    assert torch.equal(loaded.example_inputs[0], example[0])
    torch.testing.assert_close(loaded.module(*loaded.example_inputs), module(*example))
    # check_guards=False: no `_guards_fn` submodule for the quantizers to trip on.
    assert not hasattr(loaded.module, "_guards_fn")


def test_pt2_without_saved_example_inputs_gets_synthesized_ones(tmp_path):
    program = torch.export.export(nn.Linear(5, 1), (torch.randn(3, 5),))
    program.example_inputs = None
    path = tmp_path / "bare.pt2"
    torch.export.save(program, path)
    loaded = load_model(str(path))
    assert [(tuple(x.shape), x.dtype) for x in loaded.example_inputs] == [((3, 5), torch.float32)]
    assert tuple(loaded.module(*loaded.example_inputs).shape) == (3, 1)


def test_unreadable_pt2_names_the_file(tmp_path):
    path = _write(tmp_path, "broken.pt2", "not a zip archive")
    message = _user_error(load_model, str(path))
    assert "broken.pt2" in message and "torch.export.save" in message


def test_unknown_name_lists_zoo_names_and_accepted_forms():
    message = _user_error(load_model, "resnet9")
    assert "'resnet9'" in message
    assert all(name in message for name in ZOO_CONTRACT)
    assert "file.py:factory" in message and "ModelUnderTest" in message and ".pt2" in message


def test_missing_model_file_names_the_path(tmp_path):
    message = _user_error(load_model, str(tmp_path / "absent.py"))
    assert "not found" in message and "absent.py" in message


def test_missing_factory_names_the_factory(tmp_path):
    path = _write(tmp_path, "net.py", "x = 1\n")
    message = _user_error(load_model, f"{path}:make_model")
    assert "'make_model'" in message and "net.py" in message


def test_factory_returning_wrong_type_says_what_it_returned(tmp_path):
    path = _write(tmp_path, "net.py", "import torch\ndef factory():\n    return torch.nn.ReLU()\n")
    message = _user_error(load_model, f"{path}:factory")
    assert "returned ReLU" in message and "(nn.Module, example_inputs_tuple)" in message


def test_factory_returning_non_tensor_inputs_is_rejected(tmp_path):
    path = _write(
        tmp_path, "net.py", "import torch\ndef factory():\n    return torch.nn.ReLU(), [1, 2]\n"
    )
    message = _user_error(load_model, f"{path}:factory")
    assert "list of (int, int)" in message


def test_import_error_reports_type_and_message_without_traceback(tmp_path):
    path = _write(tmp_path, "net.py", "import torch\nraise ValueError('bad\\nweights')\n")
    message = _user_error(load_model, f"{path}:factory")
    assert "net.py" in message
    assert "ValueError: bad weights" in message
    assert "Traceback" not in message


def test_file_without_model_under_test_names_what_is_missing(tmp_path):
    path = _write(tmp_path, "net.py", "import torch\nModelInputs = (torch.ones(1),)\n")
    message = _user_error(load_model, str(path))
    assert "ModelUnderTest" in message and "net.py" in message


def test_model_under_test_given_as_class_asks_for_an_instance(tmp_path):
    path = _write(
        tmp_path, "net.py", "import torch\nModelUnderTest = torch.nn.ReLU\nModelInputs = (torch.ones(1),)\n"
    )
    message = _user_error(load_model, str(path))
    assert "ModelUnderTest = ReLU()" in message


EXAMPLE = (torch.zeros(1, 3, 8, 8),)


def test_calibration_pt_batch_tensor_splits_into_samples(tmp_path):
    path = tmp_path / "calib.pt"
    torch.save(torch.randn(5, 3, 8, 8), path)
    calibration = load_calibration(str(path), EXAMPLE)
    assert isinstance(calibration, Calibration)
    assert len(calibration.samples) == 5
    assert all(tuple(s[0].shape) == (1, 3, 8, 8) for s in calibration.samples)
    assert (calibration.generated, calibration.warning) == (False, None)
    assert calibration.source == f"file:{path.resolve()}"


def test_calibration_pt_list_of_tensors_gives_one_sample_each(tmp_path):
    path = tmp_path / "calib.pt"
    torch.save([torch.randn(1, 3, 8, 8) for _ in range(3)], path)
    calibration = load_calibration(str(path), EXAMPLE)
    assert [tuple(s[0].shape) for s in calibration.samples] == [(1, 3, 8, 8)] * 3


def test_calibration_pt_list_of_tuples_feeds_a_multi_input_model(tmp_path):
    example = (torch.zeros(1, 8), torch.zeros(1, 2))
    path = tmp_path / "calib.pt"
    torch.save([(torch.randn(1, 8), torch.randn(1, 2)) for _ in range(4)], path)
    calibration = load_calibration(str(path), example)
    assert len(calibration.samples) == 4
    assert all([tuple(t.shape) for t in s] == [(1, 8), (1, 2)] for s in calibration.samples)


def test_calibration_npz_arrays_in_order_are_batches_of_the_single_input(tmp_path):
    path = tmp_path / "calib.npz"
    first, second = np.ones((2, 3, 8, 8)), np.zeros((3, 3, 8, 8))
    np.savez(path, first, second)
    calibration = load_calibration(str(path), EXAMPLE)
    assert len(calibration.samples) == 5
    # numpy's float64 is cast to the model's float32.
    assert all(s[0].dtype == torch.float32 for s in calibration.samples)
    assert [float(s[0].mean()) for s in calibration.samples] == [1.0, 1.0, 0.0, 0.0, 0.0]


def test_calibration_npz_named_inputs_feed_each_input(tmp_path):
    example = (torch.zeros(1, 8), torch.zeros(1, 2))
    path = tmp_path / "calib.npz"
    np.savez(path, input1=np.ones((6, 2), np.float32), input0=np.zeros((6, 8), np.float32))
    calibration = load_calibration(str(path), example)
    assert len(calibration.samples) == 6
    assert [tuple(t.shape) for t in calibration.samples[0]] == [(1, 8), (1, 2)]
    assert float(calibration.samples[0][1].sum()) == 2.0


def test_calibration_folder_reads_every_file_in_sorted_order(tmp_path):
    torch.save(torch.full((2, 3, 8, 8), 2.0), tmp_path / "b.pt")
    np.savez(tmp_path / "a.npz", np.full((1, 3, 8, 8), 1.0))
    (tmp_path / "README.txt").write_text("ignored")
    calibration = load_calibration(str(tmp_path), EXAMPLE)
    assert [float(s[0].mean()) for s in calibration.samples] == [1.0, 2.0, 2.0]
    assert calibration.source == f"folder:{tmp_path.resolve()} (2 files)"


def test_calibration_shape_mismatch_names_file_and_both_shapes(tmp_path):
    path = tmp_path / "wrong.pt"
    torch.save(torch.randn(4, 3, 7, 8), path)
    message = _user_error(load_calibration, str(path), EXAMPLE)
    assert "wrong.pt" in message
    assert "4x3x7x8" in message and "1x3x8x8" in message


def test_calibration_missing_path_is_a_user_error(tmp_path):
    message = _user_error(load_calibration, str(tmp_path / "none.npz"), EXAMPLE)
    assert "none.npz" in message


def test_no_calibration_path_generates_seeded_samples_with_a_warning():
    example = (torch.zeros(1, 3, 8, 8, dtype=torch.float16),)
    calibration = load_calibration(None, example, n_generated=3, seed=7)
    assert calibration.generated
    assert len(calibration.samples) == 3
    assert all(s[0].shape == example[0].shape and s[0].dtype == torch.float16 for s in calibration.samples)
    assert "not representative" in calibration.warning
    assert "3 generated samples" in calibration.warning
    again = load_calibration(None, example, n_generated=3, seed=7)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(calibration.samples, again.samples))
    assert not torch.equal(calibration.samples[0][0], calibration.samples[1][0])


def test_calibration_single_tensor_for_a_two_input_model_asks_for_one_per_input(tmp_path):
    path = tmp_path / "calib.pt"
    torch.save(torch.randn(4, 8), path)
    message = _user_error(load_calibration, str(path), (torch.zeros(1, 8), torch.zeros(1, 2)))
    assert "calib.pt" in message and "2 inputs" in message and "one tensor per input" in message
