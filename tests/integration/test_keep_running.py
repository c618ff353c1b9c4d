"""``run --keep-running`` (issue 24 item 4): a stall is reported and the tree left running; a recovery is
said; a second stall is reported again; Ctrl-C then stops the tree and the verdict is the stall in force,
with what was done to the tree. And without it, the verdict is said once, after the tree's teardown.
"""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import threading
import time

import pytest

from hwrun import assert_all_gone
from hwrun import hangwatch_argv
from proc_helpers import kill_tree
from proc_helpers import proc_ended
from proc_helpers import proc_state

pytestmark = pytest.mark.timeout(150)

# Quiet (a timed sleep: a wait something ends) long enough to stall at --stall-after 3, then a line of
# progress, then a wait nothing can end.
PROGRAM = """
import sys, threading, time
open(sys.argv[1], "w").write(str(__import__("os").getpid()))
print("loading", flush=True)
time.sleep(9)
print("back", flush=True)
threading.Event().wait()
"""


class Lines:
    """hangwatch's stdout, read as it comes."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.seen: list[str] = []
        self._q: queue.Queue[str | None] = queue.Queue()
        assert proc.stdout is not None
        stream = proc.stdout
        threading.Thread(
            target=lambda: [self._q.put(x) for x in stream] + [self._q.put(None)], daemon=True
        ).start()

    def until(self, word: str, timeout: float = 60) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                line = self._q.get(timeout=max(0.1, end - time.monotonic()))
            except queue.Empty:
                break
            if line is None:
                break
            self.seen.append(line)
            if word in line:
                return
        raise AssertionError(f"{word!r} never came:\n{''.join(self.seen)[-4000:]}")

    def rest(self) -> str:
        while (line := self._q.get(timeout=30)) is not None:
            self.seen.append(line)
        return "".join(self.seen)


def test_a_stall_leaves_the_tree_running_and_ctrl_c_ends_on_the_stall(tmp_path):
    script, pidfile, report = tmp_path / "job.py", tmp_path / "pid", tmp_path / "r.json"
    script.write_text(PROGRAM)
    argv = hangwatch_argv(
        "run", "--no-doctor", "--keep-running", "--stall-after", "3", "--run-dir", str(tmp_path / "run"),
        "--report-json", str(report), "--", sys.executable, str(script), str(pidfile),
    )  # fmt: skip
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        lines = Lines(proc)
        lines.until("hangwatch verdict: STALLED")
        lines.until("tree: left running (--keep-running)")
        pid = int(pidfile.read_text())
        assert not proc_ended(pid) and proc_state(pid) != "T"  # running, and not left stopped
        first = json.loads(report.read_text())  # the report is written at the stall, not only at the end
        assert first["verdict"]["state"] == "stalled" and first["tree_action"].startswith("left running")
        lines.until("progress again")
        lines.until("hangwatch verdict: STALLED")  # the wait nothing ends: a new stall, said again
        assert not proc_ended(pid)
        proc.send_signal(signal.SIGINT)
        out = lines.rest()
        proc.wait(timeout=60)
    finally:
        kill_tree(proc)
    assert proc.returncode == 3, out[-3000:]  # the stall in force, not "interrupted" (130)
    # The stall in force was said in full when it came: the end says it in short, once (issue 24 item 10).
    end = out[out.rindex("hangwatch verdict: STALLED") :]
    assert "as said at" in end and "stalled:" not in end and "left running after the stall" in end, end
    data = json.loads(report.read_text())
    # The tree was there to look at: no advice to run again with --keep-running (issue 24 item 9).
    assert not any("--keep-running" in s for s in data["verdict"]["next_steps"]), data["verdict"][
        "next_steps"
    ]
    assert data["verdict"]["state"] == "stalled"
    assert data["tree_action"].startswith("left running after the stall"), data["tree_action"]
    history = [n for n in data["notes"] if n.startswith("--keep-running:")]
    assert len(history) == 3 and "progressed again" in history[1], history
    assert proc_ended(pid)
    assert_all_gone(data)


def test_without_it_the_verdict_is_said_once_after_the_teardown(tmp_path):
    """The live line said the whole verdict, then the block said it again, with the tree's dying words
    between them: now one short line that it came, the tree's output, then the block, once."""
    script = tmp_path / "job.py"
    script.write_text(
        "import signal, sys, threading\n"
        "signal.signal(signal.SIGTERM, lambda *a: (print('dying words', flush=True), sys.exit(1)))\n"
        "print('up', flush=True)\nthreading.Event().wait()\n"
    )
    argv = hangwatch_argv("run", "--no-doctor", "--stall-after", "3", "--run-dir", str(tmp_path / "run"),
                          "--", sys.executable, str(script))  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=90)
    out = done.stdout
    assert done.returncode == 3, (out, done.stderr)
    assert out.count("hangwatch verdict:") == 1, out
    assert "[hangwatch] verdict" not in out  # no second copy in a live line
    came = next(line for line in out.splitlines() if "stopping the tree; the verdict follows" in line)
    assert came.startswith("[hangwatch] stalled")
    assert out.index(came) < out.index("dying words") < out.index("hangwatch verdict:"), out
    assert "tree: stopped by hangwatch at the verdict" in out
