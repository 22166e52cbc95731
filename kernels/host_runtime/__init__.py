"""The host build of the device runtime's CPU kernels and Ethos-U backend (see build.py), and the
process that runs programs with it (session.py, worker.py). The public API is kernels.runtime."""
