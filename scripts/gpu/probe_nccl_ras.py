"""Probe NCCL's RAS service (NCCL 2.24 and later, localhost:28028) on a GPU machine (issue 26): what it
answers about a live job whose collective never completes, asked twice a few seconds apart, in text and,
where the service takes ``SET FORMAT json``, JSON. Writes $OUT/nccl_ras_probe.json.

    python3 scripts/gpu/probe_nccl_ras.py
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

PROGRAM = r"""
import torch, torch.distributed as dist
dist.init_process_group("nccl", init_method="tcp://127.0.0.1:29565", rank=0, world_size=1)
t = torch.ones(1 << 20, device="cuda")
for _ in range(5):
    dist.all_reduce(t)
torch.cuda.synchronize()
print("QUEUED", flush=True)
torch.cuda._sleep(int(2e12))
dist.all_reduce(t)
torch.cuda.synchronize()
"""


def ask(command: str, fmt: str | None = None) -> dict[str, str]:
    out: dict[str, str] = {}
    with socket.create_connection(("127.0.0.1", 28028), timeout=15) as s:
        f = s.makefile("rwb", buffering=0)
        f.write(b"CLIENT PROTOCOL 2\n")
        out["hello"] = f.readline().decode(errors="replace").strip()
        if fmt:
            f.write(f"SET FORMAT {fmt}\n".encode())
            out["format"] = f.readline().decode(errors="replace").strip()
        f.write(f"{command}\n".encode())
        chunks = []
        start = time.monotonic()
        while True:
            data = s.recv(65536)
            if not data:
                break
            chunks.append(data)
        out["answer"] = b"".join(chunks).decode(errors="replace")
        out["seconds"] = f"{time.monotonic() - start:.2f}"
    return out


def main() -> int:
    out = Path(os.environ.get("OUT", "."))
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1"}
    child = subprocess.Popen([sys.executable, "-c", PROGRAM], env=env, stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    for line in child.stdout:
        if "QUEUED" in line:
            break
    time.sleep(5)
    found: dict[str, object] = {}
    for name, command, fmt in (
        ("status", "STATUS", None),
        ("verbose", "VERBOSE STATUS", None),
        ("json", "VERBOSE STATUS", "json"),
    ):
        try:
            found[name] = ask(command, fmt)
        except OSError as exc:
            found[name] = f"{type(exc).__name__}: {exc}"
    time.sleep(3)
    try:
        found["verbose_again"] = ask("VERBOSE STATUS")
    except OSError as exc:
        found["verbose_again"] = str(exc)
    child.kill()
    child.wait()
    (out / "nccl_ras_probe.json").write_text(json.dumps(found, indent=1) + "\n")
    print(json.dumps(found, indent=1)[:12000])
    return 0


if __name__ == "__main__":
    sys.exit(main())
