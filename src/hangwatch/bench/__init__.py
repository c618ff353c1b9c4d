"""``hangwatch bench``: drive the load generator over rounds, and the servers it launches."""
