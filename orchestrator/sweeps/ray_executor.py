"""`sweep --executor ray[:ADDRESS]`: a sweep's configurations as Ray tasks, rows in job order.

`ray` starts a Ray instance on this machine for the sweep (`workers` CPUs, default the
machine's cores) and stops it after; `ray:ADDRESS` connects to a running cluster (`ray:auto`
for the one `ray start` last started here, `ray:HOST:PORT` for its head, `ray:ray://HOST:PORT`
for a Ray Client server), where the cluster's CPUs decide how many configurations compile at
once (`workers`, when given, caps it). A process already connected to Ray (`ray.init` called)
runs the tasks on that connection. Each task calls the same `sweep.run_job` a local worker
calls, so every row is the one a local sweep computes.

What a worker needs, and how it gets it:

- the package: the tasks reference `orchestrator` by module, and no working directory is
  shipped, so every node's Python must import the same version of `orchestrate` (on this
  machine a `ray start` from this venv uses this venv; on a remote cluster, install the
  package with `pip install 'orchestrate[ray]'` on every node);
- the files a job names (a model `.py`, a `.pt2`, calibration, a platform YAML, a policy): a
  task runs in the sweep's working directory when that folder exists on its node, so relative
  paths mean what they mean here; on a multi-machine cluster, give paths on a shared filesystem;
- the capture/quantization cache (orchestrator/artifacts/cache.py): this process's resolved cache folder
  (or `off`) is passed to every task as `ORCHESTRATE_CACHE` (and `ORCHESTRATE_CACHE_DIR` when
  set), so all workers read and write the same content-addressed entries; on a multi-machine
  cluster that folder must be a shared filesystem mounted at the same path on every node,
  otherwise each node fills a cache of its own;
- the host numerics (orchestrator/numerics.py): a task imports `orchestrator` before anything
  computes, which pins them, and the settings are also in the task's environment from process
  start, so a worker whose torch was imported early computes the same scales.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import tempfile
import warnings

from kernels.cache_root import CACHE_ENV
from orchestrator import numerics
from orchestrator.errors import UserError

MISSING_RAY = "sweep --executor ray needs Ray: pip install 'orchestrate[ray]'"
# Seconds to wait for a cluster's head to accept a connection: Ray itself retries an
# unreachable GCS for many minutes (seen here: still retrying after 8 min) before failing.
CONNECT_TIMEOUT_SECONDS = 5.0
# The object store holds only the rows (a few hundred bytes each); Ray's default reserves
# 30% of the machine's memory in /dev/shm.
LOCAL_OBJECT_STORE_BYTES = 200 * 1024 * 1024


def import_ray():
    """The `ray` module, or the one-line UserError saying how to install it."""
    try:
        import ray  # lazy: optional (ray)
    except ImportError:
        raise UserError(MISSING_RAY) from None
    return ray


def worker_env() -> dict[str, str]:
    """The environment every task runs with: this process's cache folder and host numerics."""
    from orchestrator.artifacts import cache  # lazy: heavy (torch)

    folder = cache.cache_dir()
    env = dict(numerics.SETTINGS)
    env["ORCHESTRATE_CACHE"] = "off" if folder is None else str(folder.expanduser().absolute())
    if os.environ.get(CACHE_ENV):
        env[CACHE_ENV] = os.path.abspath(os.path.expanduser(os.environ[CACHE_ENV]))
    return env


def sweep_on_ray(jobs: list, address: str | None, workers: int | None, run, label,
                 progress=None) -> tuple:
    """Run every job as a Ray task on the cluster at `address` (None: a Ray instance started
    here with `workers` CPUs), at most `workers` at once when given; rows in job order. `run`
    is orchestrator.sweeps.local.run_job (passed in, so this module does not import sweep back) and
    `label(job)` names a job in progress lines.

    `progress(label, event, seconds)` hears each configuration finish, in finishing order. A
    job's error is raised as the worker raised it (a bad model is the same UserError as in a
    local sweep); the other tasks are cancelled."""
    ray = import_ray()
    if not jobs:
        return ()
    connected_here = not ray.is_initialized()
    if connected_here:
        _connect(ray, address, workers or min(os.cpu_count() or 1, len(jobs)))
    try:
        return _run(ray, jobs, workers, progress, run, label)
    finally:
        if connected_here:
            ray.shutdown()


def _connect(ray, address: str | None, cpus: int) -> None:
    debug = bool(os.environ.get("ORCHESTRATE_DEBUG"))
    options = dict(log_to_driver=debug, logging_level=logging.WARNING)
    if address is None:
        # "local": a new instance even when RAY_ADDRESS or an earlier `ray start` names another.
        options.update(address="local", num_cpus=cpus, include_dashboard=False,
                       object_store_memory=LOCAL_OBJECT_STORE_BYTES)
    else:
        options.update(address=_reachable(ray, address))
    with _ray_core_quiet(not debug), _stderr_captured() as printed, warnings.catch_warnings():
        # Ray 2.52 warns on every init about a future change to GPU visibility; no GPUs here.
        warnings.simplefilter("ignore", FutureWarning)
        try:
            ray.init(**options)
            error = None
        except (ConnectionError, RuntimeError, ValueError) as raised:
            error = raised
    if debug:
        sys.stderr.write(printed.text)
    if error is not None:
        # Ray's own exception is often empty (a ConnectionError() after 20 s of retries); the
        # reason is in the last line its C++ client printed.
        lines = [line for line in printed.text.splitlines() if line.strip()]
        reason = _one_line(error) or (lines[-1].split("] ")[-1] if lines else "")
        where = "a local Ray instance" if address is None else f"the Ray cluster at '{address}'"
        raise UserError(f"could not start or join {where}: {type(error).__name__}"
                        f"{': ' + reason[:300] if reason else ''}") from None


