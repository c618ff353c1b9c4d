"""Validate the Flight Recorder read at a stall on a real GPU (issue 26): NCCL's dump pipe, poked by
hangwatch, the dump read back, the collective left unfinished named.

One rank (one GPU: NCCL refuses two ranks on one device) runs a few all-reduces, then queues one behind a
kernel that spins for minutes (``torch.cuda._sleep``) and waits for it in ``torch.cuda.synchronize``:
the all-reduce is enqueued and never completes. ``hangwatch run --stall-after 15`` must say stalled, ask
the rank through its pipe (the rank runs on), and name "rank 0 waits in seq 6 (nccl:all_reduce)"; and read
NCCL's RAS service twice (the rank serves it on 28028).

    HANGWATCH_PY_SPY=$PWD/.gl/py-spy PYTHONPATH=src python3 scripts/gpu/validate_flight_recorder.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

PROGRAM = r"""
import os, time, torch, torch.distributed as dist
dist.init_process_group("nccl", init_method="tcp://127.0.0.1:29563", rank=0, world_size=1)
t = torch.ones(1 << 20, device="cuda")
for _ in range(5):
    dist.all_reduce(t)
torch.cuda.synchronize()
print("five all-reduces done; queueing one behind a spinning kernel", flush=True)
torch.cuda._sleep(int(2e12))  # minutes of spinning on the GPU, on the current stream
dist.all_reduce(t)            # enqueued behind it: started never, completed never
torch.cuda.synchronize()
"""


def main() -> int:
    out = Path(os.environ.get("OUT", "."))
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        argv = [sys.executable, "-m", "hangwatch", "run", "--quiet", "--no-doctor", "--stall-after", "15",
                "--run-dir", str(Path(tmp) / "run"), "--report-json", str(report), "--",
                sys.executable, "-c", PROGRAM]  # fmt: skip
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
        print(done.stdout[-4000:], done.stderr[-2000:])
        data = json.loads(report.read_text()) if report.exists() else {}
        files = sorted(p.name for p in (Path(tmp) / "run" / "flight-recorder").glob("*"))
    (out / "flight_recorder_report.json").write_text(json.dumps(data, indent=1) + "\n")
    v = data.get("verdict") or {}
    fr = data.get("flight_recorder") or {}
    said = " ".join(v.get("evidence", []))
    checks = {
        "stalled": v.get("state") == "stalled",
        "the rank asked through its pipe": fr.get("triggered") == 1,
        "its dump read": len(fr.get("dumps") or []) == 1,
        "the unfinished all-reduce named": "waits in seq 6 (nccl:all_reduce)" in said,
        "decided by the recorder too": "stall:flight-recorder" in (v.get("decided_by") or []),
        # NCCL's RAS service (the tree listens on 28028): read twice; one rank alone says nothing more.
        "NCCL RAS read twice": len(data.get("nccl_ras") or []) == 2,
        "no RAS claim about a one-rank communicator": "NCCL RAS, communicator" not in said,
    }
    print("flight-recorder files:", files)
    print("capture:", {k: fr.get(k) for k in ("triggered", "elapsed_s", "missing")})
    print(
        "ras:",
        [
            (r.get("t"), r.get("nccl_version"), len(r.get("communicators") or []))
            for r in data.get("nccl_ras") or []
        ],
    )
    for name, ok in checks.items():
        print(f"{'PASS' if ok else 'FAIL'}  {name}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
