"""Raspberry Pi Pico 2 (RP2350: Cortex-M33, no NPU): the data is platform.yaml next to this file,
read by `platforms.load_platform("pico2")`."""
