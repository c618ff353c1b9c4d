"""One process that supervises one tree after another, as isolate's trials and bench's servers do.

As a subreaper it starts tree A (a shell whose background child outlives it), ends A's root so the
child is re-parented here, ends that child too and leaves it a zombie, unreaped; then it starts tree B
and samples B with a ``TreeSampler`` that adopts our orphans. It prints one JSON line: A's orphan,
B's root, and the members and exits B's sampler saw. The orphan of A must be in neither.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

from hangwatch.collect.proctree import TreeSampler
from hangwatch.engines.generic import generic_role
from hangwatch.supervise.launcher import become_subreaper


def main() -> None:
    assert become_subreaper()
    a = subprocess.Popen(["sh", "-c", "sleep 60 & echo $!; wait"], stdout=subprocess.PIPE, text=True)
    assert a.stdout is not None
    orphan = int(a.stdout.readline())
    a.kill()
    a.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # re-parented to us once its shell is gone
        with open(f"/proc/{orphan}/stat") as f:
            if int(f.read().rsplit(")", 1)[1].split()[1]) == os.getpid():
                break
        time.sleep(0.05)
    os.kill(orphan, signal.SIGKILL)
    time.sleep(0.3)  # a zombie now, ours, not reaped
    b = subprocess.Popen(["sleep", "60"])
    try:
        sampler = TreeSampler([b.pid], generic_role, adopter=os.getpid(), watch_deaths=False)
        seen: set[int] = set()
        exits: set[int] = set()
        for i in range(3):
            reading = sampler.sample(float(i))
            seen |= {p.pid for p in reading.processes}
            exits |= {e.pid for e in reading.exits}
            time.sleep(0.2)
        print(json.dumps({"orphan": orphan, "root": b.pid, "members": sorted(seen), "exits": sorted(exits)}))
    finally:
        b.kill()
        b.wait()
        os.waitpid(orphan, 0)


if __name__ == "__main__":
    main()
