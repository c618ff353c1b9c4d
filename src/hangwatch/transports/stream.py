"""A long-lived collector per node: one request line in, one bundle line out, for a whole watch.

``hangwatch collect --stream`` started once per node through the transport's client (``ssh NODE``,
``kubectl exec -i POD``, ``srun --jobid J --overlap -w NODE``) and kept open: the handshake and the remote
interpreter's start are paid once per watch, not once per round. A session that dies (the node's sshd
killed, the pod gone, the step cancelled) or does not answer in time is closed, and its failure said as a
``NodeAnswer`` by the transport's own ``answer_of``, like a one-shot exchange's; the next request opens a
new one, so a node that comes back is seen again.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from hangwatch.model.nodes import NodeAnswer
from hangwatch.transports.runner import Exchange

T = TypeVar("T")
MAX_LINE_BYTES = 64_000_000


class StreamSession:
    """``argv`` (a client running ``collect --stream`` on a node) kept open; ``answer`` says its failures."""

    def __init__(
        self,
        host: str,
        argv: list[str],
        answer: Callable[[Exchange], NodeAnswer],
        open_timeout_s: float = 5.0,
    ) -> None:
        self.host = host
        self.argv = argv
        self.answer = answer
        self.open_timeout_s = open_timeout_s
        self._proc: subprocess.Popen[bytes] | None = None
        self._lines: queue.Queue[bytes | None] = queue.Queue()
        self._stderr: deque[str] = deque(maxlen=20)
        self.started = 0  # sessions opened: 1 for a node that never failed

    def ask(self, request: str, timeout_s: float) -> NodeAnswer:
        sent = time.time()
        if self._proc is None:
            self._open()
            timeout_s += self.open_timeout_s  # the handshake, once per session
        proc = self._proc
        assert proc is not None and proc.stdin is not None
        try:
            proc.stdin.write(request.encode() + b"\n")
            proc.stdin.flush()
        except OSError:
            pass  # the session is gone; its exit status and stderr say why, below
        try:
            line = self._lines.get(timeout=timeout_s)
        except queue.Empty:
            self.close(grace_s=0.0)  # it did not answer in time: do not wait on it any longer
            return self.answer(Exchange(None, b"", self._said(), sent, time.time()))
        if line is None:  # end of output: the session ended
            rc = self._finish()
            if rc == 0:  # a collector that ended cleanly without answering: that is not an answer
                rc = 1
            return self.answer(Exchange(rc, b"", self._said(), sent, time.time()))
        return self.answer(Exchange(0, line, "", sent, time.time()))

    def close(self, grace_s: float = 2.0) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with contextlib.suppress(OSError):
            if proc.stdin is not None:
                proc.stdin.close()  # the collector ends at the end of its input
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def _open(self) -> None:
        self.started += 1
        self._lines = queue.Queue()
        self._stderr.clear()
        proc = subprocess.Popen(
            self.argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        self._proc = proc
        lines = self._lines

        out = proc.stdout
        assert out is not None

        def read_out() -> None:
            for line in iter(lambda: out.readline(MAX_LINE_BYTES + 1), b""):
                lines.put(line)
            lines.put(None)

        def read_err() -> None:
            assert proc.stderr is not None
            for raw in proc.stderr:
                self._stderr.append(raw.decode("utf-8", "replace"))

        threading.Thread(target=read_out, name=f"ssh-out-{self.host}", daemon=True).start()
        threading.Thread(target=read_err, name=f"ssh-err-{self.host}", daemon=True).start()

    def _finish(self) -> int | None:
        proc, self._proc = self._proc, None
        if proc is None:
            return None
        try:
            return proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return None

    def _said(self) -> str:
        time.sleep(0.05)  # the stderr reader's last lines
        return "".join(self._stderr)


class StreamSessions:
    """A session per node, asked in parallel (at most ``concurrency`` at once), one answer per node."""

    def __init__(self, sessions: Sequence[StreamSession], concurrency: int) -> None:
        self.sessions = list(sessions)
        self._pool = ThreadPoolExecutor(max_workers=max(1, min(concurrency, len(self.sessions) or 1)))

    def ask(self, request: str, timeout_s: float, finish: Callable[[NodeAnswer], T]) -> list[T]:
        return list(self._pool.map(lambda s: finish(s.ask(request, timeout_s)), self.sessions))

    def close(self) -> None:
        for s in self.sessions:
            s.close()
        self._pool.shutdown(wait=True)
