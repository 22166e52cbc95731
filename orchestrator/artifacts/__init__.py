"""The artifacts room: what a compile writes and reads back as data. The outputs beside a
`.pte` (manifest with SHA-256 of every file, TOSA per partition, plan), the atomic file writes,
the capture/quantization cache and `orchestrate size`.

Everything read here that the tool did not just make is checked (hash, schema, paths inside its
folder) before use.
"""
