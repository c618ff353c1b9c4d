"""Every verdict says which rules decided it, every rule it can name is in the one rulebook, and
docs/verdicts.md carries that book as it is."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

from builders import report
from builders import verdict
from hangwatch import engines
from hangwatch.analyse.assess import Assessor
from hangwatch.analyse.assess import Policy
from hangwatch.analyse.stackrules import RULES
from hangwatch.model.rulebook import RULEBOOK
from hangwatch.model.rulebook import known
from hangwatch.model.rulebook import stack_rule_id
from hangwatch.model.rulebook import statement_of
from hangwatch.model.samples import ExitHow
from hangwatch.model.samples import ExitRecord
from hangwatch.model.samples import ProcessSample
from hangwatch.model.samples import Tick
from hangwatch.model.vocabulary import State
from hangwatch.render.markdown import markdown_report
from hangwatch.render.text import verdict_text

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src" / "hangwatch"
# A rule id as the code writes it: "family:words" in a string literal.
_ID = re.compile(r"""["']((?:ready|exited|crashed|stalled|serving|timeout|stacks|state|log|stall|crash|nodes)"""
                 r""":[a-z][a-z0-9-]*)["']""")  # fmt: skip


def test_ids_are_unique_and_every_statement_is_one_line():
    ids = [r.id for r in RULEBOOK]
    assert len(ids) == len(set(ids))
    assert all(r.statement and "\n" not in r.statement for r in RULEBOOK)


def test_every_stack_rule_has_an_entry():
    for rule in RULES:
        assert known(stack_rule_id(rule.__name__)), rule.__name__
    assert known("stacks:no-rule-matched")


def test_every_id_the_code_writes_is_in_the_book():
    written = set()
    for path in SRC.rglob("*.py"):
        if path.name == "rulebook.py":
            continue
        written |= set(_ID.findall(path.read_text()))
    # The ids built from a value (the log's causes) are checked where they are built.
    missing = sorted(i for i in written if not known(i))
    assert written and not missing, missing
    for cause in ("cuda-oom", "port-in-use", "exception"):
        assert known(f"log:{cause}")


def test_the_page_carries_the_book_as_it_is():
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "rulebook_doc.py"), "--check"],
        capture_output=True,
        check=False,
    )
    assert done.returncode == 0, "docs/verdicts.md and the rulebook disagree: run scripts/rulebook_doc.py"


def proc(pid: int, state: str = "S", cpu: float = 0.0) -> ProcessSample:
    return ProcessSample(pid, 1, f"p{pid}", ("x",), state, 10.0, cpu, 0, 0, 0, 4, 1 << 20, (), None, None)


def _assessor(stall: float) -> Assessor:
    return Assessor(engines.by_name("generic"), Policy(stall_after=stall), root_pids={1})


def test_a_stall_says_the_window_decided_and_what_named_its_cause():
    a = _assessor(10)
    v = None
    for t in range(11):
        v = a.observe(Tick(float(t), (proc(1), proc(2)))) or v
    assert v is not None and v.state is State.STALLED
    assert v.decided_by == ("stalled:window", "log:none")


def test_a_stopped_member_says_so_and_a_death_says_which_order_decided():
    a = _assessor(60)
    v = None
    for t in range(30):
        v = v or a.observe(Tick(float(t), (proc(1), proc(2, state="T" if t else "S"))))
    assert v is not None and v.decided_by == ("stalled:stopped-member", "state:stopped")
    a = _assessor(60)
    a.observe(Tick(0.0, (proc(1), proc(2), proc(3))))
    dead = ExitRecord(1.0, 3, "rank1", "rank", "1", ExitHow.ZOMBIE_STAT, signal=signal.SIGKILL, lifetime_s=5)
    v = a.observe(Tick(1.0, (proc(1), proc(2)), exits=(dead,)))
    for t in range(2, 10):
        v = v or a.observe(Tick(float(t), (proc(1), proc(2))))
    assert v is not None and v.state is State.CRASHED
    assert v.decided_by[-1] == "crash:death-first" and v.decided_by[0].startswith("crashed:")
    assert all(known(i) for i in v.decided_by)


def test_every_output_says_which_rules_decided():
    v = verdict(decided_by=("stalled:window", "stacks:collective-wait", "stall:culprit-raised"))
    text = verdict_text(report(v))
    assert "decided by: stalled:window > stacks:collective-wait > stall:culprit-raised" in text
    assert statement_of("stall:culprit-raised") in text  # the last rule's statement, in words
    assert "`stacks:collective-wait`" in markdown_report(report(v))


def test_an_id_this_version_does_not_know_is_said_so_not_an_error():
    # A report written by another version, read back (isolate --resume).
    assert statement_of("stacks:from-the-future") == "a rule this version of hangwatch does not know"
