"""Frozen, typed samples and the report they add up to. Nothing here does I/O."""
