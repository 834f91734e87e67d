"""Encode and decode :mod:`procsv.ipc.messages` to and from ZeroMQ frames, with validation.

Run in every process. Wire format of one message: frame 0 is a JSON object
``{"v": SCHEMA_VERSION, "kind": KIND, "body": {...fields...}}``; frames 1.. are binary payloads
(tensor bytes, serialized protos) whose meaning the message's fields describe. A message that is
not valid JSON, has an unknown kind or version, a field of the wrong type (checked element by
element, into nested dataclasses) or an enum field with a value outside its enum raises
:class:`ProtocolError`; a service drops such a message and keeps running.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from enum import Enum
from functools import lru_cache
from typing import Any, Sequence, Union

from procsv.ipc.messages import ALL_MESSAGES, SCHEMA_VERSION, Message

_BY_KIND: dict[str, type[Message]] = {m.KIND: m for m in ALL_MESSAGES}

Frames = Sequence[Union[bytes, memoryview, Any]]


class ProtocolError(ValueError):
    """A message could not be decoded: malformed JSON, unknown kind or version, bad field."""


def encode(msg: Message, payload: Sequence[Any] = ()) -> list[Any]:
    """Return the frames for ``msg`` followed by its binary ``payload`` frames (not copied)."""
    body = {f.name: _to_json(getattr(msg, f.name)) for f in dataclasses.fields(msg)}
    header = json.dumps({"v": SCHEMA_VERSION, "kind": msg.KIND, "body": body}, separators=(",", ":"))
    return [header.encode(), *payload]


def decode(frames: Frames) -> tuple[Message, list[Any]]:
    """Parse frames into ``(message, payload_frames)``; raise :class:`ProtocolError` if invalid."""
    if not frames:
        raise ProtocolError("empty message")
    head = frames[0]
    raw = head.bytes if hasattr(head, "bytes") else bytes(head)
    try:
        obj = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ProtocolError(f"header is not JSON: {type(exc).__name__}") from None
    if not isinstance(obj, dict):
        raise ProtocolError("header is not an object")
    version, kind = obj.get("v"), obj.get("kind")
    if type(version) is not int or version != SCHEMA_VERSION:
        raise ProtocolError(f"schema version {version!r:.40}, expected {SCHEMA_VERSION}")
    cls = _BY_KIND.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ProtocolError(f"unknown message kind {kind!r:.60}")
    body = obj.get("body")
    if not isinstance(body, dict):
        raise ProtocolError("body is not an object")
    msg: Message = _build(cls, body)
    return msg, list(frames[1:])


def _to_json(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _to_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, (list, tuple)):
        return [_to_json(v) for v in value]
    if isinstance(value, dict):
        return {k: _to_json(v) for k, v in value.items()}
    return value


@lru_cache(maxsize=None)
def _hints(cls: type) -> dict[str, Any]:
    import procsv.ipc.messages as mod

    return typing.get_type_hints(cls, vars(mod))


def _build(cls: type, body: dict[str, Any]) -> Any:
    hints = _hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name in body:
            kwargs[f.name] = _check(body[f.name], hints[f.name], f"{cls.__name__}.{f.name}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ProtocolError(f"{cls.__name__}: missing field {f.name!r}")
    unknown = set(body) - {f.name for f in dataclasses.fields(cls)}
    if unknown:
        raise ProtocolError(f"{cls.__name__}: unknown fields {sorted(unknown)}")
    return cls(**kwargs)


def _check(value: Any, tp: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        options = typing.get_args(tp)
        if value is None and type(None) in options:
            return None
        errors: list[str] = []
        for opt in options:
            if opt is type(None):
                continue
            try:
                return _check(value, opt, where)
            except ProtocolError as exc:
                errors.append(str(exc))
        raise ProtocolError(errors[0] if errors else f"{where}: bad value")
    if origin is dict:
        if not isinstance(value, dict):
            raise ProtocolError(f"{where}: expected an object, got {type(value).__name__}")
        key_tp, val_tp = typing.get_args(tp)
        return {_check(k, key_tp, where): _check(v, val_tp, where) for k, v in value.items()}
    if origin is list:
        if not isinstance(value, list):
            raise ProtocolError(f"{where}: expected a list, got {type(value).__name__}")
        (item_tp,) = typing.get_args(tp)
        return [_check(v, item_tp, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(tp, type) and issubclass(tp, Enum):
        if not isinstance(value, str):
            raise ProtocolError(f"{where}: expected a string, got {type(value).__name__}")
        try:
            return tp(value)
        except ValueError:
            raise ProtocolError(f"{where}: {value!r:.40} is not one of "
                                f"{sorted(str(m.value) for m in tp)}") from None
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ProtocolError(f"{where}: expected an object")
        return _build(tp, value)
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ProtocolError(f"{where}: expected a number, got {type(value).__name__}")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ProtocolError(f"{where}: expected an integer, got {type(value).__name__}")
        return value
    if tp in (str, bool):
        if not isinstance(value, tp):
            raise ProtocolError(f"{where}: expected {tp.__name__}, got {type(value).__name__}")
        return value
    raise ProtocolError(f"{where}: unsupported type {tp!r}")
