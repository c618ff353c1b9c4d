"""``hangwatch doctor`` end to end: real nvcc-built modules, capabilities given on the command line."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from cuda_artefacts import CAPABILITIES
from cuda_artefacts import VERDICTS
from hwrun import hangwatch_argv

pytestmark = pytest.mark.timeout(300)


def doctor(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, str, dict]:
    report = tmp_path / "doctor.json"
    proc = subprocess.run(
        hangwatch_argv("doctor", "--report-json", str(report), *args),
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, **(env or {})},
        check=False,
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    data = json.loads(report.read_text()) if report.exists() else {}
    return proc.returncode, proc.stdout + proc.stderr, data


@pytest.mark.parametrize("capability", CAPABILITIES)
def test_verdicts_per_capability(artefacts, tmp_path, capability):
    rc, out, data = doctor(
        tmp_path, "--capability", capability, "--python", sys.executable, "--scan", str(artefacts)
    )
    assert data["schema"] == "hangwatch.doctor/1"
    assert data["capabilities"] == [capability]
    got = {Path(m["path"]).stem: m["verdict"] for m in data["modules"]}
    column = CAPABILITIES.index(capability)
    assert got == {name: verdicts[column] for name, verdicts in VERDICTS.items()}
    for m in data["modules"]:
        assert set(m) >= {"path", "sass", "ptx", "verdict"}
    check = next(c for c in data["checks"] if c["name"] == "extension-architectures")
    assert set(check) >= {"name", "status", "summary", "evidence"}
    assert check["status"] == "fail"  # every capability has some module with nothing for it
    assert rc == 3
    assert "extension-architectures" in out


def test_all_native_passes(artefacts, tmp_path):
    only = tmp_path / "only"
    only.mkdir()
    shutil.copy(artefacts / "multi.so", only / "multi.so")
    rc, out, data = doctor(tmp_path, "--capability", "12.0", "--python", sys.executable, "--scan", str(only))
    check = next(c for c in data["checks"] if c["name"] == "extension-architectures")
    assert check["status"] == "pass", out
    assert data["modules"][0]["sass"] == ["sm_90", "sm_100a", "sm_120"]
    assert rc in (0, 1)  # other checks of this machine may warn (e.g. its open-files limit)


def test_sgl_kernel_loader_on_an_sm120_gpu(artefacts, tmp_path):
    """The story: a library whose loader picks its sm100/ build on an SM120 GPU."""
    site = tmp_path / "site"
    pkg = site / "sgl_kernel"
    for sub, module in (("sm90", "sm90a.so"), ("sm100", "sm100a.so")):
        (pkg / sub).mkdir(parents=True)
        shutil.copy(artefacts / module, pkg / sub / "common_ops.abi3.so")
    (pkg / "__init__.py").write_text("raise ImportError('doctor must never import this')\n")
    env = {"PYTHONPATH": str(site)}
    rc, out, data = doctor(tmp_path, "--capability", "12.0", "--python", sys.executable, env=env)
    check = next(c for c in data["checks"] if c["name"] == "arch-directories")
    assert check["status"] == "fail", out
    assert any("picks sm100/" in e for e in check["evidence"])
    assert rc == 3
    rc, out, data = doctor(tmp_path, "--capability", "9.0", "--python", sys.executable, env=env)
    assert next(c for c in data["checks"] if c["name"] == "arch-directories")["status"] == "pass"


def test_fast_checks_and_a_taken_port(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        rc, _out, data = doctor(tmp_path, "--fast", "--port", str(port))
    assert data["mode"] == "fast"
    check = next(c for c in data["checks"] if c["name"] == "port")
    assert check["status"] == "fail"
    assert f"pid {os.getpid()}" in " ".join(check["evidence"])
    assert rc == 3
    assert data["timings"]["total_s"] < 2.0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--capability", "banana"], "not a compute capability"),
        (["--model", "/no/such/model"], "no such folder"),
        (["--scan", "/no/such.so"], "no such file"),
    ],
)
def test_bad_input_is_a_usage_error(tmp_path, args, message):
    rc, out, _ = doctor(tmp_path, *args)
    assert rc == 2 and message in out
