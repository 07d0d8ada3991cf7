"""What the exhaustive mode sees of a store: every answer of every call, and a sweep of
read-only questions.

:func:`~pagedstate.engines.conformance.run_exhaustive` drives the reference and the store
under test through the explorer's world (:class:`pagedstate.models.world.World`), whose
actions return only some of the coordinator's answers (a drain's ops, a restore's bool). So
that every answer is compared, both coordinators are observed while an action runs: each
call of a coordinator method (and each read of ``last_forward``/``next_forward``) the world
makes is logged with its answer or the class of the error it raised. The reference is
observed by a subclass (:func:`recording_reference`), the store under test through a proxy
(:class:`Observed`) that forwards everything else. Only the outermost calls are logged: a
method that calls another of its own coordinator's methods logs once.

Answers are compared by value and by type, all the way down (:func:`strict`): ``1`` is not
``True``, ``1.0`` is not ``1``, a list is not a tuple.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import attrs

from pagedstate.models.world import Config, seq
from pagedstate.spec.ops import _ImageOp
from pagedstate.spec.snapshot import Snapshot

__all__ = [
    "RECORDED",
    "Observed",
    "answers",
    "differ",
    "questions",
    "recording_reference",
    "show",
    "strict",
    "type_diff",
]

#: The coordinator calls whose answers are logged: every method of
#: :class:`~pagedstate.spec.protocols.CoordinatorProtocol` the world calls or could, plus
#: the two forward properties it reads. Left out: ``snapshot`` (compared on its own),
#: ``clone`` and the attachments made once at construction.
RECORDED: frozenset[str] = frozenset(
    {
        "acquire_checkpoint_source",
        "adopt_transfer_units",
        "applies",
        "begin_restore",
        "cancel_midstep",
        "checkpoint",
        "checkpoint_fates",
        "clear_index",
        "complete_previous_batch",
        "contains",
        "ensure_free_units",
        "forget_pending",
        "has_available_units",
        "has_offload_pins",
        "is_idle",
        "last_forward",
        "next_forward",
        "outstanding",
        "publish_midstep",
        "reclaim_stale_offload_pins",
        "release_offload_store_source",
        "release_suspended_restore",
        "release_transfer_units",
        "reserve_midstep",
        "reserve_transfer_units",
        "restore_queued_for",
        "resumable_hit",
        "resume_suspended_restore",
        "settle_completions",
        "settle_offload_store",
        "suspend_queued_restore",
        "take_checkpoint_ops",
        "take_offload_stores",
        "unindex",
        "was_reclaimed",
    }
)

_PROPERTIES = frozenset({"last_forward", "next_forward"})


@attrs.define
class _Log:
    """The calls of the action now running (``None``: not logging) and the call depth."""

    calls: list[tuple[Any, ...]] | None = None
    depth: int = 0


LOG = _Log()

_SCALARS = (bool, int, float, str, bytes, type(None))


def strict(value: Any) -> Any:
    """``value`` with its type at every level, for comparisons where ``1 != True``.

    Tuples, lists, dicts and sets (and their subclasses: named tuples), the image ops
    (:class:`~pagedstate.spec.ops.CheckpointStoreOp`, ``CheckpointRestoreOp``: by their
    slot, units, bytes and layout) and attrs instances are taken apart, keys included;
    other objects are compared as they are, with their type beside them.
    """
    t = type(value)
    if t in _SCALARS:
        return (t, value)
    if isinstance(value, (tuple, list)):
        return (t, tuple(strict(x) for x in value))
    if isinstance(value, dict):
        return (t, {strict(k): strict(x) for k, x in value.items()})
    if isinstance(value, (frozenset, set)):
        return (t, frozenset(strict(x) for x in value))
    if isinstance(value, _ImageOp):
        return (t, strict(value._key()))
    names = _FIELDS.get(t)
    if names is None:
        names = _FIELDS[t] = tuple(f.name for f in attrs.fields(t)) if attrs.has(t) else ()
    if names:
        return (t, tuple(strict(getattr(value, n)) for n in names))
    return (t, value)


_FIELDS: dict[type, tuple[str, ...]] = {}


def _logged(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        log = LOG
        if log.depth or log.calls is None:
            return fn(*args, **kwargs)
        log.depth += 1
        try:
            out = fn(*args, **kwargs)
        except BaseException as exc:
            log.depth -= 1
            if log.calls is not None:
                log.calls.append((name, "raised", type(exc)))
            raise
        log.depth -= 1
        if log.calls is not None:
            log.calls.append((name, "ok", strict(out)))
        return out

    return call


def _note_read(name: str, value: Any) -> None:
    if LOG.calls is not None and not LOG.depth:
        LOG.calls.append((name, "ok", strict(value)))


@functools.cache
def recording_reference(cls: type) -> type:
    """A subclass of the reference coordinator class ``cls`` whose :data:`RECORDED` calls
    are logged (its ``clone`` keeps the class); one per ``cls``, cached.

    Raises:
        TypeError: ``last_forward`` or ``next_forward`` is not a property of ``cls`` (the
            proxy logs those reads, so the reference must too).
    """
    ns: dict[str, Any] = {}
    for name in RECORDED:
        attr = inspect.getattr_static(cls, name, None)
        if isinstance(attr, property):
            fget = attr.fget
            assert fget is not None

            def read(self: Any, _name: str = name, _fget: Any = fget) -> Any:
                value = _fget(self)
                _note_read(_name, value)
                return value

            ns[name] = property(read)
        elif callable(attr):
            ns[name] = functools.wraps(attr)(_logged(name, attr))
    missing = _PROPERTIES - {n for n, a in ns.items() if isinstance(a, property)}
    if missing:  # the proxy logs these reads; the reference must too
        raise TypeError(f"{cls.__name__}: {sorted(missing)} are not properties")
    return type(f"Recording{cls.__name__}", (cls,), ns)


class Observed:
    """A store under test's coordinator behind a proxy that logs its :data:`RECORDED`
    calls and forwards every other attribute (reads and writes) unchanged."""

    __slots__ = ("_target",)

    def __init__(self, target: Any) -> None:
        object.__setattr__(self, "_target", target)

    @property
    def target(self) -> Any:
        """The coordinator itself."""
        return self._target

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._target, name)
        if name in RECORDED:
            if name in _PROPERTIES:
                _note_read(name, value)
                return value
            if callable(value):
                return _logged(name, value)
        return value

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._target, name, value)

    def __repr__(self) -> str:
        return f"Observed({self._target!r})"


#: A read-only question: (method or property name, arguments; ``None`` for a property).
Question = tuple[str, tuple[Any, ...] | None]


def questions(cfg: Config) -> tuple[Question, ...]:
    """The read-only questions asked of both coordinators in every new state: ``contains``
    of each hash, ``restore_queued_for`` of each slot (and one past them),
    ``has_available_units(count, protected)`` for every count up to two past the pool and
    every protected hash, ``is_idle``, ``outstanding``, ``has_offload_pins``,
    ``checkpoint_fates``, the two forward properties, and for each sequence ``applies``
    and ``resumable_hit`` of a KV hit of each length over the hashes (assumed checkpointed
    or not)."""
    hashes = range(1, cfg.hashes + 1)
    out: list[Question] = [("contains", (h,)) for h in hashes]
    out += [("restore_queued_for", (s,)) for s in range(cfg.seqs + cfg.scratch_slots + 1)]
    out += [("has_available_units", (k, p)) for k in range(cfg.units + 2) for p in (None, *hashes)]
    out += [("is_idle", ()), ("outstanding", ()), ("has_offload_pins", ())]
    out += [("checkpoint_fates", ()), ("last_forward", None), ("next_forward", None)]
    blocks = list(hashes)
    for i in range(cfg.seqs):
        s = seq(i, i)  # the world's own sequence objects
        out.append(("applies", (s,)))
        out += [
            ("resumable_hit", (s, hit, blocks, assume))
            for hit in range(len(blocks) + 1)
            for assume in (False, True)
        ]
    return tuple(out)


def answers(coord: Any, asked: tuple[Question, ...]) -> list[Any]:
    """``coord``'s answer to each question (strict; a raised error as its class). An
    :class:`Observed` coordinator is asked directly."""
    if type(coord) is Observed:
        coord = coord.target
    out: list[Any] = []
    for name, args in asked:
        try:
            value = getattr(coord, name)
            out.append(("ok", strict(value if args is None else value(*args))))
        except Exception as exc:  # noqa: BLE001 - every outcome is compared
            out.append(("raised", type(exc)))
    return out


# -- messages ---------------------------------------------------------------------------


def differ(r: tuple[Any, ...], s: tuple[Any, ...]) -> str:
    """What differs between two unequal outcomes ``(kind, value, calls)`` of an action
    (``kind`` ``"ok"``, ``"raised"``, ...; values strict; calls as :data:`LOG` logs them)."""
    if r[:2] != s[:2]:
        return (
            f"results differ: the reference {r[0]} {show(r[1])}, the store under test"
            f" {s[0]} {show(s[1])}"
        )
    for i, (a, b) in enumerate(zip(r[2], s[2], strict=False)):
        if a != b:
            return (
                f"call {i + 1} of the action differs: the reference's {a[0]} {a[1]}"
                f" {show(a[2])}, the store under test's {b[0]} {b[1]} {show(b[2])}"
            )
    return (
        f"the calls differ: the reference made {[c[0] for c in r[2]]}, the store under test"
        f" {[c[0] for c in s[2]]}"
    )


def show(value: Any) -> str:
    """A strict value (or an error class) as it would print (``1``, ``True``, ``1.0``,
    ``(0, 1)`` and ``[0, 1]`` all read differently)."""
    if isinstance(value, type):
        return value.__name__
    if not (isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], type)):
        return repr(value)
    t, v = value
    # A subclass of a builtin reads as its base, so its name is added.
    sub = "" if t in _BUILTINS else f" ({t.__qualname__})"
    if issubclass(t, tuple):
        return "(" + ", ".join(show(x) for x in v) + ("," if len(v) == 1 else "") + ")" + sub
    if issubclass(t, list):
        return "[" + ", ".join(show(x) for x in v) + "]" + sub
    if issubclass(t, dict):
        return "{" + ", ".join(f"{show(k)}: {show(x)}" for k, x in v.items()) + "}" + sub
    if issubclass(t, (frozenset, set)):
        return f"{t.__name__}({{{', '.join(sorted(show(x) for x in v))}}})"
    if attrs.has(t) and isinstance(v, tuple):
        names = [f.name for f in attrs.fields(t)]
        inner = ", ".join(f"{n}={show(x)}" for n, x in zip(names, v, strict=True))
        return f"{t.__name__}({inner})"
    if isinstance(v, tuple) and issubclass(t, _ImageOp):
        return f"{t.__name__}{show(v)}"
    if issubclass(t, (int, float, str, bytes)) and t not in _BUILTINS:
        return f"{v!r}{sub}"
    return repr(v)


def type_diff(a: Snapshot, b: Snapshot) -> str:
    """The fields of two equal snapshots whose values differ in type somewhere."""
    out = []
    for f in attrs.fields(Snapshot):
        x, y = strict(getattr(a, f.name)), strict(getattr(b, f.name))
        if x != y:
            out.append(f"{f.name}: {show(x)} != {show(y)}")
    return "; ".join(out)


_BUILTINS = (bool, int, float, str, bytes, type(None), tuple, list, dict, set, frozenset)
