"""pyvmm.common.record: the start path's value records, without dataclasses."""

from __future__ import annotations

import pytest

from pyvmm.common.record import MutableRecord, Record, replace
from pyvmm.kvm.memory import Protection
from pyvmm.loader.elf import Segment


class Pair(Record):
    __slots__ = ("left", "right", "note")
    _uncompared = ("note",)

    def __init__(self, left: int, right: int = 0, note: str = "") -> None:
        if left < 0:
            raise ValueError("left is never negative")
        self.left = left
        self.right = right
        self.note = note


def test_equal_and_hashed_by_the_compared_fields_only():
    assert Pair(1, 2, "a") == Pair(1, 2, "b")
    assert hash(Pair(1, 2, "a")) == hash(Pair(1, 2, "b"))
    assert Pair(1, 2) != Pair(2, 1)
    assert len({Pair(1, 2), Pair(1, 2, "x"), Pair(3)}) == 2
    assert Pair(1) != (1, 0)  # a record is not a tuple


def test_shown_by_its_compared_fields():
    assert repr(Pair(1, 2, "hidden")) == "Pair(left=1, right=2)"
    assert repr(Protection(write=False)) == "Protection(read=True, write=False, execute=False)"


def test_fields_are_read_only_once_set():
    pair = Pair(1, 2)
    with pytest.raises(AttributeError, match="cannot assign to field 'left' of Pair"):
        pair.left = 5
    with pytest.raises(AttributeError, match="cannot delete field 'right' of Pair"):
        del pair.right
    with pytest.raises(AttributeError):
        pair.other = 1  # no such field: __slots__
    assert (pair.left, pair.right) == (1, 2)


def test_replace_makes_a_copy_through_init_so_its_checks_run_again():
    pair = Pair(1, 2, "n")
    moved = replace(pair, right=7)
    assert (moved.left, moved.right, moved.note) == (1, 7, "n")
    assert (pair.left, pair.right) == (1, 2)
    with pytest.raises(ValueError, match="never negative"):
        pair.replace(left=-1)
    with pytest.raises(TypeError, match="Pair has no field 'middle'"):
        pair.replace(middle=3)


def test_a_segments_file_bytes_are_carried_but_not_compared():
    one = Segment(0x100000, 0x1000, 0x10, 0x20, 5, 0, b"a" * 0x10)
    other = Segment(0x100000, 0x1000, 0x10, 0x20, 5, 0, b"b" * 0x10)
    assert one == other and one.data != other.data
    assert "data" not in repr(one)


class Settings(MutableRecord):
    __slots__ = ("cpus", "memory")

    def __init__(self, cpus: str | None = None, memory: int | None = None) -> None:
        self.cpus = cpus
        self.memory = memory


def test_a_mutable_record_is_filled_in_step_by_step_and_still_compared_by_value():
    settings = Settings()
    settings.memory = 64
    assert settings == Settings(memory=64) and settings != Settings(cpus="0", memory=64)
    assert repr(settings) == "Settings(cpus=None, memory=64)"
    with pytest.raises(TypeError):
        hash(settings)


def test_a_record_can_be_held_weakly():
    import weakref

    pair = Pair(1)
    assert weakref.ref(pair)() is pair
