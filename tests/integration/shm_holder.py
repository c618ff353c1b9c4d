"""A process outside any tree under test: maps /dev/shm/NAME (it must exist), writes READY, sleeps."""

from __future__ import annotations

import mmap
import os
import sys
import time
from pathlib import Path

if __name__ == "__main__":
    path, ready = sys.argv[1], sys.argv[2]
    fd = os.open(path, os.O_RDWR)
    mm = mmap.mmap(fd, os.fstat(fd).st_size)
    os.close(fd)
    Path(ready).write_text(str(os.getpid()))
    while True:
        time.sleep(3600)
