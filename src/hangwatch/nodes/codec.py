"""A bundle to JSON and back into the frozen model objects the analysis consumes.

Encoding is ``dataclasses.asdict`` made plain (the report writers' ``plain``: enums to values, secrets
scrubbed); decoding walks the dataclasses' type hints, so a field added to a sample is carried without
touching this module. Unknown keys are ignored (a newer collector of the same schema); a missing
required field, a wrong type or another schema is a ``BundleDecodeError`` that the transport records
as that node's evidence.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import types
import typing
from enum import Enum
from typing import Any

from hangwatch.model.nodes import BUNDLE_SCHEMA
from hangwatch.model.nodes import NodeBundle
from hangwatch.model.stacks import ThreadStack
from hangwatch.model.stacks import intern_frames
from hangwatch.render.json_report import plain

# Six digits: the analysis compares CPU seconds and timestamps, which the reports' three digits would blur.
BUNDLE_FLOAT_DIGITS = 6


class BundleDecodeError(ValueError):
    """The text is not a bundle of this schema."""


def encode(bundle: NodeBundle) -> str:
    data = plain(dataclasses.asdict(bundle), BUNDLE_FLOAT_DIGITS)
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def decode(text: str) -> NodeBundle:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BundleDecodeError(f"not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise BundleDecodeError("not a JSON object")
    schema = data.get("schema")
    if schema != BUNDLE_SCHEMA:
        raise BundleDecodeError(f"schema {schema!r}, expected {BUNDLE_SCHEMA!r}")
    bundle = from_plain(NodeBundle, data, "bundle")
    assert isinstance(bundle, NodeBundle)
    return bundle


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def from_plain(tp: Any, data: Any, where: str) -> Any:
    """``data`` (JSON values) as an instance of the type ``tp``."""
    if tp is Any:
        return data
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if data is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return from_plain(arg, data, where)
            except BundleDecodeError as exc:
                errors.append(str(exc))
        raise BundleDecodeError("; ".join(errors))
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return _dataclass(tp, data, where)
    if origin is tuple:
        if not isinstance(data, list):
            raise BundleDecodeError(f"{where}: expected a list")
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(from_plain(args[0], v, f"{where}[{i}]") for i, v in enumerate(data))
        if len(args) != len(data):
            raise BundleDecodeError(f"{where}: expected {len(args)} items")
        return tuple(
            from_plain(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(args, data, strict=True))
        )
    if origin is dict:
        if not isinstance(data, dict):
            raise BundleDecodeError(f"{where}: expected an object")
        key_t, value_t = typing.get_args(tp)
        return {from_plain(key_t, k, where): from_plain(value_t, v, f"{where}.{k}") for k, v in data.items()}
    if isinstance(tp, type) and issubclass(tp, Enum):
        try:
            return tp(data)
        except ValueError:
            raise BundleDecodeError(f"{where}: {data!r} is not a {tp.__name__}") from None
    return _scalar(tp, data, where)


def _dataclass(tp: type, data: Any, where: str) -> Any:
    if not isinstance(data, dict):
        raise BundleDecodeError(f"{where}: expected an object")
    hints = _hints(tp)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(tp):
        if f.name in data:
            kwargs[f.name] = from_plain(hints[f.name], data[f.name], f"{where}.{f.name}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise BundleDecodeError(f"{where}: missing {f.name!r}")
    value = tp(**kwargs)
    if isinstance(value, ThreadStack):
        # Ranks in the same wait have equal stacks: one shared tuple lets the merge compute each once.
        value = dataclasses.replace(value, frames=intern_frames(value.frames))
    return value


def _scalar(tp: Any, data: Any, where: str) -> Any:
    if tp is float:
        if data is None:
            return math.nan  # ``plain`` writes a float that was not finite as null
        if isinstance(data, int | float) and not isinstance(data, bool):
            return float(data)
    elif tp is int:
        if isinstance(data, int) and not isinstance(data, bool):
            return data
    elif tp is bool:
        if isinstance(data, bool):
            return data
    elif tp is str:
        if isinstance(data, str):
            return data
    else:
        raise BundleDecodeError(f"{where}: cannot decode type {tp!r}")
    raise BundleDecodeError(f"{where}: expected {getattr(tp, '__name__', tp)}, got {type(data).__name__}")
