"""Arm Corstone-300 (SSE-300, Cortex-M55 with Ethos-U55 or Ethos-U65): the data is platform.yaml
next to this file, read by `platforms.load_platform("corstone300")`."""
