"""Adapter: every touch of the Ethos-U backend's private names, in one place, with a version guard.

ExecuTorch keeps what a placement report needs out of its public API:
- `TOSAPartitioner._tag_module(module, containing_program, reporter, tag_iterator=None)` is the
  only place the partitioner's `WhyNoPartitionReporter` is visible; upstream calls it again on
  every control-flow submodule (`torch.cond` branches) with the 4th argument;
- `WhyNoPartitionReporter._rejected_nodes` (node -> message) holds the rejections;
- `executorch.backends.arm.ethosu.backend.vela_compile` is called once per partition; wrapping it
  is how each call gets an output folder of its own. The swap is process-global, so a lock keeps
  two compiles in one process from interleaving their recordings.

`tests/test_upstream_adapters.py` checks each of these names and signatures without compiling,
so an ExecuTorch upgrade that moves them fails there, not as a wrong report.
"""

from __future__ import annotations

import contextlib
import inspect
import threading
from typing import Callable, Iterator

from partitioners.upstream_version import UpstreamVersionError, require  # noqa: F401

SUPPORTED_EXECUTORCH = ("1.5.1",)
_VELA_LOCK = threading.Lock()


def check_version() -> str:
    return require("executorch", SUPPORTED_EXECUTORCH, "partitioners/upstream_ethos_u.py")


def capture_reporters(partitioner) -> list:
    """Make `partitioner` hand over every WhyNoPartitionReporter it fills while tagging."""
    check_version()
    reporters: list = []
    upstream_tag_module = partitioner._tag_module

    def tag_module(module, containing_program, reporter, *args, **kwargs):
        reporters.append(reporter)
        return upstream_tag_module(module, containing_program, reporter, *args, **kwargs)

    partitioner._tag_module = tag_module
    return reporters


def rejected_nodes(reporter) -> dict:
    """node -> the message of the operator-support check that rejected it."""
    return dict(reporter._rejected_nodes)


@contextlib.contextmanager
def vela_compile_wrapped(make_wrapper: Callable[[Callable], Callable]) -> Iterator[None]:
    """Replace the backend's `vela_compile` by `make_wrapper(upstream_vela_compile)` meanwhile."""
    check_version()
    import executorch.backends.arm.ethosu.backend as ethosu_backend  # lazy: heavy (executorch, vela)

    with _VELA_LOCK:
        upstream = ethosu_backend.vela_compile
        ethosu_backend.vela_compile = make_wrapper(upstream)
        try:
            yield
        finally:
            ethosu_backend.vela_compile = upstream


def contract() -> dict[str, object]:
    """The upstream names and signatures this adapter relies on (for the contract test)."""
    import executorch.backends.arm.ethosu.backend as ethosu_backend  # lazy: heavy (executorch, vela)
    from executorch.backends.arm.ethosu import EthosUPartitioner  # lazy: heavy (executorch, vela)
    from executorch.exir.backend.utils import WhyNoPartitionReporter  # lazy: heavy (executorch)

    return {
        "_tag_module": list(inspect.signature(EthosUPartitioner._tag_module).parameters),
        "_rejected_nodes": isinstance(WhyNoPartitionReporter()._rejected_nodes, dict),
        "vela_compile": list(inspect.signature(ethosu_backend.vela_compile).parameters),
    }
