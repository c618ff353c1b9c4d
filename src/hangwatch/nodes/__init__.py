"""Across nodes: the per-node collector (``hangwatch collect``), the bundle codec, host lists, and the
fan-out that runs the collector once per node through a transport (``hangwatch.transports``)."""
