"""Values as the log writes them: :func:`encode` and :func:`decode`, and the stand-in classes
the replay rebuilds them as (a sequence as the log saw it, an opaque value, an int subclass,
and the base of the outside objects, which encode as the log named them)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, cast

from pagedstate.spec.types import (
    CheckpointRestoreOp,
    CheckpointStoreOp,
    StateStoreOperationId,
    SuspendedCheckpointRestore,
)
from pagedstate.spec.wire import UNHANDLED
from pagedstate.spec.wire import encode as _encode

if TYPE_CHECKING:
    from .standins import _Script

# ---------------------------------------------------------------------------------------
# Values
# ---------------------------------------------------------------------------------------


class _Seq:
    """A sequence as the log saw it; its fields are set from every line that names it."""

    __slots__ = ("sid", "state_slot", "has_per_req_cache", "__weakref__")

    def __init__(self, sid: int) -> None:
        self.sid = sid
        self.state_slot: Any = -1
        self.has_per_req_cache: Any = True

    def __repr__(self) -> str:
        return f"<seq {self.sid}>"


class _Opaque:
    """A value the log could only describe (type name and repr); equal by both."""

    __slots__ = ("type_name", "text")

    def __init__(self, type_name: str, text: str) -> None:
        self.type_name = type_name
        self.text = text

    def __repr__(self) -> str:
        return self.text

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Opaque) and (self.type_name, self.text) == (
            other.type_name,
            other.text,
        )

    def __hash__(self) -> int:
        return hash((self.type_name, self.text))


#: The stand-in classes made so far, by type name (and repr, for int subclasses); each
#: cleared past 4096 entries, a bound on the memory of a long, odd log.
_OPAQUE_TYPES: dict[str, type[_Opaque]] = {}
_OPAQUE_INT_TYPES: dict[str, type[_OpaqueInt]] = {}


def _named_subclass(
    cache: dict[str, type[_T]], key: str, base: type[_T], type_name: str, ns: dict[str, Any]
) -> type[_T]:
    """The subclass of ``base`` named ``type_name`` (a ``__qualname__``) with class
    attributes ``ns``, made once per ``key`` (``cache`` is cleared past 4096 entries)."""
    cls = cache.get(key)
    if cls is None:
        if len(cache) >= 4096:
            cache.clear()
        cls = cast(
            "type[_T]",
            type(type_name.rsplit(".", 1)[-1], (base,), {"__slots__": (), **ns}),
        )
        cls.__qualname__ = type_name
        cache[key] = cls
    return cls


def _opaque(type_name: str, text: str) -> _Opaque:
    """A stand-in for a value of type ``type_name`` (a ``__qualname__``) whose repr was
    ``text``: an instance of a subclass of :class:`_Opaque` of that name, so that an error
    message naming the value's type names the original one."""
    return _named_subclass(_OPAQUE_TYPES, type_name, _Opaque, type_name, {})(type_name, text)


class _OpaqueInt(int):
    """An int subclass as the log saw it: its value, type name (the class's) and repr."""

    __slots__ = ()
    _text = ""

    def __repr__(self) -> str:
        return self._text

    def __str__(self) -> str:
        # the plain number, as an IntEnum's str() and an f-string give (Python >= 3.11)
        return int.__repr__(self)


def _opaque_int(n: int, type_name: str, text: str) -> int:
    """A stand-in for an instance of the int subclass ``type_name`` (a ``__qualname__``)
    with value ``n`` and repr ``text``: it encodes, compares and prints as the original."""
    key = f"{type_name}\0{text}"
    return _named_subclass(_OPAQUE_INT_TYPES, key, _OpaqueInt, type_name, {"_text": text})(n)


def _stand_in(value: Any) -> Any:
    """The replay's ``extra`` hook of :func:`pagedstate.spec.wire.encode`: its own stand-ins
    encode as the log wrote their originals."""
    t = type(value)
    if t is _Seq:
        return {
            "seq": value.sid,
            "state_slot": encode(value.state_slot),
            "has_per_req_cache": encode(value.has_per_req_cache),
        }
    if isinstance(value, _Opaque):
        return {"object": value.type_name, "repr": value.text}
    if isinstance(value, _Scripted):
        return {"ext": value.name}
    return UNHANDLED


def encode(value: Any) -> Any:
    """The log's encoding of ``value`` (:func:`pagedstate.spec.wire.encode`, which the
    event log writes with); the replay's own stand-ins encode as the log wrote their
    originals."""
    return _encode(value, _stand_in)


_NAN = float("nan")
_T = TypeVar("_T")

#: An outside object's name in the log: the offload index, the first scratch pool, or the
#: K-th other scratch pool (``scratch#K``, K >= 1).
_EXT_NAME = re.compile(r"offload|scratch|scratch#[1-9][0-9]{0,8}|token#(0|[1-9][0-9]{0,17})")

