"""Replay "the story" in small: an SGLang launch that loads its weights and then deadlocks silently.

The real incident: SGLang serving DeepSeek-V3 with tensor parallelism and an EAGLE3 draft model. Every
scheduler rank logged its distributed init, loaded the target weights, loaded the draft weights and
printed ``Capture cuda graph begin. This can take up to several minutes.``, and then nothing happened,
ever: no error, no exit, 0 % CPU, the HTTP port never bound (SGLang binds it only after every
scheduler reports ready), and the launcher kept polling its pipes every five seconds without an
overall timeout. One rank had taken a different code path and was waiting in a different collective
than its peers, so each side waited for the other forever.

This module replays that, with the same process model and the same log lines, using only the
standard library (no GPU, no torch, no network)::

    python -m hangwatch.demo.story [--ranks 4] [--weights-seconds 4]

* The launcher (the main process; titled like ``python3 -m sglang.launch_server ...`` when
  setproctitle is installed) logs ``[YYYY-mm-dd HH:MM:SS] server_args=ServerArgs(...)`` on stderr with
  the real current time, starts ``--ranks`` scheduler processes with the ``spawn`` start method and
  waits for them like SGLang's ``_wait_for_scheduler_ready``: ``poll(timeout=5.0)`` on one pipe per
  rank plus an ``is_alive()`` check of every rank, with no overall timeout.
* Each scheduler is titled ``sglang::scheduler_TP{r}`` (setproctitle: /proc/PID/cmdline and comm;
  otherwise prctl(PR_SET_NAME), so only /proc/PID/comm, cut by the kernel to ``sglang::schedul``),
  dies with its parent (PR_SET_PDEATHSIG, as SGLang's schedulers do) and logs SGLang 0.5.10-format
  lines with its ``TP{r}`` tag: ``Init torch distributed begin.`` / ``ends.`` (a real rendezvous of all
  ranks), ``Load weight begin.``, then really reads a weight shard it wrote to an unlinked temporary
  file for ``--weights-seconds`` (rchar rises, CPU stays low, no log lines), ``Load weight end. ...
  type=DeepseekV3ForCausalLM ...``, the same for the draft (``type=LlamaForCausalLMEagle3``), and
  ``Capture cuda graph begin. This can take up to several minutes. avail mem=...``.
* Then the deadlock, a real one: ranks 0 .. N-2 wait in ``CudaGraphRunner.capture`` ->
  ``capture_one_batch_size`` -> ``tensor_model_parallel_all_reduce`` on one ``multiprocessing.Barrier``
  of N parties, while rank N-1 took the speculative-decoding branch and waits in
  ``CudaGraphRunner.capture`` -> ``broadcast_draft_buffers`` on another barrier of N parties. Every
  scheduler sleeps in a futex wait (state S, 0 % CPU) forever, and the launcher keeps polling.

Ctrl-C or SIGTERM stops the launcher, which takes its schedulers down with it.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ctypes.util
import dataclasses
import importlib
import logging
import multiprocessing as mp
import signal
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from multiprocessing.context import SpawnProcess
from multiprocessing.synchronize import Barrier
from pathlib import Path
from types import FrameType
from typing import BinaryIO

logger = logging.getLogger("hangwatch.demo.story")

_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15
_MIB = 1024 * 1024
#: Seconds between two reads of 1 MiB while "loading weights": 16 MiB/s per rank, ~0 % CPU.
_READ_INTERVAL = 1 / 16
#: Memory figures of one 141 GB GPU, so that the printed numbers add up the way SGLang's do.
_GPU_AVAIL_GB = 139.28
_TARGET_WEIGHTS_GB = 84.31
_DRAFT_WEIGHTS_GB = 0.95
_AVAIL_AT_CAPTURE_GB = 12.85
_BATCH_SIZES = (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64)

TARGET_MODEL = "deepseek-ai/DeepSeek-V3"
DRAFT_MODEL = "lmsys/SGLang-EAGLE3-DeepSeek-V3-0324"


@dataclasses.dataclass(frozen=True)
class ServerArgs:
    """The handful of SGLang server arguments the story needs; printed the way SGLang 0.5.10 does."""

    model_path: str
    tokenizer_path: str
    host: str
    port: int
    trust_remote_code: bool
    mem_fraction_static: float
    tp_size: int
    dp_size: int
    speculative_algorithm: str
    speculative_draft_model_path: str
    speculative_num_steps: int
    speculative_eagle_topk: int
    speculative_num_draft_tokens: int
    cuda_graph_max_bs: int
    disable_cuda_graph: bool
    log_level: str


@dataclasses.dataclass(frozen=True)
class SchedulerSettings:
    """What one scheduler process is told by the launcher (picklable for ``spawn``)."""

    tp_rank: int
    tp_size: int
    shard_mb: int
    weights_seconds: float
    draft_seconds: float


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def set_process_title(title: str) -> bool:
    """Set the process title with setproctitle when it is installed; return whether it was.

    setproctitle rewrites /proc/PID/cmdline and sets /proc/PID/comm (cut to 15 bytes) too.
    """
    try:
        module = importlib.import_module("setproctitle")
    except ImportError:
        return False
    module.setproctitle(title)
    return True


def set_comm(name: str) -> None:
    """Set /proc/PID/comm with prctl(PR_SET_NAME); the kernel keeps the first 15 bytes."""
    _libc().prctl(_PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)


def kill_itself_when_parent_died() -> None:
    """Get SIGKILLed when the launcher dies, like SGLang's scheduler processes (PR_SET_PDEATHSIG)."""
    _libc().prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def configure_logger(prefix: str = "") -> None:
    """SGLang's format: ``[%(asctime)s{prefix}] %(message)s`` on stderr, second resolution."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"[%(asctime)s{prefix}] %(message)s", datefmt="%Y-%m-%d %H:%M:%S"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)


# --------------------------------------------------------------------------------------------------
# Scheduler side
# --------------------------------------------------------------------------------------------------


def write_weight_shard(size_mb: int) -> BinaryIO:
    """Write a ``size_mb`` MiB "weight shard" to an unlinked temporary file and return it, open.

    The file has no name, so it disappears with the process however the process ends.
    """
    shard: BinaryIO = tempfile.TemporaryFile(prefix="hangwatch-demo-shard-")  # noqa: SIM115  (returned)
    block = bytes(range(256)) * (_MIB // 256)
    for _ in range(size_mb):
        shard.write(block)
    shard.flush()
    return shard


def read_weights(shard: BinaryIO, seconds: float) -> int:
    """Read ``shard`` 1 MiB at a time at a steady pace for ``seconds``, wrapping around; return bytes."""
    total = 0
    start = time.monotonic()
    deadline = start + seconds
    reads = 0
    shard.seek(0)
    while time.monotonic() < deadline:
        chunk = shard.read(_MIB)
        if not chunk:
            shard.seek(0)
            continue
        total += len(chunk)
        reads += 1
        # An absolute schedule keeps the byte rate steady whatever a single read costs.
        time.sleep(max(0.0, min(start + reads * _READ_INTERVAL, deadline) - time.monotonic()))
    return total


class CudaGraphRunner:
    """Named after SGLang's runner so that the hung ranks' stacks read ``CudaGraphRunner.capture``."""

    def __init__(self, settings: SchedulerSettings, decode_barrier: Barrier, draft_barrier: Barrier) -> None:
        self.settings = settings
        self.decode_barrier = decode_barrier
        self.draft_barrier = draft_barrier
        # The rank-dependent branch behind the deadlock: only the last TP rank believes it must
        # broadcast the draft buffers before capturing, so it enters a collective nobody else does.
        self.sync_draft_buffers = settings.tp_rank == settings.tp_size - 1

    def capture(self) -> None:
        """Capture the decode graphs, largest batch size first; never returns in this story."""
        if self.sync_draft_buffers:
            self.broadcast_draft_buffers()
        for bs in reversed(_BATCH_SIZES):
            self.capture_one_batch_size(bs)

    def broadcast_draft_buffers(self) -> None:
        """The culprit's collective: waits for all ranks, which are waiting in another one."""
        self.draft_barrier.wait()

    def capture_one_batch_size(self, bs: int) -> None:
        """Warm-up forward of batch size ``bs``, whose TP all-reduce needs every rank."""
        del bs  # the batch size only matters for the (absent) kernels
        self.tensor_model_parallel_all_reduce()

    def tensor_model_parallel_all_reduce(self) -> None:
        """The peers' collective: waits for all ranks, one of which is in broadcast_draft_buffers."""
        self.decode_barrier.wait()


