"""Validate our native unwinder (collect/unwind.py) against ``py-spy dump --native`` on CUDA processes, and
time both: what only a GPU machine has (libcuda, torch's CUDA libraries of a gigabyte and more, threads
parked in the CUDA driver).

Cases (each a real program, left in its state while it is read):
  spin:         stack_program.py spin: a kernel spins on a flag, the host in torch.cuda.synchronize;
  stream-wait:  stack_program.py stream-wait: the host in Stream.synchronize on a stream that waits for a
                value never written;
  ipc-sync:     gpu_waits.py ipc --host-wait sync: two ranks (CuPy only), rank 0's host in
                cudaDeviceSynchronize, rank 1 in a Python wait;
  native-waits: tests/programs/native_waits.py with its gloo pair, under torch's CUDA build (every torch
                library mapped);
  matmul:       stack_program.py matmul: work, the host moving (threads may differ between two readings:
                counted, not compared).

For every process of each tree: py-spy's --native dump, then ours twice with one dumper (the second
reuses every library read by the first, as a collector's next round does), each thread compared with the
rule of tests/integration/test_native_unwind.py (frames py-spy found in debug information aside). Then
``hangwatch collect --pid ROOT --samples 1`` both ways (``HANGWATCH_NATIVE_UNWINDER=py-spy`` for py-spy's).
Writes $OUT/unwind_validation.json and prints a summary.

    HANGWATCH_PY_SPY=$PWD/.gl/py-spy PYTHONPATH=src python3 scripts/gpu/validate_unwind.py [CASE ...]
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "tests"))

from builders import process_sample  # noqa: E402
from hangwatch.collect import procfs  # noqa: E402
from hangwatch.collect.stacks import StackDumper  # noqa: E402
from stack_compare import SOURCE_FILES  # noqa: E402
from stack_compare import comparable  # noqa: E402

COLLECT = ("--samples", "1", "--no-probe")
REPEAT = 20  # our unwinder's captures of each process, where its main thread was
SOURCES = (*SOURCE_FILES, ".cu", ".cuh")  # CUDA's sources too, on the GPU machine


def cases(tmp: Path) -> dict[str, tuple[list[str], Path]]:
    py = sys.executable
    prog = str(HERE / "stack_program.py")

    def ready(name: str) -> Path:
        return tmp / f"{name}.ready"

    native = str(REPO / "tests" / "programs" / "native_waits.py")
    beat = str(tmp / "beat")
    return {
        "spin": ([py, prog, "spin", "--ready-file", str(ready("spin"))], ready("spin")),
        "stream-wait": ([py, prog, "stream-wait", "--ready-file", str(ready("stream"))], ready("stream")),
        "ipc-sync": (
            [py, str(HERE / "gpu_waits.py"), "ipc", "--host-wait", "sync", "--ready-file", str(ready("ipc"))],
            ready("ipc"),
        ),
        "native-waits": (
            [py, native, "--ready", str(ready("native")), "--heartbeat", beat, "--torch-port", "29655"],
            ready("native"),
        ),
        "matmul": (
            [py, prog, "matmul", "--seconds", "300", "--ready-file", str(ready("matmul"))],
            ready("matmul"),
        ),
    }


def tree(root: int) -> list[int]:
    """The root and its descendants, by a scan of every process's parent (a thread's children too)."""
    parents: dict[int, list[int]] = {}
    for pid in procfs.list_pids():
        stat = procfs.read_stat(pid)
        if stat is not None:
            parents.setdefault(stat.ppid, []).append(pid)
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(parents.get(pid, []))
    return sorted(out)


def compare(pid: int, moving: bool) -> dict[str, Any]:
    sample = process_sample(pid, "case")
    started = time.monotonic()
    theirs = StackDumper(unwinder=None).dump(sample, native=True)
    t_theirs = time.monotonic() - started
    dumper = StackDumper()
    started = time.monotonic()
    ours = dumper.dump(sample, native=True)
    t_first = time.monotonic() - started
    started = time.monotonic()
    again = dumper.dump(sample, native=True)
    t_again = time.monotonic() - started
    row: dict[str, Any] = {
        "pid": pid,
        "py_spy_native_s": round(t_theirs, 3),
        "ours_first_s": round(t_first, 3),
        "ours_again_s": round(t_again, 3),
        "outcomes": [theirs.outcome.value, ours.outcome.value, again.outcome.value],
        "detail": ours.detail,
        "threads": len(ours.threads),
        "same": 0,
        "differ": [],
        "leaf_frames": {},
    }
    # Our unwinder again and again on the process as it is: where each capture's main thread was (its
    # innermost native frame's library) and how many of them reached no native frame under Python's (the
    # unwinding stopped at the leaf: the vDSO before it was read, 2026-12-06).
    leaves: dict[str, int] = {}
    bare = 0
    for _ in range(REPEAT):
        seen = dumper.dump(sample, native=True)
        main = next((t for t in seen.threads if t.tid == pid), None)
        if main is None:
            continue
        native = [f for f in main.frames if f.native]
        leaf = native[-1].file.rsplit("/", 1)[-1] if native else "none"
        leaves[leaf] = leaves.get(leaf, 0) + 1
        last_py = max((i for i, f in enumerate(main.frames) if not f.native), default=-1)
        bare += not any(f.native and f.name != "??" for f in main.frames[last_py + 1 :])
    row["repeat"] = {"captures": REPEAT, "leaf_libraries": leaves, "no_native_under_python": bare}
    reference = {t.tid: t for t in theirs.threads}
    for t in ours.threads:
        row["leaf_frames"][t.name or str(t.tid)] = [f.name for f in t.frames if f.native][:6]
        if t.tid not in reference:
            row["differ"].append({"tid": t.tid, "why": "py-spy did not list it"})
            continue
        a, b = comparable(t.frames, reference[t.tid].frames, SOURCES)
        if a == b:
            row["same"] += 1
        elif not (moving and t.active):
            row["differ"].append({"tid": t.tid, "name": t.name, "ours": a, "py_spy": b})
    return row


def collect_times(root: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for label, env in (("ours", {}), ("py-spy", {"HANGWATCH_NATIVE_UNWINDER": "py-spy"})):
        walls, own = [], []
        for _ in range(2):
            started = time.monotonic()
            done = subprocess.run(
                [sys.executable, "-m", "hangwatch", "collect", "--pid", str(root), *COLLECT],
                capture_output=True,
                text=True,
                env={**os.environ, **env, "PYTHONPATH": str(REPO / "src")},
                check=False,
            )
            walls.append(round(time.monotonic() - started, 3))
            try:
                own.append(json.loads(done.stdout)["clock"]["duration_s"])
            except (ValueError, KeyError):
                own.append(None)
        out[label] = {"wall_s": walls, "collector_s": own}
    return out


def main() -> int:
    out_dir = Path(os.environ.get("OUT", "."))
    only = set(sys.argv[1:])  # case names to run (default: all)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, (argv, ready) in cases(Path(tmp)).items():
            if only and name not in only:
                continue
            proc = subprocess.Popen(
                argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
            )
            try:
                deadline = time.monotonic() + 180
                while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
                    time.sleep(0.2)
                if not ready.exists():
                    ended = proc.poll() is not None and proc.stderr is not None
                    err = proc.stderr.read().decode(errors="replace")[-800:] if ended else ""  # type: ignore[union-attr]
                    results[name] = {"error": f"not ready (rc {proc.poll()}) {err}"}
                    print(name, results[name], flush=True)
                    continue
                time.sleep(2.0)
                rows = [compare(pid, moving=name == "matmul") for pid in tree(proc.pid)]
                results[name] = {"processes": rows, "collect": collect_times(proc.pid)}
                for r in rows:
                    print(
                        f"{name} pid {r['pid']}: threads {r['threads']} same {r['same']}"
                        f" differ {len(r['differ'])}"
                        f" | py-spy --native {r['py_spy_native_s']} s, ours {r['ours_first_s']} s then"
                        f" {r['ours_again_s']} s | {r['outcomes']} {r['detail'] or ''}"
                        f" | x{r['repeat']['captures']}: {r['repeat']['leaf_libraries']},"
                        f" {r['repeat']['no_native_under_python']} with no native frame under Python",
                        flush=True,
                    )
                    for d in r["differ"]:
                        print("   DIFF", json.dumps(d)[:1500], flush=True)
                print(f"{name} collect: {results[name]['collect']}", flush=True)
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, 9)
                proc.wait()
    (out_dir / "unwind_validation.json").write_text(json.dumps(results, indent=1))
    bad = sum(len(r["differ"]) for c in results.values() for r in c.get("processes", []))
    print("threads differing:", bad)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
