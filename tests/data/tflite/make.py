"""How the `.tflite` files beside this script were made: by TensorFlow's own converter (full
integer, int8 input and output, 16 uniform random calibration images), from Keras models with
random weights (seed 1), as a team on the incumbent flow makes them. Run in an environment with
tensorflow-cpu (not the project's): `python make.py`.

- unet_upsample_int8.tflite: an encoder-decoder on 64x64x3 (two stride-2 SAME convolutions,
  Keras `Resizing(interpolation="nearest")` back up twice, which converts to
  RESIZE_NEAREST_NEIGHBOR with half-pixel centers, a skip CONCATENATION, a 1x1 head);
- large_mean_int8.tflite: a 3x3 convolution on 272x272x3 and a GlobalAveragePooling2D (TFLite
  MEAN over 73,984 elements per channel, more than the 65,536 a TOSA pool window takes), then
  a Dense layer.
"""

from pathlib import Path

import numpy as np
import tensorflow as tf

HERE = Path(__file__).resolve().parent
rng = np.random.default_rng(0)
L = tf.keras.layers


def convert(model, shape, name):
    def representative():
        for _ in range(16):
            yield [rng.uniform(0, 1, (1, *shape)).astype(np.float32)]

    converter = tf.lite.TFLiteConverter.from_keras_model(model)
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = representative
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    converter.inference_input_type = tf.int8
    converter.inference_output_type = tf.int8
    (HERE / name).write_bytes(converter.convert())


tf.keras.utils.set_random_seed(1)
x = i = L.Input((64, 64, 3), batch_size=1)
e1 = L.Conv2D(16, 3, strides=2, padding="same", activation="relu")(x)
e2 = L.Conv2D(32, 3, strides=2, padding="same", activation="relu")(e1)
u1 = L.Resizing(32, 32, interpolation="nearest")(e2)
d1 = L.Conv2D(16, 3, padding="same", activation="relu")(L.Concatenate()([u1, e1]))
u2 = L.Resizing(64, 64, interpolation="nearest")(d1)
convert(tf.keras.Model(i, L.Conv2D(2, 1, padding="same")(u2)), (64, 64, 3),
        "unet_upsample_int8.tflite")

x = i = L.Input((272, 272, 3), batch_size=1)
f = L.Conv2D(8, 3, padding="same", activation="relu")(x)
convert(tf.keras.Model(i, L.Dense(4)(L.GlobalAveragePooling2D()(f))), (272, 272, 3),
        "large_mean_int8.tflite")
