"""Arm Corstone-320 (SSE-320, Cortex-M85 with Ethos-U85): the data is platform.yaml next to this
file, read by `platforms.load_platform("corstone320")`."""
