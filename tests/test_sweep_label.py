"""A sweep over two factories of one file names each row by its factory (it named both by the
file, so their rows could not be told apart)."""

from orchestrator.sweeps.local import model_label, render_text, SweepRow


def test_two_factories_of_one_file_are_two_names_in_the_sweep_table():
    rows = tuple(SweepRow(model_label(f"models/user_models.py:{factory}", "user_models"),
                          "ethos-u55-128", "cortex-m55", 1, 100.0, 1000, 1e-3, "estimate", 1024,
                          0, 2048, True, True)
                 for factory in ("conv1d_audio", "gru_kws"))
    table = render_text(rows)
    assert "user_models:conv1d_audio" in table and "user_models:gru_kws" in table
    # a zoo name, a .pt2, a .tflite keep the model's own name
    assert model_label("ds-cnn", "ds-cnn") == "ds-cnn"
    assert model_label("/m/kws_ref_model.tflite", "kws_ref_model") == "kws_ref_model"
