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


def test_each_table_of_the_code_tries_its_rules_in_the_order_of_its_section():
    """The book's order is the order of evaluation: a rule moved in a table (or added without its row in
    the book) fails here, and the page then shows the new order once regenerated."""
    from hangwatch.analyse.assess import DECISIONS
    from hangwatch.analyse.causes import CRASH_RULES
    from hangwatch.analyse.causes import STALL_RULES
    from hangwatch.model.rulebook import TABLES
    from hangwatch.model.rulebook import section

    assert tuple(d.id for d in DECISIONS) == section("tick")
    assert (*(stack_rule_id(r.__name__) for r in RULES), "stacks:no-rule-matched") == section("stacks")
    assert tuple(i for i, _ in STALL_RULES) == section("state")
    assert tuple(i for i, _ in CRASH_RULES) == section("crash")
    # Every rule belongs to one section, and every section has rules.
    assert {r.table for r in RULEBOOK} == {t for t, _ in TABLES}


def test_the_first_rule_of_the_tick_table_that_holds_decides():
    """A ready answer in the tick that also ends the window: readiness comes before the window in the
    table, so it decides (a healthy boot is not called stalled by the tick it turned ready)."""
    from hangwatch.model.samples import ProbeOutcome
    from hangwatch.model.samples import ProbeResult

    a = _assessor(5)
    for t in range(5):
        assert a.observe(Tick(float(t), (proc(1), proc(2)))) is None
    ok = ProbeResult(5.0, "http://127.0.0.1:1/health", ProbeOutcome.HTTP, 200)
    v = a.observe(Tick(5.0, (proc(1), proc(2)), probes=(ok,)))
    assert v is not None and v.state is State.READY and v.decided_by == ("ready:probe",)
    # Without the answer the same tick is the window's.
    b = _assessor(5)
    for t in range(5):
        b.observe(Tick(float(t), (proc(1), proc(2))))
    w = b.observe(Tick(5.0, (proc(1), proc(2))))
    assert w is not None and w.decided_by[0] == "stalled:window"


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
    return Assessor(engines.by_name("generic"), Policy(stall_after_s=stall), root_pids={1})


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


# -- "unknown": the rules that came closest and what each lacked ---------------------------------------


def test_one_capture_of_a_spin_says_the_rule_it_almost_met_lacked_captures_over_time():
    """A rank spinning while the others wait is the odd one out over two captures; one capture of it is
    `unknown`, and the verdict says which rule came closest and that it lacked captures over time (the
    shape this rule was written for is a GPU flag spin: spin_wait is a CPU one)."""
    from fixtures.stacks import loader
    from hangwatch.analyse.stackrules import diagnose

    one = diagnose(loader.samples("spin_wait", "python", 1), loader.ticks("spin_wait", cpu_delta=0.5))
    assert one.cause.value == "unknown" and one.rules == ("stacks:no-rule-matched",)
    assert one.near and one.near[0].rule == "stacks:odd-one-out", one.near
    assert "captures over time" in one.near[0].lacked
    assert all(known(m.rule) for m in one.near)
    # Over time the same rule decides: a named cause lists no near misses.
    over = diagnose(loader.samples("spin_wait", "python"), loader.ticks("spin_wait", cpu_delta=0.5))
    assert over.rules == ("stacks:odd-one-out",) and over.near == ()


def test_a_rule_that_lacked_a_still_process_names_the_one_that_moves():
    """A compile whose workers move is no stuck-worker: the miss says who moved, so the reader sees why."""
    from fixtures.stacks import loader
    from hangwatch.analyse.stackrules import diagnose

    d = diagnose(loader.samples("silent_compile", "python"), loader.ticks("silent_compile", cpu_delta=0.5))
    assert d.cause.value == "unknown"
    assert any("moves" in m.lacked for m in d.near), d.near


def test_a_shape_no_rule_was_written_for_gives_no_near_miss():
    """A loader at work and a progress-then-hang tree resemble no rule's shape: no near miss is made up."""
    from fixtures.stacks import loader
    from hangwatch.analyse.stackrules import diagnose

    for name in ("slow_loader", "progress_then_hang"):
        d = diagnose(loader.samples(name, "python"), loader.ticks(name, cpu_delta=0.5))
        assert d.cause.value == "unknown" and d.near == (), (name, d.near)


def test_the_closest_are_the_ones_that_met_the_most_in_book_order_among_equals():
    from hangwatch.model.rulebook import NEAR_MISSES_SHOWN
    from hangwatch.model.rulebook import NearMiss
    from hangwatch.model.rulebook import closest

    misses = [NearMiss(f"stacks:r{i}", met, "x") for i, met in enumerate((1, 3, 2, 3, 1))]
    assert [m.rule for m in closest(misses)] == ["stacks:r1", "stacks:r3", "stacks:r2"][:NEAR_MISSES_SHOWN]
    assert closest([]) == ()


def test_every_output_lists_the_closest_rules_of_an_unknown_verdict(tmp_path):
    import json

    from hangwatch.model.rulebook import NearMiss
    from hangwatch.render.html import html_report
    from hangwatch.render.json_report import write_report

    near = (
        NearMiss("stacks:odd-one-out", 1, "captures over time <b>x</b>"),
        NearMiss("stacks:stuck-worker", 1, "every process in place (python[7] moves)"),
    )
    v = verdict(decided_by=("stalled:window", "stacks:no-rule-matched"), near_misses=near)
    text = verdict_text(report(v))
    assert "closest rules (what each lacked):" in text
    assert "- stacks:stuck-worker: every process in place (python[7] moves)" in text
    md = markdown_report(report(v))
    assert "closest rules: `stacks:odd-one-out` lacked" in md and "`stacks:stuck-worker` lacked" in md
    page = html_report(report(v))
    assert 'id="near-misses"' in page and "<code>stacks:stuck-worker</code> lacked every process" in page
    assert "<b>x</b>" not in page  # markup in a lacked text is text
    write_report(report(v), tmp_path / "r.json")
    data = json.loads((tmp_path / "r.json").read_text())
    assert [m["rule"] for m in data["verdict"]["near_misses"]] == [
        "stacks:odd-one-out",
        "stacks:stuck-worker",
    ]
    # A decided verdict has none, and says nothing of them.
    assert "closest rules" not in verdict_text(report(verdict(decided_by=("stalled:window",))))


def test_a_snapshot_and_a_resumed_isolate_keep_the_closest_rules():
    from hangwatch.analyse import causes
    from hangwatch.isolate.state import _run_dict
    from hangwatch.isolate.state import _run_from
    from hangwatch.model.isolate import RunResult
    from hangwatch.model.rulebook import NearMiss
    from hangwatch.model.vocabulary import Cause
    from hangwatch.stacks import snapshot_text

    near = (NearMiss("stacks:odd-one-out", 1, "captures over time"),)
    d = causes.Diagnosis(
        Cause.UNKNOWN, "low", "no rule matched", rules=("stacks:no-rule-matched",), near=near
    )
    lines = snapshot_text(7, [], d)
    assert (
        "  closest rules (what each lacked):" in lines
        and "    - stacks:odd-one-out: captures over time" in lines
    )
    v = verdict(near_misses=near)
    run = RunResult(verdict=v, duration_s=1.0, run_dir="/tmp/x", culprits=(), overhead_s=0.0)
    assert _run_from(_run_dict(run)).verdict.near_misses == near