def run_scheduler_process(
    settings: SchedulerSettings,
    pipe_writer: Connection,
    init_barrier: Barrier,
    decode_barrier: Barrier,
    draft_barrier: Barrier,
) -> None:
    """One scheduler rank: init, load target and draft weights, start graph capture, deadlock."""
    kill_itself_when_parent_died()
    # Ctrl-C reaches the whole foreground process group; the launcher alone handles it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    tp_tag = f" TP{settings.tp_rank}" if settings.tp_size > 1 else ""
    title = f"sglang::scheduler{tp_tag.replace(' ', '_')}"
    if not set_process_title(title):
        set_comm(title)
    configure_logger(tp_tag)
    jitter = settings.tp_rank * 0.01  # ranks never report identical memory figures

    logger.info("Init torch distributed begin.")
    started = time.monotonic()
    shard = write_weight_shard(settings.shard_mb)
    init_barrier.wait()  # the real rendezvous: every rank must arrive
    logger.info(
        "Init torch distributed ends. elapsed=%.2f s, mem usage=%.2f GB", time.monotonic() - started, 0.0
    )

    avail = _GPU_AVAIL_GB - jitter
    load_weights(shard, settings.weights_seconds, "DeepseekV3ForCausalLM", avail, _TARGET_WEIGHTS_GB)
    avail -= _TARGET_WEIGHTS_GB
    load_weights(shard, settings.draft_seconds, "LlamaForCausalLMEagle3", avail, _DRAFT_WEIGHTS_GB)
    shard.close()

    logger.info(
        "Capture cuda graph begin. This can take up to several minutes. avail mem=%.2f GB",
        _AVAIL_AT_CAPTURE_GB - jitter,
    )
    CudaGraphRunner(settings, decode_barrier, draft_barrier).capture()
    # Never reached in this story; a real scheduler would go on to report readiness.
    pipe_writer.send({"status": "ready", "tp_rank": settings.tp_rank})


