"""Encode and decode :mod:`procsv.ipc.messages` to and from ZeroMQ frames, with validation.

Run in every process. Wire format of one message: frame 0 is a JSON object
``{"v": SCHEMA_VERSION, "kind": KIND, "body": {...fields...}}``; frames 1.. are binary payloads
(tensor bytes, serialized protos) whose meaning the message's fields describe.

Every input is either a message or a typed rejection: :func:`decode` returns ``(message,
payload)`` or raises :class:`ProtocolError` (never another exception), whose ``reason`` (a
:class:`RejectReason`) says what was wrong: no frames or an empty header, a header that is not
UTF-8 JSON (binary, truncated), not an object, another schema version (:class:`SchemaMismatch`,
which names it), an unknown kind, a kind this receiver does not take (``accept``), a field
missing, unknown or of the wrong type (checked element by element, into nested dataclasses; an
enum field takes only its enum's values), or a number of payload frames other than the header
announces (:func:`payload_frames`). A receiver counts the rejection
(:class:`procsv.ipc.rejections.Rejections`) and keeps running.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import types
import typing
from enum import Enum, StrEnum
from functools import lru_cache
from typing import AbstractSet, Any, Optional, Sequence, Union

from procsv.ipc.messages import (ALL_MESSAGES, SCHEMA_VERSION, GraphEvent, GroupCopy, Message, Relayed, ReplicaCopy, SaveData,
                                 SummaryBatch)

_BY_KIND: dict[str, type[Message]] = {m.KIND: m for m in ALL_MESSAGES}

Frames = Sequence[Union[bytes, memoryview, Any]]
INT_MIN, INT_MAX = -(1 << 63), (1 << 63) - 1  # an int field holds an int64 (as it does in TF and NumPy)


def loads_untrusted(text: Union[str, bytes]) -> Any:
    """``json.loads`` of bytes a peer sent, with the cyclic collector held off while it parses.

    A header nested a thousand deep takes the C decoder to the recursion limit (it is then refused); a
    collection the decoder's allocations set off down there would run other objects' finalizers (a socket's,
    a generator's) with no stack left: each would fail as an unraisable ``RecursionError`` and its cleanup
    be lost. Off only for the parse (a few microseconds); the collector runs at the next allocation after.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        return json.loads(text)
    finally:
        if enabled:
            gc.enable()


class RejectReason(StrEnum):
    """Why a message was refused; the values are the keys of the rejection counters."""

    EMPTY = "empty"  # no frame at all, or an empty header frame
    NOT_JSON = "not_json"  # the header is not UTF-8 JSON (binary garbage, truncated)
    NOT_OBJECT = "not_object"  # JSON, but not {"v", "kind", "body"} with an object body
    SCHEMA_VERSION = "schema_version"  # another (or no) schema version: see SchemaMismatch
    UNKNOWN_KIND = "unknown_kind"  # no message of that kind exists
    UNEXPECTED_KIND = "unexpected_kind"  # a real kind, but not one this receiver takes
    BAD_FIELD = "bad_field"  # a field missing, unknown, of the wrong type or outside its enum
    FRAMES = "frames"  # the payload frames do not match what the header announces
    NO_IDENTITY = "no_identity"  # a ROUTER got a message without a body behind the peer's identity


class ProtocolError(ValueError):
    """A message was refused; ``reason`` says why (the counters' key), the text says where."""

    def __init__(self, text: str, reason: RejectReason = RejectReason.BAD_FIELD) -> None:
        super().__init__(text)
        self.reason = reason


class SchemaMismatch(ProtocolError):
    """A message of another schema version (``version``: what it said, None if nothing usable):
    a process of another procsv release is talking to this run."""

    def __init__(self, version: Optional[int]) -> None:
        super().__init__(f"schema version {version!r:.40}, expected {SCHEMA_VERSION}", RejectReason.SCHEMA_VERSION)
        self.version = version


def encode(msg: Message, payload: Sequence[Any] = ()) -> list[Any]:
    """Return the frames for ``msg`` followed by its binary ``payload`` frames (not copied).

    A :class:`SaveData`'s tensor specs are encoded once per spec object (:func:`_spec_text`): the
    trainer's in-memory snapshots hand the same objects over again while the tensors keep their
    shapes and offsets (:mod:`procsv.trainer.checkpoint.layout`), and their encoding was most of
    the header's (issue 54)."""
    if type(msg) is SaveData:
        return [_save_header(msg).encode(), *payload]
    body = {name: _to_json(getattr(msg, name)) for name in _field_names(type(msg))}
    header = json.dumps({"v": SCHEMA_VERSION, "kind": msg.KIND, "body": body}, separators=(",", ":"))
    return [header.encode(), *payload]


_SPEC_TEXT: dict[int, tuple[Any, str]] = {}  # id(spec) -> (that spec, its JSON); the spec is held: its id stays its own
_SPEC_TEXT_MAX = 4096


def _save_header(msg: SaveData) -> str:
    """:func:`encode`'s header of a :class:`SaveData`: the same JSON object, its specs' text reused."""
    body = {name: _to_json(getattr(msg, name)) for name in _field_names(SaveData) if name != "tensors"}
    head = json.dumps({"v": SCHEMA_VERSION, "kind": msg.KIND, "body": body}, separators=(",", ":"))
    return head[:-2] + ',"tensors":[' + ",".join(map(_spec_text, msg.tensors)) + "]}}"  # (the body's, the header's })


def _spec_text(spec: Any) -> str:
    """The JSON of one tensor spec, made once per spec object (a spec is frozen)."""
    held = _SPEC_TEXT.get(id(spec))
    if held is not None and held[0] is spec:
        return held[1]
    if len(_SPEC_TEXT) >= _SPEC_TEXT_MAX:
        _SPEC_TEXT.clear()
    text = json.dumps(_to_json(spec), separators=(",", ":"))
    _SPEC_TEXT[id(spec)] = (spec, text)
    return text


def decode(frames: Frames, accept: Optional[AbstractSet[type[Message]]] = None) -> tuple[Message, list[Any]]:
    """Parse frames into ``(message, payload_frames)``; raise :class:`ProtocolError` if invalid.

    ``accept``: the message classes this receiver takes (None: any); another kind is refused with
    ``UNEXPECTED_KIND``. Nothing but :class:`ProtocolError` escapes, whatever the bytes.
    """
    if not frames:
        raise ProtocolError("empty message", RejectReason.EMPTY)
    head = frames[0]
    raw = head.bytes if hasattr(head, "bytes") else bytes(head)
    if not raw:
        raise ProtocolError("empty header frame", RejectReason.EMPTY)
    try:
        obj = loads_untrusted(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ProtocolError("header is not UTF-8", RejectReason.NOT_JSON) from None
    except (ValueError, RecursionError) as exc:  # JSONDecodeError; an integer of more than 4300 digits
        raise ProtocolError(f"header is not JSON: {type(exc).__name__}", RejectReason.NOT_JSON) from None
    if not isinstance(obj, dict):
        raise ProtocolError("header is not an object", RejectReason.NOT_OBJECT)
    version, kind = obj.get("v"), obj.get("kind")
    if type(version) is not int or version != SCHEMA_VERSION:
        raise SchemaMismatch(version if type(version) is int else None)
    cls = _BY_KIND.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ProtocolError(f"unknown message kind {kind!r:.60}", RejectReason.UNKNOWN_KIND)
    if accept is not None and cls not in accept:
        raise ProtocolError(f"a {kind} message, which this receiver does not take", RejectReason.UNEXPECTED_KIND)
    body = obj.get("body")
    if not isinstance(body, dict):
        raise ProtocolError("body is not an object", RejectReason.NOT_OBJECT)
    try:
        msg: Message = _build(cls, body)
    except ProtocolError:
        raise
    except Exception as exc:  # a case _check does not foresee: refused and counted, never a dead loop
        raise ProtocolError(f"{cls.__name__}: {type(exc).__name__}: {exc}"[:200]) from None
    payload = list(frames[1:])
    want = payload_frames(msg)
    if len(payload) != want:
        raise ProtocolError(f"{cls.__name__}: {len(payload)} payload frames, its header announces {want}",
                            RejectReason.FRAMES)
    return msg, payload


def payload_frames(msg: Message) -> int:
    """How many payload frames follow ``msg``'s header (see :mod:`procsv.ipc.messages`).

    ``SaveData``: one per tensor without an ``offset`` (one with an offset needs ``arena``), and
    one for the meta graph if ``meta_graph``;
    ``SummaryBatch``: one per proto, one for the columns if any, one per item; ``GraphEvent``: one;
    ``Relayed``: its ``frames``; ``GroupCopy``, ``ReplicaCopy``: one per tensor; others: none.
    """
    if isinstance(msg, SaveData):
        if msg.arena is None and any(t.offset is not None for t in msg.tensors):
            raise ProtocolError("SaveData: a tensor at an offset, but no arena")
        return sum(1 for t in msg.tensors if t.offset is None) + (1 if msg.meta_graph else 0)
    if isinstance(msg, SummaryBatch):
        if msg.columns < 0:
            raise ProtocolError(f"SummaryBatch.columns: {msg.columns} is negative")
        return len(msg.protos) + (1 if msg.columns else 0) + len(msg.items)
    if isinstance(msg, GraphEvent):
        return 1
    if isinstance(msg, (GroupCopy, ReplicaCopy)):
        return len(msg.tensors)
    if isinstance(msg, Relayed):
        if msg.frames < 1:
            raise ProtocolError(f"Relayed.frames: {msg.frames} (a relayed message has at least its header)")
        return msg.frames
    return 0


_PLAIN = frozenset({str, int, float, bool, type(None)})  # exact types: an IntEnum or StrEnum is not one


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _field_names(cls: Any) -> tuple[str, ...]:
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in dataclasses.fields(cls))
    return names


def _to_json(value: Any) -> Any:
    """``value`` as JSON-ready data: dataclasses as objects, enums as their values, tuples as lists.

    On every message's send path (a checkpoint's header holds a nested spec per tensor): plain
    values are recognised by their exact type first, and a dataclass's field names are looked up
    once per class."""
    tp = type(value)
    if tp in _PLAIN:
        return value
    if tp is list or tp is tuple:
        return [_to_json(v) for v in value]
    if dataclasses.is_dataclass(tp):
        return {name: _to_json(getattr(value, name)) for name in _field_names(tp)}
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, (list, tuple)):
        return [_to_json(v) for v in value]
    if isinstance(value, dict):
        return {k: _to_json(v) for k, v in value.items()}
    return value


@lru_cache(maxsize=None)
def _hints(cls: type) -> dict[str, Any]:
    """The field types of a message class, resolved in the module that defines it."""
    return typing.get_type_hints(cls)


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
        if value != value:  # NaN (Python's JSON reads it; no procsv message means it)
            raise ProtocolError(f"{where}: NaN")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ProtocolError(f"{where}: expected an integer, got {type(value).__name__}")
        if not INT_MIN <= value <= INT_MAX:  # steps, pids, sizes, shapes: all int64 where they are used
            raise ProtocolError(f"{where}: {value:.3g} is outside int64")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise ProtocolError(f"{where}: expected str, got {type(value).__name__}")
        try:
            value.encode("utf-8")  # JSON may escape a lone surrogate, which no file or log can take
        except UnicodeEncodeError:
            raise ProtocolError(f"{where}: not valid Unicode (a lone surrogate)") from None
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ProtocolError(f"{where}: expected bool, got {type(value).__name__}")
        return value
    raise ProtocolError(f"{where}: unsupported type {tp!r}")
