"""The import rules of docs/architecture.md, read from the source with ``ast`` (lazy imports inside
functions included): each part of the package imports only the parts below it."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "hangwatch"

# The shared leaves: any part may import them (``hangwatch`` itself: its __version__).
LEAVES = {"hangwatch", "errors", "redact", "words", "pacing", "ranges"}
# One module or package per command; nodes/ is the ``collect`` command's and ``stacks --hosts``' (a module
# named ``collect`` would shadow collect/).
COMMANDS = {"run", "attach", "stacks", "cleanup", "doctor", "bench", "isolate", "demo", "nodes", "sidecar"}
BELOW_COMMANDS = {"model", "collect", "transports", "engines", "analyse", "render", "supervise"}
# What each part may import besides itself and the leaves. The commands sit on top of supervise/;
# cli/ on top of everything.
ALLOWED: dict[str, set[str]] = {
    "model": set(),
    "errors": {"model"},  # the exit codes of the vocabulary
    "redact": set(),
    "words": set(),
    "ranges": set(),  # labels compacted into ranges: the analysis's sentences and the renderers' text
    "pacing": set(),
    "collect": {"model"},
    "transports": {"model"},  # how to reach another node: a boundary, like collect/
    "engines": {"model"},
    "analyse": {"model", "engines"},
    "render": {"model"},
    "supervise": {"model", "collect", "engines", "analyse", "render"},
    **{c: set(BELOW_COMMANDS) for c in COMMANDS},
    "cli": BELOW_COMMANDS | COMMANDS,
    "__main__": {"cli"},
}
# A command that uses another: run makes doctor's fast checks before it launches; the demo is run over
# the bundled story.
ALLOWED["run"] |= {"doctor"}
ALLOWED["demo"] |= {"run"}
# The sidecar (``hangwatch watch``) is attach's read-only watch kept running, its reading served over HTTP.
ALLOWED["sidecar"] |= {"attach"}
# Across nodes the watch is the assessor's over merged evidence, not supervise/'s local session: nodes/
# reaches the nodes (transports/) and analyses what comes back, and never launches or signals anything.
ALLOWED["nodes"] -= {"supervise"}


def part_of(module: str) -> str:
    """``hangwatch.collect.procfs`` -> collect; ``hangwatch.run`` -> run; ``hangwatch`` -> hangwatch."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def imports_of(path: Path) -> set[str]:
    """Every hangwatch module ``path`` imports, at the top or inside a function."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "hangwatch":
                found |= {f"hangwatch.{a.name}" for a in node.names}
            elif node.module.startswith("hangwatch."):
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name == "hangwatch" or a.name.startswith("hangwatch.")}
    return found


def module_of(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_every_part_imports_only_the_parts_below_it():
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        mine = part_of(module_of(path))
        allowed = ALLOWED.get(mine, set()) | LEAVES | {mine}
        for target in sorted(imports_of(path)):
            theirs = part_of(target)
            if theirs == "__version__":
                theirs = "hangwatch"
            if theirs not in allowed:
                wrong.append(f"{path.relative_to(PACKAGE)} imports {target} ({mine} -> {theirs})")
    assert not wrong, "\n".join(wrong)


def test_every_part_has_a_rule():
    parts = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    parts |= {p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    assert parts <= set(ALLOWED), sorted(parts - set(ALLOWED))


def test_the_demo_story_needs_nothing_but_the_standard_library():
    """``python -m hangwatch.demo.story`` runs anywhere: it imports nothing of ours."""
    assert imports_of(PACKAGE / "demo" / "story.py") == set()


# The engine profiles' own modules: only engines/ imports them; everything else reads the registry.
ENGINE_PACKAGE = PACKAGE / "engines"
ENGINE_MODULES = {
    f"hangwatch.engines.{p.stem}"
    for p in ENGINE_PACKAGE.glob("*.py")
    if p.stem not in {"__init__", "registry", "profile", "bootflags", "launchers"}
}
# Where an engine's name may not be written in code (comments and docstrings may cite engines).
NO_ENGINE_NAMES = ("analyse", "collect", "model", "nodes", "supervise", "doctor", "bench")
# Strings that must name an engine still, each with the reason. Prose that cites what an engine was seen
# to do, in the words a reader sees, is evidence, not a fact the code uses.
ALLOWED_NAMES: dict[tuple[str, str], str] = {
    ("supervise/launcher.py", "python -m vllm"): "an example command line in a usage hint",
    ("analyse/doctor/checks.py", "vLLM and SGLang want"): "prose: what the limit is, and who asks for it",
    ("analyse/doctor/checks.py", "vLLM's queues need it"): "prose: who maps the shared memory",
    ("analyse/doctor/checks.py", "vLLM's pynccl loads"): "prose: why the wheel matters",
    ("analyse/doctor/checks.py", "vllm #18851"): "a citation of the bug report",
    ("analyse/doctor/nccl.py", "vllm#22479"): "a citation of the bug report",
    ("model/rulebook.py", "SGLang/vLLM: /health 200"): "prose: an example of a ready status",
}
ENGINE_NAME = ("vllm", "sglang")


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def test_only_engines_import_an_engine_profile_module():
    wrong = [
        f"{path.relative_to(PACKAGE)} imports {target}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if ENGINE_PACKAGE not in path.parents
        for target in sorted(imports_of(path) & ENGINE_MODULES)
    ]
    # ``from hangwatch.engines import vllm`` names the module as an imported name.
    for path in sorted(PACKAGE.rglob("*.py")):
        if ENGINE_PACKAGE in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module == "hangwatch.engines":
                wrong += [
                    f"{path.relative_to(PACKAGE)} imports hangwatch.engines.{a.name}"
                    for a in node.names
                    if f"hangwatch.engines.{a.name}" in ENGINE_MODULES
                ]
    assert {"hangwatch.engines.vllm", "hangwatch.engines.sglang"} <= ENGINE_MODULES
    assert not wrong, "\n".join(wrong)


def test_no_engine_name_in_the_code_of_the_layers_below_the_registry():
    """An engine's package, flag, variable, path or metric name in analyse/, collect/ ... is a fact that
    belongs in its profile; comments and docstrings may cite engines."""
    wrong, used = [], set()
    for part in NO_ENGINE_NAMES:
        for path in sorted((PACKAGE / part).rglob("*.py")):
            rel = str(path.relative_to(PACKAGE))
            tree = ast.parse(path.read_text(encoding="utf-8"))
            docs = _docstrings(tree)
            for node in ast.walk(tree):
                if not isinstance(node, ast.Constant) or not isinstance(node.value, str) or id(node) in docs:
                    continue
                if not any(name in node.value.lower() for name in ENGINE_NAME):
                    continue
                allowed = [
                    key for key in ALLOWED_NAMES if key[0] == rel and key[1].lower() in node.value.lower()
                ]
                used.update(allowed)
                if not allowed:
                    wrong.append(f"{rel}:{node.lineno}: {node.value[:80]!r}")
    assert not wrong, "\n".join(wrong)
    assert not set(ALLOWED_NAMES) - used, f"allowed but gone: {sorted(set(ALLOWED_NAMES) - used)}"
