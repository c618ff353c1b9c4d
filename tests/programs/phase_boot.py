"""A boot in phases: prints vLLM's startup lines (docs/engine-facts.md) with a pause after each, then a
ready line, then waits to be stopped. Under ``hangwatch run --engine vllm --ready-pattern READY`` its
phases are process_start, weights, model_loaded, ready; each as long as ``--pause`` seconds.

``--port`` is taken and ignored: the engine's health probe is pointed at it (a free port) so that no
server of the machine answers for this program.

Example::

    python tests/programs/phase_boot.py --pause 1.0
"""

from __future__ import annotations

import argparse
import time

from _util import log


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pause", type=float, default=1.0, help="seconds each phase lasts")
    parser.add_argument("--port", type=int, help="ignored (the probe's port)")
    args = parser.parse_args()
    log("INFO vLLM API server version 0.0.0")
    time.sleep(args.pause)
    log("INFO Loading model from scratch")
    time.sleep(args.pause)
    log("INFO Loading weights took 1.00 seconds")
    time.sleep(args.pause)
    log("READY to serve")
    time.sleep(600)  # stopped by hangwatch once ready (--until-ready)


if __name__ == "__main__":
    main()
