"""The SGLang CPU import shims (tests/e2e/sglang_shims), without SGLang: the stand-in kernel and the chain."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

SHIMS = Path(__file__).resolve().parents[1] / "e2e" / "sglang_shims"


def _load_sgl_kernel():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location(
        "sgl_kernel_shim_under_test", SHIMS / "sgl_kernel" / "__init__.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.torch
def test_assign_req_to_token_pool_cpu_writes_each_request_slice():
    torch = pytest.importorskip("torch")
    kernel = _load_sgl_kernel()
    req_to_token = torch.full((4, 8), -1, dtype=torch.int32)
    # Three requests in pool rows 2, 0, 3: positions [1, 4), [0, 2), [5, 5) (empty); their new cache
    # locations come one after another in out_cache_loc.
    kernel.assign_req_to_token_pool_cpu(
        torch.tensor([2, 0, 3]),
        req_to_token,
        torch.tensor([1, 0, 5]),
        torch.tensor([4, 2, 5]),
        torch.tensor([10, 11, 12, 20, 21], dtype=torch.int64),
        req_to_token.shape[1],
    )
    assert req_to_token[2].tolist() == [-1, 10, 11, 12, -1, -1, -1, -1]
    assert req_to_token[0].tolist() == [20, 21, -1, -1, -1, -1, -1, -1]
    assert req_to_token[1].tolist() == [-1] * 8
    assert req_to_token[3].tolist() == [-1] * 8


@pytest.mark.torch
def test_other_kernels_are_stubs_that_fail_when_called():
    pytest.importorskip("torch")
    kernel = _load_sgl_kernel()
    from_import = kernel.copy_all_layer_kv_cache_cpu  # importing the name works
    with pytest.raises(NotImplementedError, match="copy_all_layer_kv_cache_cpu"):
        from_import(1, 2)
    assert not hasattr(kernel, "__all__")  # dunder probes fail normally


def test_sitecustomize_registers_the_torchvision_stand_in_and_runs_chained_files(tmp_path: Path):
    marker = tmp_path / "ran.txt"
    extra = tmp_path / "extra_site.py"
    extra.write_text(f"open({str(marker)!r}, 'w').write(__name__)\n")
    env = {
        **os.environ,
        "PYTHONPATH": str(SHIMS),
        "HANGWATCH_EXTRA_SITECUSTOMIZE": str(SHIMS / "sitecustomize.py") + os.pathsep + str(extra),
    }
    out = subprocess.run(
        [sys.executable, "-c", "import sys; print('torchvision._meta_registrations' in sys.modules)"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=True,
    )
    assert out.stdout.strip() == "True", out.stderr
    # The shims' own file in the list is skipped (no recursion); the other runs once, under its own name.
    assert marker.read_text() == "hangwatch_extra_sitecustomize_0"


def test_a_missing_chained_file_stops_the_interpreter(tmp_path: Path):
    env = {**os.environ, "PYTHONPATH": str(SHIMS), "HANGWATCH_EXTRA_SITECUSTOMIZE": str(tmp_path / "nope.py")}
    out = subprocess.run(
        [sys.executable, "-c", "print('started')"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert out.returncode == 2 and "started" not in out.stdout, out
    assert "nope.py" in out.stderr
