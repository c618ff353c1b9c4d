"""Run the cases of a parametrized family side by side, each still its own test (``import side_by_side``).

A family whose cases each wait out the same stall window costs N windows one after another; started
together they cost about one. A module-scoped fixture calls :func:`run_family` once for the cases pytest
selected (``-k`` picks fewer: only those run); each parametrized test then takes its own case's outcome
with :func:`outcome` and asserts on it as before, so a failure names its case and only that case fails.
Each case gets a folder of its own, and a state folder of its own (:func:`own_state`), as conftest's
``state_dir`` gives each test.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from typing import TypeVar

import pytest

K = TypeVar("K")
R = TypeVar("R")


def selected(request: pytest.FixtureRequest, test: str, param: str) -> list[Any]:
    """The values of ``param`` of the items of ``test`` (in the requesting module) that this session runs."""
    return [
        item.callspec.params[param]
        for item in request.session.items
        if isinstance(item, pytest.Function) and item.module is request.module and item.originalname == test
    ]


def own_state(folder: Path) -> dict[str, str]:
    """The environment that keeps a run's hangwatch state (run folders, phase history) in ``folder``."""
    return {"XDG_STATE_HOME": str(folder / "state")}


def run_family(
    tmp_path_factory: pytest.TempPathFactory, keys: list[K], run_case: Callable[[K, Path], R]
) -> dict[K, R | Exception]:
    """``run_case(key, folder)`` for every key at once, each in a thread and a fresh folder of its own.

    A case that raises (a hangwatch that never ended, a program that never got ready) keeps its exception
    for its own test to raise: one case's failure is never another's. Threads cannot be stopped: on Ctrl-C
    (or SIGTERM, which conftest turns into it) the cases in flight end by themselves, each within its own
    hangwatch's timeout, and each reaps its own tree as it would in a test of its own.
    """

    def one(key: K, folder: Path) -> R | Exception:
        try:
            return run_case(key, folder)
        except Exception as exc:  # re-raised by the key's own test, through outcome()
            return exc

    folders = {key: tmp_path_factory.mktemp(str(key)) for key in keys}
    with ThreadPoolExecutor(max_workers=max(len(keys), 1)) as pool:
        futures = {key: pool.submit(one, key, folders[key]) for key in keys}
        return {key: future.result() for key, future in futures.items()}


def outcome(results: dict[K, R | Exception], key: K) -> R:
    """The key's result, or its exception raised here, in the key's own test."""
    result = results[key]
    if isinstance(result, Exception):
        raise result
    return result
