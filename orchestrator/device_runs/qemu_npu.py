"""The NPU of a hybrid program on QEMU: each Ethos-U invocation the runner firmware hands over
semihosting (platforms/qemu_npu_bridge.py) is computed here, by the same `NpuExecutor` the twin
and the host runtime use: Vela's command stream from the request in the Ethos-U55/U65
functional model, on the regions the firmware sent (weights, scratch with the inputs the
firmware's EthosUBackend copied in, fast scratch), and with `--npu-model auto` checked byte for
byte against the partition's TOSA graph. A fault or a difference fails the invocation: the
firmware's driver sees an NPU error, EthosUBackend fails the delegate call, and the BundleIO
case fails on the device, with the host's reason naming the partition."""

from __future__ import annotations

from npu_driver.ethos_u import execute_backend_invocation
from npu_driver.ethos_u.errors import NpuModelError, UnmodelledCommand
from orchestrator.verification.npu import NpuExecutor
from platforms.qemu_npu_bridge import FAST_SCRATCH, NpuBridgeRefused


class QemuNpuHandler:
    """The bridge's `NpuHandler` for one program: finds the partition whose payload the request
    carries and runs it. `executor.tally` holds what ran, per partition."""

    def __init__(self, twin, accelerator: str, npu_model: str = "auto"):
        self.executor = NpuExecutor(npu_model, accelerator)
        self.partitions = {bytes(p.payload.cmd_bytes): p for p in twin.partitions}
        self.calls = 0

    @property
    def executes_stream(self) -> bool:
        """Whether an Ethos-U85's invocations run from their command streams (the U85 model,
        --npu-model stream|both) rather than from the partitions' TOSA graphs."""
        return self.executor.u85_stream

    def __call__(self, payload: bytes, regions: list) -> int:
        self.calls += 1
        partition = self.partitions.get(bytes(payload))
        if partition is None:
            raise NpuBridgeRefused("the command stream matches no Ethos-U partition of the "
                                   "program (a payload the firmware should not hold)")
        name = partition.delegate_name
        before = self.executor.tally.commands[name]
        fast = len(regions[FAST_SCRATCH]) if len(regions) > FAST_SCRATCH else 0
        self.executor.run_invocation(partition, payload, regions,
                                     f"{name} (NPU invocation {self.calls} on QEMU)")
        if len(regions) > FAST_SCRATCH and len(regions[FAST_SCRATCH]) != fast:
            raise NpuBridgeRefused(
                f"{name}: the command stream uses {len(regions[FAST_SCRATCH]):,} B of fast "
                f"scratch; the firmware set aside {fast:,} B")
        return self.executor.tally.commands[name] - before


class StreamNpuHandler:
    """The bridge's `NpuHandler` for a file compiled by Vela outside orchestrate (the
    incumbent's `.tflite`, run by TFLM's Ethos-U kernel): there is no TOSA graph to hold the
    stream against, so each invocation's command stream runs in the Ethos-U functional model
    (the U55/U65 model, or the U85 model) on the regions the firmware sent, as the NPU would
    run it. `commands` counts what it executed."""

    def __init__(self, accelerator: str):
        self.accelerator = accelerator
        self.calls = 0
        self.commands = 0
        self.executes_stream = True

    def __call__(self, payload: bytes, regions: list) -> int:
        self.calls += 1
        try:
            counters = execute_backend_invocation(payload, regions, self.accelerator)
        except UnmodelledCommand as error:
            raise NpuBridgeRefused(f"NPU invocation {self.calls}: the Ethos-U functional model "
                                   f"does not implement {error}") from None
        except (NpuModelError, ValueError) as error:
            raise NpuBridgeRefused(f"NPU invocation {self.calls}: the command stream fails on "
                                   f"the NPU model: {error}") from None
        if isinstance(counters, tuple):  # the U85 model's (outputs, counters)
            counters = counters[1]
        executed = getattr(counters, "commands", 0)
        self.commands += executed
        return executed
