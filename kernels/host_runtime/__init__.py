"""The process that runs programs with the host build of the device runtime's CPU kernels and
Ethos-U backend (session.py, worker.py), and that build's own C++ (csrc/); the build itself is
kernels/native/host.py. The public API is kernels.runtime."""
