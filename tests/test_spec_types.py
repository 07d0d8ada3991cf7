"""SPEC A.1: the checkpoint spec, its wire form, the per-batch op bound, and the error
hierarchy of :mod:`pagedstate.spec.errors`."""

from __future__ import annotations

import attrs
import pytest
from conftest import LAYOUT, spec

import pagedstate.spec as ps
from pagedstate.spec import errors
from pagedstate.spec.errors import (
    AmbiguousSuspendError,
    BadSpecError,
    BatchTooLargeError,
    CheckpointVanishedError,
    DuplicateUnitError,
    IllegalTransitionError,
    InvalidArgumentError,
    LeaseReusedError,
    NoFreeUnitError,
    PagedStateError,
    PartialReleaseError,
    PinUnderflowError,
    RawUnitFreeError,
    SlotBusyError,
    SourcePinLostError,
    UnknownOperationError,
    WrongOwnerError,
)
from pagedstate.spec.types import (
    PagedStateCheckpointSpec,
    StateStoreOperationId,
    checkpoint_copy_ops_per_batch,
    units_for,
)

GOOD = {"page_unit_bytes": 10, "slot_bytes": 25, "layout_id": LAYOUT, "image_bytes": 25}


def make(**changes):
    return PagedStateCheckpointSpec(**{**GOOD, **changes})


# -- validation -------------------------------------------------------------------------


def test_valid_spec_constructs_and_is_frozen():
    s = make()
    assert (s.page_unit_bytes, s.slot_bytes, s.image_bytes, s.layout_id) == (10, 25, 25, LAYOUT)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        s.page_unit_bytes = 20  # type: ignore[misc]
    assert s == spec(10, 25)
    assert hash(s) == hash(spec(10, 25))


@pytest.mark.parametrize("field", ["page_unit_bytes", "slot_bytes", "image_bytes"])
@pytest.mark.parametrize("bad", [True, False, 0, -1, -25, 2.5, 10.0, "10", None])
def test_byte_counts_must_be_positive_non_bool_ints(field, bad):
    with pytest.raises(BadSpecError):
        make(**{field: bad})


def test_bad_spec_error_is_a_value_error():
    with pytest.raises(ValueError):
        make(page_unit_bytes=0)
    assert issubclass(BadSpecError, ValueError)
    assert issubclass(BadSpecError, PagedStateError)


def test_image_may_not_exceed_slot():
    with pytest.raises(BadSpecError):
        make(image_bytes=26)
    assert make(image_bytes=25).image_bytes == 25  # equal is allowed
    assert make(image_bytes=1).image_bytes == 1


@pytest.mark.parametrize("bad", ["", None, 7, b"test-v1", ["test-v1"]])
def test_layout_id_must_be_a_non_empty_str(bad):
    with pytest.raises(BadSpecError):
        make(layout_id=bad)


# -- geometry ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("page", "slot", "image", "units"),
    [
        (10, 25, 25, 3),
        (10, 30, 30, 3),
        (10, 31, 31, 4),
        (10, 100, 100, 10),
        (10, 25, 1, 1),
        (10, 25, 10, 1),
        (10, 25, 11, 2),
        (1, 7, 7, 7),
        (100, 25, 25, 1),
    ],
)
def test_units_per_checkpoint_is_ceil_image_over_page(page, slot, image, units):
    s = make(page_unit_bytes=page, slot_bytes=slot, image_bytes=image)
    assert s.units_per_checkpoint == units
    assert units_for(image, page) == units


def test_units_are_derived_from_the_image_not_the_slot():
    # A 9 MB image in a 21 MB slot prices 6 units of 1.6 MB, not 14 (SPEC E.1 example).
    s = make(page_unit_bytes=1_600_000, slot_bytes=21_168_000, image_bytes=9_060_352)
    assert s.units_per_checkpoint == 6
    assert spec(10, 25, image_bytes=11).units_per_checkpoint == 2


# -- wire form --------------------------------------------------------------------------


def test_to_wire_is_exactly_the_four_fields():
    wire = make().to_wire()
    assert wire == {"page_unit_bytes": 10, "slot_bytes": 25, "image_bytes": 25, "layout_id": LAYOUT}
    assert set(wire) == {"page_unit_bytes", "slot_bytes", "image_bytes", "layout_id"}
    assert "units_per_checkpoint" not in wire


def test_from_wire_round_trips():
    s = make(image_bytes=13)
    assert PagedStateCheckpointSpec.from_wire(s.to_wire()) == s


