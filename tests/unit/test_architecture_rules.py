"""The rules of docs/architecture.md beside the import rules (tests/unit/test_architecture.py), each read
from the source with ``ast``: what a change must keep, checked where a test can check it."""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_architecture import COMMANDS
from test_architecture import PACKAGE
from test_architecture import module_of

from builders import process_sample
from hangwatch.analyse.assess import Assessor
from hangwatch.analyse.assess import watch_policy
from hangwatch.engines import by_name
from hangwatch.model.samples import Tick
from hangwatch.model.vocabulary import CLI_WORDS
from hangwatch.model.vocabulary import OptionWords


def _sources(*parts: str) -> Iterator[tuple[Path, ast.Module]]:
    for part in parts:
        root = PACKAGE / part
        for path in sorted(root.rglob("*.py")) if root.is_dir() else [root.with_suffix(".py")]:
            yield path, ast.parse(path.read_text(encoding="utf-8"))


def _docstrings(tree: ast.Module) -> set[int]:
    """The ids of the string constants that are docstrings (of the module, a class, a function)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def _strings(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """Every string the code uses (f-strings' literal parts included), docstrings left out."""
    skip = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            yield node.lineno, node.value


def test_every_verdict_is_written_by_the_assessor() -> None:
    """``Verdict(...)`` is built in analyse/assess.py only; isolate/state.py reads saved ones back."""
    readers = {PACKAGE / "isolate" / "state.py"}
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == PACKAGE / "analyse" / "assess.py" or path in readers:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Verdict":
                wrong.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert wrong == [], "verdicts written outside analyse/assess.py: " + ", ".join(wrong)


def test_samples_are_frozen() -> None:
    """Every dataclass of model/ is ``frozen=True``: a sample handed on cannot change under its reader."""
    loose = []
    for path, tree in _sources("model"):
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            for d in node.decorator_list:
                bare = isinstance(d, ast.Name) and d.id == "dataclass"
                call = isinstance(d, ast.Call) and getattr(d.func, "id", None) == "dataclass"
                frozen = call and any(
                    k.arg == "frozen" and getattr(k.value, "value", False) is True
                    for k in d.keywords  # type: ignore[union-attr]
                )
                if bare or (call and not frozen):
                    loose.append(f"{path.relative_to(PACKAGE)}: {node.name}")
    assert loose == [], loose


# What reaches the outside world: a process, a socket, HTTP, a database, native code, the GPU's library.
_OUTSIDE = {"subprocess", "socket", "http", "urllib.request", "sqlite3", "ctypes", "pynvml", "select"}


def test_the_analysis_the_model_and_the_renderers_read_nothing_from_outside() -> None:
    """Only the boundary parts (collect/, transports/, and the commands that launch or serve) import what
    reaches the outside; model/, analyse/, engines/ and render/ decide from values handed to them."""
    wrong = []
    for path, tree in _sources("model", "analyse", "engines", "render"):
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for name in names:
                if name in _OUTSIDE or name.split(".")[0] in _OUTSIDE - {"urllib.request"}:
                    wrong.append(f"{path.relative_to(PACKAGE)} imports {name}")
    assert wrong == [], wrong


def test_the_analysis_names_no_flag_of_the_watch_in_its_words() -> None:
    """The watch's own flags (attach's --window, run's --timeout, --ready-url, ...) are the commands'
    names, handed to the analysis as ``OptionWords``: none is written in analyse/."""
    flags = {
        CLI_WORDS.window,
        CLI_WORDS.timeout,
        CLI_WORDS.ready_url,
        CLI_WORDS.ready_pattern,
        CLI_WORDS.engine,
    }
    wrong = [
        f"{path.relative_to(PACKAGE)}:{line}: {text!r}"
        for path, tree in _sources("analyse")
        for line, text in _strings(tree)
        if any(flag in text for flag in flags)
    ]
    assert wrong == [], wrong


@pytest.mark.parametrize(("words", "said"), [(OptionWords(), "watch window"), (CLI_WORDS, "--window")])
def test_a_verdict_names_the_window_in_the_words_it_is_given(words: OptionWords, said: str) -> None:
    """Must cover: the end of attach's window, worded by whoever built the watch. Must not: a flag name
    where the watch was built without the command line's words."""
    policy = watch_policy(by_name("generic"), stall_after_s=30, window_s=4, words=words)
    a = Assessor(by_name("generic"), policy, {1})
    root = process_sample(1, "python")
    verdicts = [a.observe(Tick(float(t), (root,))) for t in range(6)]
    final = next(v for v in verdicts if v is not None)
    assert f"the 4 s {said}" in final.summary, final.summary
    if words == OptionWords():
        assert "--" not in final.summary


def test_each_command_has_one_orchestrating_module_and_a_parser() -> None:
    """A command's module or package is named after it, and ``cli/<command>.py`` parses its options
    (``nodes/`` is the ``collect`` command's and ``stacks --hosts``'; ``sidecar/`` is ``watch``'s)."""
    parser_of = {"nodes": "collect", "sidecar": "watch"}
    missing = []
    for command in sorted(COMMANDS):
        if not (PACKAGE / f"{command}.py").is_file() and not (PACKAGE / command / "__init__.py").is_file():
            missing.append(f"no module or package {command}")
        if not (PACKAGE / "cli" / f"{parser_of.get(command, command)}.py").is_file():
            missing.append(f"no cli/{parser_of.get(command, command)}.py")
    assert missing == [], missing


def test_the_demo_story_imports_only_the_standard_library() -> None:
    """``python -m hangwatch.demo.story`` runs anywhere: nothing of ours, nothing installed."""
    ((path, tree),) = _sources("demo/story")
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            imported.add(node.module.split(".")[0])
    assert imported - set(sys.stdlib_module_names) - {"__future__"} == set(), module_of(path)
