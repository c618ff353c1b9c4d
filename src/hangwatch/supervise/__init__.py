"""Owning a launched process tree: launch it in a session of its own, guard it, watch it, clean it up."""
