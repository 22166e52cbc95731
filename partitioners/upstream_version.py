"""The version guard every upstream adapter uses: an upgrade breaks loudly, in one place.

The guard lives in kernels/upstream_version.py (kernels/ sits below partitioners/ and has
adapters of its own); this module re-exports it so the partitioners' and the orchestrator's
adapters keep importing from here, with one guard and one error class for all of them.
"""

from __future__ import annotations

from kernels.upstream_version import UpstreamVersionError, require

__all__ = ["UpstreamVersionError", "require"]
