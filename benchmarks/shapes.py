"""Shapes the fault matrix does not hold (issue 23), each with its expectation written before it ran.

Each shape is a real program under `hangwatch run` (real gloo ranks, real torchrun and
torch.multiprocessing.spawn, real flock holders outside the tree) and an expectation: the state, the
cause (any of a few), who must be named, what the summary must say. The script prints one row per shape
(right or wrong, and why), so the same list can be run on two versions of hangwatch for the
before/after table of docs/fault-matrix.md:

    .venv/bin/python benchmarks/shapes.py                     # every shape, this checkout's hangwatch
    .venv/bin/python benchmarks/shapes.py --only cycle sort   # some
    .venv/bin/python benchmarks/shapes.py --json out.json

Every process a shape starts is killed afterwards (descendants first); nothing but loopback is used.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from proc_helpers import free_port  # noqa: E402
from proc_helpers import spawn  # noqa: E402
from proc_helpers import wait_for_file  # noqa: E402

PROGRAMS = REPO / "tests" / "programs"
PY = sys.executable


def prog(name: str, *args: str) -> list[str]:
    return [PY, str(PROGRAMS / f"{name}.py"), *args]


@dataclass(frozen=True)
class Shape:
    name: str
    what: str  # the class of shape, in words
    argv: Callable[[Path], list[str]]
    window: float
    states: tuple[str, ...]  # any of these
    causes: tuple[str | None, ...] = (None,)
    says: tuple[str, ...] = ()  # words the summary must hold
    never: tuple[str, ...] = ()  # words it must not hold
    holder: bool = False  # a flock holder outside the tree for the shape's run ("--hold")
    hold_s: float = 0.0  # the holder's time (0: forever)
    timeout: float = 150.0
    extra: tuple[str, ...] = field(default=())


def _torchrun() -> str:
    return str(Path(PY).with_name("torchrun"))


def _work(shape: str) -> Shape:
    return Shape(
        shape,
        f"silent CPU work ({shape})",
        lambda _: prog("work_loops", "--shape", shape, "--seconds", "22"),
        8,
        ("ready", "exited"),
        extra=("--ready-pattern", "^work done$"),
    )


SHAPES: tuple[Shape, ...] = (
    *(
        _work(s)
        for s in ("cycle", "sort", "arith", "recurse", "hash", "regex", "json", "threads", "children")
    ),
    Shape(
        "spawn-work",
        "mp.spawn rank building tables while its peer waits in the all-reduce",
        lambda _: prog("spawn_job", "--shape", "work", "--seconds", "25"),
        8,
        ("exited",),
    ),
    Shape(
        "lock-poll-live-holder",
        "a rank polling a file lock a live process outside the tree releases after 35 s",
        lambda d: prog("lock_file_poll", "--lock", str(d / "x.lock")),
        120,
        ("exited",),
        holder=True,
        hold_s=35,
    ),
    Shape(
        "lock-held-outside",
        "a rank polling a file lock held forever by a process outside the tree",
        lambda d: prog("lock_file_poll", "--lock", str(d / "x.lock")),
        15,
        ("stalled",),
        ("collective-wait",),
        says=("keeps trying the lock on", "outside the tree"),
        holder=True,
    ),
    Shape(
        "torchrun-node-absent",
        "torchrun --nnodes 2 started on one node",
        lambda _: [
            _torchrun(),
            "--nnodes",
            "2",
            "--nproc-per-node",
            "2",
            "--node-rank",
            "0",
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(free_port()),
            str(PROGRAMS / "torchrun_job.py"),
        ],
        12,
        ("stalled",),
        ("rendezvous-wait",),
        says=("node rank 1 (ranks 2-3 of 4) never joined",),
        never=("idle server",),
    ),
    Shape(
        "spawn-sigkill",
        "a rank SIGKILLed under torch.multiprocessing.spawn",
        lambda _: prog("spawn_job", "--shape", "kill"),
        30,
        ("crashed",),
        ("dead-peer",),
        says=("consequence",),
    ),
    Shape(
        "spawn-loader-queue",
        "a rank in queue.get for its own stuck loader thread, its peer in the all-reduce",
        lambda _: prog("spawn_job", "--shape", "loader"),
        60,
        ("stalled",),
        ("collective-wait",),
        says=("Queue.get",),
        never=("every rank waits in the same collective",),
    ),
    Shape(
        "spin-for-parked-peer",
        "ranks spinning for a rank parked in Event.wait (a spin the frames do not name)",
        lambda _: prog("spin_wait", "--ranks", "3", "--culprit", "2"),
        20,
        ("stalled",),
        ("collective-wait",),
        says=("rank2",),
    ),
)


def run_shape(shape: Shape, workdir: Path) -> dict[str, Any]:
    d = Path(tempfile.mkdtemp(dir=workdir, prefix=shape.name + "-"))
    report = d / "report.json"
    options = [
        "--stall-after",
        f"{shape.window:g}",
        "--report-json",
        str(report),
        "--run-dir",
        str(d / "run"),
    ]
    argv = [
        PY,
        "-m",
        "hangwatch",
        "run",
        "--quiet",
        "--no-doctor",
        *options,
        *shape.extra,
        "--",
        *shape.argv(d),
    ]
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        if shape.holder:
            ready = d / "holding"
            hold = prog("lock_file_poll", "--hold", str(d / "x.lock"), "--seconds", f"{shape.hold_s:g}",
                        "--ready-file", str(ready))  # fmt: skip
            holder = stack.enter_context(spawn(hold, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            wait_for_file(ready, 30, holder)
        proc = stack.enter_context(spawn(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=shape.timeout)
    wall = time.monotonic() - started
    if not report.exists():
        return {"shape": shape.name, "right": False, "why": "no report", "wall_s": round(wall, 1)}
    data = json.loads(report.read_text())
    v = data["verdict"]
    why = []
    if v["state"] not in shape.states:
        why.append(f"state {v['state']} not {'/'.join(shape.states)}")
    if shape.causes != (None,) and v["cause"] not in shape.causes:
        why.append(f"cause {v['cause']} not {'/'.join(str(c) for c in shape.causes)}")
    why += [f"summary lacks {w!r}" for w in shape.says if w not in v["summary"]]
    why += [f"summary says {w!r}" for w in shape.never if w in v["summary"]]
    return {
        "shape": shape.name,
        "what": shape.what,
        "state": v["state"],
        "cause": v["cause"],
        "culprits": v["culprits"],
        "decided_by": v.get("decided_by", []),
        "duration_s": data["duration_s"],
        "summary": v["summary"][:300],
        "right": not why,
        "why": "; ".join(why),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="shape names")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    shapes = [s for s in SHAPES if not args.only or s.name in args.only]
    results = []
    with tempfile.TemporaryDirectory(prefix="hangwatch-shapes-") as tmp:
        for shape in shapes:
            r = run_shape(shape, Path(tmp))
            results.append(r)
            verdict = f"{r.get('state')}/{r.get('cause')}"
            mark = "right" if r["right"] else f"WRONG: {r['why']}"
            print(f"{shape.name:24} {verdict:28} {r.get('duration_s', '-')!s:>7} s  {mark}", flush=True)
    right = sum(r["right"] for r in results)
    print(f"{right} of {len(results)} shapes right")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0 if right == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
