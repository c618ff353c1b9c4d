"""A new engine is one file: a made-up profile, once in the registry's tuple, is what detection, the log
scanner, the versions read, the host's cache folders, the lock-file walk, the boot history's warm caches
and the next steps use, with nothing else touched."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import sys
from pathlib import Path

import pytest

from builders import report
from hangwatch.analyse import causes
from hangwatch.analyse.doctor.nccl import rules
from hangwatch.analyse.logscan import LogScanner
from hangwatch.analyse.logscan import line_source
from hangwatch.collect.host import cache_dirs
from hangwatch.collect.pyenv import describe_env
from hangwatch.collect.pyenv import quick_env
from hangwatch.collect.stacks import DumpRun
from hangwatch.collect.stacks import StackDumper
from hangwatch.collect.versions import environment_versions
from hangwatch.engines import registry
from hangwatch.engines.generic import GENERIC
from hangwatch.engines.profile import CUDA_GRAPHS_OFF
from hangwatch.engines.profile import EnvRule
from hangwatch.engines.profile import Profile
from hangwatch.engines.profile import rule
from hangwatch.engines.profile import title_roles
from hangwatch.model.doctor import CacheFolder
from hangwatch.model.doctor import GpuInventory
from hangwatch.model.samples import ProcessSample
from hangwatch.model.vocabulary import Cause
from hangwatch.supervise.history import key_of
from hangwatch.supervise.session import with_environment
from hangwatch.supervise.watch import stack_kit

# A made-up engine that logs "<toy w3 pid=41> message" and says "ToyEngine gave up." when it fails.
TOY = Profile(
    name="toyengine",
    display_name="ToyEngine",
    command_markers=(re.compile(r"\btoyengine\b"),),
    phases=(rule("weights", "loading weights", r"toy: loading the weights"),),
    role_of=title_roles(re.compile(r"^toy::(?P<role>\w+?)(?:_(?P<rank>TP\d+))?$"), "server"),
    log_prefixes=(r"<\w+ pid=\d+> ",),
    writer_pid=re.compile(r"<(?P<label>\w+) pid=(?P<pid>\d+)>"),
    fatal_lines=(r"ToyEngine gave up\.",),
    compile_frames=(r"toyengine/jit/",),
    next_step_flags={CUDA_GRAPHS_OFF: "--toy-no-graphs"},
    distributions=("toyengine",),
    cache_dirs=(CacheFolder("ToyEngine cache", "TOY_CACHE", "toyengine"),),
    env_rules=(
        EnvRule(
            "toy-env", lambda s: "TOY_SPIN" in s.env, lambda s: "TOY_SPIN spins", after="launch-blocking"
        ),
    ),
)


@pytest.fixture
def with_toy(monkeypatch):
    """TOY registered as a new engine module would be: one entry before the generic profile."""
    monkeypatch.setattr(registry, "ENGINES", (*registry.ENGINES[:-1], TOY, GENERIC))


def test_detect_and_recognise_log_pick_up_a_registered_engine(with_toy):
    assert registry.detect(["python", "-m", "toyengine", "--port", "9"]) is TOY
    assert registry.by_name("toyengine") is TOY
    assert registry.recognise_log("toy: loading the weights of m") == "toyengine"
    assert registry.detect(["python", "-m", "vllm.entrypoints.openai.api_server"]).name == "vllm"
    assert registry.detect(["./train.sh"]) is GENERIC


def test_without_it_nothing_knows_the_engine():
    assert registry.detect(["python", "-m", "toyengine"]) is GENERIC
    assert registry.recognise_log("toy: loading the weights of m") is None
    assert line_source("<worker_TP1 pid=41> hello") == (None, None)


def test_the_log_scanner_reads_its_writers_and_its_fatal_line(with_toy):
    assert line_source("<worker_TP1 pid=41> hello") == (41, "TP1")
    scanner = LogScanner(TOY)
    sample = scanner.scan(
        (
            "<worker_TP1 pid=41> toy: loading the weights",
            "<worker_TP1 pid=41> Traceback (most recent call last):",
            '<worker_TP1 pid=41>   File "toy.py", line 1, in <module>',
            "<worker_TP1 pid=41> KeyError: 'w'",
            "<server pid=40> ToyEngine gave up.",
        ),
        200,
        1.0,
    )
    assert [e.phase for e in sample.phase_events] == ["weights"]
    assert sample.phase_events[0].source == "pid:41"
    assert dict(sample.named) == {40: "server", 41: "worker_TP1"}
    found = [(f.cause, f.pid, f.rank, f.line.split("> ", 1)[1]) for f in sample.findings]
    assert found == [
        (Cause.EXCEPTION, 41, "TP1", "Traceback (most recent call last):"),
        (Cause.EXCEPTION, 41, "TP1", "KeyError: 'w'"),  # the summary after its writer's prefix
        (Cause.EXCEPTION, 40, None, "ToyEngine gave up."),
    ]


def test_its_packages_are_read_where_the_caller_passes_the_registry(with_toy, tmp_path: Path):
    assert registry.distributions()[-1] == "toyengine"
    asked: list[list[str]] = []

    def run(argv: list[str], timeout_s: float) -> str:
        asked.append(json.loads(argv[-1]))
        return 'HANGWATCH-VERSIONS {"python": "3.11.7", "toyengine": "0.1.0"}\n'

    env = environment_versions(
        ("toyengine",),
        python="/venv/bin/python",
        run=run,
        inventory=GpuInventory,
        proc_root=tmp_path,
        engines=registry.distributions(),
    )
    assert "toyengine" in asked[0] and env["toyengine"] == "0.1.0"
    site = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    (site / "toyengine-0.1.0.dist-info").mkdir(parents=True)
    (tmp_path / "venv" / "bin").mkdir()
    (tmp_path / "venv" / "bin" / "python").write_text("")
    assert (
        quick_env(str(tmp_path / "venv" / "bin" / "python"), registry.distributions()).version_of("toyengine")
        == "0.1.0"
    )
    # The interpreter is asked for the packages it is given (an engine installed here: pytest).
    assert describe_env(sys.executable, import_torch=False, engines=()).version_of("pytest") is None
    facts = describe_env(sys.executable, import_torch=False, engines=("pytest",))
    assert facts.version_of("pytest") == pytest.__version__


def test_its_cache_folder_is_one_of_the_hosts(with_toy, tmp_path: Path):
    folders = dict(cache_dirs({"HOME": str(tmp_path)}, registry.cache_folders()))
    assert folders["ToyEngine cache"] == tmp_path / ".cache" / "toyengine"
    assert folders["vLLM cache"] == tmp_path / ".cache" / "vllm"
    assert dict(cache_dirs({"TOY_CACHE": "/fast/toy"}, registry.cache_folders()))["ToyEngine cache"] == Path(
        "/fast/toy"
    )


def test_next_steps_and_doctor_rules_name_its_flag(with_toy):
    step = causes.NEXT_STEPS[Cause.CUDA_GRAPH_CAPTURE][0]
    # The narrowest switch of each engine first: graphs off, then eager mode.
    assert step.startswith(
        "A rank hangs inside CUDA graph capture: confirm with `--disable-cuda-graph` (SGLang) or "
        "`--toy-no-graphs` (ToyEngine) or `--enforce-eager` (vLLM); if that boots"
    )
    names = [r.name for r in rules()]
    assert names.index("toy-env") > names.index("launch-blocking")


def test_next_steps_without_it_are_the_built_in_engines():
    assert causes.NEXT_STEPS[Cause.CUDA_GRAPH_CAPTURE][0].startswith(
        "A rank hangs inside CUDA graph capture: confirm with `--disable-cuda-graph` (SGLang) or "
        "`--enforce-eager` (vLLM); if that boots"
    )
    assert "toy" not in " ".join(s for steps in causes.NEXT_STEPS.values() for s in steps)


def test_the_end_of_run_versions_ask_for_its_package(monkeypatch, tmp_path: Path):
    """supervise/'s end of a run (``run``, ``attach``) asks the command's interpreter for the registry's
    packages: a stand-in interpreter answers only when it is asked for the made-up engine's."""
    python = tmp_path / "python"
    answer = 'HANGWATCH-VERSIONS {"python": "3.11.7", "toyengine": "0.1.0"}'
    python.write_text(f"#!/bin/sh\ncase \"$3\" in *'\"toyengine\"'*) echo '{answer}';; esac\n")
    python.chmod(0o755)
    assert "toyengine" not in with_environment(report(), ("toyengine",), python=str(python)).environment
    monkeypatch.setattr(registry, "ENGINES", (*registry.ENGINES[:-1], TOY, GENERIC))
    out = with_environment(report(), ("toyengine", "serve"), python=str(python))
    assert out.environment["toyengine"] == "0.1.0"


