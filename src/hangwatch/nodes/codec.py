"""A bundle to JSON and back into the frozen model objects the analysis consumes.

Encoding is ``dataclasses.asdict`` made plain (the report writers' ``plain``: enums to values, secrets
scrubbed). Schema ``hangwatch.node-bundle/2`` is ``/1`` with each distinct stack written once: every
thread's ``frames`` is an empty list, and ``thread_stacks`` names, thread by thread in the bundle's
order (stack rounds, processes, threads), the entry of ``stack_table`` that holds its frames. Ranks in
one wait have equal stacks, so a node of ten ranks sends three or four stacks instead of forty, and the
controller builds each of those frames once (docs/multinode.md, "the bundle").

Decoding is typed and compiled (msgspec, straight into the model's dataclasses, ignoring unknown keys:
a newer collector of the same schema). Where that refuses the text, the generic decoder (``from_plain``,
walking the dataclasses' type hints, so a field added to a sample is carried without touching this
module) reads it again: it takes a float written as null (``plain`` writes a float that was not finite
so) and says exactly what is wrong. Both schemas are read; another one, a missing required field or a
wrong type is a ``BundleDecodeError`` (``BundleVersionError`` for another schema, naming it and the
collector's version) that the transport records as that node's evidence.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import re
import types
import typing
from enum import Enum
from typing import Any

import msgspec

from hangwatch.model.nodes import BUNDLE_SCHEMA
from hangwatch.model.nodes import BUNDLE_SCHEMA_V1
from hangwatch.model.nodes import NodeBundle
from hangwatch.model.stacks import FRAME_CACHE
from hangwatch.model.stacks import Frame
from hangwatch.model.stacks import ThreadStack
from hangwatch.model.stacks import intern_frames
from hangwatch.render.json_report import plain

# Six digits: the analysis compares CPU seconds and timestamps, which the reports' three digits would blur.
BUNDLE_FLOAT_DIGITS = 6
SCHEMAS_READ = (BUNDLE_SCHEMA_V1, BUNDLE_SCHEMA)
_VERSION = re.compile(r"^hangwatch\.node-bundle/(\d+)$")


class BundleDecodeError(ValueError):
    """The text is not a bundle this hangwatch reads."""


class BundleVersionError(BundleDecodeError):
    """A node bundle of a schema this hangwatch does not read (another hangwatch on the node)."""


class _WireFrame(msgspec.Struct, frozen=True, gc=False):
    """A ``Frame`` as the stack table carries it: hashable, so that a stack every node sends (the same
    collective on 1,000 nodes) becomes ``Frame`` values once for all of them (``FrameCache.parsed``)."""

    name: str
    file: str
    line: int = 0
    native: bool = False
    code: str | None = None


class _Head(msgspec.Struct, gc=False):
    """What is read before the bundle itself: the schema, and /2's stack table."""

    schema: Any = None
    collector_version: Any = None
    stack_table: tuple[tuple[_WireFrame, ...], ...] = ()
    thread_stacks: tuple[int, ...] = ()


class _Schema(msgspec.Struct, gc=False):
    schema: Any = None
    collector_version: Any = None


_HEAD = msgspec.json.Decoder(_Head)
_SCHEMA = msgspec.json.Decoder(_Schema)
_BODY = msgspec.json.Decoder(NodeBundle)


def encode(bundle: NodeBundle) -> str:
    data = plain(dataclasses.asdict(bundle), BUNDLE_FLOAT_DIGITS)
    # Always the current schema's layout, whatever a decoded older bundle said it was.
    data["schema"] = BUNDLE_SCHEMA
    table: list[Any] = []
    index: dict[tuple[tuple[Any, ...], ...], int] = {}
    order: list[int] = []
    for sample in data["stacks"]:
        for process in sample["processes"]:
            for thread in process["threads"]:
                key = tuple(tuple(f.values()) for f in thread["frames"])
                at = index.get(key)
                if at is None:
                    at = index[key] = len(table)
                    table.append(thread["frames"])
                order.append(at)
                thread["frames"] = []
    data["stack_table"] = table
    data["thread_stacks"] = order
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def decode(text: str | bytes) -> NodeBundle:
    """A node's output (its bytes as sent, or text) as a bundle; ``BundleDecodeError`` says why not."""
    try:
        try:
            return _decode(text)
        except _NotJson:
            if not isinstance(text, bytes):
                raise
            # Not UTF-8 throughout: read as text with the bad bytes replaced (a log line cut mid-character).
            return _decode(text.decode("utf-8", "replace"))
    except BundleDecodeError:
        raise
    except (RecursionError, MemoryError, TypeError, ValueError) as exc:  # shapes or nesting no bundle has
        raise BundleDecodeError(f"unreadable: {type(exc).__name__}: {str(exc)[:200]}") from None