class _ray_core_quiet:
    """Ray's C++ core logs only fatal errors from this process (and a Ray instance it starts).

    Without ray[default]'s dashboard packages no node runs a metrics agent, and the core logs
    "Failed to establish connection to the metrics exporter agent" to stderr some 30 s into a
    sweep. It reads RAY_BACKEND_LOG_LEVEL once, in ray.init; a level the user set is kept."""

    def __init__(self, enabled: bool):
        self.enabled = enabled and "RAY_BACKEND_LOG_LEVEL" not in os.environ

    def __enter__(self):
        if self.enabled:
            os.environ["RAY_BACKEND_LOG_LEVEL"] = "fatal"
        return self

    def __exit__(self, *exc):
        if self.enabled:
            os.environ.pop("RAY_BACKEND_LOG_LEVEL", None)
        return False


def _reachable(ray, address: str) -> str:
    """`address` as ray.init takes it, once its head accepts a TCP connection."""
    if address.startswith("ray://"):
        resolved, target = address, address[len("ray://"):]
    else:
        from ray._private.services import (  # lazy: optional (ray, after import_ray)
            canonicalize_bootstrap_address_or_die)

        try:
            # Resolves `auto` (RAY_ADDRESS, else the cluster `ray start` last started here)
            # and `localhost`; a private function of Ray's, pinned by the `ray` extra.
            resolved = target = canonicalize_bootstrap_address_or_die(address)
        except (ConnectionError, ValueError) as error:
            # Ray's advice that follows ("Please specify ... `--address` flag") is about its CLI.
            reason = _one_line(error).split(". Please")[0].rstrip(".")
            raise UserError(f"--executor ray:{address}: {reason}; give ray:HOST:PORT of a "
                            "cluster's head, or start one with `ray start --head`") from None
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        raise UserError(f"--executor ray:{address} is not HOST:PORT, e.g. ray:10.0.0.1:6379")
    try:
        socket.create_connection((host.strip("[]"), int(port)), CONNECT_TIMEOUT_SECONDS).close()
    except OSError as error:
        at = address if address == resolved else f"{address} ({target})"
        raise UserError(f"no Ray cluster answers at {at}: {error.strerror or error}; check the "
                        "address, or start one there with `ray start --head`") from None
    return resolved


def _run(ray, jobs: list, workers: int | None, progress, run, label) -> tuple:
    task = ray.remote(num_cpus=1)(_run_job_in).options(runtime_env={"env_vars": worker_env()})
    folder = os.getcwd()
    window = workers or len(jobs)
    pending: dict = {}  # ObjectRef -> job index
    rows: dict = {}
    submitted = 0
    try:
        while submitted < len(jobs) or pending:
            while submitted < len(jobs) and len(pending) < window:
                pending[task.remote(folder, run, jobs[submitted])] = submitted
                submitted += 1
            (ready,), _ = ray.wait(list(pending), num_returns=1)
            index = pending.pop(ready)
            rows[index] = _result(ray, ready)
            if progress:
                progress(label(jobs[index]), "done", 0.0)
    except BaseException:
        for ref in pending:
            ray.cancel(ref, force=True)
        raise
    return tuple(rows[i] for i in range(len(jobs)))


def _result(ray, ref):
    """The task's row, or the exception the job raised in its worker (not Ray's wrapper)."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as error:
        cause = error.cause
        while isinstance(cause, ray.exceptions.RayTaskError):
            cause = cause.cause
        if isinstance(cause, BaseException):
            raise cause from error
        raise


def _run_job_in(folder: str, run, job):
    """`run(job)` in a Ray worker, from the sweep's working directory when this node has it."""
    if os.path.isdir(folder):
        os.chdir(folder)
    return run(job)


class _stderr_captured:
    """What native code writes to this process's stderr (file descriptor 2) in the block, as
    `.text`: Ray's C++ client prints a warning line per failed retry while ray.init waits."""

    def __enter__(self):
        sys.stderr.flush()
        self._log = tempfile.TemporaryFile()
        self._saved = os.dup(2)
        os.dup2(self._log.fileno(), 2)
        self.text = ""
        return self

    def __exit__(self, *exc):
        sys.stderr.flush()
        os.dup2(self._saved, 2)
        os.close(self._saved)
        self._log.seek(0)
        self.text = self._log.read().decode(errors="replace")
        self._log.close()
        return False


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split())[:300]
