"""The verify room: the host twin, the local check against the quantized reference, the NPU
executor every method uses (`--npu-model`), the BundleIO bundle, the method names and results
(`methods.py`) and the combined verdict that says which methods ran (`combined.py`, with
`verify_all`).

The methods that run device code (the host ExecuTorch runtime, the runner firmware on QEMU) are
in orchestrator.device_runs; the verdict here combines their results.
"""
