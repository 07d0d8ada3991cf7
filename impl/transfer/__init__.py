"""Prefill/decode transfer of checkpoint images between two processes (SPEC D.12).

An engine that splits prefill and decode across instances moves checkpoint images from the
prefill instance's pool to the decode instance's pool. The store already has the protocol
(SPEC D.12); this module runs it between two real processes over ``torch.distributed``:
``gloo`` on CPU tensors (CI, two local processes), ``nccl`` on two GPUs.

Roles
-----
Rank 0 is the **sender** (prefill). It owns a production
:class:`~pagedstate.impl.UnitPool` and
:class:`~pagedstate.impl.PagedStateCheckpointCoordinator` (taken by name at run time, see
the layering note below), ``StateTensors`` of the model's layout and a
``TorchCopyExecutor``. For every image it writes a deterministic pseudo-random state into a
slot, files a checkpoint, drains, executes the store op on the tensors and completes the
batch: the image is READY in its pool. To send it, it leases the image
(``acquire_checkpoint_source(h)``: a source pin that is never timed out), and ends the lease
only by its terminal path: ``release_offload_store_source(op)`` once its units have been read
(phase 1) and ``settle_offload_store(op)`` once the send completed or was given up (phase 2).

Rank 1 is the **receiver** (decode). Per image it checks the header (``layout_id`` digest,
``image_bytes``, unit count: SPEC A.1), reserves units (``reserve_transfer_units(owner)``,
``owner`` a :class:`LoadOperationId` with a fresh attempt number, SPEC A.3), suspends an older
local restore queued into the destination slot (``suspend_queued_restore``), receives the
bytes into the reserved units, adopts them (``adopt_transfer_units``: READY with no free
window, or released as a duplicate) and releases the suspended restore; on failure it
releases the reservation and resumes the suspended restore. Then it restores the image into
the slot (``begin_restore`` + drain + execute + complete) and compares the slot's carried
bytes bit for bit with the image regenerated from the seed.

Wire protocol
-------------
Control messages are int64 tensors of fixed length on a gloo group (the default group with
``gloo``; a ``gloo`` subgroup next to ``nccl``, so the host reads them without a device
sync); image bytes go over the **data group**, a subgroup of the run's backend of their own
(``nccl`` on GPUs), so that a lost payload can be aborted without losing the control
messages (see "A lost payload" below)::

    S -> R  HELLO   [MAGIC, VERSION, page_unit_bytes, image_bytes, units, len, digest, payload]
    S -> R          layout_id as len uint8 bytes
    S -> R          [pipeline, window, 0, 0, 0, 0, 0, 0] (VERSION 2: both ranks must agree)
    R -> S  WELCOME [MAGIC, status, reason, 0]          (refused: both sides raise)
    per round of up to `window` images:
    S -> R  ROUND   [MAGIC, KIND_ROUND, round, count, 0, 0, 0, 0] followed, in the same
                    message, by count x [index, prefix_hash, units, image_bytes, digest,
                    variant, 0, 0], zero-padded to `window` headers
    R -> S  REPLIES count x [index, status, reason, free_units]
    S -> R  GO      [MAGIC, KIND_PAYLOAD, round, accepted, 0, 0, 0, 0]: the payload follows
                    (the receiver posts its receives only now: on NCCL a posted receive
                    cannot be withdrawn if the sender is lost first)
    S -> R  PAYLOAD the accepted images' bytes, in header order (one grouped p2p batch)
    with pipeline=2, GO of round k and ROUND of round k+1 (or END) are one message:
    S -> R  GO + ROUND  [MAGIC, KIND_PAYLOAD, k, accepted, 0, 0, 0, 0] + ROUND(k+1) or END
                    (round k's receives are posted on it, round k+1 accepted and answered,
                    and only then round k's payload waited, landed and adopted)
    a lost round (its payload failed or passed the data deadline):
    R -> S  ABANDON [MAGIC, KIND_ABANDON, round, count, 0, 0, 0, 0]: best effort
    finally:
    S -> R  END     [MAGIC, KIND_END, rounds, images, 0, 0, 0, 0], padded as a ROUND
    R -> S  SUMMARY [adopted, duplicates, refused, aborted, mismatches, verified, 0, 0]

A refused image (no room, another layout, wrong byte or unit count) is refused **before
anything is sent**: the sender ends its lease (settle, the one-phase cancel of SPEC B.3 row
19) and sends no payload for it. ``digest`` is the first 63 bits of BLAKE2b over the
``layout_id``; the HELLO carries the whole string, and the receiver compares every field.

Payload: ``staged`` (default) or ``regions``. ``staged`` gathers the image's unit regions
(unit-major, region-minor, trimmed to ``image_bytes``: SPEC E.3) into one staging tensor per
image (one ``index_select`` per region when the regions are of one size, else one
``torch.cat`` of the pieces) and sends that: one message per image whatever the geometry
(Qwen3-Next at 16-token pages is 101 units x 12 regions = 1,212 regions per image; a message
each costs a p2p launch each), and the sender's source pin is released as soon as the gather
is queued (stream order: later writers of those units run after it), so the lease holds the
units for a device-local copy, not for the network. The receiver lands the staging tensor
into its units (one ``index_copy_`` per region, or one ``_foreach_copy_`` of the pieces).
``regions`` sends each region view directly
(no staging memory, no extra copies; the source pin is held until the send completed); it is
measured against ``staged`` by :mod:`pagedstate.models.bench.transfer`.

Completion: on CUDA, ``isend``/``irecv`` complete on the device, after the host returns. The
receiver adopts (publishes READY) and the sender settles (reports the terminal state) only
after an event recorded behind the transfer has completed (one host sync per round), so
"adopted" means the bytes are there (SPEC C13) and a failed transfer is seen before adoption.

A lost payload
--------------
A round's payload must complete within ``TransferConfig.data_timeout_s`` seconds
(:data:`~pagedstate.impl.transfer.config.DATA_DEADLINE_FRACTION` = 0.5 of ``timeout_s``, the
groups' timeout) of being posted. On nccl its work is polled (``is_completed()``, short
sleeps); on gloo each transfer is waited with the time left as its timeout (a gloo p2p work
completes only inside ``wait()``). When a transfer fails or the deadline passes, the data
group is **aborted before the round is given up** (:meth:`Link.abort_data`): on nccl
``_abort_process_group`` (``ncclCommAbort``); on gloo, where ``ProcessGroup.abort()`` is a
no-op, a timed-out wait, which closes every connection of the group's context. Only then
does the receiver release the round's reservations: a receive that is still posted could
otherwise land in units handed to someone else. The whole round is given up, an image whose
bytes fully arrived included: nothing of it is landed or adopted. If the data group cannot
be aborted, its buffers are kept alive and the round's reservations are **not** released
(:meth:`Receiver.quarantine`; held to the end of the run); the local restores are resumed
either way. On the sender, a failed payload aborts the data group too, and only then does
its ``finally`` end the round's leases.

Rounds in flight (``TransferConfig.pipeline``)
--------------------------------------------
``pipeline=1``: one round after the other (3 control messages per round). ``pipeline=2``:
round k's payload is posted (:meth:`Link.post`) and waited (:meth:`Link.wait`, its deadline
counted from the post) only after round k+1's lease, ROUND/REPLIES exchange and gather,
before round k's settle, landing and adoption; GO of round k travels with ROUND of round k+1
(2 control messages per round). Round k owns ``window`` staging buffers and destination
slots from ``(k % pipeline) * window`` (``window * pipeline <= slots``). A lost sender with
two rounds in flight gives **both** up by one rule (:mod:`.giveup`): the data group is
aborted (or a payload still posted cancelled, :meth:`Link.cancel`) before any reservation
of either is released, and when it cannot be aborted every reservation of both is kept.

Faults (``TransferConfig.fault``; each is a test in ``tests/test_transfer.py``)
------------------------------------------------------------------------------------
- ``"sender_dies"``: in the round holding ``fault_image`` the sender leases, sends the
  headers, reads the replies and then dies before any payload: its own ``finally`` settles
  every lease of the round (the terminal path; nothing is reclaimed by timeout), it writes
  its result and the process exits with :data:`CRASH_EXIT` without a teardown. The receiver's
  receive fails (the connection is reset, or the group's timeout expires), it releases every
  reservation of the round, resumes the suspended restores, runs them and checks the slots
  hold the local images.
- ``"sender_dies_after_go"``: as ``"sender_dies"``, but the sender first sends GO, so the
  receiver has posted its payload receives when the sender dies. On gloo the receive fails
  when the connection goes; on nccl it passes the data deadline; either way the data group
  is aborted and the round given up as above (the nccl path is written, not yet run on two
  GPUs).
- ``"sender_dies_mid_payload"``: after GO the sender sends the bytes of the round's first
  accepted image as transfers of their own and dies before the rest: on gloo the
  receiver's first receives have completed and the others are still posted. The data group
  is aborted, then the whole round is given up (the image whose bytes arrived too).
- ``"sender_stalls_mid_payload"``: as ``"sender_dies_mid_payload"``, but the sender stays
  alive and silent until the receiver's ABANDON, then sends the rest late and reports the
  outcome (``KIND_LATE``): the late send must fail (the receiver aborted its data group
  before it released anything), and the receiver counts the bytes of the round's units and
  staging tensors written after it gave up (``late_writes``, 0). The sender then fails; its
  ``finally`` settles its leases.
- ``"sender_stalls"``: as ``"sender_dies"``, but the sender stays alive and silent for
  ``2 * timeout_s`` before it sends: the receiver's receive times out (a hung peer, not a
  dead one) and it gives the round up as above. The sender's late send then fails or lands
  nowhere; either way its ``finally`` settles its leases, never a timeout of the store.
- ``"duplicate"``: after the last round the sender sends ``fault_image`` again, alone in a
  round, with every byte inverted (a wrongful adoption would then show). The receiver's
  ``adopt_transfer_units`` returns False and releases the units; the canonical image still
  restores bit-exact.
- ``"receiver_full"``: before the round holding ``fault_image`` a live-KV tenant of the
  receiver takes every unit it can get (``ensure_free_units(1)`` then one unit, as an
  engine's fresh KV block does, SPEC A.4), so ``reserve_transfer_units`` finds no room: the
  images of that round are refused before anything is received, the receiver's snapshot is
  unchanged by the refusal, and the tenant gives its units back after the round.

Layering: ``pagedstate.impl.transfer`` imports ``pagedstate.impl`` and ``pagedstate.spec``
only; ``pagedstate.gpu`` and torch are taken by name at run time (``importlib``), so
importing the driver needs neither, and :func:`spawn_transfer` checks for torch before it
starts a process (:class:`TorchMissingError`: ``pip install 'pagedstate[gpu]'``).

Modules: :mod:`.config` (the run), :mod:`.wire` (messages, :class:`Link`), :mod:`.side`
(what both ranks own), :mod:`.sender` and :mod:`.receiver` (the two roles and their loops),
:mod:`.giveup` (the receiver's rounds in flight and their give-up path),
:mod:`.timing` (phase timers, the plain baseline), :mod:`.rank` (one rank, its report),
:mod:`.launch` (the two processes; ``python -m pagedstate.impl.transfer`` is one rank).
"""

