"""The verify room: the host twin, the local check against the quantized reference, the NPU
executor every method uses (`--npu-model`), the BundleIO bundle, and the method names and
results (`methods.py`).

The methods that run device code (the host ExecuTorch runtime, the runner firmware on QEMU) and
the combined verdict (`verify_all`) are in orchestrator.device_runs, which builds on this room.
"""
