"""The device-runs room: the verification methods whose judge is real device code, and the
verdict of every method together. The host ExecuTorch runtime with the device kernels and
EthosUBackend built for the host (`runtime_verify.py`), the platform's runner firmware on QEMU
(`qemu.py`: which installed platform runs a program, why QEMU cannot judge it, the run and its
report) with the NPU invocations it hands over semihosting computed on the host
(`qemu_npu.py`), and `combined.py` (`verify_all`: every method this machine has, the verdict
theirs together, the device code deciding).

It depends on orchestrator.verification (the twin, the NPU executor every method uses, the
BundleIO bundle, the method results), never the other way. The harnesses are in platforms/
(the QEMU harness in platforms/qemu.py; the FVP harness in platforms/fvp.py).
"""
