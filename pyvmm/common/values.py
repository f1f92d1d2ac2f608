"""How the command line's values are read: numbers in ASCII decimal digits
only, so one rule serves every option that takes a count, a size or a time,
and words from a fixed list, refused alike."""

from __future__ import annotations

from pyvmm.common.errors import UsageError

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing (docs/startup.md)
if TYPE_CHECKING:
    from collections.abc import Callable

#: The most a user or group id can be (2**32 - 1 is the kernel's "no id").
MAX_ID = 2**32 - 2


def is_decimal(text: str) -> bool:
    """ASCII digits only (str.isdigit alone accepts other scripts' digits)."""
    return text.isascii() and text.isdigit()


def positive_int(option: str, text: str, most: int | None = None) -> int:
    """An option's value as a positive decimal integer (ASCII digits only)."""
    if not is_decimal(text) or int(text) <= 0:
        raise UsageError(f"{option}: '{text}' is not a positive integer")
    if most is not None and int(text) > most:
        raise UsageError(f"{option}: {text} is more than {most}")
    return int(text)


def one_of(values: tuple[str, ...]) -> Callable[[str, str], str]:
    """An option's value checker: the value if it is one of ``values``."""

    def check(option: str, value: str) -> str:
        if value not in values:
            raise UsageError(f"{option}: '{value}' is not one of {', '.join(values)}")
        return value

    return check