_OP_FIELDS = {
    "store_op": ("src_slot", "unit_ids", "total_bytes", "layout_id"),
    "restore_op": ("dst_slot", "unit_ids", "total_bytes", "layout_id"),
    "lease": ("checkpoint_id", "op", "lease_id"),
}


def decode(
    value: Any,
    seq: Callable[[int], _Seq] | None = None,
    ext: Callable[[str], Any] | None = None,
) -> Any:
    """Rebuild the value :func:`encode` (or the log) wrote. ``seq(id)`` supplies the
    replay's sequence object for an id (its fields are then set from the encoding);
    ``ext(name)`` the stand-in for ``{"ext": name}``.

    Raises:
        ValueError: not an encoding of this format.
    """

    def d(v: Any) -> Any:
        if v is None or isinstance(v, (bool, int, str)):
            return v
        if isinstance(v, float):
            return v
        if isinstance(v, list):
            return [d(x) for x in v]
        if not isinstance(v, dict):
            raise ValueError(f"not an encoded value: {v!r}")
        if "seq" in v:
            if set(v) != {"seq", "state_slot", "has_per_req_cache"} or type(v["seq"]) is not int:
                raise ValueError(f"a sequence is {{seq, state_slot, has_per_req_cache}}: {v!r}")
            if seq is None:
                raise ValueError("a sequence where none can be")
            s = seq(v["seq"])
            s.state_slot = d(v["state_slot"])
            s.has_per_req_cache = d(v["has_per_req_cache"])
            return s
        if "int" in v:
            n, type_name, text = v.get("int"), v.get("type"), v.get("repr")
            if (
                set(v) != {"int", "type", "repr"}
                or type(n) is not int
                or not (isinstance(type_name, str) and isinstance(text, str))
            ):
                raise ValueError(f"an int subclass is {{int, type, repr}}: {v!r}")
            return _opaque_int(n, type_name, text)
        if "object" in v:
            if set(v) != {"object", "repr"} or not all(isinstance(x, str) for x in v.values()):
                raise ValueError(f"an opaque value is {{object, repr}}: {v!r}")
            return _opaque(v["object"], v["repr"])
        if len(v) != 1:
            raise ValueError(f"an encoded value has one tag: {v!r}")
        ((tag, body),) = v.items()
        if tag in ("tuple", "set", "frozenset"):
            if not isinstance(body, list):
                raise ValueError(f"{tag} needs a list: {v!r}")
            items = [d(x) for x in body]
            try:
                return {"tuple": tuple, "set": set, "frozenset": frozenset}[tag](items)
            except TypeError as exc:  # an unhashable item: no engine value encodes so
                raise ValueError(f"{tag} of an unhashable item: {exc}") from exc
        if tag == "dict":
            if not (
                isinstance(body, list) and all(isinstance(p, list) and len(p) == 2 for p in body)
            ):
                raise ValueError(f"dict needs [key, value] pairs: {v!r}")
            try:
                return {d(k): d(x) for k, x in body}
            except TypeError as exc:  # an unhashable key: no engine value encodes so
                raise ValueError(f"dict with an unhashable key: {exc}") from exc
        if tag == "float":
            if body not in ("nan", "inf", "-inf"):
                raise ValueError(f"float tag is nan, inf or -inf: {v!r}")
            # one NaN object for every logged NaN: a NaN equals nothing, so a NaN owner
            # (a transfer owner, say) is found again only as the same object, which is
            # what an engine passing one constant does (the log cannot tell two NaNs apart)
            return _NAN if body == "nan" else float(body)
        if tag == "bytes":
            if not isinstance(body, str):
                raise ValueError(f"bytes needs hex: {v!r}")
            return bytes.fromhex(body)
        if tag == "op":
            if not (isinstance(body, list) and len(body) == 2):
                raise ValueError(f"op is [prefix_hash, generation]: {v!r}")
            return StateStoreOperationId(d(body[0]), d(body[1]))
        if tag in _OP_FIELDS:
            names = _OP_FIELDS[tag]
            if not (isinstance(body, dict) and set(body) == set(names)):
                raise ValueError(f"{tag} has fields {names}: {v!r}")
            fields = {k: d(body[k]) for k in names}
            if tag == "store_op":
                return CheckpointStoreOp(**fields)
            if tag == "restore_op":
                return CheckpointRestoreOp(**fields)
            return SuspendedCheckpointRestore(**fields)
        if tag == "ext":
            if ext is None or not _EXT_NAME.fullmatch(body if isinstance(body, str) else ""):
                raise ValueError(f"unknown outside object: {v!r}")
            return ext(body)
        raise ValueError(f"unknown tag {tag!r}")

    return d(value)


# The base of the outside objects' stand-ins (:mod:`.standins`), here because
# :func:`encode` names them as the log did (``{"ext": name}``).
class _Scripted:
    name = ""

    def __init__(self, script: _Script, name: str | None = None) -> None:
        self._script = script
        if name is not None:
            self.name = name
