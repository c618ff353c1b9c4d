#!/bin/bash
# A launch script's ranks: each a subshell that waits a moment, then execs python with RANK and WORLD_SIZE
# set, as launch scripts do (`RANK=$r exec python train.py`). hangwatch first sees each rank as the shell,
# whose environment has no RANK; the exec brings it. Each rank prints "rank up" and sleeps.
for r in 0 1; do
  ( sleep 2; RANK=$r WORLD_SIZE=2 exec "${PYTHON:-python3}" -c "import time; print('rank up', flush=True); time.sleep(3600)" ) &
done
wait
