"""CUDA's binary-compatibility rules, and the verdicts for the GPUs of the story (9.0, 10.0, 12.0)."""

from __future__ import annotations

import pytest

from hangwatch.analyse.doctor.archcompat import arch_directory
from hangwatch.analyse.doctor.archcompat import coverage
from hangwatch.analyse.doctor.archcompat import loader_choice
from hangwatch.analyse.doctor.archcompat import parse_capability
from hangwatch.model.doctor import Coverage

N, J, X = Coverage.NATIVE, Coverage.JIT, Coverage.NONE


@pytest.mark.parametrize(
    ("sass", "ptx", "gpu", "verdict"),
    [
        (["sm_90"], [], (9, 0), N),
        (["sm_80"], [], (8, 6), N),  # same major, newer minor
        (["sm_86"], [], (8, 0), X),  # older minor than the code
        (["sm_90"], [], (10, 0), X),  # never across majors
        (["sm_100"], [], (12, 0), X),
        (["sm_90a"], [], (9, 0), N),
        (["sm_100a"], [], (10, 3), X),  # arch-specific: exactly its own capability
        (["sm_100a"], [], (12, 0), X),
        (["sm_100f"], [], (10, 3), N),  # family: same major, newer minor
        (["sm_100f"], [], (11, 0), X),
        (["sm_120"], [], (12, 1), N),
        ([], ["compute_90"], (12, 0), J),  # plain PTX: any newer GPU
        ([], ["compute_120"], (10, 0), X),
        ([], ["compute_100a"], (10, 0), J),  # arch-specific PTX: only its own capability
        ([], ["compute_100a"], (12, 0), X),
        ([], ["compute_100f"], (10, 3), J),
        (["sm_90"], ["compute_90"], (10, 0), J),
        (["sm_90", "sm_120"], ["compute_90"], (12, 0), N),
        ([], [], (9, 0), X),
    ],
)
def test_rules(sass, ptx, gpu, verdict):
    assert coverage(sass, ptx, gpu)[0] is verdict


def test_reason_names_arch_specific_code():
    verdict, reason = coverage(["sm_100a"], [], (12, 0))
    assert verdict is X
    assert "sm_100a only on 10.0" in reason


@pytest.mark.parametrize(
    ("text", "cap"),
    [("9.0", (9, 0)), ("12", (12, 0)), ("12.1", (12, 1)), ("sm_120", (12, 0)), ("100", (10, 0))],
)
def test_parse_capability(text, cap):
    assert parse_capability(text) == cap


@pytest.mark.parametrize("text", ["x", "9.a", "", "sm_"])
def test_parse_capability_rejects(text):
    with pytest.raises(ValueError, match="compute capability"):
        parse_capability(text)


def test_arch_directories_and_known_loader():
    assert arch_directory("/site/sgl_kernel/sm100/common_ops.abi3.so") == ("sm100", (10, 0), "")
    assert arch_directory("/site/pkg/sm_90a/x.so") == ("sm_90a", (9, 0), "a")
    assert arch_directory("/site/vllm/_C.abi3.so") is None
    # sgl-kernel's loader: 9.0 -> sm90/, every other GPU -> sm100/ (the story of an sm_120 GPU).
    assert loader_choice("sgl_kernel", (9, 0))[0] == "sm90"  # type: ignore[index]
    assert loader_choice("sgl_kernel", (12, 0))[0] == "sm100"  # type: ignore[index]
    assert loader_choice("vllm", (12, 0)) is None
