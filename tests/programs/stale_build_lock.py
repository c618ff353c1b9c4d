"""A load that waits for a C++ extension build another process marked "in progress" and never finished.

torch's ``cpp_extension.load`` marks a build with ``<TORCH_EXTENSIONS_DIR>/<py>_cpu/<name>/lock``
(``torch.utils.file_baton.FileBaton``) and every other loader polls, ``time.sleep`` between looks, for
the file to go away. This program is such a loader: it prints torch's line and waits on the baton of
``--name`` in ``$TORCH_EXTENSIONS_DIR`` (a test writes the lock file first, as a killed build leaves
it). It polls forever unless the file is removed, then prints ``loaded`` and exits 0. Uses torch's own
``FileBaton`` where torch is installed, the same loop otherwise.
"""

from __future__ import annotations

import argparse
import os
import time

from _util import die_with_parent
from _util import log
from _util import set_title


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--name", default="myext")
    args = parser.parse_args()
    set_title("loader")
    die_with_parent()
    folder = os.path.join(os.environ["TORCH_EXTENSIONS_DIR"], "py311_cpu", args.name)
    lock = os.path.join(folder, "lock")
    log(f"Loading extension module {args.name}...")
    try:
        from torch.utils.file_baton import FileBaton
    except ImportError:
        while os.path.exists(lock):
            time.sleep(0.1)
    else:
        FileBaton(lock).wait()
    log("loaded")


if __name__ == "__main__":
    main()
