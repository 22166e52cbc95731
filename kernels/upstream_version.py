"""The version guard every upstream adapter uses: an upgrade breaks loudly, in one place.

It lives in kernels/ because kernels/ sits below partitioners/ and orchestrator/
(tests/test_architecture.py) and has adapters of its own (kernels/upstream_runtime.py);
partitioners/upstream_version.py re-exports it, so there is one guard and one error class.
"""

from __future__ import annotations

from importlib import metadata


class UpstreamVersionError(RuntimeError):
    """The installed package is not one the adapter was checked against."""


def require(package: str, supported: tuple[str, ...], adapter: str) -> str:
    """The installed version of `package`; UpstreamVersionError naming `adapter` if unsupported."""
    found = metadata.version(package)
    if found not in supported:
        raise UpstreamVersionError(
            f"{package} {found} is installed; {adapter} was checked against "
            f"{', '.join(supported)}: install {package}=={supported[-1]} or re-check the "
            "adapter's contract tests (tests/test_upstream_adapters.py)")
    return found