@pytest.mark.parametrize("bad", [None, [("page_unit_bytes", 10)], "x", 3, (10, 25, 25)])
def test_from_wire_needs_a_mapping(bad):
    with pytest.raises(TypeError):
        PagedStateCheckpointSpec.from_wire(bad)


def test_from_wire_rejects_an_extra_key():
    wire = {**make().to_wire(), "units_per_checkpoint": 3}
    with pytest.raises(BadSpecError, match="fields"):
        PagedStateCheckpointSpec.from_wire(wire)


@pytest.mark.parametrize("missing", sorted(GOOD))
def test_from_wire_rejects_a_missing_key(missing):
    wire = {k: v for k, v in make().to_wire().items() if k != missing}
    with pytest.raises(BadSpecError, match="fields"):
        PagedStateCheckpointSpec.from_wire(wire)


@pytest.mark.parametrize(
    "changes",
    [
        {"page_unit_bytes": 0},
        {"slot_bytes": True},
        {"image_bytes": 26},
        {"layout_id": ""},
        {"image_bytes": "25"},
    ],
)
def test_from_wire_revalidates(changes):
    with pytest.raises(BadSpecError):
        PagedStateCheckpointSpec.from_wire({**make().to_wire(), **changes})


# -- per-batch bound --------------------------------------------------------------------


@pytest.mark.parametrize(("n", "ops"), [(1, 2), (4, 8), (256, 512), (None, 0), (0, 0)])
def test_checkpoint_copy_ops_per_batch_is_two_per_sequence(n, ops):
    assert checkpoint_copy_ops_per_batch(n) == ops


@pytest.mark.parametrize("bad", [-1, -100])
def test_checkpoint_copy_ops_per_batch_rejects_negative(bad):
    with pytest.raises(InvalidArgumentError):
        checkpoint_copy_ops_per_batch(bad)
    with pytest.raises(ValueError):
        checkpoint_copy_ops_per_batch(bad)


# -- operation ids ----------------------------------------------------------------------


def test_operation_id_compares_by_both_fields():
    a = StateStoreOperationId(11, 1)
    assert a == StateStoreOperationId(11, 1)
    assert a != StateStoreOperationId(11, 2)
    assert a != StateStoreOperationId(12, 1)
    assert (a.prefix_hash, a.generation) == (11, 1)
    assert len({a, StateStoreOperationId(11, 1), StateStoreOperationId(11, 2)}) == 2


# -- error hierarchy --------------------------------------------------------------------


def test_every_exported_error_is_a_paged_state_error():
    assert errors.__all__, "errors.__all__ is empty"
    for name in errors.__all__:
        cls = getattr(errors, name)
        assert isinstance(cls, type) and issubclass(cls, Exception), name
        assert issubclass(cls, PagedStateError), name
        assert getattr(ps, name) is cls, f"pagedstate.spec does not re-export {name}"


@pytest.mark.parametrize(
    ("cls", "builtin"),
    [
        (BadSpecError, ValueError),
        (InvalidArgumentError, ValueError),
        (DuplicateUnitError, ValueError),
        (WrongOwnerError, AssertionError),
        (PartialReleaseError, AssertionError),
        (RawUnitFreeError, AssertionError),
        (NoFreeUnitError, AssertionError),
        (IllegalTransitionError, AssertionError),
        (PinUnderflowError, AssertionError),
        (UnknownOperationError, LookupError),
        (LeaseReusedError, AssertionError),
        (SourcePinLostError, AssertionError),
        (SlotBusyError, AssertionError),
        (AmbiguousSuspendError, AssertionError),
        (CheckpointVanishedError, RuntimeError),
        (BatchTooLargeError, RuntimeError),
    ],
)
def test_errors_keep_atoms_builtin_bases(cls, builtin):
    """An engine that catches what ATOM's module raises keeps working (SPEC A.2, B.3, E.5)."""
    assert issubclass(cls, builtin)
    assert issubclass(cls, PagedStateError)
    assert cls.__name__ in errors.__all__


def test_duplicate_unit_error_is_an_invalid_argument():
    assert issubclass(DuplicateUnitError, InvalidArgumentError)


def test_illegal_transition_error_names_the_missing_row():
    e = IllegalTransitionError("record", "COPYING", "pin_restore", "-", "detail")
    assert (e.machine, e.phase, e.event, e.guard) == ("record", "COPYING", "pin_restore", "-")
    assert "COPYING" in str(e) and "pin_restore" in str(e) and "detail" in str(e)
    with pytest.raises(AssertionError):
        raise e
