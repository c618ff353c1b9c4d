"""Fixtures shared by the integration tests of several modules."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

import pytest

from nodes_emulation import EmulatedNodes
from nodes_emulation import skip_reason


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatedNodes]:
    """Three emulated nodes (tests/nodes_emulation.py), one cluster per test module, checked gone after."""
    reason = skip_reason()
    if reason is not None:
        pytest.skip(reason)
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed (the ranks are gloo programs): pip install torch==2.13.0")
    nodes = EmulatedNodes(tmp_path_factory.mktemp("nodes")).start()
    try:
        yield nodes
    finally:
        nodes.close()
    assert nodes.leftovers() == []