def test_the_boot_history_reads_its_cache_folder(monkeypatch, tmp_path: Path):
    """A boot is warm when the made-up engine's cache held an entry from before it started: read by the
    boot history's key (supervise/history.py) only once the engine is registered."""
    toy = tmp_path / "toy"
    toy.mkdir()
    started = dt.datetime(2025, 1, 1, tzinfo=dt.UTC).timestamp()
    (toy / "kernel.bin").write_text("from an earlier boot")
    os.utime(toy / "kernel.bin", (started - 3600, started - 3600))
    env = {
        "HOME": str(tmp_path / "home"),
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "no"),
        "TOY_CACHE": str(toy),
    }
    command = ("toyengine", "serve")
    r = report(started_at="2025-01-01T00:00:00+00:00")
    assert not key_of(r, command, env).caches_warm
    monkeypatch.setattr(registry, "ENGINES", (*registry.ENGINES[:-1], TOY, GENERIC))
    assert key_of(r, command, env).caches_warm


def test_a_stack_capture_walks_its_cache_folder_for_lock_files(monkeypatch, tmp_path: Path):
    """The dumper a watch captures with (its kit, given the engines' caches by supervise/) looks for lock
    files no process holds in the made-up engine's cache folder, as the tree's environment names it."""
    proc, toy = tmp_path / "proc", tmp_path / "toy"
    (proc / "7").mkdir(parents=True)
    fields = ["S", "1", "1", "1", *["0"] * 46]
    (proc / "7" / "stat").write_text("7 (python) " + " ".join(fields))
    (proc / "7" / "environ").write_bytes(f"HOME={tmp_path / 'home'}\0TOY_CACHE={toy}\0".encode())
    (toy / "kernels").mkdir(parents=True)
    (toy / "kernels" / "lock").write_text("")
    members = [ProcessSample(7, 1, "toy", (), "S", 1.0, 0.0, 0, 0, 0, 1, 0, (), None, None)]

    def lock_files() -> list[str]:
        kit = stack_kit(True, gpu_available=False)  # what run and attach capture with
        if kit.dumper is None:  # no py-spy here: the kit's own caches still say what the walk is given
            caches = registry.cache_folders()
        else:
            caches = kit.dumper.engine_caches
            assert caches == registry.cache_folders()
        runner = lambda argv, d: DumpRun(0, "[]", "", 0.0)  # noqa: E731
        dumper = StackDumper("py-spy", engine_caches=caches, runner=runner, root=proc)
        return [f.path for f in dumper.capture(members, 1.0, native=False).lock_files]

    assert str(toy / "kernels" / "lock") not in lock_files()
    monkeypatch.setattr(registry, "ENGINES", (*registry.ENGINES[:-1], TOY, GENERIC))
    assert str(toy / "kernels" / "lock") in lock_files()
