"""Renesas EK-RA8D1 (RA8D1: Cortex-M85 with Helium, no NPU): the data is platform.yaml next to this
file, read by `platforms.load_platform("ekra8d1")`."""
