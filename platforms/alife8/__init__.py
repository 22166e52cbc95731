"""Alif Semiconductor Ensemble E8 (RTSS-HP: Cortex-M55 with Ethos-U55-256 or Ethos-U85-256): the
data is platform.yaml next to this file, read by `platforms.load_platform("alife8")`."""
