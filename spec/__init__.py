"""pagedstate.spec: the law. Vocabulary, transition tables (data), invariants, op and wire
types, errors. Imports nothing else of pagedstate."""

from .errors import *  # noqa: F403
from .errors import __all__ as _errors_all
from .snapshot import (
    INVARIANTS,
    STEP_INVARIANTS,
    OffloadPinView,
    RecordView,
    Snapshot,
    check_invariants,
    check_step_invariants,
)
from .tables import LEASE, OFFLOAD, RECORD, RESTORE, SCRATCH, TABLES, TRANSFER, Row, Table
from .types import (
    CHECKPOINT_OWNER,
    TRANSFER_OWNER,
    CheckpointRestoreOp,
    CheckpointStoreOp,
    CompletionToken,
    ManualCompletion,
    OffloadIndex,
    PagedStateCheckpointSpec,
    ScratchSlotPool,
    SequenceLike,
    StateStoreOperationId,
    SuspendedCheckpointRestore,
    checkpoint_copy_ops_per_batch,
    units_for,
)

__all__ = [
    *_errors_all,
    "INVARIANTS",
    "STEP_INVARIANTS",
    "OffloadPinView",
    "RecordView",
    "Snapshot",
    "check_invariants",
    "check_step_invariants",
    "LEASE",
    "OFFLOAD",
    "RECORD",
    "RESTORE",
    "SCRATCH",
    "TABLES",
    "TRANSFER",
    "Row",
    "Table",
    "CHECKPOINT_OWNER",
    "TRANSFER_OWNER",
    "CheckpointRestoreOp",
    "CheckpointStoreOp",
    "CompletionToken",
    "ManualCompletion",
    "OffloadIndex",
    "PagedStateCheckpointSpec",
    "ScratchSlotPool",
    "SequenceLike",
    "StateStoreOperationId",
    "SuspendedCheckpointRestore",
    "checkpoint_copy_ops_per_batch",
    "units_for",
]
