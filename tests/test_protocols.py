"""The protocols of ``spec/protocols.py`` describe what the coordinators, stores and pools
really expose: an engine coding against :class:`CoordinatorProtocol`
sees the whole surface, including ``pool`` and ``store`` (through which the store-level
calls ``lookup``, ``contains_or_pending``, ``changed_since`` and ``cancel_queued_restore``
are reached). mypy checks the same statically (``_is_a_coordinator`` in both modules)."""

from __future__ import annotations

import pytest
from conftest import spec

from pagedstate import impl as I
from pagedstate.models import reference as R
from pagedstate.spec.protocols import (
    CheckpointStoreProtocol,
    CoordinatorProtocol,
    UnitPoolProtocol,
)

#: Hooks for the checkers, not engine surface.
CHECKER_HOOKS = {"clone", "row_sink", "store_class", "on_transition", "self_check"}


def _members(proto: type) -> set[str]:
    return {n for n in dir(proto) if not n.startswith("_")}


@pytest.mark.parametrize("M", [R, I], ids=["reference", "impl"])
def test_the_coordinator_protocol_is_the_coordinators_public_surface(M):
    c = M.PagedStateCheckpointCoordinator(M.UnitPool(4), spec(10, 25), True)
    public = {n for n in dir(c) if not n.startswith("_")} - CHECKER_HOOKS
    assert public == _members(CoordinatorProtocol)
    assert isinstance(c, CoordinatorProtocol)
    assert isinstance(c.store, CheckpointStoreProtocol)
    assert isinstance(c.pool, UnitPoolProtocol)
    for name in ("lookup", "contains_or_pending", "changed_since", "cancel_queued_restore"):
        assert name in _members(CheckpointStoreProtocol)
