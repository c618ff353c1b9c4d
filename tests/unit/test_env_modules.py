"""doctor scans every CUDA extension module of the environment, found by its ELF headers, not by a list
of package names; a module only one backend uses fails that backend, not the environment.

A fake site-packages (on PYTHONPATH of a real interpreter) holds modules of packages no list names:
real nvcc-built artefacts where nvcc exists, else minimal ELF files with a ``.nv_fatbin`` section."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from cuda_artefacts import build_all
from cuda_artefacts import find_nvcc
from elfcraft import cuda_module
from elfcraft import host_module
from hangwatch.analyse.doctor.coverage import check_extension_arch
from hangwatch.collect.pyenv import describe_env
from hangwatch.doctor.session import scan_modules
from hangwatch.engines import registry
from hangwatch.model.doctor import Coverage
from hangwatch.model.doctor import Status

FA3 = "FlashAttention-3 (an attention backend for Hopper)"


def _cuda(path: Path, archs: list[int], artefact: str | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    nvcc = find_nvcc()
    if nvcc is not None and artefact is not None:
        shutil.copy(build_all(nvcc) / f"{artefact}.so", path)  # what nvcc really writes
    else:
        path.write_bytes(cuda_module(archs))


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    site = tmp_path / "site-packages"
    _cuda(site / "xformers" / "_C.so", [90], "sm90")
    _cuda(site / "my_ext.cpython-311-x86_64-linux-gnu.so", [120], "sm120")
    _cuda(site / "vllm" / "vllm_flash_attn" / "_vllm_fa3_C.abi3.so", [90], "sm90a")
    _cuda(site / "nvidia" / "cublas" / "lib" / "libcublas.so.12", [90, 120], "multi")
    (site / "numpy_like").mkdir()
    (site / "numpy_like" / "_core.so").write_bytes(host_module())
    (site / "numpy_like-1.0.dist-info").mkdir()
    (site / "numpy_like-1.0.dist-info" / "ignored.so").write_bytes(cuda_module([90]))
    monkeypatch.setenv("PYTHONPATH", str(site))
    return site


def _files(site: Path) -> list[tuple[str, str | None]]:
    env = describe_env(sys.executable, import_torch=False, engines=registry.distributions())
    assert env.error is None
    return [(e.path, e.package) for e in env.extensions if e.path.startswith(str(site))]


def test_every_shared_object_is_listed_with_its_package(site):
    got = {str(Path(path).relative_to(site)): package for path, package in _files(site)}
    assert got == {
        "my_ext.cpython-311-x86_64-linux-gnu.so": "my_ext",
        "numpy_like/_core.so": "numpy_like",
        "nvidia/cublas/lib/libcublas.so.12": "nvidia/cublas",
        "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so": "vllm",
        "xformers/_C.so": "xformers",
    }


def test_modules_found_by_their_headers_and_judged(site):
    timings: dict[str, float] = {}
    files = _files(site)
    scans, modules, seconds = scan_modules(files, [(12, 0)], None, timings)
    assert len(scans) == 4  # the host-only module's headers said no: never parsed further
    got = {str(Path(m.path).relative_to(site)): (m.package, m.verdict, m.feature) for m in modules}
    assert got == {
        "my_ext.cpython-311-x86_64-linux-gnu.so": ("my_ext", Coverage.NATIVE, None),
        "nvidia/cublas/lib/libcublas.so.12": ("nvidia/cublas", Coverage.NATIVE, None),
        "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so": ("vllm", Coverage.NONE, FA3),
        "xformers/_C.so": ("xformers", Coverage.NONE, None),
    }
    assert set(timings) == {"elf_headers_s", "fatbins_s"}
    check = check_extension_arch(modules, [(12, 0)], len(files), seconds)
    assert check.status is Status.FAIL
    assert check.summary.startswith("1 of 4 GPU modules have no code for 12.0")  # xformers; FA3 apart
    assert any(e.endswith(f"(only for {FA3})") for e in check.evidence)


def test_a_module_only_one_backend_uses_fails_that_backend_not_the_environment(site):
    (site / "xformers" / "_C.so").unlink()
    files = _files(site)
    _scans, modules, seconds = scan_modules(files, [(12, 0)], None)
    check = check_extension_arch(modules, [(12, 0)], len(files), seconds)
    assert check.status is Status.WARN
    assert check.summary == (
        f"{FA3}: not usable on 12.0 (1 module used only by it has no code for this GPU); "
        "every other GPU module has code for it"
    )
    assert check.evidence[0] == f"scanned 4 shared objects in {seconds:.2f} s; 3 carry GPU code"
