"""Value records for the start path, without dataclasses.

A record class lists its fields in ``__slots__`` and writes its own
``__init__`` (plain assignments, in the field order). This base gives it,
from ``__slots__`` alone, what a frozen dataclass gave: equality and a
hash over the fields, a repr, a ``replace`` and fields that cannot be
changed once set (a value checked when it was made stays checked). None of
it generates or compiles code, so defining a record costs what any class
costs (docs/startup.md: why pyvmm's start path has no dataclasses).

``_uncompared`` names fields that are carried but are not part of the
value (a file's bytes, a lease, where a value came from): equality, hash
and repr leave them out.

``MutableRecord`` is the same without the read-only fields and the hash,
for a record filled in step by step (a container's settings read from its
bundle) that is still compared by value.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing is for type checkers only: --version imports none
if TYPE_CHECKING:
    from typing import Any, TypeVar

    R = TypeVar("R", bound="MutableRecord")


class MutableRecord:
    """A value with named fields, compared and shown by them."""

    # Caches may hold a record weakly (the launcher's kernels: serve/warm.py).
    __slots__ = ("__weakref__",)
    _uncompared: tuple[str, ...] = ()

    #: The fields that make the value: ``__slots__`` less ``_uncompared``.
    _compared: tuple[str, ...] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._compared = tuple(name for name in cls.__slots__ if name not in cls._uncompared)

    def _values(self) -> tuple:
        return tuple(getattr(self, name) for name in self._compared)

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self._values() == other._values()  # type: ignore[attr-defined]

    __hash__ = None  # type: ignore[assignment]  (its fields may change)

    def __repr__(self) -> str:
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._compared)
        return f"{type(self).__name__}({shown})"

    def replace(self: R, **changes: Any) -> R:
        """A copy with ``changes`` (the fields by name), made through
        ``__init__`` so that its checks run again."""
        fields = {name: getattr(self, name) for name in type(self).__slots__}
        unknown = changes.keys() - fields.keys()
        if unknown:
            raise TypeError(f"{type(self).__name__} has no field '{sorted(unknown)[0]}'")
        fields.update(changes)
        return type(self)(**fields)


class Record(MutableRecord):
    """A value with named, read-only fields (see the module's docstring)."""

    __slots__ = ()

    def __setattr__(self, name: str, value: Any) -> None:
        # Set once, in __init__; a slot not yet set has no value.
        if hasattr(self, name):
            raise AttributeError(f"cannot assign to field '{name}' of {type(self).__name__}")
        object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"cannot delete field '{name}' of {type(self).__name__}")

    def __hash__(self) -> int:
        return hash(self._values())


def replace(record: R, **changes: Any) -> R:
    """``record.replace(**changes)``, in dataclasses.replace's spelling."""
    return record.replace(**changes)
