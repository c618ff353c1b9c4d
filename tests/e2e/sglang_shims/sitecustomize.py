"""Import shim for real SGLang 0.5.23 on a CPU-only machine; put this directory first on ``PYTHONPATH``.

Python imports ``sitecustomize`` once at start-up in every interpreter that has this directory on its path,
so the launcher and each process SGLang spawns (schedulers, detokenizer: multiprocessing's ``spawn``
inherits the environment) run it before any import of their own.

What it does:

1. The registry's torchvision 0.28.0 is built against CUDA: importing it beside the CPU torch 2.13.0 fails
   in ``torchvision/_meta_registrations.py`` with ``RuntimeError: operator torchvision::nms does not
   exist``. transformers imports torchvision whenever it is installed, and SGLang imports transformers. An
   empty module registered under that name in ``sys.modules`` is found by torchvision's
   ``from torchvision import _meta_registrations`` instead of the real file; nothing on SGLang's text
   path uses the meta kernels it would register.
2. The stand-in ``sgl_kernel`` package next to this file replaces the CUDA-only ``sglang-kernel`` wheel
   (it is found by the ordinary import system, because this directory is on the path; nothing to do here).

Chaining: another harness (fault injection, for one) may need its own ``sitecustomize`` in the same
processes, and Python imports only the first module of that name on ``sys.path``. Name its file(s) in
``HANGWATCH_EXTRA_SITECUSTOMIZE`` (several separated by ``os.pathsep``): when this file is the one Python
imported (``__name__ == "sitecustomize"``), it executes each of them after the shims are in place, in
order, as a module named ``hangwatch_extra_sitecustomize_<N>`` (N from 0) with ``__file__`` set, so they
can install import hooks (``sys.meta_path``) as a sitecustomize would. This file itself is skipped if it
is listed. When this file is run by another sitecustomize (the other harness first on the path, chaining
to it), it only installs the shims and chains to nothing: the head of the chain runs the others. A
file that is missing or raises ends the interpreter at once (exit status 2, one line on stderr): ``site``
would only print the error and start the process anyway, and a misspelt path would silently drop a fault.
"""

from __future__ import annotations

import os
import runpy
import sys
import types

EXTRA_ENV = "HANGWATCH_EXTRA_SITECUSTOMIZE"
_META = "torchvision._meta_registrations"
if _META not in sys.modules:
    sys.modules[_META] = types.ModuleType(_META, "empty stand-in (hangwatch sglang shims)")


def _chain() -> None:
    if __name__ != "sitecustomize":
        return
    me = os.path.realpath(__file__)
    extra = [p for p in os.environ.get(EXTRA_ENV, "").split(os.pathsep) if p]
    for n, path in enumerate(p for p in extra if os.path.realpath(p) != me):
        try:
            runpy.run_path(path, run_name=f"hangwatch_extra_sitecustomize_{n}")
        except Exception as exc:
            sys.stderr.write(f"hangwatch sglang shims: {EXTRA_ENV} file {path} failed: {exc!r}\n")
            sys.stderr.flush()
            os._exit(2)


_chain()
