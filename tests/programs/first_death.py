"""Which failure came first? A launcher and its ranks in the two orders a real engine fails in.

``--mode kill-then-raise`` (vLLM's worker SIGKILLed during start-up): rank ``--victim`` sets its title
(``first_death:rR``) and is SIGKILLed at once, before any sampler could see the new title; the
launcher notices the death, prints a traceback ending in ``RuntimeError: Engine core initialization
failed. See root cause above.`` and exits 1. The root cause is the death; the exception is its
consequence.

``--mode raise-then-teardown`` (SGLang's scheduler raising): rank ``--victim`` prints a traceback
(prefixed ``[TP<victim>]`` as SGLang's rank lines are) and exits 1; the launcher, like SGLang's on its
child's SIGQUIT, SIGKILLs every rank and then itself. The root cause is the exception; the deaths by
signal are the tear-down.

``--mode raise-untagged-then-teardown`` (SGLang's TP=1 scheduler raising): rank ``--victim`` prints a
traceback with no rank tag ("Scheduler hit an exception"), tells the launcher (SGLang's scheduler sends
its parent SIGQUIT) and waits; the launcher kills a helper of its own first (SGLang's tear-down kills the
resource tracker first), then every rank, the raiser last, then itself. No line names the writer and
the order of deaths points at the helper; only the bytes each wrote show who wrote the traceback.

``--mode kill-quietly`` (a rank killed while its peers wait on a queue): rank ``--victim`` is SIGKILLed,
the others go on waiting on a queue, nobody fails after it.

Ranks are titled ``first_death:rR`` (``--title`` sets the prefix: ``sglang::scheduler_TP`` names them as
SGLang does). ``--ready-file`` is written once every rank is up; the failure comes ``--delay`` seconds
later.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import signal
import sys
import time
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event

from _util import add_ready_file_arg
from _util import log
from _util import set_title
from _util import write_ready


def rank_main(
    rank: int, victim: int, mode: str, delay: float, title: str, up: Queue[int], go: Event, mail: Queue[str]
) -> None:
    if rank != victim or mode == "raise-then-teardown":
        set_title(f"{title}{rank}")  # a victim to be killed stays untitled until the moment it dies
    up.put(rank)
    go.wait()
    if rank == victim:
        time.sleep(delay)
        if mode == "raise-then-teardown":
            print(f"[TP{rank}] Scheduler hit an exception: Traceback (most recent call last):", flush=True)
            print(f'[TP{rank}]   File "model_runner.py", line 42, in load_model', flush=True)
            print(f"[TP{rank}] ValueError: weight shape mismatch in layer 3", flush=True)
            sys.exit(1)
        if mode == "raise-untagged-then-teardown":
            print("Scheduler hit an exception: Traceback (most recent call last):", flush=True)
            for depth in range(8):
                print(f'  File "scheduler.py", line {100 + depth}, in event_loop_{depth}', flush=True)
                print(f"    self.step_{depth}(batch, forward_mode, model_runner)", flush=True)
            print("ValueError: weight shape mismatch in layer 3", flush=True)
            os.kill(os.getppid(), signal.SIGUSR1)
            time.sleep(60)  # killed by the launcher's tear-down
        set_title(f"{title}{rank}")  # the title it dies with: no tick sees it alive
        os.kill(os.getpid(), signal.SIGKILL)
    mail.get()  # the others wait for a message that never comes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--mode",
        choices=("kill-then-raise", "raise-then-teardown", "raise-untagged-then-teardown", "kill-quietly"),
        required=True,
    )
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--victim", type=int, default=1)
    parser.add_argument("--delay", type=float, default=1.0)
    parser.add_argument(
        "--title",
        default="first_death:r",
        help="rank titles: this and the rank (sglang::scheduler_TP: SGLang's)",
    )
    add_ready_file_arg(parser)
    args = parser.parse_args()
    ctx = mp.get_context("spawn")
    up: Queue[int] = ctx.Queue()
    mail: Queue[str] = ctx.Queue()
    go = ctx.Event()
    untagged = args.mode == "raise-untagged-then-teardown"
    helper = ctx.Process(target=time.sleep, args=(120,), name="helper")
    if untagged:
        helper.start()
    ranks = [
        ctx.Process(target=rank_main, args=(r, args.victim, args.mode, args.delay, args.title, up, go, mail))
        for r in range(args.ranks)
    ]
    for proc in ranks:
        proc.start()
    for _ in ranks:
        up.get()
    log("launcher: ranks up: " + ", ".join(f"rank{r}={p.pid}" for r, p in enumerate(ranks)))
    if untagged:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})  # taken by sigtimedwait below
    write_ready(args.ready_file)
    go.set()
    victim = ranks[args.victim]
    if untagged:
        signal.sigtimedwait({signal.SIGUSR1}, 60)
        log("Received sigquit from a child process. It usually means the child failed.")
        assert helper.pid is not None
        os.kill(helper.pid, signal.SIGKILL)
        time.sleep(0.2)
        for proc in sorted(ranks, key=lambda p: p is victim):  # the raiser last
            if proc.pid is not None:
                os.kill(proc.pid, signal.SIGKILL)
        time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGKILL)
    victim.join()
    if args.mode == "kill-quietly":
        for proc in ranks:
            proc.join()
        return
    time.sleep(0.3)
    if args.mode == "kill-then-raise":
        log("Traceback (most recent call last):")
        log('  File "core.py", line 80, in run_engine_core')
        log("RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}")
        for proc in ranks:
            if proc.is_alive():
                proc.terminate()
        sys.exit(1)
    log("Received sigquit from a child process. It usually means the child failed.")
    for proc in ranks:
        if proc.is_alive() and proc.pid is not None:
            os.kill(proc.pid, signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    main()
