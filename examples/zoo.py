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
from examples.zoo_index import ZOO_MODELS, canonical, zoo_names  # noqa: F401 - zoo_names re-exported

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


_FACTORIES: dict[str, Factory] = {
    "ds-cnn": _seeded(DSCNNKWS, (1, 1, 49, 10)),
    "mobilenet-v1-025": _seeded(MobileNetV1025, (1, 3, 96, 96)),
    "resnet8": _seeded(ResNet8, (1, 3, 32, 32)),
    "deep-autoencoder": _seeded(DeepAutoEncoder, (1, 640)),
    "person-detector": _seeded(person_detector.PersonDetector, person_detector.INPUT_SHAPE),
    "mixed": _seeded(mixed.MixedModel, mixed.INPUT_SHAPE),
}
# Names, descriptions and kinds are examples/zoo_index.py's (read without torch).
_ENTRIES = tuple(ZooEntry(model.name, model.description, _FACTORIES[model.name], model.kind)
                 for model in ZOO_MODELS)

ZOO: dict[str, ZooEntry] = {entry.name: entry for entry in _ENTRIES}


def lookup(name: str) -> ZooEntry | None:
    """The entry for `name`, accepting underscores for hyphens and any case (`DS_CNN`)."""
    return ZOO.get(canonical(name))