# --------------------------------------------------------------------------------------------------
# Launcher side
# --------------------------------------------------------------------------------------------------


def load_weights(shard: BinaryIO, seconds: float, model_type: str, avail_gb: float, size_gb: float) -> None:
    """One model's weights, between SGLang's "Load weight begin" and "Load weight end" lines."""
    logger.info("Load weight begin. avail mem=%.2f GB", avail_gb)
    started = time.monotonic()
    read_weights(shard, seconds)
    logger.info(
        "Load weight end. elapsed=%.2f s, type=%s, avail mem=%.2f GB, mem usage=%.2f GB.",
        time.monotonic() - started,
        model_type,
        avail_gb - size_gb,
        size_gb,
    )


def _wait_for_scheduler_ready(readers: list[Connection], procs: list[SpawnProcess]) -> list[object]:
    """SGLang's startup wait: ``poll(timeout=5.0)`` each pipe, check every rank, no overall timeout."""
    infos: list[object] = []
    for i, reader in enumerate(readers):
        while True:
            if reader.poll(timeout=5.0):
                try:
                    data = reader.recv()
                except EOFError:  # the rank died: the only write end of its pipe closed
                    procs[i].join(timeout=5.0)
                    raise RuntimeError(_died_message(i, procs[i])) from None
                if not isinstance(data, dict) or data.get("status") != "ready":
                    raise RuntimeError("Initialization failed. Please see the error messages above.")
                infos.append(data)
                break
            for rank, proc in enumerate(procs):
                if not proc.is_alive():
                    raise RuntimeError(_died_message(rank, proc))
    return infos


def _died_message(rank: int, proc: SpawnProcess) -> str:
    return (
        f"Rank {rank} scheduler died during initialization (exit code: {proc.exitcode}). "
        "If exit code is -9 (SIGKILL), a common cause is the OS OOM killer. "
        "Run `dmesg -T | grep -i oom` to check."
    )


