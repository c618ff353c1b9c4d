"""Write the rulebook's table into docs/verdicts.md, between its markers (or check it with --check).

.venv/bin/python scripts/rulebook_doc.py          # rewrite the section
.venv/bin/python scripts/rulebook_doc.py --check  # exit 1 when the page and the table disagree
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hangwatch.model.rulebook import RULEBOOK
from hangwatch.render.rulebook import BEGIN
from hangwatch.render.rulebook import END
from hangwatch.render.rulebook import rulebook_markdown

PAGE = Path(__file__).resolve().parents[1] / "docs" / "verdicts.md"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check; exit 1 on a difference")
    args = parser.parse_args()
    text = PAGE.read_text()
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < 0:
        print(f"{PAGE}: the rulebook's markers are missing", file=sys.stderr)
        return 1
    fresh = text[:start] + rulebook_markdown(RULEBOOK) + text[end + len(END) :]
    if args.check:
        return 0 if fresh == text else 1
    PAGE.write_text(fresh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
