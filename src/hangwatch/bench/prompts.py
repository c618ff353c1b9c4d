"""Prompt sets for ``bench``: the bundled one, or a JSONL file of ``{"prompt": "..."}`` lines.

The format is the one ``vllm bench serve --dataset-name custom`` reads, so one file can drive both
clients (extra keys such as ``output_tokens`` are ignored here). A file that cannot be used is a
``UsageError`` naming the line, before any request is sent.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

from hangwatch.errors import UsageError
from hangwatch.model.bench import Prompt

MAX_PROMPTS = 100_000


def bundled_text() -> str:
    return resources.files("hangwatch.bench").joinpath("prompts.jsonl").read_text(encoding="utf-8")


def parse_prompts(text: str, source: str) -> tuple[Prompt, ...]:
    prompts: list[Prompt] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except ValueError as exc:
            raise UsageError(f"{source} line {number} is not JSON: {exc}") from None
        text_value = item.get("prompt") if isinstance(item, dict) else None
        if not isinstance(text_value, str) or not text_value.strip():
            raise UsageError(
                f'{source} line {number} has no "prompt" string',
                'Write one JSON object per line: {"prompt": "..."}',
            )
        prompts.append(Prompt(text_value))
        if len(prompts) > MAX_PROMPTS:
            raise UsageError(f"{source} has more than {MAX_PROMPTS} prompts")
    if not prompts:
        raise UsageError(f"{source} holds no prompts")
    return tuple(prompts)


def load_prompts(path: Path | None) -> tuple[Prompt, ...]:
    if path is None:
        return parse_prompts(bundled_text(), "the bundled prompt set")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--prompts {path}: cannot read it ({exc})") from None
    return parse_prompts(text, f"--prompts {path}")