def _raise_system_exit(signum: int, frame: FrameType | None) -> None:
    del frame
    raise SystemExit(128 + signum)


def build_parser() -> argparse.ArgumentParser:
    """The demo's command line."""
    parser = argparse.ArgumentParser(
        prog="python -m hangwatch.demo.story",
        description="Replay an SGLang launch that loads its weights, then deadlocks in CUDA graph capture.",
    )
    parser.add_argument("--ranks", type=int, default=4, help="tensor-parallel scheduler processes (>= 2)")
    parser.add_argument(
        "--weights-seconds", type=float, default=4.0, help="how long each rank reads its target weight shard"
    )
    parser.add_argument(
        "--draft-seconds", type=float, default=1.0, help="how long each rank reads the draft weights"
    )
    parser.add_argument("--shard-mb", type=int, default=16, help="size of each rank's weight shard file")
    parser.add_argument("--port", type=int, default=30000, help="the port the server would listen on")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Launch the schedulers and wait for them the way SGLang does (forever, in this story)."""
    args = build_parser().parse_args(argv)
    if args.ranks < 2:
        build_parser().error("--ranks must be at least 2: the deadlock is between ranks")
    server_args = ServerArgs(
        model_path=TARGET_MODEL,
        tokenizer_path=TARGET_MODEL,
        host="127.0.0.1",
        port=args.port,
        trust_remote_code=True,
        mem_fraction_static=0.82,
        tp_size=args.ranks,
        dp_size=1,
        speculative_algorithm="EAGLE3",
        speculative_draft_model_path=DRAFT_MODEL,
        speculative_num_steps=3,
        speculative_eagle_topk=1,
        speculative_num_draft_tokens=4,
        cuda_graph_max_bs=max(_BATCH_SIZES),
        disable_cuda_graph=False,
        log_level="info",
    )
    # SGLang leaves its main process's title alone, so it shows the interpreter's comm and the
    # launch_server command line. setproctitle would also set comm to the title's first 15 bytes,
    # which no real launcher shows; put the original comm back.
    comm = Path("/proc/self/comm").read_text().rstrip("\n")
    if set_process_title(
        f"python3 -m sglang.launch_server --model-path {TARGET_MODEL} --tp {args.ranks} --trust-remote-code "
        f"--speculative-algorithm EAGLE3 --speculative-draft-model-path {DRAFT_MODEL} --port {args.port}"
    ):
        set_comm(comm)
    configure_logger()
    logger.info("server_args=%r", server_args)

    ctx = mp.get_context("spawn")  # SGLang's start method
    init_barrier = ctx.Barrier(args.ranks)
    decode_barrier = ctx.Barrier(args.ranks)
    draft_barrier = ctx.Barrier(args.ranks)
    readers: list[Connection] = []
    procs: list[SpawnProcess] = []
    signal.signal(signal.SIGTERM, _raise_system_exit)
    try:
        for tp_rank in range(args.ranks):
            reader, writer = ctx.Pipe(duplex=False)
            settings = SchedulerSettings(
                tp_rank, args.ranks, args.shard_mb, args.weights_seconds, args.draft_seconds
            )
            proc = ctx.Process(
                target=run_scheduler_process,
                args=(settings, writer, init_barrier, decode_barrier, draft_barrier),
                daemon=True,  # multiprocessing also terminates daemonic children at interpreter exit
            )
            proc.start()
            writer.close()  # the child now holds the only write end, so its death reads as EOF here
            readers.append(reader)
            procs.append(proc)
        _wait_for_scheduler_ready(readers, procs)
        # Never reached in this story. A real launcher would now bind the HTTP port and serve.
        logger.info("The server is fired up and ready to roll!")
        for proc in procs:
            proc.join()
    except RuntimeError as exc:
        logger.error("%s", exc)
        return 1
    except KeyboardInterrupt:
        return 130
    finally:
        # Take the schedulers down with the launcher, whatever ended it (SIGTERM arrives as SystemExit).
        for proc in procs:
            with contextlib.suppress(OSError):
                proc.terminate()
        for proc in procs:
            proc.join(timeout=5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
