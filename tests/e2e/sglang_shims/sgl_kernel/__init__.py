"""Stand-in for the ``sgl_kernel`` package (``sglang-kernel`` on PyPI is CUDA-only: no ``*_cpu`` ops).

SGLang 0.5.23's CPU engine (``SGLANG_USE_CPU_ENGINE=1``) imports two ops at module level:

* ``assign_req_to_token_pool_cpu`` (``sglang/srt/mem_cache/allocation.py``), called on every prefill:
  implemented here in plain torch, with the semantics of the Triton kernel it replaces
  (``assign_req_to_token_pool`` in the same file).
* ``copy_all_layer_kv_cache_cpu`` (``sglang/kernels/ops/kvcache/cache_move.py``), not called in a plain
  boot or a plain generation.

Every other attribute is a stub that raises ``NotImplementedError`` *when called* (not when imported), so
an import that SGLang makes but never uses on this path still works, and a call that would need a real
kernel fails loudly instead of computing something wrong.
"""

from __future__ import annotations

from typing import Any
from typing import NoReturn

import torch

__version__ = "0.0.0+hangwatch.cpu.shim"


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """``req_to_token[req_pool_indices[i], start_offset[i]:end_offset[i]]`` = request i's slice of
    ``out_cache_loc`` (the slices are consecutive, in request order)."""
    del pool_len  # the row length; indexing req_to_token by row already accounts for it
    rows = req_pool_indices.tolist()
    starts = start_offset.tolist()
    ends = end_offset.tolist()
    offset = 0
    for row, start, end in zip(rows, starts, ends, strict=True):
        length = end - start
        if length > 0:
            req_to_token[row, start:end] = out_cache_loc[offset : offset + length].to(req_to_token.dtype)
        offset += length


def _stub(name: str) -> Any:
    def unavailable(*args: Any, **kwargs: Any) -> NoReturn:
        raise NotImplementedError(
            f"sgl_kernel.{name} is not available: this is hangwatch's CPU stand-in for sgl_kernel, "
            "which implements only assign_req_to_token_pool_cpu"
        )

    unavailable.__name__ = unavailable.__qualname__ = name
    return unavailable


def __getattr__(name: str) -> Any:
    # Dunder lookups (__path__ of a submodule import, __all__ of a star import, copy/pickle protocol
    # probes) must keep failing the normal way, or the import machinery mistakes us for something else.
    if name.startswith("__") and name.endswith("__"):
        raise AttributeError(name)
    return _stub(name)
