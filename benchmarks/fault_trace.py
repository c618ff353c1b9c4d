"""Check where fault targets fire: boot a real server with `kind=trace` faults (no fault, one log line per
target per process on its first call), without hangwatch, and print which process called what, when.

Startup targets are traced from the launch; `--serving` targets only after /health is 200 (an armfile),
then a few completion requests are sent. One boot answers for every target named.

    .venv/bin/python benchmarks/fault_trace.py --engine sglang --tp 2 \
        --target sglang.srt.model_executor.model_runner:ModelRunner.alloc_memory_pool \
        --serving sglang.srt.managers.tp_worker:TpModelWorker.forward_batch_generation
    .venv/bin/python benchmarks/fault_trace.py --engine sglang --tp 1 --matrix   # the matrix's own targets
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from faults import matrix  # noqa: E402

TRACED_RE = re.compile(
    r"hangwatch-fault: traced kind=trace target=(?P<target>\S+) call=\d+ in pid (?P<pid>\d+) "
    r"title '(?P<title>.*)' thread '(?P<thread>.*)' t=(?P<t>[\d.]+)"
)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engine", choices=("vllm", "sglang"), required=True)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--target", action="append", default=[], help="module:qualname traced from the launch")
    p.add_argument("--serving", action="append", default=[], help="module:qualname traced once serving")
    p.add_argument("--matrix", action="store_true", help="trace the matrix's targets for this engine")
    p.add_argument("--boot-timeout", type=float, default=300.0)
    p.add_argument("--workdir", type=Path)
    args = p.parse_args(argv)

    targets = dict.fromkeys(args.target)
    serving = dict.fromkeys(args.serving)
    if args.matrix:
        table = matrix.VLLM_TARGETS if args.engine == "vllm" else matrix.SGLANG_TARGETS
        for (_, phase), target in table.items():
            (serving if phase == "serving" else targets)[target] = None
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="fault-trace-"))
    workdir.mkdir(parents=True, exist_ok=True)
    armfile = workdir / "armed"
    specs = [f"kind=trace;target={t};who=any" for t in targets]
    specs += [f"kind=trace;target={t};who=any;armfile={armfile}" for t in serving]
    cell = matrix.Cell(args.engine, args.tp, "TP0" if args.tp > 1 else "sched", "weights", "trace")
    port = matrix.free_port()
    cmd, env = matrix.server_command(cell, port)
    env["HANGWATCH_FAULT"] = "||".join(specs)
    log = workdir / "server.log"
    tracker = matrix.Tracker()
    t0 = time.time()
    print(f"trace: {len(specs)} targets, log {log}", file=sys.stderr)
    try:
        with matrix.interrupts_raise(), log.open("w") as out:
            server = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                env={**os.environ, **matrix.OFFLINE_ENV, **env}, start_new_session=True,
            )  # fmt: skip
            tracker.add(server)
            ok = matrix._wait_ready(
                f"http://127.0.0.1:{port}/health", args.boot_timeout, lambda: server.poll() is None
            )
            ready = time.time() - t0
            print(f"trace: ready={ok} after {ready:.0f} s", file=sys.stderr)
            if ok and serving:
                armfile.touch()
                results: list[str] = []
                threads = matrix.send_requests(cell, port, 3, results)
                for th in threads:
                    th.join(timeout=120)
                print(f"trace: requests {results}", file=sys.stderr)
            time.sleep(2)
    except KeyboardInterrupt:
        pass
    finally:
        tracker.close()
    seen = set()
    for line in log.read_text(errors="replace").splitlines():
        m = TRACED_RE.search(line)
        if m:
            seen.add(m["target"])
            print(
                f"{float(m['t']) - t0:6.1f} s  pid {m['pid']:>7}  {m['title'][:40]:40s} "
                f"{m['thread'][:20]:20s} {m['target']}"
            )
        elif "cannot patch" in line or "bad HANGWATCH_FAULT" in line:
            print(line)
    for t in [*targets, *serving]:
        if t not in seen:
            print(f"  NEVER CALLED: {t}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
