"""The transfer driver's errors, and its run-time imports of torch and the device side.

``pagedstate.impl`` imports only ``pagedstate.spec`` and itself statically: torch and
``pagedstate.gpu`` are taken by name at run time (:func:`_module`), so importing the driver
needs neither.
"""

from __future__ import annotations

import importlib
from typing import Any

from pagedstate.spec.errors import InvalidArgumentError

#: What installs the driver's run-time dependencies (the extra that pins torch).
INSTALL_HINT = "pip install 'pagedstate[gpu]'"


class TransferError(RuntimeError):
    """The transfer could not go on (a protocol step failed; the message says which).

    ``result``: when raised out of :func:`run_rank`, the rank's report at the failure (its
    unit accounting, the rows it took), else None."""

    result: dict[str, Any] | None = None


class WireError(TransferError):
    """A message could not be sent or received: the peer died, the connection broke, or the
    group's timeout expired (the original error is the ``__cause__``)."""


class PayloadLost(WireError):
    """A round's payload did not complete: a transfer failed (the peer died, a connection
    broke) or the data deadline (``TransferConfig.data_timeout_s`` seconds from posting)
    passed. Raised by :meth:`~pagedstate.impl.transfer.Link.exchange` only after it tried to
    abort the data group, so that nothing can land in the round's buffers any more.

    Attributes:
        done: transfers of the payload that completed before it was given up.
        works: transfers posted (on nccl one grouped work for the whole payload).
        aborted: True when nothing can land any more (the data group was aborted, or every
            transfer had finished); False when the backend could not be aborted: then the
            buffers may still be written, the link keeps them alive (``Link.held``) and the
            caller must neither release nor reuse them.
        how: what was done to the data group, in words.
    """

    def __init__(
        self, message: str, *, done: int = 0, works: int = 0, aborted: bool = False, how: str = ""
    ) -> None:
        super().__init__(message)
        self.done = done
        self.works = works
        self.aborted = aborted
        self.how = how


class LayoutMismatchError(TransferError):
    """The peers' layouts differ (``layout_id``, page or image bytes, units or payload mode):
    no image may cross (SPEC A.1). Raised on both ranks after the HELLO exchange."""


class SenderCrashed(TransferError):
    """The sender died on purpose (``fault="sender_dies"``, ``"sender_dies_after_go"`` or
    ``"sender_dies_mid_payload"``) after its leases were settled;
    ``result`` is its rank report, written before the process exits."""


class TorchMissingError(TransferError, ImportError):
    """torch (with ``torch.distributed``) cannot be imported here: the driver needs the
    ``gpu`` extra (``pip install 'pagedstate[gpu]'``, the extra that pins torch). Raised
    before anything runs: by :func:`~pagedstate.impl.transfer.spawn_transfer` before it
    starts a process, and by a rank before it joins a process group."""


def _module(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError as e:
        # torch itself, or a module of ours that needs it (``e.name``: what was missing)
        missing = {name.split(".")[0], (e.name or "").split(".")[0]}
        cls = TorchMissingError if "torch" in missing else TransferError
        raise cls(
            f"the transfer driver needs {name} ({e}): install the gpu extra, which pins"
            f" torch: {INSTALL_HINT}"
        ) from None


def _need(v: object, cls: type, name: str) -> None:
    if not isinstance(v, cls):
        raise InvalidArgumentError(f"{name} must be an instance of {cls.__name__}, got {v!r}")
