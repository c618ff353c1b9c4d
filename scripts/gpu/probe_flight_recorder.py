"""Probe how torch's Flight Recorder is dumped from outside a live NCCL rank (issue 26), on a GPU machine.

Starts a one-rank NCCL process group (a child process) with the Flight Recorder on and its dump pipe set,
has it run a few all-reduces and then wait, writes to its pipe from outside as hangwatch would, and reads
what the rank dumped (pickle, loaded with no globals allowed). Prints the environment variables the build
knows, the files the rank made, the time from the write to the dump, and the dump's shape; writes
$OUT/flight_recorder_probe.json and the raw dump.

    python3 scripts/gpu/probe_flight_recorder.py
"""

from __future__ import annotations

import io
import json
import os
import pickle
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

CHILD = r"""
import os, sys, time, torch, torch.distributed as dist
dist.init_process_group("nccl", init_method="tcp://127.0.0.1:29561", rank=0, world_size=1)
t = torch.ones(1024, device="cuda")
for _ in range(5):
    dist.all_reduce(t)
torch.cuda.synchronize()
dist.barrier()
print("COLLECTIVES DONE", flush=True)
time.sleep(float(sys.argv[1]))
"""


class NoGlobals(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refused global {module}.{name}")


def main() -> int:
    out = Path(os.environ.get("OUT", "."))
    import torch

    found: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda}
    lib = Path(torch.__file__).parent / "lib"
    names: set[str] = set()
    for so in lib.glob("libtorch*.so"):
        text = so.read_bytes()
        names |= {m.decode() for m in re.findall(rb"TORCH_(?:NCCL|FR)_[A-Z_]+", text)}
    keys = ("TRACE", "DUMP", "PIPE", "FR_", "DEBUG")
    found["env_names"] = sorted(n for n in names if any(k in n for k in keys))
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        env = {
            **os.environ,
            "TORCH_FR_BUFFER_SIZE": "200",
            "TORCH_NCCL_TRACE_BUFFER_SIZE": "200",
            "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": str(d / "pipe_rank_"),
            "TORCH_FR_DEBUG_INFO_PIPE_FILE": str(d / "frpipe_rank_"),
            "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": str(d / "trace_rank_"),
            "TORCH_FR_DUMP_TEMP_FILE": str(d / "frtrace_rank_"),
        }
        argv = [sys.executable, "-c", CHILD, "60"]
        child = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert child.stdout is not None
        lines = []
        for line in child.stdout:
            lines.append(line.rstrip())
            if "COLLECTIVES DONE" in line:
                break
        time.sleep(2)
        found["files_before"] = sorted(p.name for p in d.iterdir())
        pipes = [p for p in d.iterdir() if p.name.endswith(".pipe")]
        found["pipes"] = [p.name for p in pipes]
        dumps: dict[str, Any] = {}
        for pipe in pipes:
            start = time.monotonic()
            fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)
            os.write(fd, b"1\n")
            os.close(fd)
            deadline = start + 20
            while time.monotonic() < deadline:
                made = [p for p in d.iterdir() if not p.name.endswith(".pipe") and p.stat().st_size > 0]
                if made:
                    time.sleep(0.5)
                    break
                time.sleep(0.05)
            dumps[pipe.name] = round(time.monotonic() - start, 3)
        found["dump_after_s"] = dumps
        found["files_after"] = sorted(f"{p.name} {p.stat().st_size}" for p in d.iterdir())
        for p in d.iterdir():
            if p.name.endswith(".pipe") or p.stat().st_size == 0:
                continue
            raw = p.read_bytes()
            (out / f"fr_dump_{p.name}").write_bytes(raw)
            try:
                data = NoGlobals(io.BytesIO(raw)).load()
                found[f"shape_{p.name}"] = {
                    "keys": sorted(data) if isinstance(data, dict) else type(data).__name__,
                    "entries": [
                        {
                            k: e.get(k)
                            for k in (
                                "record_id",
                                "pg_id",
                                "collective_seq_id",
                                "p2p_seq_id",
                                "profiling_name",
                                "state",
                                "process_group",
                                "retired",
                            )
                        }
                        for e in (data.get("entries") or [])[:8]
                    ]
                    if isinstance(data, dict)
                    else None,
                    "pg_config": data.get("pg_config") if isinstance(data, dict) else None,
                    "pg_status": data.get("pg_status") if isinstance(data, dict) else None,
                    "version": data.get("version") if isinstance(data, dict) else None,
                }
            except Exception as exc:  # a probe: say what it was
                found[f"shape_{p.name}"] = f"{type(exc).__name__}: {exc}"
        child.kill()
        child.wait()
        found["child_lines"] = lines[-10:]
    path = out / "flight_recorder_probe.json"
    path.write_text(json.dumps(found, indent=1, default=str) + "\n")
    print(json.dumps(found, indent=1, default=str)[:6000])
    return 0


if __name__ == "__main__":
    sys.exit(main())