from __future__ import annotations

from .config import (
    BACKENDS,
    COPY_ENGINES,
    CRASH_EXIT,
    DATA_DEADLINE_FRACTION,
    FAULTS,
    MID_PAYLOAD_FAULTS,
    PAYLOADS,
    PIPELINES,
    VERIFY_MODES,
    TransferConfig,
    image_key,
    image_units,
    layout_digest,
)
from .config import MAX_TIMEOUT_S as MAX_TIMEOUT_S
from .config import _config_from_json as _config_from_json
from .config import _config_json as _config_json
from .errors import (
    LayoutMismatchError,
    PayloadLost,
    SenderCrashed,
    TorchMissingError,
    TransferError,
    WireError,
)
from .launch import spawn_transfer
from .rank import run_rank
from .receiver import Receiver
from .receiver import _receiver_loop as _receiver_loop
from .sender import Sender
from .sender import _sender_loop as _sender_loop
from .side import Incoming, Outgoing
from .wire import ACCEPT as ACCEPT
from .wire import CTRL_LEN as CTRL_LEN
from .wire import HEADER_LEN as HEADER_LEN
from .wire import KIND_ABANDON as KIND_ABANDON
from .wire import KIND_END as KIND_END
from .wire import KIND_LATE as KIND_LATE
from .wire import KIND_PAYLOAD as KIND_PAYLOAD
from .wire import KIND_ROUND as KIND_ROUND
from .wire import MAGIC as MAGIC
from .wire import REASONS, ImageHeader, Link, LoadOperationId, Posted, Refusal, Reply
from .wire import REFUSE as REFUSE
from .wire import REPLY_LEN as REPLY_LEN
from .wire import VERSION as VERSION

__all__ = [
    "BACKENDS",
    "COPY_ENGINES",
    "CRASH_EXIT",
    "DATA_DEADLINE_FRACTION",
    "FAULTS",
    "MID_PAYLOAD_FAULTS",
    "PAYLOADS",
    "PIPELINES",
    "REASONS",
    "VERIFY_MODES",
    "ImageHeader",
    "Incoming",
    "LayoutMismatchError",
    "Link",
    "LoadOperationId",
    "Outgoing",
    "PayloadLost",
    "Posted",
    "Receiver",
    "Refusal",
    "Reply",
    "Sender",
    "SenderCrashed",
    "TorchMissingError",
    "TransferConfig",
    "TransferError",
    "WireError",
    "image_key",
    "image_units",
    "layout_digest",
    "run_rank",
    "spawn_transfer",
]
