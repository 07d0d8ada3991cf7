"""The receiver's give-up path: the rounds in flight when the sender is lost.

With ``pipeline=1`` one round is in flight at a time; with ``pipeline=2`` a second one, the
successor, is already accepted (reserved, its local restores suspended) while the first
one's payload is posted. A lost sender (no GO, a failed control message, a payload that
failed or passed its deadline) gives every round in flight up, **all of them by one rule**:
the data group is aborted before any reservation of any of them is released (a receive
still posted could otherwise land in units handed to someone else), and a data group that
cannot be aborted keeps every reservation of every round in flight (quarantined, held to
the end of the run). The successor has no receive posted (its GO never came), so for it the
rule is conservative: one rule for everything in flight, nothing to get wrong about which
round a late receive could still write.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from .errors import PayloadLost, WireError
from .side import Incoming
from .wire import CTRL_LEN, KIND_ABANDON, KIND_LATE, MAGIC, Posted

if TYPE_CHECKING:
    from .receiver import Receiver
    from .wire import Link


@attrs.define(eq=False)
class _Accepted:
    """One round on the receiver, from its ROUND to its adoption: its images (``incs``,
    filled as they are accepted), the slots it expects to check (``expect``: slot ->
    ``(index, what, key)``), its first staging buffer and slot (``base``), and its payload
    once posted (``posted``)."""

    rnd: int
    base: int
    incs: list[Incoming] = attrs.Factory(list)
    replies: list[Any] = attrs.Factory(list)
    expect: dict[int, tuple[int, str, int]] = attrs.Factory(dict)
    replied: bool = False
    posted: Posted | None = None


def _give_up_rounds(
    r: Receiver,
    link: Link,
    rounds: list[_Accepted],
    err: WireError,
    outcome: dict[int, list[str]],
    local: dict[str, int],
) -> dict[str, Any]:
    """The rounds in flight are lost (``err``: no GO, a control message failed, or a
    payload failed): give every image of every one of them up, those whose bytes fully
    arrived too (nothing of a lost round is landed or adopted). The data group was aborted
    before ``err`` was raised (:meth:`Link.wait`) or given (:meth:`Link.cancel`), so the
    reservations are released (``release_transfer_units``) only now, when nothing can land
    in them; a payload that could not be aborted (``err.aborted`` False) has the
    reservations of **every** round in flight kept (:meth:`Receiver.quarantine`) and its
    staging buffers never reused (replaced). Every suspended local restore is resumed and
    run here (the caller checks the slots). Then ABANDON (of the first round in flight,
    counting every image given up) tells the sender (best effort), and with
    ``fault="sender_stalls_mid_payload"`` the receiver waits for the sender's late send
    (LATE) and counts the bytes of the rounds' units and staging buffers that changed since
    the give-up (``late_writes``: must be 0). Returns ``payload``, ``rounds``,
    ``quarantined`` and ``late_writes`` for the result."""
    cfg = r.cfg
    staged = cfg.payload == "staged"
    safe = not isinstance(err, PayloadLost) or err.aborted
    out: dict[str, Any] = {"quarantined": [], "rounds": [rr.rnd for rr in rounds]}
    if isinstance(err, PayloadLost):
        out["payload"] = {
            "round": next((rr.rnd for rr in rounds if rr.posted is not None), rounds[0].rnd),
            "works_done": err.done,
            "works": err.works,
            "aborted": err.aborted,
            "how": err.how,
        }
    incs = [inc for rr in rounds for inc in rr.incs]
    for inc in incs:
        resumed = inc.suspended is not None
        if safe:
            r.abort(inc)
            outcome.setdefault(inc.header.index, []).append("aborted")
        else:
            r.quarantine(inc)
            out["quarantined"].append(inc.header.index)
            outcome.setdefault(inc.header.index, []).append("quarantined")
        local["resumed"] += resumed
    index = [rr.base + k for rr in rounds for k in range(len(rr.incs))] if staged else []
    staging = [r.staging[i] for i in index]
    if not safe and staged:  # a late receive may write them: never use them again
        torch = r.torch
        if r.rows is not None:
            r.new_rows()  # the old rows stay alive in `staging` above, never reused
        else:
            for i in index:
                r.staging[i] = torch.zeros_like(r.staging[i])
    r.run_batch()  # the resumed local restores run (and released units are scrubbed)
    watch = cfg.fault == "sender_stalls_mid_payload" and bool(incs)
    units = [u for inc in incs for u in inc.units]
    before = [r.tensors.read_units(units).clone(), *[t.clone() for t in staging]] if watch else []
    try:
        link.send_ints([MAGIC, KIND_ABANDON, rounds[0].rnd, len(incs), 0, 0, 0, 0])
    except WireError:
        pass  # the sender is gone: nobody to tell
    if watch:
        try:
            late = link.recv_ints(CTRL_LEN)
        except WireError:
            late = []
        if late[:2] == [MAGIC, KIND_LATE]:
            after = [r.tensors.read_units(units), *staging]
            out["late_writes"] = int(
                sum(int((a != b).sum()) for a, b in zip(after, before, strict=True))
            )
    return out


def _fail_rounds(r: Receiver, link: Link, rounds: list[_Accepted]) -> None:
    """The run fails (a step raised) with ``rounds`` in flight: no reservation or suspended
    restore of them outlives it. A payload still posted is aborted first
    (:meth:`Link.cancel`); then every image not yet adopted is released (or, when the data
    group could not be aborted, a reserved one is quarantined), its local restore resumed."""
    safe = True
    for rr in rounds:
        if rr.posted is not None and rr.posted.state == "posted":
            lost = link.cancel(rr.posted, "the receiver failed with the payload in flight")
            safe = safe and (lost is None or lost.aborted)
    for rr in rounds:
        for inc in rr.incs:
            if not safe and inc.state == "reserved":
                r.quarantine(inc)
            elif inc.state in ("reserved", "landed"):
                r.abort(inc)
