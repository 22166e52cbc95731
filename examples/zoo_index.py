"""The built-in models' names, descriptions and kinds, without their code: what `orchestrate
list` and a model-name check need, answered without importing torch (examples/zoo.py holds
the factories and is checked against this list by tests/test_startup.py)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ZooModel:
    name: str
    description: str
    kind: str  # "classifier" | "autoencoder" | "detector"


ZOO_MODELS: tuple[ZooModel, ...] = (
    ZooModel("ds-cnn", "MLPerf Tiny keyword spotting DS-CNN: 1x1x49x10 MFCC in, 12 class logits "
             "out", "classifier"),
    ZooModel("mobilenet-v1-025", "MLPerf Tiny visual wake words MobileNetV1 x0.25: 1x3x96x96 "
             "in, 2 logits out", "classifier"),
    ZooModel("resnet8", "MLPerf Tiny CIFAR-10 ResNet-8: 1x3x32x32 in, 10 class logits out",
             "classifier"),
    ZooModel("deep-autoencoder", "MLPerf Tiny anomaly detection autoencoder: 1x640 in, 1x640 "
             "reconstruction out", "autoencoder"),
    ZooModel("person-detector", "µYOLO-style person detector of U55-supported ops: 1x3x128x128 "
             "in, 4x4x5 = 80 out", "detector"),
    ZooModel("mixed", "classifier with ops the U55 rejects (stride-4 conv, where, sort): "
             "1x3x32x32 in", "classifier"),
)
_BY_NAME = {model.name: model for model in ZOO_MODELS}


def canonical(name: str) -> str:
    """`DS_CNN` -> `ds-cnn`: any case, underscores for hyphens."""
    return name.strip().lower().replace("_", "-")


def zoo_names() -> tuple[str, ...]:
    """The canonical (hyphenated) names, in registry order."""
    return tuple(_BY_NAME)


def find(name: str) -> ZooModel | None:
    return _BY_NAME.get(canonical(name))
