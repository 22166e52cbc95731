"""The device-runs room: the verification methods whose judge is real device code. The host
ExecuTorch runtime with the device kernels and EthosUBackend built for the host
(`runtime_verify.py`), and the platform's runner firmware on QEMU (`qemu.py`: which installed
platform runs a program, why QEMU cannot judge it, the run and its report) with the NPU
invocations it hands over semihosting computed on the host (`qemu_npu.py`).

It owns running device code and reporting what it showed; the twin, the NPU executor every
method uses, the BundleIO bundle and the combined verdict stay in orchestrator.verification.
The harnesses are in platforms/ (the QEMU harness in platforms/qemu.py; the FVP harness stays in
platforms/fvp.py).
"""
