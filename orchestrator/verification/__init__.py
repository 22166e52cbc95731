"""The verify room: the host twin, the real ExecuTorch runtime on the host, the Corstone runner on
QEMU and the FVP (through platforms/), the local check against the quantized reference, the
BundleIO bundle, and the combined verdict that says which methods ran.
"""
