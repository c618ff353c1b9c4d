"""Two native unwinders' stacks of one thread made comparable (imported by tests/integration/
test_native_unwind.py and scripts/gpu/validate_unwind.py as ``stack_compare``).

py-spy reads debug information where a library carries it: it adds the functions the compiler inlined
and names the source file instead of the library. Our unwinder reads neither. Those frames of py-spy's
are the only difference allowed: the inlined ones are dropped (those of a name beyond as many as ours
has), and source file names are not compared.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from hangwatch.model.stacks import Frame

SOURCE_FILES = (".c", ".cc", ".cpp", ".cxx", ".h", ".hpp")


def comparable(
    ours: Sequence[Frame], theirs: Sequence[Frame], sources: tuple[str, ...] = SOURCE_FILES
) -> tuple[list[tuple[str, bool, str]], list[tuple[str, bool, str]]]:
    """Both stacks as (name, native, file); ``sources``: the suffixes of a source file's name."""
    # py-spy's frames from debug information beyond ours of each name are the inlined ones (Cython's
    # wrapper and the function inlined into it both read ``deviceSynchronize``).
    left = Counter(f.name for f in ours)
    kept = []
    for f in theirs:
        if f.native and f.file.endswith(sources):
            if left[f.name] <= 0:
                continue
            left[f.name] -= 1
        kept.append(f)
    source = {i for i, f in enumerate(kept) if f.native and f.file.endswith(sources)}
    a = [(f.name, f.native, "" if i in source else f.file) for i, f in enumerate(ours)]
    b = [(f.name, f.native, "" if i in source else f.file) for i, f in enumerate(kept)]
    return a, b
