"""How the ONNX files beside this script were made: by another framework's exporter, not by
`torch.onnx` (TensorFlow/Keras trained on scikit-learn's digits, exported by tf2onnx, quantized
by ONNX Runtime's static quantizer into QDQ form). Run in an environment with tensorflow-cpu,
tf2onnx, onnxruntime and scikit-learn (not the project's): `python make.py`.

- digits_cnn.onnx: Conv2D, BatchNormalization, ReLU, DepthwiseConv2D, MaxPooling2D,
  GlobalAveragePooling2D, Dense, Softmax, trained (float);
- digits_cnn_qdq.onnx: the same, QuantizeLinear/DequantizeLinear around every tensor (int8
  activations, per-channel int8 weights), calibrated on 200 training images;
- digits_mlp_qdq.onnx: a three-layer Dense network with ReLU6, trained, QDQ the same way.
"""

from pathlib import Path

import numpy as np
import onnx
import tensorflow as tf
import tf2onnx
from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                      quantize_static)
from sklearn.datasets import load_digits

HERE = Path(__file__).resolve().parent
tf.keras.utils.set_random_seed(0)
digits = load_digits()
images = (digits.images / 16.0).astype(np.float32)[..., None]  # N, 8, 8, 1 (NHWC)
labels = digits.target.astype(np.int64)
train, test = slice(0, 1500), slice(1500, None)
np.savez(HERE / "digits_test_images.npz", input0=images[test][:, None], labels=labels[test])
np.savez(HERE / "digits_test_features.npz", input0=images[test].reshape(-1, 1, 64),
         labels=labels[test])


def cnn():
    inputs = tf.keras.Input((8, 8, 1), batch_size=1, name="image")
    x = tf.keras.layers.Conv2D(16, 3, padding="same", use_bias=False)(inputs)
    x = tf.keras.layers.BatchNormalization()(x)
    x = tf.keras.layers.ReLU()(x)
    x = tf.keras.layers.DepthwiseConv2D(3, padding="same", activation="relu")(x)
    x = tf.keras.layers.Conv2D(24, 1, activation="relu")(x)
    x = tf.keras.layers.MaxPooling2D(2)(x)
    x = tf.keras.layers.GlobalAveragePooling2D()(x)
    outputs = tf.keras.layers.Dense(10, activation="softmax")(x)
    return tf.keras.Model(inputs, outputs)


def mlp():
    inputs = tf.keras.Input((64,), batch_size=1, name="features")
    x = tf.keras.layers.Dense(48)(inputs)
    x = tf.keras.layers.ReLU(max_value=6.0)(x)
    x = tf.keras.layers.Dense(32, activation="relu")(x)
    outputs = tf.keras.layers.Dense(10)(x)
    return tf.keras.Model(inputs, outputs)


class Reader(CalibrationDataReader):
    def __init__(self, name, values):
        self.items = iter([{name: v[None]} for v in values])

    def get_next(self):
        return next(self.items, None)


def export(model, data, name, qdq_name=None):
    model.compile("adam", "sparse_categorical_crossentropy" if name == "digits_cnn" else
                  tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    model.fit(data[train], labels[train], epochs=30, batch_size=32, verbose=0)
    print(name, "test accuracy", model.evaluate(data[test], labels[test], verbose=0)[1])
    spec = (tf.TensorSpec((1, *data.shape[1:]), tf.float32, name=model.inputs[0].name),)
    proto, _ = tf2onnx.convert.from_keras(model, input_signature=spec, opset=17)
    path = HERE / f"{name}.onnx"
    onnx.save(proto, path)
    if qdq_name:
        quantize_static(str(path), str(HERE / f"{qdq_name}.onnx"),
                        Reader(proto.graph.input[0].name, data[train][:200]),
                        quant_format=QuantFormat.QDQ, activation_type=QuantType.QInt8,
                        weight_type=QuantType.QInt8, per_channel=True)


export(cnn(), images, "digits_cnn", "digits_cnn_qdq")
export(mlp(), images.reshape(-1, 64), "digits_mlp", "digits_mlp_qdq")
(HERE / "digits_mlp.onnx").unlink()  # the float MLP is not kept
