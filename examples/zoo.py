"""The built-in models, by name: the four MLPerf Tiny models, a person detector, a mixed model.

Weights cannot be downloaded, so every model gets a deterministic random init (seed 0) and
deterministic example inputs. BatchNorm running statistics and affine parameters are
randomized too: with the default (mean 0, var 1, weight 1, bias 0) folding BN into the conv
is an identity, and a bug in folding would go unnoticed.
"""

from dataclasses import dataclass
from typing import Callable, Literal

import torch
from executorch.examples.models.mlperf_tiny import (
    DeepAutoEncoder,
    DSCNNKWS,
    MobileNetV1025,
    ResNet8,
)
from torch import Tensor, nn

from examples import mixed, person_detector

Kind = Literal["classifier", "autoencoder", "detector"]
Factory = Callable[[], tuple[nn.Module, tuple[Tensor, ...]]]

_SEED = 0


@dataclass(frozen=True)
class ZooEntry:
    """One built-in model: `factory()` returns a fresh eval-mode module and its example inputs."""

    name: str
    description: str
    factory: Factory
    kind: Kind


def randomize_batchnorm(module: nn.Module) -> None:
    """Give every BatchNorm non-trivial statistics (draws from the caller's seeded RNG)."""
    for bn in module.modules():
        if isinstance(bn, nn.modules.batchnorm._BatchNorm):
            with torch.no_grad():
                bn.running_mean.normal_(0.0, 0.1)
                bn.running_var.uniform_(0.5, 1.5)
                bn.weight.uniform_(0.8, 1.2)
                bn.bias.normal_(0.0, 0.1)


def _seeded(build: Callable[[], nn.Module], input_shape: tuple[int, ...]) -> Factory:
    """Wrap a constructor into a factory that is deterministic and leaves the global RNG alone."""

    def factory() -> tuple[nn.Module, tuple[Tensor, ...]]:
        # fork_rng so that loading a zoo model does not reset the caller's random stream.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(_SEED)
            module = build()
            randomize_batchnorm(module)
            # Uniform in [-1, 1), the range the upstream MLPerf Tiny examples use.
            example = torch.rand(input_shape) * 2 - 1
        return module.eval(), (example,)

    return factory


_ENTRIES = (
    ZooEntry(
        name="ds-cnn",
        description="MLPerf Tiny keyword spotting DS-CNN: 1x1x49x10 MFCC in, 12 class logits out",
        factory=_seeded(DSCNNKWS, (1, 1, 49, 10)),
        kind="classifier",
    ),
    ZooEntry(
        name="mobilenet-v1-025",
        description="MLPerf Tiny visual wake words MobileNetV1 x0.25: 1x3x96x96 in, 2 logits out",
        factory=_seeded(MobileNetV1025, (1, 3, 96, 96)),
        kind="classifier",
    ),
    ZooEntry(
        name="resnet8",
        description="MLPerf Tiny CIFAR-10 ResNet-8: 1x3x32x32 in, 10 class logits out",
        factory=_seeded(ResNet8, (1, 3, 32, 32)),
        kind="classifier",
    ),
    ZooEntry(
        name="deep-autoencoder",
        description="MLPerf Tiny anomaly detection autoencoder: 1x640 in, 1x640 reconstruction out",
        factory=_seeded(DeepAutoEncoder, (1, 640)),
        kind="autoencoder",
    ),
    ZooEntry(
        name="person-detector",
        description="µYOLO-style person detector of U55-supported ops: 1x3x128x128 in, 4x4x5 = 80 out",
        factory=_seeded(person_detector.PersonDetector, person_detector.INPUT_SHAPE),
        kind="detector",
    ),
    ZooEntry(
        name="mixed",
        description="classifier with ops the U55 rejects (stride-4 conv, where, sort): 1x3x32x32 in",
        factory=_seeded(mixed.MixedModel, mixed.INPUT_SHAPE),
        kind="classifier",
    ),
)

ZOO: dict[str, ZooEntry] = {entry.name: entry for entry in _ENTRIES}


def zoo_names() -> tuple[str, ...]:
    """The canonical (hyphenated) names, in registry order."""
    return tuple(ZOO)


def lookup(name: str) -> ZooEntry | None:
    """The entry for `name`, accepting underscores for hyphens and any case (`DS_CNN`)."""
    return ZOO.get(name.strip().lower().replace("_", "-"))
