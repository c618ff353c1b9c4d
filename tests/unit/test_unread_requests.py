"""Bytes a server has not read, from the kernel (sock_diag's receive queue), on real sockets; and what
the stack rules make of a server that reads none."""

from __future__ import annotations

import socket
import time
from dataclasses import replace

from hangwatch.analyse.stackcontext import stack_context
from hangwatch.analyse.stackrules import Miss
from hangwatch.analyse.stackrules import rule_requests_unread
from hangwatch.analyse.stackwaits import Wait
from hangwatch.analyse.stackwaits import classify_thread
from hangwatch.collect.connections import ConnectionWatcher
from hangwatch.model.samples import ConnectionSample
from hangwatch.model.stacks import DumpOutcome
from hangwatch.model.stacks import Frame
from hangwatch.model.stacks import ProcessStacks
from hangwatch.model.stacks import StackSample
from hangwatch.model.stacks import ThreadStack


def _read(watcher: ConnectionWatcher, port: int) -> ConnectionSample:
    sample = watcher.read([port])
    assert sample is not None and sample.error is None, sample
    return sample


def test_bytes_left_in_the_queue_are_unread_and_bytes_read_are_not() -> None:
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    try:
        client.sendall(b"GET /health HTTP/1.1\r\n\r\n")
        time.sleep(0.3)
        watcher = ConnectionWatcher()
        # Not accepted yet: the connection waits in the listening socket's queue, its bytes unread.
        waiting = _read(watcher, port)
        assert [c.unread_s is not None for c in waiting.connections] == [True], waiting
        accepted, _ = server.accept()
        with accepted:
            assert accepted.recv(64)
            read = _read(watcher, port)
            assert [c.unread_s for c in read.connections] == [None], read  # read: nothing waits unread
            client.sendall(b"GET /next HTTP/1.1\r\n\r\n")
            time.sleep(1.1)
            left = _read(watcher, port)
            (conn,) = left.connections
            assert conn.unread_s is not None and conn.unread_s >= 1.0, conn  # unread since it came
    finally:
        client.close()
        server.close()


# -- what the stack rules make of a server that reads none -------------------------------------------
# The shapes of a real capture (test_serving_wedge[spin], 2026-12-04): the stub's completion handler spins
# below its asyncio loop, caught twice with native frames and once without.

_LOOP = (
    Frame("<module>", "stub_openai.py", 401),
    Frame("main", "stub_openai.py", 397),
    Frame("run", "asyncio/runners.py", 190),
    Frame("Runner.run", "asyncio/runners.py", 118),
    Frame("BaseEventLoop.run_until_complete", "asyncio/base_events.py", 640),
    Frame("BaseEventLoop.run_forever", "asyncio/base_events.py", 607),
)
_HANDLER = (
    Frame("Stub.handle", "stub_openai.py", 134),
    Frame("Stub.route", "stub_openai.py", 157),
    Frame("Stub.completion", "stub_openai.py", 186),
)


def _handler_spinning(native: bool, line: int) -> ThreadStack:
    task = (
        Frame("task_step", "_asynciomodule.c", 0, True),
        Frame("task_step_impl", "_asynciomodule.c", 0, True),
    )
    frames = (
        *((Frame("??", "libc.so.6", 0, True),) if native else ()),
        *_LOOP,
        Frame("BaseEventLoop._run_once", "asyncio/base_events.py", 1922),
        Frame("Handle._run", "asyncio/events.py", 80),
        *(task if native else ()),
        *_HANDLER,
        Frame("_block_the_loop", "stub_openai.py", line),
    )
    return ThreadStack(7, "MainThread", True, True, frames)


def _loop_polling(native: bool) -> ThreadStack:
    below = (
        Frame("select_epoll_poll", "selectmodule.c.h", 0, True),
        Frame("epoll_wait", "libc.so.6", 0, True),
    )
    frames = (
        *_LOOP,
        Frame("BaseEventLoop._run_once", "asyncio/base_events.py", 1886),
        Frame("EpollSelector.select", "selectors.py", 468),
        *(below if native else ()),
    )
    return ThreadStack(7, "MainThread", False, False, frames)


def test_a_handler_the_loop_called_is_not_the_loop_waiting_however_deep_the_capture_reaches() -> None:
    for native in (True, False):
        assert classify_thread(_handler_spinning(native, 329))[0] is Wait.RUNNING, native
        assert classify_thread(_loop_polling(native))[0] is Wait.IDLE_LOOP, native


def test_a_server_spinning_in_a_handler_is_named_by_its_unread_requests_whatever_capture_came_last() -> None:
    def sample(t: float, native: bool, line: int, cpu: float) -> StackSample:
        stacks = ProcessStacks(
            7,
            "python",
            "APIServer",
            None,
            DumpOutcome.OK,
            (_handler_spinning(native, line),),
            "R",
            cpu,
            native,
        )
        return StackSample(t, (stacks,), 0.05)

    samples = [sample(4.0, True, 330, 3.1), sample(6.0, True, 330, 5.1), sample(8.0, False, 329, 7.1)]
    ctx = replace(stack_context(samples), unread=((7, 8000, 6.0),))
    d = rule_requests_unread(ctx)
    assert d is not None and d.culprits == (7,), d
    assert "spinning in" in d.explanation and "unread in the kernel" in d.explanation, d.explanation
    # The same server with its loop in its poll reads what comes: not this rule's.
    polling = [
        StackSample(
            t,
            (
                ProcessStacks(
                    7, "python", "APIServer", None, DumpOutcome.OK, (_loop_polling(n),), "S", 1.0, n
                ),
            ),
            0.05,
        )
        for t, n in ((4.0, True), (6.0, True), (8.0, False))
    ]
    # The shape is there (a port with requests unread), so the rule says what it lacked: for an
    # `unknown` verdict's "closest rules".
    near = rule_requests_unread(replace(stack_context(polling), unread=((7, 8000, 6.0),)))
    assert isinstance(near, Miss), near
    assert "out of its event loop" in near.lacked, near


def test_a_handler_thread_spinning_beside_a_starved_main_thread_is_where_the_server_stopped_reading() -> None:
    """A thread-per-request server (tests/programs/threaded_server.py --wedge spin, 2026-12-04): the handler
    thread spins and holds the GIL, the main thread starves in ``Thread.start`` of the next handler and
    stops accepting. Requests sit unread; the spinner is named first, the main thread beside it."""
    starved = (
        Frame("serve_forever", "socketserver.py", 240),
        Frame("ThreadingMixIn.process_request", "socketserver.py", 705),
        Frame("Thread.start", "threading.py", 969),
        Frame("Event.wait", "threading.py", 629),
    )
    main = ThreadStack(7, "MainThread", False, False, starved)
    spin = (Frame("Handler.do_POST", "threaded_server.py", 84), Frame("_wedge", "threaded_server.py", 56))
    handler = ThreadStack(9, "Thread-4 (process_request_thread)", True, True, spin)
    samples = [
        StackSample(
            t, (ProcessStacks(7, "python", None, None, DumpOutcome.OK, (main, handler), "R", cpu),), 0.05
        )
        for t, cpu in ((4.0, 3.0), (6.0, 5.0), (8.0, 7.0))
    ]
    d = rule_requests_unread(replace(stack_context(samples), unread=((7, 8000, 6.0),)))
    assert d is not None and d.culprits == (7,), d
    assert "Thread-4 (process_request_thread) is spinning in _wedge" in d.explanation, d.explanation
    assert "its main thread in Event.wait" in d.explanation, d.explanation