class _NotJson(BundleDecodeError):
    pass


def _decode(text: str | bytes) -> NodeBundle:
    try:
        head = _HEAD.decode(text)
    except msgspec.ValidationError as exc:
        if str(exc).startswith("Expected `object`"):
            raise BundleDecodeError("not a JSON object") from None
        # Another schema may shape its stack table otherwise: its version is what to say.
        other = _SCHEMA.decode(text)
        if other.schema not in SCHEMAS_READ:
            raise BundleVersionError(version_refusal(other.schema, other.collector_version)) from None
        raise BundleDecodeError(f"stack table: {exc}") from None
    except msgspec.DecodeError as exc:
        raise _NotJson(f"not JSON: {exc}") from None
    schema = head.schema
    if schema not in SCHEMAS_READ:
        raise BundleVersionError(version_refusal(schema, head.collector_version))
    try:
        bundle = _BODY.decode(text)
    except msgspec.DecodeError:
        # The generic decoder: a float written as null, a string not UTF-8 throughout, or what is wrong.
        data = json.loads(text.decode("utf-8", "replace") if isinstance(text, bytes) else text)
        bundle = from_plain(NodeBundle, data, "bundle")
    assert isinstance(bundle, NodeBundle)
    if schema == BUNDLE_SCHEMA_V1:
        threads = [t for s in bundle.stacks for p in s.processes for t in p.threads]
        for t in threads:
            _set_frames(t, intern_frames(t.frames))
        return bundle
    return _with_stacks(bundle, head)


def version_refusal(schema: object, collector_version: object) -> str:
    """Why a bundle is not read, with the versions named: the node runs another hangwatch."""
    by = f" (hangwatch {collector_version} on the node)" if isinstance(collector_version, str) else ""
    reads = " and ".join(SCHEMAS_READ)
    match = _VERSION.match(schema) if isinstance(schema, str) else None
    if match is None:
        return f"schema {schema!r}{by} is not a node bundle (this hangwatch reads {reads})"
    newest = int(BUNDLE_SCHEMA.rsplit("/", 1)[1])
    age = "newer" if int(match.group(1)) > newest else "older"
    return (
        f"schema {schema!r}{by} is {age} than the schemas this hangwatch reads ({reads}): "
        "run the same hangwatch version on the controller and the nodes"
    )


def _with_stacks(bundle: NodeBundle, head: _Head) -> NodeBundle:
    """/2: each thread's frames from the stack table, each entry interned once for the whole bundle."""
    threads = [t for s in bundle.stacks for p in s.processes for t in p.threads]
    if len(threads) != len(head.thread_stacks):
        raise BundleDecodeError(
            f"thread_stacks names {len(head.thread_stacks)} stacks for {len(threads)} threads"
        )
    table = [FRAME_CACHE.parsed(frames, _frames) for frames in head.stack_table]
    for t, at in zip(threads, head.thread_stacks, strict=True):
        if not 0 <= at < len(table):
            raise BundleDecodeError(f"thread_stacks: {at} is not an entry of the stack table")
        _set_frames(t, table[at])
    return bundle


def _frames(wire: tuple[_WireFrame, ...]) -> tuple[Frame, ...]:
    return intern_frames([Frame(f.name, f.file, f.line, f.native, f.code) for f in wire])


def _set_frames(thread: ThreadStack, frames: tuple[Frame, ...]) -> None:
    # The decoder has just built this thread and nothing else holds it yet: setting the field in place
    # spares a copy of each of the bundle's threads (``dataclasses.replace``).
    object.__setattr__(thread, "frames", frames)


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
    return tp(**kwargs)


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
